//! The paper's three findings, each judged on a study's numbers: supported only when its
//! interval excludes zero in the stated direction, contradicted when one excludes zero in the
//! opposite direction, inconclusive otherwise (including when the conditions it needs did not
//! run).

use super::result::ArmResult;
use super::statistics::{mean, plain, Difference, Metric, SeedCoupling, BOOTSTRAP_SEED, RESAMPLES};
use crate::compare::Arm;
use serde::Serialize;
use std::fmt;
use whale_core::{bootstrap_nested_mean, Domain, Estimate};
use whale_loop::condition::Condition;
use whale_tasks::{task_domain, Bottleneck};

/// A finding of the paper, judged on this study's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub finding: String,
    pub status: Status,
    pub detail: String,
}

/// How a study's numbers stand to a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Supported,
    Contradicted,
    Inconclusive,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Supported => "supported",
            Status::Contradicted => "contradicted",
            Status::Inconclusive => "inconclusive",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Finding (a): WHALE beats weight-only, harness-only, fast-slow and sequential on best
/// mean@k. Supported when every such difference (baseline − WHALE) has its interval below
/// zero; contradicted when one lies above zero; inconclusive otherwise.
pub fn whale_beats_the_baselines(differences: &[Difference]) -> Verdict {
    let baselines = [Condition::WeightOnly, Condition::HarnessOnly, Condition::FastSlow, Condition::Sequential];
    let best: Vec<&Difference> = differences
        .iter()
        .filter(|d| d.metric == Metric::Best && baselines.iter().any(|&c| Arm::from(c) == d.arm))
        .collect();
    let shown: Vec<String> = best.iter().map(|d| format!("{} {}", d.arm, signed(&d.estimate))).collect();
    let status = if best.len() < baselines.len() {
        Status::Inconclusive
    } else if best.iter().any(|d| d.estimate.lo > 0.0) {
        Status::Contradicted
    } else if best.iter().all(|d| d.estimate.hi < 0.0) {
        Status::Supported
    } else {
        Status::Inconclusive
    };
    let detail = if best.len() < baselines.len() {
        format!("needs all four baselines beside whale; ran {}", best.len())
    } else {
        format!("best mean@k, baseline minus whale: {}", shown.join("; "))
    };
    let finding = "(a) WHALE beats weight-only, harness-only, fast-slow and sequential".to_string();
    Verdict { finding, status, detail }
}

/// The training rollouts `condition` took in each seed to first reach `target(seed)`; a seed
/// that never reached it counts with everything it spent (censored: never fewer than it needed).
fn rollouts_to(
    per_seed: &[Vec<ArmResult>],
    condition: Condition,
    target: impl Fn(&[ArmResult]) -> Option<f64>,
) -> Vec<Option<f64>> {
    per_seed
        .iter()
        .map(|runs| {
            let run = plain(runs, condition)?;
            let reached = run.rollouts_to_reach(target(runs)?);
            Some(reached.unwrap_or_else(|| run.ledger.training_rollouts()) as f64)
        })
        .collect()
}

/// The mean over seeds of `a - b` with a bootstrap interval over seeds; `None` unless both are
/// known in every seed.
fn seed_difference(a: &[Option<f64>], b: &[Option<f64>]) -> Option<Estimate> {
    let pairs: Vec<Vec<f64>> = a.iter().zip(b).map(|(a, b)| Some(vec![(*a)? - (*b)?])).collect::<Option<_>>()?;
    (!pairs.is_empty()).then(|| bootstrap_nested_mean(&pairs, RESAMPLES, BOOTSTRAP_SEED))
}

fn best_of(runs: &[ArmResult], condition: Condition) -> Option<f64> {
    Some(plain(runs, condition)?.best_and_final()?.0.mean.value)
}

fn status_of(estimate: &Estimate, favourable_above_zero: bool) -> Status {
    let (favourable, against) = if favourable_above_zero {
        (estimate.lo > 0.0, estimate.hi < 0.0)
    } else {
        (estimate.hi < 0.0, estimate.lo > 0.0)
    };
    match (favourable, against) {
        (true, _) => Status::Supported,
        (_, true) => Status::Contradicted,
        _ => Status::Inconclusive,
    }
}

/// Finding (b): the bottleneck depends on the domain. In search QA, harness-only reaches the
/// weight-only peak with fewer rollouts than weight-only (weight-only's minus harness-only's,
/// over seeds, above zero). In math, harness gains appear only after weight updates: in the
/// coupling matrix, the last accepted harness's gain over the initial one is larger under the
/// last weights than under the starting ones (that interaction, per task, pooled over seeds,
/// above zero). The paper states no bottleneck for chess; its numbers are reported. Which
/// reading applies is the domain's [`whale_tasks::TaskDomain::bottleneck`].
pub fn bottleneck(domain: Domain, per_seed: &[Vec<ArmResult>], couplings: &[SeedCoupling]) -> Verdict {
    let peak = |runs: &[ArmResult]| best_of(runs, Condition::WeightOnly);
    let weight_only = rollouts_to(per_seed, Condition::WeightOnly, peak);
    let harness_only = rollouts_to(per_seed, Condition::HarnessOnly, peak);
    let search_first = seed_difference(&weight_only, &harness_only);
    let interaction = harness_gain_interaction(couplings);
    let search_text = search_first
        .map_or("rollouts to the weight-only peak: needs weight-only and harness-only".to_string(), |e| {
            format!("rollouts to the weight-only peak, weight-only minus harness-only: {}", signed_count(&e))
        });
    let interaction_text = interaction.as_ref().map_or(
        "coupling: no WHALE run accepted a harness and trained weights".to_string(),
        |(e, at_start, at_end)| {
            format!(
                "coupling: the accepted harness's gain under the last weights minus under the start {} \
                 (gain at the start {:+.3}, under the last weights {:+.3})",
                signed(e),
                at_start,
                at_end
            )
        },
    );
    let (finding, status, detail) = match task_domain(domain).bottleneck() {
        Bottleneck::Harness => (
            format!("(b) {domain}: harness-only reaches the weight-only peak with fewer rollouts"),
            search_first.as_ref().map_or(Status::Inconclusive, |e| status_of(e, true)),
            format!("{search_text}; {interaction_text}"),
        ),
        Bottleneck::Weights => (
            format!("(b) {domain}: harness gains appear only after weight updates"),
            interaction.as_ref().map_or(Status::Inconclusive, |(e, _, _)| status_of(e, true)),
            format!("{interaction_text}; {search_text}"),
        ),
        Bottleneck::Unstated => (
            format!("(b) {domain}: the paper states no bottleneck for this domain"),
            Status::Inconclusive,
            format!("{search_text}; {interaction_text}"),
        ),
    };
    Verdict { finding, status, detail }
}

/// Per task, `(last harness, last weights) - (initial, last weights) - (last harness, start) +
/// (initial, start)`, pooled over the matrices that have two rows and two columns; with the
/// mean harness gain at the start and under the last weights.
fn harness_gain_interaction(couplings: &[SeedCoupling]) -> Option<(Estimate, f64, f64)> {
    let mut per_seed = Vec::new();
    let (mut at_start, mut at_end) = (Vec::new(), Vec::new());
    for SeedCoupling { matrix: coupling, .. } in couplings {
        let (rows, columns) = (coupling.harnesses.len(), coupling.weights.len());
        if rows < 2 || columns < 2 {
            continue;
        }
        let cell = |r: usize, c: usize| coupling.cell(r, c).map(|cell| &cell.task_means);
        let (Some(a), Some(b), Some(c), Some(d)) =
            (cell(rows - 1, columns - 1), cell(0, columns - 1), cell(rows - 1, 0), cell(0, 0))
        else {
            continue;
        };
        let n = a.len();
        if [b.len(), c.len(), d.len()].iter().any(|&len| len != n) || n == 0 {
            continue;
        }
        per_seed.push((0..n).map(|t| a[t] - b[t] - c[t] + d[t]).collect::<Vec<f64>>());
        at_start.push(mean(c) - mean(d));
        at_end.push(mean(a) - mean(b));
    }
    if per_seed.is_empty() {
        return None;
    }
    Some((bootstrap_nested_mean(&per_seed, RESAMPLES, BOOTSTRAP_SEED), mean(&at_start), mean(&at_end)))
}

/// Finding (c): small alternating steps beat sequential, in final accuracy (sequential minus
/// WHALE on final mean@k below zero) and in rollouts (to reach sequential's best mean@k,
/// sequential's minus WHALE's above zero). Supported when both hold, contradicted when either
/// is reversed with its interval.
pub fn alternating_beats_sequential(per_seed: &[Vec<ArmResult>], differences: &[Difference]) -> Verdict {
    let finding = "(c) small alternating steps beat sequential, in final accuracy and in rollouts".to_string();
    let last = differences.iter().find(|d| d.arm == Arm::from(Condition::Sequential) && d.metric == Metric::Final);
    let target = |runs: &[ArmResult]| best_of(runs, Condition::Sequential);
    let rollouts = seed_difference(
        &rollouts_to(per_seed, Condition::Sequential, target),
        &rollouts_to(per_seed, Condition::Whale, target),
    );
    let (Some(last), Some(rollouts)) = (last, rollouts) else {
        return Verdict {
            finding,
            status: Status::Inconclusive,
            detail: "needs whale and sequential in every seed".to_string(),
        };
    };
    let (accuracy, spend) = (status_of(&last.estimate, false), status_of(&rollouts, true));
    let status = if accuracy == Status::Contradicted || spend == Status::Contradicted {
        Status::Contradicted
    } else if accuracy == Status::Supported && spend == Status::Supported {
        Status::Supported
    } else {
        Status::Inconclusive
    };
    let detail = format!(
        "final mean@k, sequential minus whale {}; rollouts to sequential's best, sequential minus whale {}",
        signed(&last.estimate),
        signed_count(&rollouts)
    );
    Verdict { finding, status, detail }
}

fn signed_count(estimate: &Estimate) -> String {
    format!("{:+.0} [{:+.0}, {:+.0}]", estimate.value, estimate.lo, estimate.hi)
}

/// `+0.012 [-0.004, +0.031]`.
pub(super) fn signed(estimate: &Estimate) -> String {
    format!("{:+.3} [{:+.3}, {:+.3}]", estimate.value, estimate.lo, estimate.hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coupling::Coupling;
    use crate::study::result::Evaluation;

    fn difference(condition: Condition, value: f64, lo: f64, hi: f64) -> Difference {
        Difference {
            arm: Arm::from(condition),
            metric: Metric::Best,
            estimate: Estimate { value, lo, hi },
            seeds_agreeing: 3,
            seeds: 3,
            tasks: 64,
            tasks_for_target: Some(64),
            seeds_for_target: None,
        }
    }

    #[test]
    fn finding_a_is_supported_only_when_every_baseline_is_below_whale() {
        let baselines = [Condition::WeightOnly, Condition::HarnessOnly, Condition::FastSlow, Condition::Sequential];
        let tied: Vec<Difference> = baselines.iter().map(|&arm| difference(arm, 0.0, 0.0, 0.0)).collect();
        assert_eq!(whale_beats_the_baselines(&tied).status, Status::Inconclusive, "conditions that tie decide nothing");
        let below: Vec<Difference> = baselines.iter().map(|&arm| difference(arm, -0.05, -0.08, -0.02)).collect();
        assert_eq!(whale_beats_the_baselines(&below).status, Status::Supported);
        let mut one_above = below.clone();
        one_above[1] = difference(Condition::HarnessOnly, 0.06, 0.03, 0.09);
        let verdict = whale_beats_the_baselines(&one_above);
        assert_eq!(verdict.status, Status::Contradicted);
        assert!(verdict.detail.contains("harness-only +0.060 [+0.030, +0.090]"), "{}", verdict.detail);
        let mut straddling = below.clone();
        straddling[2] = difference(Condition::FastSlow, -0.01, -0.04, 0.02);
        assert_eq!(whale_beats_the_baselines(&straddling).status, Status::Inconclusive);
        assert_eq!(whale_beats_the_baselines(&below[..3]).status, Status::Inconclusive, "a baseline missing");
    }

    /// A run of `condition` whose curve is `(rollouts, mean@k)` and that spent `spent` rollouts.
    fn run(condition: Condition, curve: &[(u64, f64)], spent: u64) -> ArmResult {
        let mut ledger = whale_core::Ledger::default();
        ledger.record(whale_core::Purpose::WeightPhase, whale_core::Spend { rollouts: spent, ..Default::default() });
        let evaluations = curve
            .iter()
            .map(|&(rollouts, mean)| Evaluation {
                training_rollouts: rollouts,
                mean: Estimate { value: mean, lo: mean, hi: mean },
                pass: mean,
                maj: mean,
                k: 8,
                task_means: Vec::new(),
            })
            .collect();
        ArmResult { condition, algorithm: None, ledger, evaluations, ran: None, test_split: None }
    }

    fn matrix(cells: [[f64; 2]; 2]) -> SeedCoupling {
        use crate::coupling::{AcceptedHarness, Cell, WeightsColumn};
        let harness = |i: usize| AcceptedHarness { id: format!("c{i}"), hash: format!("h{i}"), iteration: i as u64 };
        let weights = |v: u64| WeightsColumn { version: v, dir: std::path::PathBuf::from(format!("v{v}")) };
        let mut all = Vec::new();
        for (row, values) in cells.iter().enumerate() {
            for (column, &value) in values.iter().enumerate() {
                all.push(Cell {
                    harness: format!("h{row}"),
                    weights_version: column as u64,
                    mean: Estimate { value, lo: value, hi: value },
                    task_means: vec![value - 0.1, value, value + 0.1],
                });
            }
        }
        let matrix = Coupling {
            k: 8,
            eval_seed: 1,
            harnesses: vec![harness(0), harness(1)],
            weights: vec![weights(0), weights(1)],
            cells: all,
        };
        SeedCoupling { seed: 0, matrix }
    }

    #[test]
    fn finding_b_reads_rollouts_in_qa_and_the_coupling_matrix_in_math() {
        let seed = |harness_only_at: u64| {
            vec![
                run(Condition::WeightOnly, &[(0, 0.1), (400, 0.3)], 512),
                run(Condition::HarnessOnly, &[(0, 0.1), (harness_only_at, 0.3)], 512),
            ]
        };
        let early = [seed(100), seed(150)];
        let verdict = bottleneck(Domain::Qa, &early, &[]);
        assert_eq!(verdict.status, Status::Supported, "{}", verdict.detail);
        assert!(verdict.detail.contains("+275 [+250, +300]"), "{}", verdict.detail);
        let late = [seed(500), seed(450)];
        assert_eq!(bottleneck(Domain::Qa, &late, &[]).status, Status::Contradicted);
        let never = [early[0].clone(), vec![early[0][0].clone(), run(Condition::HarnessOnly, &[(0, 0.1)], 512)]];
        assert_eq!(
            bottleneck(Domain::Qa, &never, &[]).status,
            Status::Inconclusive,
            "not reached counts as everything spent"
        );

        let weights_first = [matrix([[0.2, 0.3], [0.2, 0.5]]), matrix([[0.1, 0.3], [0.12, 0.45]])];
        let verdict = bottleneck(Domain::Math, &early, &weights_first);
        assert_eq!(verdict.status, Status::Supported, "{}", verdict.detail);
        assert!(verdict.detail.contains("gain at the start +0.010"), "{}", verdict.detail);
        let additive = [matrix([[0.2, 0.3], [0.3, 0.4]])];
        assert_eq!(
            bottleneck(Domain::Math, &early, &additive).status,
            Status::Inconclusive,
            "a harness gain that needs no training"
        );
        assert_eq!(bottleneck(Domain::Math, &early, &[]).status, Status::Inconclusive, "no matrix, no verdict");
        assert_eq!(bottleneck(Domain::Chess, &early, &weights_first).status, Status::Inconclusive);
    }

    #[test]
    fn finding_c_needs_whale_ahead_of_sequential_in_final_accuracy_and_in_rollouts() {
        let seed = |whale_at: u64| {
            vec![
                run(Condition::Whale, &[(0, 0.1), (whale_at, 0.4), (500, 0.45)], 512),
                run(Condition::Sequential, &[(0, 0.1), (400, 0.4)], 512),
            ]
        };
        let mut last = difference(Condition::Sequential, -0.05, -0.08, -0.02);
        last.metric = Metric::Final;
        let verdict = alternating_beats_sequential(&[seed(200), seed(300)], std::slice::from_ref(&last));
        assert_eq!(verdict.status, Status::Supported, "{}", verdict.detail);
        assert_eq!(
            alternating_beats_sequential(&[seed(450), seed(480)], std::slice::from_ref(&last)).status,
            Status::Contradicted,
            "whale needed more rollouts"
        );
        let tied = difference(Condition::Sequential, 0.0, -0.03, 0.03);
        let tied = Difference { metric: Metric::Final, ..tied };
        assert_eq!(alternating_beats_sequential(&[seed(200), seed(300)], &[tied]).status, Status::Inconclusive);
        assert_eq!(alternating_beats_sequential(&[seed(200)], &[]).status, Status::Inconclusive, "no final difference");
    }
}
