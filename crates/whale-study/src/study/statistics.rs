//! The statistics of a study: each condition's difference from WHALE, paired over test tasks
//! and pooled over seeds with a bootstrap that resamples seeds and then tasks within them; how
//! far each condition moved from its start; the rollouts each took to reach weight-only's peak;
//! each condition's curve over seeds; and how many test tasks or seeds would bring an interval
//! to the width the paper's comparison asks.

use super::result::{ArmResult, Evaluation};
use crate::compare::Arm;
use crate::coupling::Coupling;
use crate::figures::BandCurve;
use crate::report::task_differences;
use serde::{Serialize, Serializer};
use std::fmt;
use whale_core::{bootstrap_nested_mean, Estimate};
use whale_loop::condition::Condition;

/// Bootstrap resamples of every paired interval, and their seed.
pub(super) const RESAMPLES: usize = 2000;
pub(super) const BOOTSTRAP_SEED: u64 = 0x57AD_0001;

/// Which of a run's test evaluations a difference compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// The highest mean@k (the earliest among equals).
    Best,
    /// The last evaluation.
    Final,
}

impl Metric {
    pub const BOTH: [Metric; 2] = [Metric::Best, Metric::Final];

    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Best => "best",
            Metric::Final => "final",
        }
    }
}

/// Pads like a string, so that tables can align it.
impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// An arm as its run directory names it (`weight-only-grpo`).
pub(super) fn arm_name<S: Serializer>(arm: &Arm, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&arm.name())
}

/// The coupling matrix of one seed's WHALE run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedCoupling {
    pub seed: u64,
    pub matrix: Coupling,
}

/// One condition's difference from WHALE on one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    #[serde(serialize_with = "arm_name")]
    pub arm: Arm,
    pub metric: Metric,
    /// The arm's minus WHALE's, paired over test tasks, pooled over seeds.
    pub estimate: Estimate,
    /// Seeds whose own difference has the pooled estimate's sign (0 counts with either).
    pub seeds_agreeing: usize,
    pub seeds: usize,
    /// Test tasks per seed.
    pub tasks: usize,
    /// The test tasks per seed that would bring the interval's half-width to
    /// [`TARGET_HALF_WIDTH`] with the same seeds ([`tasks_for_target`]); `None` where the
    /// spread between seeds alone is wider, so that only more seeds would help.
    pub tasks_for_target: Option<usize>,
    /// Where no test split would do: the seeds that would, at this many test tasks per seed
    /// ([`seeds_for_target`]).
    pub seeds_for_target: Option<usize>,
}

/// The half-width the issue asks of the main comparison's paired interval.
pub const TARGET_HALF_WIDTH: f64 = 0.03;

/// Test tasks per seed for a half-width of [`TARGET_HALF_WIDTH`], from the paired differences
/// of each seed. The nested bootstrap's variance is about `(V + W/n) / S` for `S` seeds of `n`
/// tasks, with `V` the variance of the seed means and `W` the mean variance within a seed. `V`
/// holds a spread between seeds, `B`, that more tasks do not shrink, beside `W/n`:
/// `V ≈ (S-1)/S (B + W/n)`. The projection keeps `B` and `W` and solves for `n`.
/// Solved for `n` from [`Spread::variance`] at the current seeds.
pub fn tasks_for_target(paired: &[Vec<f64>]) -> Option<usize> {
    let spread = Spread::of(paired)?;
    let s = spread.seeds;
    let room = s * target_variance() - (s - 1.0) / s * spread.between;
    (room > 0.0).then(|| (spread.within * (2.0 * s - 1.0) / s / room).ceil().max(1.0) as usize)
}

/// Seeds for a half-width of [`TARGET_HALF_WIDTH`] at the current test tasks per seed: the
/// fewest `S` (no fewer than now) whose [`Spread::variance`] is within the target; `None` past
/// 1,000 seeds.
pub fn seeds_for_target(paired: &[Vec<f64>]) -> Option<usize> {
    let spread = Spread::of(paired)?;
    (spread.seeds as usize..=1_000).find(|&s| spread.variance(s as f64, spread.tasks) <= target_variance())
}

fn target_variance() -> f64 {
    (TARGET_HALF_WIDTH / 1.96).powi(2)
}

/// The two parts of the paired differences' spread the projections keep apart.
struct Spread {
    seeds: f64,
    /// Mean test tasks per seed.
    tasks: f64,
    /// Mean variance of the differences within a seed (`W`).
    within: f64,
    /// Variance between seed means that more tasks would not shrink (`B`).
    between: f64,
}

impl Spread {
    fn of(paired: &[Vec<f64>]) -> Option<Spread> {
        let seeds: Vec<&Vec<f64>> = paired.iter().filter(|seed| !seed.is_empty()).collect();
        if seeds.is_empty() {
            return None;
        }
        let s = seeds.len() as f64;
        let variance = |values: &[f64]| {
            let m = mean(values);
            values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / values.len() as f64
        };
        let within = seeds.iter().map(|seed| variance(seed)).sum::<f64>() / s;
        let tasks = seeds.iter().map(|seed| seed.len()).sum::<usize>() as f64 / s;
        let means: Vec<f64> = seeds.iter().map(|seed| mean(seed)).collect();
        let between = if seeds.len() < 2 { 0.0 } else { (variance(&means) * s / (s - 1.0) - within / tasks).max(0.0) };
        Some(Spread { seeds: s, tasks, within, between })
    }

    /// The nested bootstrap's variance projected to `seeds` seeds of `tasks` tasks:
    /// `((S-1)/S B + (2S-1)/S W/n) / S`.
    fn variance(&self, seeds: f64, tasks: f64) -> f64 {
        ((seeds - 1.0) / seeds * self.between + (2.0 * seeds - 1.0) / seeds * self.within / tasks) / seeds
    }
}

/// How far one arm moved: its final test mean@k minus its first (the start), paired over test
/// tasks and pooled over seeds as a [`Difference`] is. Whether each half alone moves a domain is
/// the testbed's own signal, read before any comparison with WHALE.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Movement {
    #[serde(serialize_with = "arm_name")]
    pub arm: Arm,
    pub estimate: Estimate,
    /// Seeds whose own movement has the pooled estimate's sign (0 counts with either).
    pub seeds_agreeing: usize,
    pub seeds: usize,
}

/// The training rollouts an arm spent before its test mean@k first reached the weight-only
/// peak of the same seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeakRollouts {
    #[serde(serialize_with = "arm_name")]
    pub arm: Arm,
    /// Per seed, in seed order; `None` where the arm never reached the peak.
    pub per_seed: Vec<Option<u64>>,
    /// Mean, least and most over the seeds that reached it.
    pub mean: Option<f64>,
    pub min: Option<u64>,
    pub max: Option<u64>,
}

/// An arm's curve over seeds.
pub(super) fn band(per_seed: &[Vec<ArmResult>], arm: Arm) -> BandCurve {
    let seeds: Vec<Vec<(u64, f64)>> = per_seed
        .iter()
        .filter_map(|runs| find(runs, arm))
        .map(|run| run.evaluations.iter().map(|e| (e.training_rollouts, e.mean.value)).collect())
        .collect();
    BandCurve::over_seeds(&arm.name(), &seeds)
}

/// The run of `arm` among one seed's runs.
pub(super) fn find(runs: &[ArmResult], arm: Arm) -> Option<&ArmResult> {
    runs.iter().find(|run| run.arm() == arm)
}

/// The run of `condition`'s plain arm (the config's own algorithm) among one seed's runs.
pub(super) fn plain(runs: &[ArmResult], condition: Condition) -> Option<&ArmResult> {
    find(runs, Arm::from(condition))
}

/// The task means of a run's best or final test evaluation.
fn task_means(run: &ArmResult, metric: Metric) -> Option<&[f64]> {
    let (best, last): (&Evaluation, &Evaluation) = run.best_and_final()?;
    Some(match metric {
        Metric::Best => &best.task_means,
        Metric::Final => &last.task_means,
    })
}

pub(super) fn difference(per_seed: &[Vec<ArmResult>], arm: Arm, metric: Metric) -> Option<Difference> {
    let paired = per_seed
        .iter()
        .map(|runs| {
            let whale = task_means(plain(runs, Condition::Whale)?, metric)?;
            task_differences(whale, task_means(find(runs, arm)?, metric)?)
        })
        .collect::<Option<Vec<_>>>()?;
    let (estimate, seeds_agreeing) = pooled(&paired);
    let tasks_for_target = tasks_for_target(&paired);
    Some(Difference {
        arm,
        metric,
        estimate,
        seeds_agreeing,
        seeds: paired.len(),
        tasks: paired.first().map_or(0, Vec::len),
        tasks_for_target,
        seeds_for_target: tasks_for_target.map_or_else(|| seeds_for_target(&paired), |_| None),
    })
}

pub(super) fn movement(per_seed: &[Vec<ArmResult>], arm: Arm) -> Option<Movement> {
    let paired = per_seed
        .iter()
        .map(|runs| {
            let evaluations = &find(runs, arm)?.evaluations;
            task_differences(&evaluations.first()?.task_means, &evaluations.last()?.task_means)
        })
        .collect::<Option<Vec<_>>>()?;
    let (estimate, seeds_agreeing) = pooled(&paired);
    Some(Movement { arm, estimate, seeds_agreeing, seeds: paired.len() })
}

/// The mean of per-seed paired differences with its bootstrap interval over seeds, then tasks,
/// and the seeds whose own mean has the pooled sign.
fn pooled(paired: &[Vec<f64>]) -> (Estimate, usize) {
    let estimate = bootstrap_nested_mean(paired, RESAMPLES, BOOTSTRAP_SEED);
    let seeds_agreeing = paired.iter().filter(|seed| agrees(mean(seed), estimate.value)).count();
    (estimate, seeds_agreeing)
}

/// Whether a seed's `value` has the pooled estimate's sign (0 counts with either).
fn agrees(value: f64, pooled: f64) -> bool {
    value == 0.0 || pooled == 0.0 || (value > 0.0) == (pooled > 0.0)
}

pub(super) fn peak_rollouts(per_seed: &[Vec<ArmResult>], arm: Arm) -> PeakRollouts {
    let per_seed: Vec<Option<u64>> = per_seed
        .iter()
        .map(|runs| {
            let peak = plain(runs, Condition::WeightOnly)?.best_and_final()?.0.mean.value;
            find(runs, arm)?.rollouts_to_reach(peak)
        })
        .collect();
    let reached: Vec<u64> = per_seed.iter().flatten().copied().collect();
    PeakRollouts {
        arm,
        mean: (!reached.is_empty()).then(|| reached.iter().sum::<u64>() as f64 / reached.len() as f64),
        min: reached.iter().min().copied(),
        max: reached.iter().max().copied(),
        per_seed,
    }
}

pub(super) fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use whale_core::{Ledger, Purpose, Spend};

    fn with_task_means(condition: Condition, start: &[f64], last: &[f64]) -> ArmResult {
        let evaluation = |training_rollouts: u64, task_means: &[f64]| {
            let value = mean(task_means);
            Evaluation {
                training_rollouts,
                mean: Estimate { value, lo: value, hi: value },
                pass: value,
                maj: value,
                k: 8,
                task_means: task_means.to_vec(),
            }
        };
        let mut ledger = Ledger::default();
        ledger.record(Purpose::WeightPhase, Spend { rollouts: 64, ..Default::default() });
        ArmResult {
            condition,
            algorithm: None,
            ledger,
            evaluations: vec![evaluation(0, start), evaluation(64, last)],
            ran: None,
            test_split: None,
        }
    }
    #[test]
    fn a_movement_is_final_minus_start_paired_over_tasks_and_pooled_over_seeds() {
        let seeds = vec![
            vec![with_task_means(Condition::WeightOnly, &[0.0, 0.5, 1.0], &[0.5, 0.5, 1.0])],
            vec![with_task_means(Condition::WeightOnly, &[0.0, 0.0, 0.0, 0.0], &[0.0, 0.25, 0.0, 0.25])],
        ];
        let moved = movement(&seeds, Arm::from(Condition::WeightOnly)).expect("both seeds have a start and an end");
        let expected = (0.5 / 3.0 + 0.5 / 4.0) / 2.0;
        assert!((moved.estimate.value - expected).abs() < 1e-12, "{moved:?}");
        assert!(moved.estimate.lo >= 0.0 && moved.estimate.hi <= 0.5, "no task moved down: {moved:?}");
        assert_eq!((moved.seeds_agreeing, moved.seeds), (2, 2));
        assert!(movement(&seeds, Arm::from(Condition::HarnessOnly)).is_none(), "an arm that did not run");
    }

    #[test]
    fn one_seeds_projection_is_the_square_law_of_the_normal_interval() {
        // 32 tasks at +0.1 and 32 at -0.1: W = 0.01, so n = W (1.96 / 0.03)^2.
        let seed: Vec<f64> = (0..64).map(|i| if i % 2 == 0 { 0.1 } else { -0.1 }).collect();
        let expected = (0.01 * (1.96f64 / 0.03).powi(2)).ceil() as usize;
        assert_eq!(tasks_for_target(&[seed]), Some(expected));
    }

    #[test]
    fn seeds_that_agree_need_fewer_tasks_each_and_seeds_that_disagree_need_more_seeds() {
        let seed = |shift: f64| -> Vec<f64> { (0..64).map(|i| shift + if i % 2 == 0 { 0.1 } else { -0.1 }).collect() };
        let one = tasks_for_target(&[seed(0.0)]).unwrap();
        let three = tasks_for_target(&[seed(0.0), seed(0.0), seed(0.0)]).unwrap();
        assert!(three < one && three * 3 >= one, "one seed {one}, three agreeing seeds {three}");
        let apart = [seed(-0.2), seed(0.0), seed(0.2)];
        assert_eq!(tasks_for_target(&apart), None, "seed means 0.2 apart");
        assert_eq!(tasks_for_target(&[]), None);
        // B = 0.04 - W/n and W/n = 0.01/64: S seeds give about (B + 2W/n) / S, so B / S ≤ (0.03/1.96)^2
        // takes about 0.04 / 2.34e-4 = 171 seeds.
        let seeds = seeds_for_target(&apart).expect("a seed count");
        assert!((165..=175).contains(&seeds), "{seeds}");
        assert_eq!(seeds_for_target(&[seed(0.0), seed(0.0), seed(0.0)]), Some(3), "already within the target");
        assert_eq!(seeds_for_target(&[]), None);
    }
}
