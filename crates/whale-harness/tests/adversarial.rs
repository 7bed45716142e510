//! Broken and hostile harnesses end as the right error kind, within their limits, while the
//! well-behaved rollouts of the same run complete normally.

mod common;

use common::{arithmetic_job, line_of, run, ArithmeticModel};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use whale_core::{ErrorKind, Trajectory};
use whale_harness::{run_rollouts, Harness, Limits, RunOptions, SourceLocation};
use whale_policy::{ChatRequest, Completion, Policy, PolicyError};

const ADVERSARY: &str = r#"
export const meta = { name: "adversary", description: "misbehaves when the task asks it to" };

function recurse(n) {
  return recurse(n + 1) + 1;
}

export async function solve(task, ctx) {
  switch (task.mode) {
    case "normal": {
      const reply = await ctx.llm.chat([{ role: "user", content: ctx.env.observation }], { max_tokens: 16 });
      return reply.text;
    }
    case "loop":
      while (true) {}
    case "async_loop":
      await null;
      while (true) {}
    case "swallowed_loop":
      try { while (true) {} } catch (e) { return "caught"; }
    case "memory": {
      const hoard = [];
      while (true) hoard.push(new Array(100000).fill(hoard.length));
    }
    case "recursion":
      return recurse(0);
    case "huge_answer":
      return "7".repeat(1000000);
    case "throw":
      throw new Error("harness gave up");
    case "throw_value":
      throw { reason: "not an Error" };
    case "throw_huge":
      throw "x".repeat(1000000);
    case "slow_to_read": {
      const error = new Error("read me");
      Object.defineProperty(error, "name", { get() { for (;;) {} } });
      throw error;
    }
    case "unknown_tool":
      return ctx.tools.telescope("moon");
    case "malformed":
      return { answer: 7 };
    case "null":
      return null;
    case "chatty":
      for (let i = 0; i < 100; i++) ctx.llm.chat("again?");
      return "done";
    case "swallowed_limit":
      try { for (;;) ctx.llm.chat("again?"); } catch (e) { ctx.log("caught:", e.message); }
      return String(task.a + task.b);
    case "import":
      return await import("fs");
    case "require":
      return require("fs").readFileSync("/etc/passwd", "utf8");
    case "host_objects":
      return eval("globalThis.process || globalThis.std || globalThis.os").env.HOME;
    case "std":
      return std.open("/etc/passwd", "r").readAsString();
    case "clock":
      return String(Date.now());
    case "timer":
      return String(performance.now());
    case "built_in_overrun": {
      let shared = [task.a];
      for (let i = 0; i < 20; i++) shared = [shared, shared];
      return String(JSON.stringify(shared).length);
    }
  }
}
"#;

fn limits() -> Limits {
    Limits { compute_ms: 300, ..Limits::default() }
}

/// Two normal rollouts around each adversarial one, all in one run on 6 threads.
fn run_modes(modes: &[&str]) -> Vec<(String, Trajectory)> {
    let harness = Arc::new(Harness::new("adversary", ADVERSARY));
    let mut jobs = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        for (k, m) in [("normal", "normal"), (mode, mode), ("normal", "normal")].iter().enumerate() {
            let (a, b) = (i as i64 * 10 + k as i64, 5);
            let view = json!({"mode": m.0, "a": a, "b": b});
            jobs.push(arithmetic_job(&harness, &format!("{}-{i}-{k}", m.1), view, a, b, i as u64));
        }
    }
    let trajectories = run(jobs, ArithmeticModel::new(), &limits(), 6);
    trajectories.into_iter().map(|t| (t.task_id.split('-').next().unwrap_or_default().to_string(), t)).collect()
}

fn error_of(results: &[(String, Trajectory)], mode: &str) -> (ErrorKind, String) {
    let t = &results.iter().find(|(m, _)| m == mode).expect("mode present").1;
    assert_eq!(t.reward, 0.0, "{mode}");
    assert!(!t.success);
    let error = t.error.as_ref().unwrap_or_else(|| panic!("{mode} should fail: {t:?}"));
    (error.kind, error.message.clone())
}

#[test]
fn every_adversary_fails_alone_with_its_own_error_kind() {
    let modes = [
        "loop",
        "async_loop",
        "swallowed_loop",
        "memory",
        "recursion",
        "huge_answer",
        "throw",
        "throw_value",
        "throw_huge",
        "slow_to_read",
        "unknown_tool",
        "malformed",
        "null",
        "chatty",
        "swallowed_limit",
        "import",
        "require",
        "host_objects",
        "std",
        "clock",
        "timer",
    ];
    let results = run_modes(&modes);
    assert_eq!(results.len(), modes.len() * 3);
    for (_, t) in results.iter().filter(|(mode, _)| mode == "normal") {
        assert_eq!(t.error, None, "{}", t.task_id);
        assert!(t.success && t.reward == 1.0, "{}: {:?}", t.task_id, t.answer);
        assert_eq!(t.turns, 1);
    }
    let expect = |mode: &str, kind: ErrorKind, needle: &str| {
        let (found, message) = error_of(&results, mode);
        assert_eq!(found, kind, "{mode}: {message}");
        assert!(message.contains(needle), "{mode}: `{message}` lacks `{needle}`");
    };
    expect("loop", ErrorKind::Timeout, "more than 300 ms of compute time");
    expect("async_loop", ErrorKind::Timeout, "compute time");
    expect("swallowed_loop", ErrorKind::Timeout, "compute time");
    expect("memory", ErrorKind::OutOfMemory, "out of memory");
    expect("recursion", ErrorKind::StackOverflow, "Maximum call stack size exceeded");
    expect("huge_answer", ErrorKind::BadAnswer, "1000000 characters, more than the limit answer_chars = 10000");
    expect("throw", ErrorKind::Exception, "Error: harness gave up (harness.js:");
    expect("throw_value", ErrorKind::Exception, r#"{"reason":"not an Error"}"#);
    let (_, huge) = error_of(&results, "throw_huge");
    assert!(huge.len() < 5_000 && huge.ends_with("x [995918 more characters]"), "{}", &huge[huge.len() - 40..]);
    expect("slow_to_read", ErrorKind::Timeout, "compute time");
    expect("unknown_tool", ErrorKind::Exception, "ctx.tools.telescope: unknown tool (this task's tools: calculator)");
    expect("malformed", ErrorKind::BadAnswer, "solve returned a value of type object");
    expect("null", ErrorKind::BadAnswer, "solve returned null");
    expect("chatty", ErrorKind::CallLimit, "more than 16 model calls");
    expect("swallowed_limit", ErrorKind::CallLimit, "more than 16 model calls");
    expect("import", ErrorKind::Exception, "could not load module 'fs'");
    expect("require", ErrorKind::Exception, "require is not defined");
    expect("host_objects", ErrorKind::Exception, "TypeError");
    expect("std", ErrorKind::Exception, "std is not defined");
    expect("clock", ErrorKind::Exception, "Date is not defined");
    expect("timer", ErrorKind::Exception, "performance is not defined");
}

#[test]
fn exceptions_point_at_the_harness_line_and_keep_the_js_stack() {
    let results = run_modes(&["throw", "unknown_tool"]);
    let thrower = &results.iter().find(|(m, _)| m == "throw").unwrap().1;
    let error = thrower.error.as_ref().unwrap();
    let stack = error.stack.as_deref().expect("a stack");
    assert!(stack.contains("at solve (harness.js:"), "{stack}");
    let at = SourceLocation::find_in(&error.message).expect("line:column in the message");
    assert_eq!(at.line, line_of(ADVERSARY, "harness gave up"));
    assert!(at.column > 1);
    let unknown = &results.iter().find(|(m, _)| m == "unknown_tool").unwrap().1;
    let at = SourceLocation::find_in(&unknown.error.as_ref().unwrap().message).expect("a location");
    assert_eq!(at.line, line_of(ADVERSARY, "ctx.tools.telescope"));
}

#[test]
fn limits_hold_within_their_budget() {
    let results = run_modes(&["loop", "chatty", "swallowed_limit"]);
    let loop_run = &results.iter().find(|(m, _)| m == "loop").unwrap().1;
    assert!(loop_run.wall.harness_ms >= 300.0, "{:?}", loop_run.wall);
    assert!(loop_run.wall.harness_ms < 3_000.0, "stopped promptly: {:?}", loop_run.wall);
    let chatty = &results.iter().find(|(m, _)| m == "chatty").unwrap().1;
    assert_eq!(chatty.model_calls.len(), 16, "the 17th call never reached the policy");
    let swallowed = &results.iter().find(|(m, _)| m == "swallowed_limit").unwrap().1;
    assert_eq!(swallowed.answer, None, "nothing is submitted after a fatal error");
    assert!(
        swallowed.log.iter().any(|line| line.starts_with("caught: more than 16 model calls")),
        "{:?}",
        swallowed.log
    );
    let error = swallowed.error.as_ref().unwrap();
    let at = SourceLocation::find_in(&error.message).expect("where the limit was broken");
    assert_eq!(at.line, line_of(ADVERSARY, "try { for (;;) ctx.llm.chat"));
}

#[test]
fn a_built_in_call_that_runs_past_the_budget_still_times_the_rollout_out() {
    // JSON.stringify of a value that holds itself 2^20 times over: one built-in call of about
    // 0.4 s on the 2-core Xeon, which QuickJS cannot interrupt midway, against 20 ms of budget.
    let harness = Arc::new(Harness::new("adversary", ADVERSARY));
    let view = json!({"mode": "built_in_overrun", "a": 1, "b": 2});
    let limits = Limits { compute_ms: 20, ..Limits::default() };
    let ran = run(vec![arithmetic_job(&harness, "overrun", view, 1, 2, 0)], ArithmeticModel::new(), &limits, 1);
    let trajectory = &ran[0];
    assert!(trajectory.wall.harness_ms > 40.0, "the call ended within the budget: {:?}", trajectory.wall);
    assert_eq!((trajectory.reward, trajectory.success), (0.0, false));
    assert_eq!(trajectory.answer, None, "nothing is submitted past the budget");
    let error = trajectory.error.as_ref().expect("a timeout");
    assert_eq!(error.kind, ErrorKind::Timeout, "{error:?}");
    assert!(error.message.contains("more than its 20 ms") && error.message.contains("built-in"), "{error:?}");
}

#[test]
fn a_slow_model_does_not_count_against_the_compute_deadline() {
    let source = r#"
export async function solve(task, ctx) {
  let last;
  for (let i = 0; i < 3; i++) last = await ctx.llm.chat(ctx.env.observation);
  return last.text;
}"#;
    let harness = Arc::new(Harness::new("patient", source));
    // Three calls of 1 s each: three times the compute budget, which a loaded machine's own
    // harness work (building the context, compiling) stays well under.
    let policy = ArithmeticModel::slow(Duration::from_millis(1_000));
    let limits = Limits { compute_ms: 1_000, ..Limits::default() };
    let jobs = (0..4).map(|i| arithmetic_job(&harness, &format!("t{i}"), json!({}), i, 2, i as u64)).collect();
    for t in run(jobs, policy, &limits, 4) {
        assert_eq!(t.error, None);
        assert!(t.success);
        assert!(t.wall.model_ms >= 3_000.0, "{:?}", t.wall);
        assert!(t.wall.harness_ms < 1_000.0, "{:?}", t.wall);
    }
}

#[test]
fn tool_action_and_prompt_budgets_end_the_rollout() {
    let source = r#"
export function solve(task, ctx) {
  if (task.mode === "tools") for (;;) ctx.tools.calculator(1, "+", 1);
  if (task.mode === "actions") for (;;) ctx.env.submit("1");
  if (task.mode === "prompt") for (;;) ctx.llm.chat("x".repeat(400));
  if (task.mode === "bad_submit") ctx.env.submit([1, 2]);
}"#;
    let harness = Arc::new(Harness::new("budgets", source));
    let limits = Limits { tool_calls: 5, env_actions: 3, prompt_chars: 1000, ..Limits::default() };
    let modes = ["tools", "actions", "prompt", "bad_submit"];
    let jobs = modes.iter().map(|m| arithmetic_job(&harness, m, json!({"mode": m}), 1, 1, 0)).collect();
    let results = run(jobs, ArithmeticModel::new(), &limits, 4);
    let error = |i: usize| results[i].error.clone().expect("an error");
    assert_eq!(error(0).kind, ErrorKind::CallLimit);
    assert!(error(0).message.contains("more than 5 tool calls"), "{}", error(0).message);
    assert_eq!(results[0].tool_calls.len(), 5);
    assert_eq!(error(1).kind, ErrorKind::CallLimit);
    assert_eq!(results[1].tool_calls.len(), 3, "each env action is recorded");
    assert_eq!(error(2).kind, ErrorKind::CallLimit);
    assert!(error(2).message.contains("prompt_chars = 1000"), "{}", error(2).message);
    assert_eq!(results[2].model_calls.len(), 2);
    assert_eq!(error(3).kind, ErrorKind::BadAnswer);
    assert!(error(3).message.contains("ctx.env.submit() takes a string or a number"), "{}", error(3).message);
}

#[test]
fn host_arguments_whose_json_is_too_long_throw_before_the_host_parses_them() {
    // A few characters of JSON each (`0,`) would be tens of bytes parsed, and a tool call's
    // arguments are recorded in the trajectory: the text is refused while it is still text.
    let source = r#"
export function solve(task, ctx) {
  const row = new Array(100).fill(0);
  for (const call of [
    () => ctx.tools.calculator(new Array(1000).fill(row)),
    () => ctx.llm.chat([{ role: "user", content: "What is 1 + 1?", padding: new Array(1000000).fill(0) }]),
    () => ctx.llm.chat("What is 1 + 1?", { stop: "\n", padding: new Array(1000000).fill(0) }),
  ]) {
    try { call(); } catch (e) { ctx.log(e.name, e.message); }
  }
  return ctx.tools.calculator(task.a, "+", task.b);
}"#;
    let harness = Arc::new(Harness::new("bloated", source));
    // Building a million-element array twice takes longer than `limits()`' 300 ms on a loaded
    // 2-core machine, and the budget holds at the end of a rollout too: this one gets 10 s.
    let limits = Limits { compute_ms: 10_000, ..limits() };
    let t =
        run(vec![arithmetic_job(&harness, "t", json!({"a": 2, "b": 3}), 2, 3, 0)], ArithmeticModel::new(), &limits, 1)
            .remove(0);
    assert_eq!(t.error, None);
    assert!(t.success);
    assert_eq!(
        t.log,
        [
            "RangeError ctx.tools.calculator: the argument list is more than 10000 characters as JSON",
            "RangeError ctx.llm.chat: `messages` is more than 1600000 characters as JSON",
            "RangeError ctx.llm.chat: `opts` is more than 1600000 characters as JSON",
        ]
    );
    assert_eq!(t.model_calls.len(), 0);
    let names: Vec<&str> = t.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["calculator", "env.submit"], "the refused call never reached the tool");
}

/// Checks requests as real policies do: sampling parameters validated, a chat template that
/// raises on a system message after the first (as Qwen's do), and one that fails to render a
/// message whose role is "tool".
struct StrictModel(Arc<ArithmeticModel>);

impl Policy for StrictModel {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        request.params.validate()?;
        if request.messages.iter().skip(1).any(|m| m.role == "system") {
            return Err(PolicyError::TemplateRefused("System message must be at the beginning.".into()));
        }
        if request.messages.iter().any(|m| m.role == "tool") {
            return Err(PolicyError::Template("undefined value (in chat_template:7)".into()));
        }
        self.0.chat(request)
    }
    fn name(&self) -> String {
        "strict".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

#[test]
fn requests_a_policy_would_refuse_are_the_harness_error_not_a_failed_batch() {
    let source = r#"
export function solve(task, ctx) {
  const q = ctx.env.observation;
  const tries = {
    temperature: () => ctx.llm.chat(q, { temperature: 1e300 }),
    top_p: () => ctx.llm.chat(q, { top_p: 1e-50 }),
    stops: () => ctx.llm.chat(q, { stop: new Array(17).fill("x") }),
    role: () => ctx.llm.chat([{ role: "r".repeat(1000000), content: q }]),
    template: () => ctx.llm.chat([{ role: "user", content: q }, { role: "system", content: "late" }]),
  };
  try { tries[task.mode](); } catch (e) { ctx.log(e.message); }
  return ctx.llm.chat(q).text;
}"#;
    let harness = Arc::new(Harness::new("refused", source));
    let modes = ["temperature", "top_p", "stops", "role", "template"];
    let jobs = modes.iter().map(|m| arithmetic_job(&harness, m, json!({"mode": m}), 1, 2, 0)).collect();
    let policy = Arc::new(StrictModel(ArithmeticModel::new()));
    let options = RunOptions { threads: 2, progress: false, ..RunOptions::default() };
    let trajectories = run_rollouts(jobs, policy, &limits(), options).expect("no model call failed");
    let expected = [
        "ctx.llm.chat: opts.temperature must be a number at least 0, got 1e+300",
        "ctx.llm.chat: opts.top_p must be a number in (0, 1], got ",
        "ctx.llm.chat: opts.stop must hold at most 16 strings, got 17",
        "ctx.llm.chat: messages[0].role is longer than 32 characters",
        "ctx.llm.chat: System message must be at the beginning.",
    ];
    for (t, message) in trajectories.iter().zip(expected) {
        assert_eq!(t.error, None, "{}", t.task_id);
        assert!(t.success, "{}", t.task_id);
        assert_eq!(t.log.len(), 1, "{}", t.task_id);
        assert!(t.log[0].starts_with(message), "{}: {:?}", t.task_id, t.log);
        assert_eq!(t.model_calls.len(), 1, "{}", t.task_id);
    }
}

/// A chat template that fails to render for another reason than its own refusal cannot be
/// told from a template whale renders wrongly, so it is the policy's failure: the batch did not
/// run, and nothing is scored.
#[test]
fn a_chat_template_that_fails_to_render_is_a_policy_failure_not_a_scored_task() {
    let source = r#"
export function solve(task, ctx) {
  try { ctx.llm.chat([{ role: "user", content: "q" }, { role: "tool", content: "42" }]); } catch (e) {}
  return "0";
}"#;
    let harness = Arc::new(Harness::new("tool-role", source));
    let jobs = vec![arithmetic_job(&harness, "t", json!({}), 1, 1, 0)];
    let policy = Arc::new(StrictModel(ArithmeticModel::new()));
    let options = RunOptions { threads: 1, progress: false, ..RunOptions::default() };
    let error = run_rollouts(jobs, policy, &limits(), options).expect_err("the template failed");
    assert!(error.to_string().contains("undefined value (in chat_template:7)"), "{error}");
}

#[test]
fn empty_log_lines_use_the_log_budget_too() {
    let source = "export function solve(task, ctx) { for (let i = 0; i < 100000; i++) ctx.log(''); }";
    let harness = Arc::new(Harness::new("blank", source));
    let limits = Limits { log_chars: 100, ..Limits::default() };
    let t = run(vec![arithmetic_job(&harness, "t", json!({}), 1, 1, 0)], ArithmeticModel::new(), &limits, 1).remove(0);
    assert_eq!(t.error, None);
    assert_eq!(t.log.len(), 101);
    assert_eq!(t.log[100], "[log truncated: more than 100 characters]");
}
