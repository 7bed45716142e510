// Builds the `ctx` object that `solve(task, ctx)` receives from the host's primitives.
// Evaluated once per rollout; `host` never becomes reachable from the harness.
(function (host, toolSpecs) {
  "use strict";
  const toolNames = toolSpecs.map((spec) => spec.name);
  const tools = {};
  for (const name of toolNames) {
    tools[name] = (...args) => host.tool(name, args);
  }
  const toolbox = new Proxy(Object.freeze(tools), {
    get(target, key) {
      if (typeof key === "symbol" || key in target) return target[key];
      if (key === "then" || key === "toJSON") return undefined;
      const known = toolNames.length ? toolNames.join(", ") : "none";
      throw new TypeError(`ctx.tools.${key}: unknown tool (this task's tools: ${known})`);
    },
  });
  const format = (value) => {
    if (typeof value === "string") return value;
    try {
      const json = JSON.stringify(value);
      return json === undefined ? String(value) : json;
    } catch (_) {
      return String(value);
    }
  };
  const log = (...values) => host.log(values.map(format).join(" "));
  const random = () => host.random();
  const env = Object.freeze({
    get observation() {
      return host.observation();
    },
    get done() {
      return host.done();
    },
    tools: Object.freeze(toolSpecs.map((spec) => Object.freeze(spec))),
    play: (move) => host.act("play", move),
    submit: (answer) => host.act("submit", answer),
  });
  Math.random = random;
  globalThis.console = Object.freeze({ log, info: log, warn: log, error: log, debug: log });
  return Object.freeze({
    llm: Object.freeze({ chat: (messages, opts) => host.chat(messages, opts) }),
    tools: toolbox,
    env,
    random,
    log,
  });
})
