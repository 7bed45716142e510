//! Test evaluation of the current agent (weights and incumbent harness): mean@k with pass@k
//! and maj@k beside it, on the test split only.
//!
//! Every evaluation of a run uses the same rollout seeds (common random numbers), so two points
//! of a curve differ by what changed in the agent, not by sampling luck; and an agent already
//! evaluated (same harness content, same weights version) is not evaluated again: its scores
//! are reused and no rollout is counted. Where the run takes its best and final figures, and
//! when it evaluates (start, every N steps or iterations, phase boundaries, end), is decided here.

use crate::run_dir::EvalMemo;
use crate::schedule::{Outcome, Phase};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use whale_core::{Scores, Spend, Task};
use whale_harness::scoring::{evaluate, EvalSettings, EvaluateError};
use whale_harness::{Harness, Limits};
use whale_policy::{Policy, SamplingParams};
use whale_tasks::Environment;

const EVAL_SALT: u64 = 0xE7A1_0000_7E57_0001;

/// The seed every test rollout of a run with seed `run_seed` derives from: `whale harness run
/// --seed` with it replays a test evaluation.
pub fn eval_seed(run_seed: u64) -> u64 {
    run_seed ^ EVAL_SALT
}

/// Why an evaluation is taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalReason {
    Start,
    Periodic,
    PhaseBoundary,
    End,
}

/// One evaluation; a row of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    pub reason: EvalReason,
    pub harness_id: String,
    pub weights_version: u64,
    pub scores: Scores,
    /// Each test task's mean reward, in test-split order: what paired comparisons of two
    /// evaluations (the same tasks and seeds) are computed from.
    #[serde(default)]
    pub task_means: Vec<f64>,
    /// The scores were taken from an earlier evaluation of the same agent.
    pub reused: bool,
    pub rollouts: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub seconds: f64,
}

impl EvalRecord {
    /// What the evaluation cost, for the ledger.
    pub fn spend(&self) -> Spend {
        Spend {
            rollouts: self.rollouts as u64,
            prompt_tokens: self.prompt_tokens as u64,
            completion_tokens: self.completion_tokens as u64,
            wall_s: self.seconds,
        }
    }
}

/// The test split and how to run it.
pub struct TestSet<'a> {
    pub tasks: &'a [Task],
    pub environment: &'a Environment,
    pub k: usize,
    pub seed: u64,
    pub threads: usize,
    pub limits: &'a Limits,
    pub sampling: &'a SamplingParams,
    pub progress: bool,
}

impl TestSet<'_> {
    /// Evaluates `harness` under the policy's current weights, reusing `memos` when this agent
    /// was evaluated before.
    pub fn evaluate(
        &self,
        reason: EvalReason,
        harness: &Harness,
        policy: &Arc<dyn Policy>,
        memos: &[EvalMemo],
    ) -> Result<EvalRecord, EvaluateError> {
        let weights_version = policy.weights_version();
        let earlier = memos.iter().find(|m| m.harness_id == harness.id && m.weights_version == weights_version);
        if let Some(memo) = earlier {
            return Ok(EvalRecord {
                reason,
                harness_id: harness.id.clone(),
                weights_version,
                scores: memo.scores,
                task_means: memo.task_means.clone(),
                reused: true,
                rollouts: 0,
                prompt_tokens: 0,
                completion_tokens: 0,
                seconds: 0.0,
            });
        }
        let settings = EvalSettings {
            k: self.k,
            seed: eval_seed(self.seed),
            threads: self.threads,
            limits: self.limits.clone(),
            sampling: self.sampling.clone(),
            progress: self.progress,
        };
        let evaluation = evaluate(harness, self.environment, self.tasks, policy.clone(), &settings, None)?;
        let task_means = evaluation.per_task.iter().map(whale_core::metrics::task_mean).collect();
        Ok(EvalRecord {
            reason,
            harness_id: harness.id.clone(),
            weights_version,
            scores: evaluation.scores,
            task_means,
            reused: false,
            rollouts: evaluation.usage.rollouts,
            prompt_tokens: evaluation.usage.prompt_tokens,
            completion_tokens: evaluation.usage.completion_tokens,
            seconds: evaluation.time.wall_seconds,
        })
    }
}

/// When to evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalSchedule {
    pub every_steps: u64,
    pub every_iterations: u64,
}

impl EvalSchedule {
    /// Why the agent is due for an evaluation after the units in `history`, given the phase of
    /// the next unit (`None`: the run is over) and `last_eval` (how many units of `history`
    /// had completed at the last evaluation); `None` when it is not due.
    pub fn due(&self, history: &[Outcome], last_eval: Option<usize>, next: Option<Phase>) -> Option<EvalReason> {
        let Some(last_eval) = last_eval else { return Some(EvalReason::Start) };
        let since = &history[last_eval.min(history.len())..];
        if since.is_empty() {
            return None;
        }
        let last = history.last().map(Outcome::phase);
        if next.is_none() {
            return Some(EvalReason::End);
        }
        if next != last {
            return Some(EvalReason::PhaseBoundary);
        }
        let steps = since.iter().filter(|o| o.phase() == Phase::Weights).count() as u64;
        let iterations = since.len() as u64 - steps;
        (steps >= self.every_steps || iterations >= self.every_iterations).then_some(EvalReason::Periodic)
    }
}

/// The best evaluation (highest mean@k, the earliest among equals) and the final one.
pub fn best_and_final(records: &[EvalRecord]) -> Option<(&EvalRecord, &EvalRecord)> {
    let last = records.last()?;
    let best =
        records.iter().fold(&records[0], |best, r| if r.scores.mean.value > best.scores.mean.value { r } else { best });
    Some((best, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEDULE: EvalSchedule = EvalSchedule { every_steps: 3, every_iterations: 2 };

    fn w() -> Outcome {
        Outcome::Weights { reward: 0.0 }
    }

    fn s() -> Outcome {
        Outcome::Search { new_best: false, rollouts: 10 }
    }

    #[test]
    fn evaluations_come_at_the_start_every_n_units_at_boundaries_and_at_the_end() {
        assert_eq!(SCHEDULE.due(&[], None, Some(Phase::Weights)), Some(EvalReason::Start));
        assert_eq!(SCHEDULE.due(&[], Some(0), Some(Phase::Weights)), None, "nothing new since");
        assert_eq!(SCHEDULE.due(&[w(), w()], Some(0), Some(Phase::Weights)), None);
        assert_eq!(SCHEDULE.due(&[w(), w(), w()], Some(0), Some(Phase::Weights)), Some(EvalReason::Periodic));
        assert_eq!(SCHEDULE.due(&[w(), w()], Some(0), Some(Phase::Search)), Some(EvalReason::PhaseBoundary));
        assert_eq!(SCHEDULE.due(&[w(), w(), s(), s()], Some(2), Some(Phase::Search)), Some(EvalReason::Periodic));
        assert_eq!(SCHEDULE.due(&[w(), w(), s()], Some(2), Some(Phase::Search)), None);
        assert_eq!(SCHEDULE.due(&[w()], Some(0), None), Some(EvalReason::End));
        assert_eq!(SCHEDULE.due(&[w()], Some(1), None), None, "already evaluated at the end");
    }
}
