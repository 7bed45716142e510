//! `whale harness bench`: what the harness runtime costs and how rollouts use the model.
//!
//! Three measurements, each taken once on this machine and printed as a table (nothing here is
//! a timed test):
//! 1. the runtime alone: every stock harness against [`InstantPolicy`], a benchmark fixture that
//!    answers every call at once, so rollouts/s is the ceiling the sandbox, the bindings and the
//!    episodes allow;
//! 2. a real run of the plain harness of each domain with the base model, and the share of the
//!    rollouts' time spent outside the model (the goal is under 5%: the runtime must not be
//!    what a run waits for);
//! 3. generation throughput with 1, 8 and 64 concurrent rollouts, which shows the batching
//!    engine serving many harnesses at once.

use serde::Serialize;
use std::sync::Arc;
use whale_core::{Domain, Task};
use whale_harness::scoring::{self as evaluate, EvalSettings, EvaluateError, Evaluation};
use whale_harness::{StockHarness, STOCK_HARNESSES};
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};
use whale_tasks::task_domain;

/// A benchmark fixture, not a model: a [`Policy`] that returns the same short completion to
/// every call immediately, so that timing a run measures the harness runtime alone. It has no
/// tokenizer; it counts the prompt's whitespace-separated words as its prompt tokens.
pub struct InstantPolicy {
    reply: String,
}

impl InstantPolicy {
    pub fn new(reply: impl Into<String>) -> Self {
        Self { reply: reply.into() }
    }

    /// A reply each domain's harnesses can parse: a final math answer, a move, a short answer.
    pub fn for_domain(domain: Domain) -> Self {
        Self::new(match domain {
            Domain::Math => "#### 42",
            Domain::Chess => "e2e4",
            Domain::Qa => "Paris",
        })
    }
}

impl Policy for InstantPolicy {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let prompt_tokens = request.messages.iter().map(|m| m.content.split_whitespace().count()).sum();
        Ok(Completion {
            text: self.reply.clone(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: FinishReason::Stop,
            prompt_tokens,
            completion_tokens: 1,
        })
    }

    fn name(&self) -> String {
        "instant (benchmark fixture)".to_string()
    }

    fn weights_version(&self) -> u64 {
        0
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchSettings {
    /// Rollouts per stock harness against the instant policy.
    pub runtime_rollouts: usize,
    /// Rollouts of each plain harness with the base model.
    pub model_rollouts: usize,
    /// The concurrencies of the throughput measurement.
    pub concurrency: Vec<usize>,
    pub seed: u64,
}

impl Default for BenchSettings {
    fn default() -> Self {
        Self { runtime_rollouts: 512, model_rollouts: 128, concurrency: vec![1, 8, 64], seed: 0 }
    }
}

/// One stock harness against the instant policy.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeRow {
    pub harness: &'static str,
    pub rollouts: usize,
    pub seconds: f64,
    pub errors: usize,
}

/// One plain harness with the base model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRunRow {
    pub harness: &'static str,
    pub rollouts: usize,
    pub seconds: f64,
    pub outside_model_share: f64,
    pub mean_reward: f64,
}

/// Throughput at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRow {
    pub concurrency: usize,
    pub rollouts: usize,
    pub completion_tokens: usize,
    pub seconds: f64,
}

impl ThroughputRow {
    pub fn tokens_per_second(&self) -> f64 {
        self.completion_tokens as f64 / self.seconds.max(1e-9)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub runtime: Vec<RuntimeRow>,
    pub model_runs: Vec<ModelRunRow>,
    /// Generated with `throughput_harness`.
    pub throughput: Vec<ThroughputRow>,
    pub throughput_harness: &'static str,
}

/// The harness the throughput rows run: `math/plain`, the default demo's starting point.
const THROUGHPUT_HARNESS: &StockHarness = &STOCK_HARNESSES[0];

/// Runs all three measurements; `policy` is the base model.
pub fn run(policy: Arc<dyn Policy>, settings: &BenchSettings) -> Result<BenchReport, EvaluateError> {
    let runtime = STOCK_HARNESSES.iter().map(|stock| runtime_row(stock, settings)).collect::<Result<_, _>>()?;
    let model_runs = STOCK_HARNESSES
        .iter()
        .filter(|stock| stock.name.ends_with("/plain"))
        .map(|stock| model_row(stock, policy.clone(), settings))
        .collect::<Result<_, _>>()?;
    let throughput =
        settings.concurrency.iter().map(|&n| throughput_row(n, policy.clone(), settings)).collect::<Result<_, _>>()?;
    Ok(BenchReport { runtime, model_runs, throughput, throughput_harness: THROUGHPUT_HARNESS.name })
}

/// `n` generated tasks of the harness's domain, run once each.
fn run_once(
    stock: &StockHarness,
    n: usize,
    policy: Arc<dyn Policy>,
    threads: usize,
    seed: u64,
) -> Result<Evaluation, EvaluateError> {
    let tasks: Vec<Task> = task_domain(stock.domain).generate(n, seed, 1);
    let environment = evaluate::environment(stock.domain, &tasks, None, None)?;
    let settings = EvalSettings { k: 1, seed, threads, ..EvalSettings::default() };
    evaluate::evaluate(&stock.harness(), &environment, &tasks, policy, &settings, None)
}

fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn runtime_row(stock: &StockHarness, settings: &BenchSettings) -> Result<RuntimeRow, EvaluateError> {
    let policy = Arc::new(InstantPolicy::for_domain(stock.domain));
    let run = run_once(stock, settings.runtime_rollouts, policy, available_threads(), settings.seed)?;
    Ok(RuntimeRow {
        harness: stock.name,
        rollouts: run.usage.rollouts,
        seconds: run.time.wall_seconds,
        errors: run.errors.values().sum(),
    })
}

fn model_row(
    stock: &StockHarness,
    policy: Arc<dyn Policy>,
    settings: &BenchSettings,
) -> Result<ModelRunRow, EvaluateError> {
    let threads = whale_harness::DEFAULT_THREADS;
    let run = run_once(stock, settings.model_rollouts, policy, threads, settings.seed)?;
    Ok(ModelRunRow {
        harness: stock.name,
        rollouts: run.usage.rollouts,
        seconds: run.time.wall_seconds,
        outside_model_share: run.time.outside_model_share(),
        mean_reward: run.scores.mean.value,
    })
}

fn throughput_row(
    concurrency: usize,
    policy: Arc<dyn Policy>,
    settings: &BenchSettings,
) -> Result<ThroughputRow, EvaluateError> {
    let rollouts = (2 * concurrency).max(16);
    let run = run_once(THROUGHPUT_HARNESS, rollouts, policy, concurrency, settings.seed)?;
    Ok(ThroughputRow {
        concurrency,
        rollouts: run.usage.rollouts,
        completion_tokens: run.usage.completion_tokens,
        seconds: run.time.wall_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use whale_core::ChatMessage;

    #[test]
    fn the_instant_policy_answers_every_call_with_its_reply() {
        let policy = InstantPolicy::for_domain(Domain::Math);
        let request = ChatRequest { messages: vec![ChatMessage::new("user", "two words")], params: Default::default() };
        let completion = policy.chat(request).expect("a completion");
        assert_eq!(completion.text, "#### 42");
        assert_eq!((completion.prompt_tokens, completion.completion_tokens), (2, 1));
    }

    #[test]
    fn throughput_is_measured_on_the_plain_math_harness() {
        assert_eq!(THROUGHPUT_HARNESS.name, "math/plain");
    }

    #[test]
    fn every_stock_harness_runs_cleanly_against_the_instant_policy() {
        let settings = BenchSettings { runtime_rollouts: 6, ..BenchSettings::default() };
        for stock in &STOCK_HARNESSES {
            let row = runtime_row(stock, &settings).expect("a run");
            assert_eq!((row.rollouts, row.errors), (6, 0), "{}", stock.name);
            assert!(row.seconds > 0.0);
        }
    }
}
