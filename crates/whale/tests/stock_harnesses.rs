//! Every stock harness end to end with a tiny random model served by the local batching engine:
//! on generated tasks and on a sample of the shared real data of its domain, no rollout ends in
//! an error (gibberish replies are the harness's problem to handle, not a crash), and the same
//! seed gives the same trajectories.

mod common;

use common::{real_sample, tiny_policy, untimed};
use std::sync::Arc;
use whale_core::{Domain, Task};
use whale_harness::scoring::{self as evaluate, EvalSettings, Evaluation};
use whale_harness::{stock_harness, StockHarness, STOCK_HARNESSES};
use whale_policy::Policy;
use whale_tasks::task_domain;

fn run(stock: &StockHarness, tasks: &[Task], policy: Arc<dyn Policy>, k: usize, seed: u64) -> Evaluation {
    let environment = evaluate::environment(stock.domain, tasks, None, None).expect("an environment");
    let settings = EvalSettings { k, seed, threads: 16, ..EvalSettings::default() };
    evaluate::evaluate(&stock.harness(), &environment, tasks, policy, &settings, None).expect("an evaluation")
}

/// Every rollout ran to its end without an error and called the model.
fn assert_clean(stock: &StockHarness, run: &Evaluation, rollouts: usize) {
    assert_eq!(run.usage.rollouts, rollouts, "{}", stock.name);
    for trajectory in &run.trajectories {
        assert_eq!(trajectory.error, None, "{} on {}: {:?}", stock.name, trajectory.task_id, trajectory.log);
        assert!(trajectory.turns >= 1, "{} on {}", stock.name, trajectory.task_id);
        assert!(trajectory.completion_tokens > 0, "{} on {}", stock.name, trajectory.task_id);
    }
    assert!(run.errors.is_empty(), "{}: {:?}", stock.name, run.errors);
    let scores = &run.scores;
    assert!((0.0..=1.0).contains(&scores.mean.value) && scores.pass.value >= scores.mean.value, "{}", stock.name);
}

#[test]
fn every_stock_harness_runs_end_to_end_on_generated_tasks() {
    let policy: Arc<dyn Policy> = Arc::new(tiny_policy());
    for stock in &STOCK_HARNESSES {
        let difficulty = if stock.domain == Domain::Chess { 2 } else { 1 };
        let tasks = task_domain(stock.domain).generate(3, 11, difficulty);
        let evaluation = run(stock, &tasks, policy.clone(), 2, 1);
        assert_clean(stock, &evaluation, 6);
    }
}

#[test]
fn every_stock_harness_runs_end_to_end_on_a_sample_of_the_real_data() {
    let policy: Arc<dyn Policy> = Arc::new(tiny_policy());
    for domain in Domain::ALL {
        let tasks = real_sample(domain, 5);
        for stock in STOCK_HARNESSES.iter().filter(|s| s.domain == domain) {
            let evaluation = run(stock, &tasks, policy.clone(), 1, 2);
            assert_clean(stock, &evaluation, 5);
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_trajectories() {
    let policy: Arc<dyn Policy> = Arc::new(tiny_policy());
    for name in ["math/vote", "chess/legal-moves", "qa/two-hop"] {
        let stock = stock_harness(name).expect("a stock harness");
        let tasks = task_domain(stock.domain).generate(3, 4, 2);
        let first = run(stock, &tasks, policy.clone(), 3, 9);
        let again = run(stock, &tasks, policy.clone(), 3, 9);
        let other = run(stock, &tasks, policy.clone(), 3, 10);
        let same: Vec<_> = first.trajectories.iter().map(untimed).collect();
        assert_eq!(same, again.trajectories.iter().map(untimed).collect::<Vec<_>>(), "{name}");
        assert_ne!(same, other.trajectories.iter().map(untimed).collect::<Vec<_>>(), "{name}");
        let seeds: std::collections::HashSet<u64> = first.trajectories.iter().map(|t| t.seed).collect();
        assert_eq!(seeds.len(), 9, "{name}: every rollout has its own seed");
    }
}

#[test]
fn the_stock_prompts_are_the_ones_the_base_model_was_trained_on() {
    use whale_pretrain::corpus::{CALCULATOR_INSTRUCTION, PLAIN_MATH_INSTRUCTION, SEARCH_INSTRUCTION};
    let source = |name: &str| stock_harness(name).expect("a stock harness").source;
    assert!(source("math/plain").contains(&format!("\\n{PLAIN_MATH_INSTRUCTION}`")));
    for name in ["math/vote", "math/verify"] {
        assert!(source(name).contains(PLAIN_MATH_INSTRUCTION), "{name}");
    }
    let joined = |name: &str| source(name).replace("\" +\n  \"", "");
    assert!(joined("math/calculator").contains(CALCULATOR_INSTRUCTION));
    for name in ["qa/rewrite", "qa/two-hop"] {
        assert!(joined(name).contains(SEARCH_INSTRUCTION), "{name}");
    }
}
