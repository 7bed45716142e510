//! The JavaScript of each layer mechanism (see `layers`), filled in with its parameters.
//! Every body pushes one middleware onto `whaleLayers` and uses only the scaffold's helpers
//! (`whaleMessages`, `whaleLastUser`, `whaleFinalAnswer`, `whaleWithLlm`, `whaleWithEnv`,
//! `whaleHasRoom`, `whalePromptChars`).

use serde::Serialize;

/// A JavaScript literal for `value` (JSON is valid JavaScript).
fn js(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

/// Samples `samples` replies per model call and returns the one whose final answer is most
/// common; one sample when the budget guard has no room for all of them (and two more calls).
pub(crate) fn vote(samples: usize) -> String {
    format!(
        r#"const SAMPLES = {samples};
const key = (reply) => whaleFinalAnswer(reply.text).toLowerCase();
whaleLayers.push(function whaleVote(task, ctx, next) {{
  const chat = (messages, opts) => {{
    const n = whaleHasRoom(SAMPLES + 2, SAMPLES * whalePromptChars(messages)) ? SAMPLES : 1;
    const replies = [];
    for (let i = 0; i < n; i++) replies.push(ctx.llm.chat(messages, opts));
    const votes = new Map();
    for (const reply of replies) if (key(reply) !== "") votes.set(key(reply), (votes.get(key(reply)) || 0) + 1);
    let best = replies[0];
    for (const reply of replies) if ((votes.get(key(reply)) || 0) > (votes.get(key(best)) || 0)) best = reply;
    return best;
  }};
  return next(task, whaleWithLlm(ctx, chat));
}});"#
    )
}

/// Asks again once when a reply is cut off or empty, and lets the model correct an answer or
/// move the environment refused as invalid, using the refusal.
pub(crate) fn retry() -> String {
    r#"const RETRY = "Your reply was cut off or empty. Reply again, briefly, and end with the final answer.";
const FIX = "Reply with a corrected answer only.";
whaleLayers.push(async function whaleRetry(task, ctx, next) {
  let acted = false;
  const chat = (messages, opts) => {
    const reply = ctx.llm.chat(messages, opts);
    if (reply.finish_reason !== "length" && reply.text.trim() !== "") return reply;
    const again = whaleMessages(messages);
    again.push({ role: "assistant", content: reply.text }, { role: "user", content: RETRY });
    const second = ctx.llm.chat(again, opts);
    return second.text.trim() === "" ? reply : second;
  };
  const act = (kind, value) => {
    acted = true;
    const outcome = ctx.env[kind](value);
    if (!outcome.invalid || outcome.done) return outcome;
    const prompt = `${ctx.env.observation}\n\nYour answer ${JSON.stringify(String(value))} was refused: ${outcome.reply}\n${FIX}`;
    const fixed = whaleFinalAnswer(ctx.llm.chat(prompt, { max_tokens: 64 }).text);
    return fixed === "" ? outcome : ctx.env[kind](fixed);
  };
  const out = await next(task, whaleWithEnv(whaleWithLlm(ctx, chat), act));
  if (!acted && (typeof out === "string" || typeof out === "number")) {
    act("submit", out);
    return undefined;
  }
  return out;
});"#
    .to_string()
}

/// How an answer is parsed before it is submitted or played.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parsing {
    /// The final answer of a reply: the last `\boxed{}`, else the text after "answer is" /
    /// "answer:", else the last line.
    Final,
    /// The last number, without thousands separators (submitted answers only).
    Number,
    /// Markdown, quotes, an "Answer:" label and trailing punctuation stripped.
    Clean,
}

impl Parsing {
    pub const ALL: [Parsing; 3] = [Parsing::Final, Parsing::Number, Parsing::Clean];

    fn expression(self) -> &'static str {
        match self {
            Parsing::Final => r#"(kind, value) => whaleFinalAnswer(value)"#,
            Parsing::Number => {
                r#"(kind, value) => {
  if (kind !== "submit") return "";
  const numbers = String(value).replace(/(\d),(?=\d{3}\b)/g, "$1").match(/-?\d+(?:\.\d+)?(?:\/\d+)?/g);
  return numbers ? numbers[numbers.length - 1] : "";
}"#
            }
            Parsing::Clean => {
                r#"(kind, value) => String(value).trim()
  .replace(/^\*+|\*+$/g, "")
  .replace(/^`+|`+$/g, "")
  .replace(/^["']|["']$/g, "")
  .replace(/^(?:final answer|answer)\s*[:\-]\s*/i, "")
  .replace(/[.;!]+$/, "")
  .trim()"#
            }
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Parsing::Final => "submit only the final answer of a reply (the last \\boxed{}, else the text after 'answer is' or 'answer:', else the last line) instead of the whole text, since verifiers compare a bare answer",
            Parsing::Number => "submit the last number of the answer, without thousands separators, since numeric verifiers compare numbers and prose around them breaks the match",
            Parsing::Clean => "strip markdown, quotes, an 'Answer:' label and trailing punctuation from each answer or move, which otherwise make a right answer fail the comparison",
        }
    }
}

/// Rewrites every answer or move (submitted through `ctx.env` or returned by `solve`) with
/// `parsing`; an answer the rule finds nothing in is left as it was.
pub(crate) fn parse(parsing: Parsing) -> String {
    format!(
        r#"const rewrite = {};
whaleLayers.push(async function whaleParse(task, ctx, next) {{
  let acted = false;
  const act = (kind, value) => {{
    acted = true;
    const parsed = typeof value === "string" || typeof value === "number" ? rewrite(kind, value) : "";
    return ctx.env[kind](parsed === "" ? value : parsed);
  }};
  const out = await next(task, whaleWithEnv(ctx, act));
  if (!acted && (typeof out === "string" || typeof out === "number")) {{
    act("submit", out);
    return undefined;
  }}
  return out;
}});"#,
        parsing.expression()
    )
}

/// How the messages of each model call are formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Formatting {
    /// System messages folded into the first user message.
    SystemIntoUser,
    /// Blank-line runs and trailing spaces squeezed, very long messages clipped in the middle.
    Compact,
    /// Only the system messages, the first user message and the last four messages kept.
    RecentWindow,
}

impl Formatting {
    pub const ALL: [Formatting; 3] = [Formatting::SystemIntoUser, Formatting::Compact, Formatting::RecentWindow];

    fn transform(self) -> &'static str {
        match self {
            Formatting::SystemIntoUser => {
                r#"(list) => {
  const system = list.filter((m) => m && m.role === "system").map((m) => m.content).join("\n\n");
  const rest = list.filter((m) => !(m && m.role === "system"));
  const first = rest.findIndex((m) => m && m.role === "user");
  if (system === "" || first < 0) return list;
  rest[first] = { ...rest[first], content: `${system}\n\n${rest[first].content}` };
  return rest;
}"#
            }
            Formatting::Compact => {
                r#"(list) => list.map((m) => {
  if (!m || typeof m.content !== "string") return m;
  let content = m.content.replace(/[ \t]+\n/g, "\n").replace(/\n{3,}/g, "\n\n").trim();
  if (content.length > 3000) {
    content = `${content.slice(0, 2000)}\n[... ${content.length - 3000} characters cut ...]\n${content.slice(-1000)}`;
  }
  return { ...m, content };
})"#
            }
            Formatting::RecentWindow => {
                r#"(list) => {
  const first = list.findIndex((m) => m && m.role === "user");
  return list.filter((m, i) => (m && m.role === "system") || i === first || i >= list.length - 4);
}"#
            }
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Formatting::SystemIntoUser => "fold the system message into the first user message, since small chat models often follow instructions in the user turn more reliably than in the system turn",
            Formatting::Compact => "squeeze blank-line runs and clip very long messages in the middle, so the model reads less noise and each call costs fewer prompt tokens",
            Formatting::RecentWindow => "keep only the system messages, the first user message and the last four messages of long conversations, bounding prompt cost and keeping stale turns out of the way",
        }
    }
}

/// Reformats the messages of every model call with `formatting`.
pub(crate) fn format_messages(formatting: Formatting) -> String {
    format!(
        r#"const reformat = {};
whaleLayers.push(function whaleFormat(task, ctx, next) {{
  const chat = (messages, opts) => {{
    const list = whaleMessages(messages);
    return ctx.llm.chat(Array.isArray(list) ? reformat(list) : messages, opts);
  }};
  return next(task, whaleWithLlm(ctx, chat));
}});"#,
        formatting.transform()
    )
}

/// One solved example: a user turn and the assistant's reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Shot {
    pub user: String,
    pub assistant: String,
}

/// Inserts `shots` as prior user/assistant turns (after any system message) in every model call.
pub(crate) fn few_shot(shots: &[Shot]) -> String {
    format!(
        r#"const EXAMPLES = {};
whaleLayers.push(function whaleFewShot(task, ctx, next) {{
  const turns = EXAMPLES.flatMap((e) => [{{ role: "user", content: e.user }}, {{ role: "assistant", content: e.assistant }}]);
  const chat = (messages, opts) => {{
    const list = whaleMessages(messages);
    if (!Array.isArray(list)) return ctx.llm.chat(messages, opts);
    const at = list.findIndex((m) => !(m && m.role === "system"));
    list.splice(at < 0 ? list.length : at, 0, ...turns);
    return ctx.llm.chat(list, opts);
  }};
  return next(task, whaleWithLlm(ctx, chat));
}});"#,
        js(&shots)
    )
}

/// Before a model call, calls one of the task's tools and appends the result to the last user
/// message. The tool is the `pick`-th (modulo) of those a harness can call without knowing the
/// task: no arguments (a state reading), a first argument named like `query` (called with the
/// observation) or like `expression` (called with an expression the model writes first, once).
pub(crate) fn tool_step(pick: usize, lookups: usize, result_chars: usize) -> String {
    format!(
        r#"const PICK = {pick};
const LOOKUPS = {lookups};
const RESULT_CHARS = {result_chars};
const ASK = "Write one arithmetic expression whose value answers the problem above. Reply with the expression only.";
whaleLayers.push(function whaleToolStep(task, ctx, next) {{
  const usable = ctx.env.tools.filter((t) => t.args.length === 0 || /query|expression/i.test(t.args[0]));
  if (usable.length === 0) return next(task, ctx);
  const tool = usable[PICK % usable.length];
  const byExpression = tool.args.length > 0 && /expression/i.test(tool.args[0]);
  let steps = 0;
  const consult = (list) => {{
    if (!byExpression) {{
      const args = tool.args.length === 0 ? [] : [ctx.env.observation];
      return JSON.stringify(ctx.tools[tool.name](...args));
    }}
    const question = list[whaleLastUser(list)].content;
    const asked = ctx.llm.chat([{{ role: "user", content: `${{question}}\n\n${{ASK}}` }}], {{ max_tokens: 128, trainable: false }});
    const expression = whaleFinalAnswer(asked.text).replace(/^`+|`+$/g, "");
    return `${{expression}} = ${{JSON.stringify(ctx.tools[tool.name](expression))}}`;
  }};
  const chat = (messages, opts) => {{
    const list = whaleMessages(messages);
    const last = Array.isArray(list) ? whaleLastUser(list) : -1;
    if (last < 0 || steps >= (byExpression ? 1 : LOOKUPS)) return ctx.llm.chat(messages, opts);
    steps += 1;
    let result = null;
    try {{
      result = consult(list);
    }} catch (error) {{
      ctx.log(`tool step ${{tool.name}} failed: ${{error}}`);
    }}
    if (result === null) return ctx.llm.chat(messages, opts);
    list[last] = {{ ...list[last], content: `${{list[last].content}}\n\n[${{tool.name}}] ${{String(result).slice(0, RESULT_CHARS)}}` }};
    return ctx.llm.chat(list, opts);
  }};
  return next(task, whaleWithLlm(ctx, chat));
}});"#
    )
}

/// Adds `instruction` to the system message of every model call (a new system message when
/// there is none): the prompt rewrite for harnesses whose prompt text is not a literal.
pub(crate) fn instruction(instruction: &str) -> String {
    format!(
        r#"const INSTRUCTION = {};
whaleLayers.push(function whaleInstruction(task, ctx, next) {{
  const chat = (messages, opts) => {{
    const list = whaleMessages(messages);
    if (!Array.isArray(list)) return ctx.llm.chat(messages, opts);
    const system = list.findIndex((m) => m && m.role === "system");
    if (system >= 0) list[system] = {{ ...list[system], content: `${{list[system].content}}\n${{INSTRUCTION}}` }};
    else list.unshift({{ role: "system", content: INSTRUCTION }});
    return ctx.llm.chat(list, opts);
  }};
  return next(task, whaleWithLlm(ctx, chat));
}});"#,
        js(&instruction)
    )
}

/// The search protocol a query is asked for in: one `SEARCH: <query>` line, answered by
/// `RESULTS:` (the protocol of the QA corpus, and of ReAct-style agents generally).
const SEARCH_PROTOCOL: &str = "You can search a collection of passages. To search, reply with one line \
                               `SEARCH: <query>` and wait for the RESULTS. Answer with the short answer only.";

/// Lets the model write the query of each of a rollout's first `searches` searches: every tool
/// whose first argument is named like `query` still runs on the harness's query, and before it
/// the model, shown that query under the search protocol, may reply `SEARCH: <its own query>`;
/// with `hops` 2 it sees those results and may search once more. The harness gets back as many
/// items as its own search returned, the model's results first and then its own, interleaved,
/// each item once (by `title` where items have one).
pub(crate) fn query(hops: usize, searches: usize) -> String {
    format!(
        r#"const HOPS = {hops};
const SEARCHES = {searches};
const PROTOCOL = {};
const key = (item) => (item && typeof item === "object" && "title" in item ? `t:${{item.title}}` : JSON.stringify(item));
const show = (items) => items.map((item) => (item && typeof item === "object" && "title" in item ? `[${{item.title}}] ${{item.text ?? ""}}` : JSON.stringify(item))).join("\n");
whaleLayers.push(function whaleQuery(task, ctx, next) {{
  const names = ctx.env.tools.filter((t) => t.args.length > 0 && /query/i.test(t.args[0])).map((t) => t.name);
  if (names.length === 0) return next(task, ctx);
  let rewritten = 0;
  const ask = (messages) => {{
    if (!whaleHasRoom(2, whalePromptChars(messages))) return null;
    try {{
      const found = ctx.llm.chat(messages, {{ max_tokens: 32 }}).text.match(/SEARCH:\s*([^\n]+)/);
      return found && found[1].trim() !== "" ? found[1].trim() : null;
    }} catch (error) {{
      ctx.log(`query rewrite: model call refused: ${{error.message}}`);
      return null;
    }}
  }};
  const rewrite = (name) => (query, ...rest) => {{
    const own = ctx.tools[name](query, ...rest);
    if (!Array.isArray(own) || rewritten >= SEARCHES) return own;
    rewritten += 1;
    const messages = [{{ role: "system", content: PROTOCOL }}, {{ role: "user", content: String(query) }}];
    const lists = [];
    let asked = ask(messages);
    while (asked !== null && lists.length < HOPS) {{
      const hits = ctx.tools[name](asked, ...rest);
      if (!Array.isArray(hits)) break;
      lists.push(hits);
      messages.push({{ role: "assistant", content: `SEARCH: ${{asked}}` }}, {{ role: "user", content: `RESULTS:\n${{show(hits)}}` }});
      asked = lists.length < HOPS ? ask(messages) : null;
    }}
    if (lists.length === 0) return own;
    lists.push(own);
    const merged = [];
    const seen = new Set();
    const longest = Math.max(...lists.map((list) => list.length));
    for (let i = 0; i < longest; i++) {{
      for (const list of lists) {{
        if (i < list.length && !seen.has(key(list[i]))) {{
          seen.add(key(list[i]));
          merged.push(list[i]);
        }}
      }}
    }}
    return merged.slice(0, Math.max(own.length, 1));
  }};
  const tools = {{}};
  for (const name of names) tools[name] = rewrite(name);
  return next(task, Object.freeze({{ ...ctx, tools: new Proxy(Object.freeze(tools), {{ get: (target, name) => (name in target ? target[name] : ctx.tools[name]) }}) }}));
}});"#,
        js(&SEARCH_PROTOCOL)
    )
}
