//! What a study found, per config: the pooled statistics and the verdicts, and where each seed
//! ran, computed from the seeds' result files alone.

use super::result::{ArmResult, SeedResult, WhaleBuild};
use super::statistics::{self, Difference, Metric, Movement, PeakRollouts, SeedCoupling};
use super::verdicts::{alternating_beats_sequential, bottleneck, whale_beats_the_baselines, Verdict};
use crate::compare::Arm;
use crate::coupling::Coupling;
use crate::figures::BandCurve;
use serde::Serialize;
use whale_core::{CpuInfo, Domain, Estimate};
use whale_loop::condition::Condition;

/// Where one seed ran, from its result file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedProvenance {
    pub seed: u64,
    /// The CPU of the invocation that wrote the seed's file.
    pub cpu: CpuInfo,
    /// Every CPU its arms finished on (the file's own when its arms do not say).
    pub cpus: Vec<CpuInfo>,
    pub whale: WhaleBuild,
    pub wall_s: f64,
}

impl SeedProvenance {
    fn of(result: &SeedResult) -> SeedProvenance {
        let mut cpus: Vec<CpuInfo> = Vec::new();
        for arm in &result.arms {
            let cpu = arm.ran.as_ref().map_or(&result.cpu, |ran| &ran.cpu);
            if !cpus.contains(cpu) {
                cpus.push(cpu.clone());
            }
        }
        if cpus.is_empty() {
            cpus.push(result.cpu.clone());
        }
        SeedProvenance {
            seed: result.seed,
            cpu: result.cpu.clone(),
            cpus,
            whale: result.whale.clone(),
            wall_s: result.wall_s,
        }
    }
}

/// A seed without a result file whose arms have begun to finish.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnfinishedSeed {
    pub seed: u64,
    /// The arms with a file, in the study's order.
    pub arms: Vec<ArmSoFar>,
    /// The WHALE arm's coupling matrix, once that arm has its file.
    pub coupling: Option<Coupling>,
}

/// Where a finished arm of an unfinished seed went: no comparison yet, its own curve's ends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmSoFar {
    pub arm: String,
    /// Test mean@k of its first and last evaluations.
    pub start: Estimate,
    pub end: Estimate,
    /// Training rollouts spent before the last evaluation.
    pub training_rollouts: u64,
}

impl ArmSoFar {
    /// `None` for an arm without evaluations.
    pub fn of(arm: &ArmResult) -> Option<ArmSoFar> {
        let (first, last) = (arm.evaluations.first()?, arm.evaluations.last()?);
        Some(ArmSoFar {
            arm: arm.arm().name(),
            start: first.mean,
            end: last.mean,
            training_rollouts: last.training_rollouts,
        })
    }
}

/// One config's results over all seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DomainStudy {
    pub name: String,
    pub domain: Domain,
    /// The seeds with a result file.
    pub seeds: Vec<u64>,
    /// The study's seeds without one.
    pub missing_seeds: Vec<u64>,
    /// Those of the missing seeds that have some arms' files.
    pub unfinished: Vec<UnfinishedSeed>,
    /// Per seed with a result file, in seed order.
    pub provenance: Vec<SeedProvenance>,
    /// Test mean@k of the first arm's evaluations (for the axis label).
    pub k: usize,
    pub differences: Vec<Difference>,
    /// Each arm's final test mean@k minus its start.
    pub movements: Vec<Movement>,
    pub peak_rollouts: Vec<PeakRollouts>,
    /// Each arm's curve: the mean over seeds with the range as a band.
    pub curves: Vec<BandCurve>,
    /// The coupling matrix of the WHALE run of each seed that has one, in seed order.
    pub couplings: Vec<SeedCoupling>,
    pub verdicts: Vec<Verdict>,
}

/// `study.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Study {
    pub seeds: Vec<u64>,
    pub arms: Vec<String>,
    pub quick: bool,
    pub domains: Vec<DomainStudy>,
}

/// The statistics of one config from the result files of its seeds (in seed order), and the
/// seeds that have none.
pub fn domain_study(name: &str, domain: Domain, results: Vec<SeedResult>, missing_seeds: Vec<u64>) -> DomainStudy {
    let seeds: Vec<u64> = results.iter().map(|r| r.seed).collect();
    let provenance = results.iter().map(SeedProvenance::of).collect();
    let mut couplings = Vec::new();
    let mut per_seed = Vec::new();
    for result in results {
        if let Some(matrix) = result.coupling {
            couplings.push(SeedCoupling { seed: result.seed, matrix });
        }
        per_seed.push(result.arms);
    }
    let arms: Vec<Arm> =
        per_seed.first().map_or(Vec::new(), |runs: &Vec<ArmResult>| runs.iter().map(ArmResult::arm).collect());
    let mut differences = Vec::new();
    for &arm in arms.iter().filter(|&&arm| arm != Arm::from(Condition::Whale)) {
        for metric in Metric::BOTH {
            differences.extend(statistics::difference(&per_seed, arm, metric));
        }
    }
    let verdicts = vec![
        whale_beats_the_baselines(&differences),
        bottleneck(domain, &per_seed, &couplings),
        alternating_beats_sequential(&per_seed, &differences),
    ];
    let k = per_seed.iter().flatten().find_map(|run| run.evaluations.first().map(|e| e.k)).unwrap_or(8);
    DomainStudy {
        name: name.to_string(),
        domain,
        seeds,
        missing_seeds,
        unfinished: Vec::new(),
        provenance,
        k,
        movements: arms.iter().filter_map(|&arm| statistics::movement(&per_seed, arm)).collect(),
        peak_rollouts: arms.iter().map(|&arm| statistics::peak_rollouts(&per_seed, arm)).collect(),
        curves: arms.iter().map(|&arm| statistics::band(&per_seed, arm)).collect(),
        differences,
        couplings,
        verdicts,
    }
}
