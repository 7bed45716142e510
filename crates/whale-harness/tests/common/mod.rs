//! Episodes and policies for the harness tests: a one-question arithmetic episode with a
//! calculator tool (submit-style), a move-sequence episode (play-style), a policy that does
//! the arithmetic it is asked, and one whose replies are drawn from the call's seed.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use whale_core::{Trajectory, Verdict, WallTime};
use whale_harness::{run_rollouts, EpisodeSource, Harness, Limits, RolloutJob, RunOptions};
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};
use whale_tasks::{Episode, StepOutcome, ToolError, ToolSpec};

/// "What is a + b?", answered once with `submit`; a `calculator(a, op, b)` tool.
pub struct Arithmetic {
    pub a: i64,
    pub b: i64,
    answer: Option<String>,
}

impl Arithmetic {
    pub fn new(a: i64, b: i64) -> Self {
        Self { a, b, answer: None }
    }
}

impl Episode for Arithmetic {
    fn observation(&self) -> String {
        format!("What is {} + {}?", self.a, self.b)
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "calculator".into(),
            description: "calculator(a, op, b) with op one of + - *".into(),
            args: vec!["a".into(), "op".into(), "b".into()],
        }]
    }
    fn call_tool(&mut self, name: &str, args: &[Value]) -> Result<Value, ToolError> {
        if name != "calculator" {
            return Err(ToolError::Unknown(name.into()));
        }
        let bad = |reason: &str| ToolError::BadArgs { tool: name.into(), reason: reason.into() };
        let (Some(a), Some(op), Some(b)) = (
            args.first().and_then(Value::as_i64),
            args.get(1).and_then(Value::as_str),
            args.get(2).and_then(Value::as_i64),
        ) else {
            return Err(bad("expected (integer, operator, integer)"));
        };
        match op {
            "+" => Ok(json!(a + b)),
            "-" => Ok(json!(a - b)),
            "*" => Ok(json!(a * b)),
            _ => Err(bad("unknown operator")),
        }
    }
    fn act(&mut self, action: &str) -> StepOutcome {
        if self.answer.is_some() {
            return StepOutcome { reply: "already answered".into(), invalid: true, done: true, solved: false };
        }
        self.answer = Some(action.to_string());
        let solved = action.trim() == (self.a + self.b).to_string();
        StepOutcome { reply: "accepted".into(), invalid: false, done: true, solved }
    }
    fn is_done(&self) -> bool {
        self.answer.is_some()
    }
    fn verdict(&self) -> Verdict {
        let expected = (self.a + self.b).to_string();
        match &self.answer {
            Some(answer) if answer.trim() == expected => Verdict::pass("correct"),
            Some(answer) => Verdict::fail(format!("expected {expected}, got {answer}")),
            None => Verdict::fail("no answer"),
        }
    }
}

/// Play `line[0]`, the opponent answers `line[1]`, play `line[2]`...; a wrong move loses, an
/// empty move is invalid and not counted. A `legal_moves()` tool lists candidates.
pub struct Sequence {
    line: Vec<String>,
    next: usize,
    failed: bool,
}

impl Sequence {
    pub fn new(line: &[&str]) -> Self {
        Self { line: line.iter().map(|m| m.to_string()).collect(), next: 0, failed: false }
    }
}

impl Episode for Sequence {
    fn observation(&self) -> String {
        format!("moves so far: {}", self.line[..self.next].join(" "))
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec { name: "legal_moves".into(), description: "candidate moves".into(), args: vec![] }]
    }
    fn call_tool(&mut self, name: &str, _args: &[Value]) -> Result<Value, ToolError> {
        match (name, self.line.get(self.next)) {
            ("legal_moves", Some(expected)) => Ok(json!([expected, "resign"])),
            ("legal_moves", None) => Ok(json!([])),
            _ => Err(ToolError::Unknown(name.into())),
        }
    }
    fn act(&mut self, action: &str) -> StepOutcome {
        if action.is_empty() {
            return StepOutcome { reply: "empty move".into(), invalid: true, done: self.is_done(), solved: false };
        }
        if self.is_done() || self.line.get(self.next).map(String::as_str) != Some(action) {
            self.failed = true;
            return StepOutcome { reply: "wrong move".into(), invalid: false, done: true, solved: false };
        }
        self.next += 1;
        let reply = self.line.get(self.next).cloned().unwrap_or_default();
        if self.next < self.line.len() {
            self.next += 1;
        }
        let solved = self.next == self.line.len();
        StepOutcome { reply, invalid: false, done: solved, solved }
    }
    fn is_done(&self) -> bool {
        self.failed || self.next == self.line.len()
    }
    fn verdict(&self) -> Verdict {
        if !self.failed && self.next == self.line.len() {
            Verdict::pass("line played")
        } else {
            Verdict::fail("line not played")
        }
    }
}

/// Reads "What is A + B?" in the last message and answers the sum; optionally slow.
pub struct ArithmeticModel {
    pub delay: Duration,
    pub requests: Mutex<Vec<ChatRequest>>,
}

impl ArithmeticModel {
    pub fn new() -> Arc<Self> {
        Self::slow(Duration::ZERO)
    }
    pub fn slow(delay: Duration) -> Arc<Self> {
        Arc::new(Self { delay, requests: Mutex::new(Vec::new()) })
    }
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().unwrap().clone()
    }
}

pub fn sum_in(text: &str) -> Option<i64> {
    let rest = text.split("What is ").nth(1)?;
    let (a, rest) = rest.split_once(" + ")?;
    let b = rest.trim_end_matches('?').split('?').next()?;
    Some(a.trim().parse::<i64>().ok()? + b.trim().parse::<i64>().ok()?)
}

impl Policy for ArithmeticModel {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        std::thread::sleep(self.delay);
        let last = request.messages.last().map(|m| m.content.clone()).unwrap_or_default();
        let text = sum_in(&last).map_or_else(|| "I don't know".to_string(), |sum| sum.to_string());
        let prompt_tokens = request.messages.iter().map(|m| m.content.split_whitespace().count()).sum();
        self.requests.lock().unwrap().push(request);
        Ok(Completion {
            completion_tokens: 1,
            token_ids: vec![1],
            logprobs: vec![0.0],
            text,
            finish_reason: FinishReason::Stop,
            prompt_tokens,
        })
    }
    fn name(&self) -> String {
        "arithmetic".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

/// Replies with numbers drawn from the call's seed, as a sampling model would.
pub struct SeededModel;

impl Policy for SeededModel {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let mut rng = ChaCha8Rng::seed_from_u64(request.params.seed);
        let n = request.params.max_tokens.min(4);
        let words: Vec<String> = (0..n).map(|_| rng.gen_range(0..1000).to_string()).collect();
        Ok(Completion {
            text: words.join(" "),
            token_ids: (0..n as u32).collect(),
            logprobs: vec![-1.0; n],
            finish_reason: if n < 4 { FinishReason::Length } else { FinishReason::Stop },
            prompt_tokens: request.messages.len(),
            completion_tokens: n,
        })
    }
    fn name(&self) -> String {
        "seeded".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

pub fn arithmetic_job(harness: &Arc<Harness>, id: &str, view: Value, a: i64, b: i64, seed: u64) -> RolloutJob {
    RolloutJob {
        task_id: id.into(),
        task_view: view,
        episode: EpisodeSource::Factory(Box::new(move || Box::new(Arithmetic::new(a, b)))),
        seed,
        harness: harness.clone(),
        weights_version: 3,
    }
}

pub fn run(jobs: Vec<RolloutJob>, policy: Arc<dyn Policy>, limits: &Limits, threads: usize) -> Vec<Trajectory> {
    let options = RunOptions { threads, progress: false, ..RunOptions::default() };
    run_rollouts(jobs, policy, limits, options).expect("no sink to fail and a policy that answers")
}

/// The trajectory without its timing fields, which differ from run to run.
pub fn untimed(mut t: Trajectory) -> Trajectory {
    t.wall = WallTime::default();
    t.model_calls.iter_mut().for_each(|c| c.latency_ms = 0.0);
    t.tool_calls.iter_mut().for_each(|c| c.latency_ms = 0.0);
    t
}

/// 1-based line of the first line of `source` containing `needle`.
pub fn line_of(source: &str, needle: &str) -> u32 {
    source.lines().position(|l| l.contains(needle)).expect("needle in source") as u32 + 1
}
