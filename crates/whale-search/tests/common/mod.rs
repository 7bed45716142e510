//! A small world for search tests: "What is a + b?" episodes, a deterministic policy that
//! answers in prose ("The answer is 7."), an evaluator that runs real rollouts through
//! `whale_harness::run_rollouts`, and a proposer that returns scripted sources.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use whale_core::{Domain, Split, Task, Trajectory, Verdict};
use whale_harness::{run_rollouts, EpisodeSource, Harness, Limits, RolloutJob, RunOptions};
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};
use whale_search::{Evaluator, EvaluatorError, Proposal, ProposalContext, Proposer, ProposerError};
use whale_tasks::{Episode, StepOutcome, ToolError, ToolSpec};

/// Submits the model's whole reply: fails against a verifier that wants a bare number.
pub const PLAIN: &str = r#"export const meta = { name: "plain" };
export function solve(task, ctx) {
  const reply = ctx.llm.chat([
    { role: "system", content: "You add numbers. Read the question carefully. Reply with the sum." },
    { role: "user", content: ctx.env.observation },
  ], { max_tokens: 32 });
  return reply.text.trim();
}
"#;

/// Submits the last number of the reply: right on every task.
pub const PARSED: &str = r#"export const meta = { name: "parsed" };
export function solve(task, ctx) {
  const reply = ctx.llm.chat(ctx.env.observation, { max_tokens: 32 });
  const numbers = reply.text.match(/-?\d+/g);
  return numbers ? numbers[numbers.length - 1] : undefined;
}
"#;

/// Right only on tasks whose first addend is 0 (a small gain over PLAIN).
pub const PARSED_SMALL: &str = r#"export const meta = { name: "parsed-small" };
export function solve(task, ctx) {
  const reply = ctx.llm.chat(ctx.env.observation, { max_tokens: 32 });
  const numbers = reply.text.match(/-?\d+/g);
  return task.a === 0 && numbers ? numbers[numbers.length - 1] : reply.text;
}
"#;

/// PLAIN with a second, wasted model call: as good, and costlier.
pub const COSTLIER: &str = r#"export function solve(task, ctx) {
  ctx.llm.chat("Warm up.", { max_tokens: 4 });
  const reply = ctx.llm.chat([
    { role: "system", content: "You add numbers. Read the question carefully. Reply with the sum." },
    { role: "user", content: ctx.env.observation },
  ], { max_tokens: 32 });
  return reply.text.trim();
}
"#;

/// Submits a constant: wrong everywhere (and cheaper than PLAIN).
pub const WRONG: &str = r#"export function solve(task, ctx) {
  ctx.llm.chat(ctx.env.observation);
  return "0";
}
"#;

/// "What is a + b?", answered once; a `numbers()` tool returns [a, b].
pub struct Sum {
    a: i64,
    b: i64,
    answer: Option<String>,
}

impl Episode for Sum {
    fn observation(&self) -> String {
        format!("What is {} + {}?", self.a, self.b)
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec { name: "numbers".into(), description: "the two addends".into(), args: vec![] }]
    }
    fn call_tool(&mut self, name: &str, _args: &[Value]) -> Result<Value, ToolError> {
        match name {
            "numbers" => Ok(json!([self.a, self.b])),
            other => Err(ToolError::Unknown(other.into())),
        }
    }
    fn act(&mut self, action: &str) -> StepOutcome {
        if self.answer.is_some() {
            return StepOutcome { reply: "already answered".into(), invalid: true, done: true, solved: false };
        }
        let solved = action.trim() == (self.a + self.b).to_string();
        self.answer = Some(action.to_string());
        StepOutcome { reply: if solved { "correct" } else { "incorrect" }.into(), invalid: false, done: true, solved }
    }
    fn is_done(&self) -> bool {
        self.answer.is_some()
    }
    fn verdict(&self) -> Verdict {
        match &self.answer {
            Some(answer) if answer.trim() == (self.a + self.b).to_string() => Verdict::pass("correct"),
            Some(answer) => Verdict::fail(format!("expected {}, got {answer}", self.a + self.b)),
            None => Verdict::fail("no answer"),
        }
    }
}

/// Search tasks `sum-0`.. with `a = i % 4`, `b = i + 3`.
pub fn tasks(n: usize) -> Vec<Task> {
    (0..n)
        .map(|i| Task {
            id: format!("sum-{i}"),
            domain: Domain::Math,
            payload: json!({"a": i % 4, "b": i + 3}),
            split: Some(Split::Search),
        })
        .collect()
}

/// Answers "What is a + b?" (found in the last user message) with "The answer is a+b." and
/// counts its calls.
#[derive(Default)]
pub struct ProsePolicy {
    pub calls: AtomicUsize,
}

impl Policy for ProsePolicy {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let last = request.messages.iter().rev().find(|m| m.role == "user").map(|m| m.content.clone());
        let text = match last.as_deref().and_then(sum_in) {
            Some(sum) => format!("The answer is {sum}."),
            None => "I am not sure.".to_string(),
        };
        let prompt_tokens = request.messages.iter().map(|m| m.content.split_whitespace().count()).sum();
        Ok(Completion {
            completion_tokens: text.split_whitespace().count(),
            text,
            token_ids: vec![],
            logprobs: vec![],
            finish_reason: FinishReason::Stop,
            prompt_tokens,
        })
    }
    fn name(&self) -> String {
        "prose".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

fn sum_in(text: &str) -> Option<i64> {
    let rest = &text[text.find("What is ")? + 8..];
    let (a, rest) = rest.split_once(" + ")?;
    let b = rest.split('?').next()?;
    Some(a.trim().parse::<i64>().ok()? + b.trim().parse::<i64>().ok()?)
}

/// Real rollouts of the `Sum` world under a fixed weights version; counts rollouts and can be
/// told to fail from its `fail_after`-th call on (a crash of the rollout machinery).
pub struct SumEvaluator {
    pub policy: Arc<ProsePolicy>,
    pub version: u64,
    pub rollouts: AtomicUsize,
    pub calls: AtomicUsize,
    pub fail_after: Option<usize>,
    pub limits: Limits,
}

impl SumEvaluator {
    pub fn new(version: u64) -> Self {
        Self {
            policy: Arc::new(ProsePolicy::default()),
            version,
            rollouts: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
            fail_after: None,
            limits: Limits::default(),
        }
    }

    pub fn rollouts(&self) -> usize {
        self.rollouts.load(Ordering::SeqCst)
    }
}

impl Evaluator for SumEvaluator {
    fn weights_version(&self) -> u64 {
        self.version
    }

    fn score(&self, harness: &Harness, tasks: &[Task]) -> Result<Vec<Trajectory>, EvaluatorError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_after.is_some_and(|n| call >= n) {
            return Err("the rollout engine stopped".into());
        }
        let harness = Arc::new(harness.clone());
        let jobs = tasks
            .iter()
            .enumerate()
            .map(|(i, task)| {
                let a = task.payload["a"].as_i64().unwrap_or(0);
                let b = task.payload["b"].as_i64().unwrap_or(0);
                RolloutJob {
                    task_id: task.id.clone(),
                    task_view: task.payload.clone(),
                    episode: EpisodeSource::Ready(Box::new(Sum { a, b, answer: None })),
                    seed: i as u64,
                    harness: harness.clone(),
                    weights_version: self.version,
                }
            })
            .collect();
        let options = RunOptions { threads: 4, progress: false, ..RunOptions::default() };
        let trajectories = run_rollouts(jobs, self.policy.clone(), &self.limits, options)?;
        self.rollouts.fetch_add(trajectories.len(), Ordering::SeqCst);
        Ok(trajectories)
    }
}

/// What a scripted proposer does in one iteration.
pub enum Script {
    Propose(Vec<(&'static str, &'static str)>),
    Fail(&'static str),
    Panic,
}

/// Plays a script, one step per iteration (the last step repeats), and remembers what each
/// call was told.
pub struct ScriptedProposer {
    pub steps: VecDeque<Script>,
    pub seen_examples: Vec<usize>,
}

impl ScriptedProposer {
    pub fn new(steps: Vec<Script>) -> Self {
        Self { steps: steps.into(), seen_examples: Vec::new() }
    }
}

impl Proposer for ScriptedProposer {
    fn name(&self) -> &str {
        "scripted"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError> {
        self.seen_examples.push(ctx.examples.len());
        let step = if self.steps.len() > 1 { self.steps.pop_front() } else { None };
        match step.as_ref().or(self.steps.front()) {
            Some(Script::Propose(sources)) => Ok(sources
                .iter()
                .map(|(source, hypothesis)| Proposal {
                    source: source.to_string(),
                    hypothesis: hypothesis.to_string(),
                    parent: None,
                })
                .collect()),
            Some(Script::Fail(reason)) => Err(ProposerError::Config(reason.to_string())),
            Some(Script::Panic) => panic!("scripted proposer crash"),
            None => Ok(Vec::new()),
        }
    }
}
