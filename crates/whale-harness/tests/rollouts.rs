//! Well-behaved harnesses: what reaches the policy, the tools and the episode, and what the
//! trajectory records, in order; determinism for a seed; streaming to a sink.

mod common;

use common::{arithmetic_job, run, untimed, ArithmeticModel, SeededModel, Sequence};
use serde_json::json;
use std::io::{BufRead, BufReader, Seek};
use std::sync::Arc;
use whale_core::{ChatMessage, ErrorKind, Trajectory};
use whale_harness::{call_seed, run_rollouts, EngineError, EpisodeSource, Harness, Limits, RolloutJob, RunOptions};
use whale_policy::{ChatRequest, Completion, Policy, PolicyError};

const CALCULATING: &str = r#"
export const meta = { name: "calculating" };

export function solve(task, ctx) {
  ctx.log("task", task);
  const first = ctx.llm.chat(
    [{ role: "system", content: "Be brief." }, { role: "user", content: ctx.env.observation }],
    { max_tokens: 8, stop: ["\n"], temperature: 0.5 },
  );
  const check = ctx.tools.calculator(task.a, "+", task.b);
  try {
    ctx.tools.calculator(task.a, "^", task.b);
  } catch (e) {
    console.log("refused:", e.message);
  }
  const second = ctx.llm.chat(`Confirm: What is ${task.a} + ${task.b}?`, { trainable: false });
  return Number(first.text) === check ? check : second.text;
}
"#;

#[test]
fn a_submit_style_rollout_records_every_call_in_order() {
    let harness = Arc::new(Harness::new("calculating", CALCULATING));
    let policy = ArithmeticModel::new();
    let job = arithmetic_job(&harness, "sum-1", json!({"a": 3, "b": 4}), 3, 4, 11);
    let t = run(vec![job], policy.clone(), &Limits::default(), 1).remove(0);
    assert_eq!(t.error, None);
    assert_eq!((t.reward, t.success), (1.0, true));
    assert_eq!(t.answer, Some(json!("7")), "a returned number is submitted as its text");
    assert_eq!((t.task_id.as_str(), t.harness_id.as_str(), t.weights_version, t.seed), ("sum-1", "calculating", 3, 11));
    let order: Vec<(&str, usize)> = t.order.iter().map(|(k, i)| (k.as_str(), *i)).collect();
    assert_eq!(order, [("model", 0), ("tool", 0), ("tool", 1), ("model", 1), ("tool", 2)]);
    let names: Vec<&str> = t.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["calculator", "calculator", "env.submit"]);
    assert_eq!(t.tool_calls[0].args, json!([3, "+", 4]));
    assert_eq!(t.tool_calls[0].result, json!(7));
    assert!(t.tool_calls[1].error.as_deref().is_some_and(|e| e.contains("unknown operator")));
    assert_eq!(t.tool_calls[2].result["solved"], json!(true));
    assert_eq!(
        t.model_calls[0].messages,
        [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "What is 3 + 4?")]
    );
    assert_eq!(t.model_calls[0].completion, "7");
    assert!(t.model_calls[0].trainable && !t.model_calls[1].trainable);
    assert_eq!(t.model_calls[1].finish_reason, "stop");
    assert_eq!(t.turns, 2);
    assert_eq!(t.prompt_tokens, t.model_calls.iter().map(|c| c.prompt_tokens).sum::<usize>());
    assert_eq!(t.completion_tokens, 2);
    assert_eq!(t.log[0], r#"task {"a":3,"b":4}"#);
    assert!(t.log[1].starts_with("refused: tool `calculator`: bad arguments: unknown operator"), "{:?}", t.log);
    let sent: Vec<ChatRequest> = policy.requests();
    assert_eq!(sent[0].params.max_tokens, 8);
    assert_eq!(sent[0].params.stop, ["\n"]);
    assert_eq!(sent[0].params.temperature, 0.5);
    assert_eq!(sent[1].params.top_k, 20, "unset options keep the run's defaults");
    assert_eq!(sent[0].params.seed, call_seed(11, 0));
    assert_eq!(sent[1].params.seed, call_seed(11, 1));
    let wall = &t.wall;
    assert!(wall.model_ms >= 0.0 && wall.tools_ms >= 0.0 && wall.harness_ms > 0.0, "{wall:?}");
}

#[test]
fn a_play_style_rollout_plays_the_line_and_answers_with_the_moves() {
    let source = r#"
export function solve(task, ctx) {
  const replies = [];
  ctx.log(ctx.env.tools.map((t) => t.name).join(","));
  while (!ctx.env.done) {
    const [move] = ctx.tools.legal_moves();
    replies.push(ctx.env.play(move).reply);
  }
  ctx.log(replies.join(","), "|", ctx.env.observation);
  return "ignored: the harness has acted";
}"#;
    let harness = Arc::new(Harness::new("player", source));
    let job = RolloutJob {
        task_id: "line".into(),
        task_view: json!({"fen": "start"}),
        episode: EpisodeSource::Ready(Box::new(Sequence::new(&["e4", "e5", "Nf3", "Nc6", "Bb5"]))),
        seed: 1,
        harness,
        weights_version: 0,
    };
    let t = run(vec![job], ArithmeticModel::new(), &Limits::default(), 1).remove(0);
    assert_eq!(t.error, None);
    assert!(t.success);
    assert_eq!(t.answer, Some(json!(["e4", "Nf3", "Bb5"])));
    assert_eq!(t.log, ["legal_moves", "e5,Nc6, | moves so far: e4 e5 Nf3 Nc6 Bb5"]);
    let names: Vec<&str> = t.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["legal_moves", "env.play", "legal_moves", "env.play", "legal_moves", "env.play"]);
    assert_eq!(t.turns, 0);
}

const SAMPLING: &str = r#"
export async function solve(task, ctx) {
  const draws = [ctx.random(), Math.random(), ctx.random()];
  const replies = await Promise.all([ctx.llm.chat("a"), ctx.llm.chat("b", { max_tokens: 2 })]);
  ctx.log(draws.join(" "));
  return replies.map((r) => r.text).join("|");
}"#;

fn sampling_jobs() -> Vec<RolloutJob> {
    let harness = Arc::new(Harness::from_source(SAMPLING));
    (0..12).map(|i| arithmetic_job(&harness, &format!("t{i}"), json!({}), i, 1, 100 + i as u64)).collect()
}

#[test]
fn the_same_seeds_give_the_same_trajectories() {
    let first: Vec<Trajectory> = run(sampling_jobs(), Arc::new(SeededModel), &Limits::default(), 4);
    let second: Vec<Trajectory> = run(sampling_jobs(), Arc::new(SeededModel), &Limits::default(), 3);
    assert_eq!(
        first.iter().map(|t| t.task_id.clone()).collect::<Vec<_>>(),
        (0..12).map(|i| format!("t{i}")).collect::<Vec<_>>()
    );
    let untimed_first: Vec<Trajectory> = first.into_iter().map(untimed).collect();
    assert_eq!(untimed_first, second.into_iter().map(untimed).collect::<Vec<_>>());
    let logs: std::collections::HashSet<&String> = untimed_first.iter().map(|t| &t.log[0]).collect();
    assert_eq!(logs.len(), 12, "different seeds draw differently");
    let answers: std::collections::HashSet<String> =
        untimed_first.iter().map(|t| t.answer.clone().unwrap().to_string()).collect();
    assert_eq!(answers.len(), 12, "different seeds sample differently");
    for t in &untimed_first {
        let draws: Vec<f64> = t.log[0].split(' ').map(|x| x.parse().unwrap()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)), "{draws:?}");
        assert_eq!(t.model_calls[1].finish_reason, "length");
        assert_eq!(t.harness_id, whale_harness::content_hash(SAMPLING));
    }
}

#[test]
fn finished_trajectories_stream_to_the_sink_as_json_lines() {
    let mut file = tempfile::tempfile().unwrap();
    let options = RunOptions { threads: 5, progress: false, sink: Some(&mut file), ..RunOptions::default() };
    let returned = run_rollouts(sampling_jobs(), Arc::new(SeededModel), &Limits::default(), options).unwrap();
    file.rewind().unwrap();
    let mut streamed: Vec<Trajectory> =
        BufReader::new(file).lines().map(|line| serde_json::from_str(&line.unwrap()).unwrap()).collect();
    assert_eq!(streamed.len(), returned.len());
    streamed.sort_by_key(|t| t.seed);
    let calls = |ts: &[Trajectory]| ts.iter().flat_map(|t| t.model_calls.clone()).collect::<Vec<_>>();
    assert!(calls(&returned).iter().all(|c| c.sampled.is_some()), "the returned calls carry their sampled tokens");
    assert!(calls(&streamed).iter().all(|c| c.sampled.is_none()), "the lines do not: traces stay readable");
    let without_tokens = |mut t: Trajectory| {
        t.model_calls.iter_mut().for_each(|c| c.sampled = None);
        untimed(t)
    };
    let streamed: Vec<Trajectory> = streamed.into_iter().map(without_tokens).collect();
    let returned: Vec<Trajectory> = returned.into_iter().map(without_tokens).collect();
    assert!(streamed == returned, "the returned vector is in job order, which these seeds follow");
}

/// Refuses prompts over 20 characters (as a server does when they start with "served"); stops
/// altogether on "halt".
struct PickyPolicy;

impl Policy for PickyPolicy {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let text = &request.messages[0].content;
        if text == "halt" {
            return Err(PolicyError::EngineStopped);
        }
        if text.len() > 20 && text.starts_with("served") {
            return Err(PolicyError::ContextExceeded("maximum context length is 20 tokens".into()));
        }
        if text.len() > 20 {
            return Err(PolicyError::PromptTooLong { prompt_tokens: text.len(), context_window: 20 });
        }
        Ok(Completion {
            text: "ok".into(),
            token_ids: vec![],
            logprobs: vec![],
            finish_reason: whale_policy::FinishReason::Stop,
            prompt_tokens: 1,
            completion_tokens: 1,
        })
    }
    fn name(&self) -> String {
        "picky".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

#[test]
fn a_prompt_too_long_in_process_or_served_is_catchable_and_a_failed_policy_call_fails_the_batch() {
    let source = r#"
export function solve(task, ctx) {
  let reply;
  try {
    reply = ctx.llm.chat("x".repeat(50));
  } catch (e) {
    ctx.log(e.message);
    reply = ctx.llm.chat("short");
  }
  try {
    ctx.llm.chat("served " + "x".repeat(50));
  } catch (e) {
    ctx.log(e.message);
  }
  if (task.halt) ctx.llm.chat("halt");
  return String(task.a + task.b);
}"#;
    let harness = Arc::new(Harness::new("picky", source));
    let recovers = || arithmetic_job(&harness, "recovers", json!({"a": 1, "b": 1}), 1, 1, 0);
    let results = run(vec![recovers()], Arc::new(PickyPolicy), &Limits::default(), 2);
    assert_eq!(results[0].error, None);
    assert!(results[0].success);
    assert_eq!(
        results[0].log,
        [
            "ctx.llm.chat: prompt of 50 tokens does not fit the context window of 20",
            "ctx.llm.chat: the server refused the prompt as too long for the model's context: maximum context \
             length is 20 tokens"
        ]
    );
    assert_eq!(results[0].model_calls.len(), 1, "failed calls are not recorded");

    // A call the policy fails is no score: the whole batch is an error, the good rollout too.
    let halts = arithmetic_job(&harness, "halts", json!({"a": 1, "b": 1, "halt": true}), 1, 1, 0);
    let options = RunOptions { threads: 2, progress: false, ..RunOptions::default() };
    let error = run_rollouts(vec![recovers(), halts], Arc::new(PickyPolicy), &Limits::default(), options)
        .expect_err("a failed model call fails the batch");
    let EngineError::Policy { task_id, message } = &error else { panic!("{error}") };
    assert_eq!(task_id, "halts");
    assert!(message.contains("the policy failed: the generation engine has stopped"), "{message}");
}

#[test]
fn a_harness_that_does_not_compile_fails_each_rollout_with_its_location() {
    let harness = Arc::new(Harness::new("broken", "export function solve(task, ctx) {\n  return task.a +;\n}\n"));
    let jobs = (0..3).map(|i| arithmetic_job(&harness, &format!("t{i}"), json!({"a": 1}), 1, 1, i)).collect();
    for t in run(jobs, ArithmeticModel::new(), &Limits::default(), 2) {
        let error = t.error.unwrap();
        assert_eq!(error.kind, ErrorKind::Exception);
        assert!(
            error.message.starts_with("SyntaxError:") && error.message.contains("(harness.js:2:"),
            "{}",
            error.message
        );
    }
}

#[test]
fn the_log_keeps_its_budget_and_marks_the_cut() {
    let source = "export function solve(task, ctx) { for (let i = 0; i < 1000; i++) ctx.log('line', i); }";
    let harness = Arc::new(Harness::new("chatterbox", source));
    let limits = Limits { log_chars: 100, ..Limits::default() };
    let t = run(vec![arithmetic_job(&harness, "t", json!({}), 1, 1, 0)], ArithmeticModel::new(), &limits, 1).remove(0);
    assert_eq!(t.error, None);
    assert_eq!(t.answer, None, "nothing returned, nothing submitted");
    assert_eq!(t.reward, 0.0);
    assert_eq!(t.log.last().unwrap(), "[log truncated: more than 100 characters]");
    // "line 0".."line 9" take 60 characters, "line 10".."line 14" 35 more; "line 15" would pass 100.
    assert_eq!(t.log.len(), 16);
    assert_eq!(t.log[14], "line 14");
}

#[test]
fn rollouts_share_no_javascript_state() {
    let source = "globalThis.runs = (globalThis.runs || 0) + 1;\nexport function solve() { return runs; }";
    let harness = Arc::new(Harness::new("counter", source));
    let jobs = (0..6).map(|i| arithmetic_job(&harness, &format!("t{i}"), json!({}), 0, 1, i)).collect();
    for t in run(jobs, ArithmeticModel::new(), &Limits::default(), 2) {
        assert_eq!(t.answer, Some(json!("1")), "each rollout has a fresh runtime");
        assert!(t.success);
    }
}

struct BrokenSink;

impl std::io::Write for BrokenSink {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("disk full"))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_sink_that_cannot_be_written_stops_the_run_with_an_error() {
    let mut sink = BrokenSink;
    let options = RunOptions { threads: 1, progress: false, sink: Some(&mut sink), ..RunOptions::default() };
    let err = run_rollouts(sampling_jobs(), Arc::new(SeededModel), &Limits::default(), options).unwrap_err();
    assert!(matches!(err, whale_harness::EngineError::Sink(_)), "{err}");
    assert!(err.to_string().contains("disk full"), "{err}");
}
