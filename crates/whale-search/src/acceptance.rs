//! Which harness leaves an iteration as the incumbent.
//!
//! The incumbent always competes, so "no change" wins unless a candidate is better in the
//! Pareto order of `whale_core::pareto` (success rate first, then mean turns, then mean
//! tokens). With one rollout per search task a success rate is noisy, so two stricter rules
//! ask a candidate's success gain to be real before it may replace the incumbent: a minimum
//! margin, or a paired bootstrap over the same search tasks. Under either, a gain in cost
//! alone never replaces the incumbent.

use crate::score::ScoreCard;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use whale_core::{pareto, Objectives};

/// Tolerance for comparing success rates computed from the same number of tasks.
const EPSILON: f64 = 1e-12;

/// The acceptance rule of a harness search.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acceptance {
    /// The best of incumbent and candidates in the Pareto order; ties keep the incumbent.
    #[default]
    Pareto,
    /// Only candidates whose success rate beats the incumbent's by at least this much compete.
    Margin(f64),
    /// Only candidates whose success beats the incumbent's on the same tasks with at least
    /// `confidence` bootstrap probability compete (one-sided, `resamples` resamples of tasks).
    PairedBootstrap { resamples: usize, confidence: f64 },
}

impl Acceptance {
    /// The index in `candidates` of the candidate that replaces the incumbent, or `None` to
    /// keep it. `seed` makes the bootstrap reproducible.
    pub fn choose(&self, incumbent: &ScoreCard, candidates: &[&ScoreCard], seed: u64) -> Option<usize> {
        let eligible: Vec<usize> =
            (0..candidates.len()).filter(|&i| self.admits(incumbent, candidates[i], seed)).collect();
        let mut items: Vec<Objectives> = vec![incumbent.objectives];
        items.extend(eligible.iter().map(|&i| candidates[i].objectives));
        match pareto::best(&items) {
            Some(0) | None => None,
            Some(position) => Some(eligible[position - 1]),
        }
    }

    fn admits(&self, incumbent: &ScoreCard, candidate: &ScoreCard, seed: u64) -> bool {
        let gain = candidate.objectives.success - incumbent.objectives.success;
        match *self {
            Acceptance::Pareto => true,
            Acceptance::Margin(margin) => gain + EPSILON >= margin.max(EPSILON),
            Acceptance::PairedBootstrap { resamples, confidence } => {
                probability_of_gain(incumbent, candidate, resamples, seed) >= confidence
            }
        }
    }
}

/// The bootstrap probability that the candidate's mean success over the tasks both were scored
/// on exceeds the incumbent's: the share of resamples of those tasks (with replacement) in
/// which the mean paired difference is positive.
pub fn probability_of_gain(incumbent: &ScoreCard, candidate: &ScoreCard, resamples: usize, seed: u64) -> f64 {
    let before: HashMap<&str, bool> = incumbent.tasks.iter().map(|t| (t.task_id.as_str(), t.success)).collect();
    let differences: Vec<f64> = candidate
        .tasks
        .iter()
        .filter_map(|t| {
            before.get(t.task_id.as_str()).map(|&b| f64::from(u8::from(t.success)) - f64::from(u8::from(b)))
        })
        .collect();
    let (n, resamples) = (differences.len(), resamples.max(1));
    if n == 0 {
        return 0.0;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let gains =
        (0..resamples).filter(|_| (0..n).map(|_| differences[rng.gen_range(0..n)]).sum::<f64>() > EPSILON).count();
    gains as f64 / resamples as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::TaskOutcome;

    /// A card over `successes.len()` tasks with the given outcomes and a fixed cost per task.
    fn card(successes: &[bool], turns: usize, tokens: usize) -> ScoreCard {
        let tasks: Vec<TaskOutcome> = successes
            .iter()
            .enumerate()
            .map(|(i, &success)| TaskOutcome {
                task_id: format!("t{i}"),
                reward: f64::from(u8::from(success)),
                success,
                turns,
                tokens,
            })
            .collect();
        let n = successes.len() as f64;
        ScoreCard {
            hash: format!("{successes:?}{turns}{tokens}"),
            weights_version: 1,
            objectives: Objectives {
                success: successes.iter().filter(|&&s| s).count() as f64 / n,
                mean_turns: turns as f64,
                mean_tokens: tokens as f64,
            },
            mean_reward: 0.0,
            errors: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            tasks,
        }
    }

    fn pattern(n: usize, every: usize) -> Vec<bool> {
        (0..n).map(|i| i % every == 0).collect()
    }

    #[test]
    fn pareto_keeps_the_incumbent_unless_a_candidate_is_better() {
        let incumbent = card(&pattern(10, 2), 2, 100);
        let worse = card(&pattern(10, 3), 1, 50);
        let same = card(&pattern(10, 2), 2, 100);
        let costlier = card(&pattern(10, 2), 3, 100);
        assert_eq!(Acceptance::Pareto.choose(&incumbent, &[&worse, &same, &costlier], 0), None);
        let cheaper = card(&pattern(10, 2), 2, 80);
        assert_eq!(Acceptance::Pareto.choose(&incumbent, &[&worse, &cheaper], 0), Some(1));
        let better = card(&pattern(10, 1), 4, 400);
        assert_eq!(Acceptance::Pareto.choose(&incumbent, &[&cheaper, &better], 0), Some(1));
    }

    #[test]
    fn a_margin_ignores_small_gains_and_cost_only_gains() {
        let incumbent = card(&pattern(10, 2), 2, 100);
        let slightly = card(&[true, true, true, false, true, false, true, false, true, false], 2, 100);
        let cheaper = card(&pattern(10, 2), 1, 10);
        assert_eq!(Acceptance::Pareto.choose(&incumbent, &[&slightly], 0), Some(0));
        assert_eq!(Acceptance::Margin(0.15).choose(&incumbent, &[&slightly, &cheaper], 0), None);
        let clearly = card(&pattern(10, 1), 2, 100);
        assert_eq!(Acceptance::Margin(0.15).choose(&incumbent, &[&slightly, &cheaper, &clearly], 0), Some(2));
        assert_eq!(Acceptance::Margin(0.0).choose(&incumbent, &[&cheaper], 0), Some(0));
    }

    #[test]
    fn the_paired_bootstrap_needs_a_gain_consistent_over_tasks() {
        let rule = Acceptance::PairedBootstrap { resamples: 2000, confidence: 0.95 };
        let incumbent = card(&pattern(40, 2), 2, 100);
        let mut one_more = pattern(40, 2);
        one_more[1] = true;
        assert!(probability_of_gain(&incumbent, &card(&one_more, 2, 100), 2000, 3) < 0.95);
        assert_eq!(rule.choose(&incumbent, &[&card(&one_more, 2, 100)], 3), None);
        let all = card(&pattern(40, 1), 2, 100);
        assert!(probability_of_gain(&incumbent, &all, 2000, 3) > 0.99);
        assert_eq!(rule.choose(&incumbent, &[&card(&one_more, 2, 100), &all], 3), Some(1));
        assert_eq!(probability_of_gain(&incumbent, &card(&pattern(40, 2), 1, 1), 2000, 3), 0.0);
    }

    #[test]
    fn the_rule_reads_from_config_json() {
        let rule: Acceptance =
            serde_json::from_str(r#"{"paired_bootstrap": {"resamples": 500, "confidence": 0.9}}"#).expect("json");
        assert_eq!(rule, Acceptance::PairedBootstrap { resamples: 500, confidence: 0.9 });
        assert_eq!(serde_json::from_str::<Acceptance>(r#"{"margin": 0.05}"#).expect("json"), Acceptance::Margin(0.05));
        assert_eq!(serde_json::from_str::<Acceptance>(r#""pareto""#).expect("json"), Acceptance::Pareto);
    }
}
