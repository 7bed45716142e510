//! `whale study`: every condition of every config (one per domain) under several seeds, and
//! what the paper's comparison needs from them: each condition's difference from WHALE, paired
//! over test tasks and pooled over seeds, with a bootstrap interval that resamples seeds and
//! then tasks within them; in how many seeds its sign holds; the rollouts each condition took to
//! reach weight-only's peak; the coupling matrix of every WHALE run; the figures (curves with
//! a band over seeds, a forest plot of the differences, the coupling heat maps); and a verdict
//! on each of the paper's three findings.
//!
//! One seed of one config is a `whale compare` directory, `runs/<study>/<config>/seed-<s>/`, so a
//! study killed at any moment continues where it stopped (finished runs are kept, an
//! unfinished one resumes from its last unit; a coupling matrix continues from its last cell).
//! `study.json`, `report.html` and `figures/*.png` are written from the run directories at the
//! end, and can be rewritten from them at any time.

use crate::compare::{self, Arm, CompareError};
use crate::condition::Condition;
use crate::config::RunConfig;
use crate::coupling::{self, Coupling, CouplingError, COUPLING_FILE};
use crate::experiment::Verbosity;
use crate::figures::{self, BandCurve, FigureError, ForestRow};
use crate::lock::{DirLock, LockError};
use crate::report::{self, task_differences, ReportError, Series};
use crate::run_dir::{read_json, write_atomic};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use whale_core::{bootstrap_nested_mean, Estimate};

/// Bootstrap resamples of every paired interval, and their seed.
const RESAMPLES: usize = 2000;
const BOOTSTRAP_SEED: u64 = 0x57AD_0001;

#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("{config}, seed {seed}: {source}")]
    Compare { config: String, seed: u64, source: Box<CompareError> },
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("{config}, seed {seed}, the coupling matrix: {source}")]
    Coupling { config: String, seed: u64, source: Box<CouplingError> },
    #[error(transparent)]
    Figure(#[from] FigureError),
    #[error("writing {}: {reason}", path.display())]
    Write { path: PathBuf, reason: String },
    #[error("reading {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("two configs are both named `{0}`: a study keeps one directory per config name")]
    DuplicateName(String),
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// What a study runs.
#[derive(Debug, Clone)]
pub struct StudyPlan {
    /// One config per domain (any number), each run under every seed.
    pub configs: Vec<RunConfig>,
    pub seeds: Vec<u64>,
    pub arms: Vec<Arm>,
    /// Smaller splits and budgets, the same code path ([`quick`]).
    pub quick: bool,
}

/// `--quick`: at most 16 search and 32 test tasks, an eighth of the budget (at least 128
/// rollouts), weight steps of 8 tasks, phases of at most 2 weight steps and 2 search
/// iterations (so that the conditions still alternate within the smaller budget), and mean@4.
pub fn quick(mut config: RunConfig) -> RunConfig {
    config.tasks.search = config.tasks.search.min(16);
    config.tasks.test = config.tasks.test.min(32);
    config.schedule.budget = (config.schedule.budget / 8).max(128);
    config.schedule.weight_steps = config.schedule.weight_steps.min(2);
    config.schedule.search_iterations = config.schedule.search_iterations.min(2);
    config.weights.tasks_per_step = config.weights.tasks_per_step.min(8);
    config.eval.k = config.eval.k.min(4);
    config
}

/// One condition's difference from WHALE on one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// The arm's name (`weight-only`, `weight-only-grpo`, ...).
    pub arm: String,
    /// `best` or `final` test mean@k.
    pub metric: &'static str,
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
    pub arm: String,
    pub estimate: Estimate,
    /// Seeds whose own movement has the pooled estimate's sign (0 counts with either).
    pub seeds_agreeing: usize,
    pub seeds: usize,
}

/// The training rollouts an arm spent before its test mean@k first reached the weight-only
/// peak of the same seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeakRollouts {
    pub arm: String,
    /// Per seed, in seed order; `None` where the arm never reached the peak.
    pub per_seed: Vec<Option<u64>>,
    /// Mean, least and most over the seeds that reached it.
    pub mean: Option<f64>,
    pub min: Option<u64>,
    pub max: Option<u64>,
}

/// The coupling matrix of one seed's WHALE run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedCoupling {
    pub seed: u64,
    pub matrix: Coupling,
}

/// A finding of the paper, judged on this study's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub finding: &'static str,
    /// `supported`, `contradicted` or `inconclusive`.
    pub status: &'static str,
    pub detail: String,
}

/// One config's results over all seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DomainStudy {
    pub name: String,
    pub domain: String,
    pub seeds: Vec<u64>,
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

/// Runs (or resumes) every arm of every config under every seed in `root`, then writes
/// `root/study.json` and `root/report.html`. Seeds are the outer loop, and a seed's coupling
/// matrices follow its runs, so a study stopped early has every config on the seeds it finished.
/// `root` stays locked throughout ([`DirLock`]), each comparison and coupling matrix under its own
/// directory's lock too.
pub fn run(plan: &StudyPlan, root: &Path, verbosity: Verbosity) -> Result<Study, StudyError> {
    check_names(&plan.configs)?;
    let _lock = DirLock::create(root)?;
    let has_whale = plan.arms.iter().any(|arm| arm.name() == Condition::Whale.as_str());
    let units = plan.configs.len() * plan.seeds.len() * (1 + usize::from(has_whale));
    let bar = progress_bar(units as u64, verbosity.progress);
    for &seed in &plan.seeds {
        for config in &plan.configs {
            bar.set_message(format!("{} seed {seed}", config.name));
            let config = seeded(config, seed, plan.quick);
            let quiet = Verbosity { progress: false };
            compare::compare(&config, &seed_dir(root, &config.name, seed), &plan.arms, quiet).map_err(|source| {
                StudyError::Compare { config: config.name.clone(), seed, source: Box::new(source) }
            })?;
            bar.inc(1);
            if has_whale {
                bar.set_message(format!("{} seed {seed}: coupling matrix", config.name));
                coupling_of(&whale_dir(root, &config.name, seed)).map_err(|source| StudyError::Coupling {
                    config: config.name.clone(),
                    seed,
                    source: Box::new(source),
                })?;
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    let study = read(plan, root)?;
    write(&study, root)?;
    Ok(study)
}

/// The coupling matrix of the finished run in `run`, under its lock.
fn coupling_of(run: &Path) -> Result<Coupling, CouplingError> {
    let lock = DirLock::acquire(run)?;
    coupling::compute(&lock, false)
}

fn check_names(configs: &[RunConfig]) -> Result<(), StudyError> {
    for (index, config) in configs.iter().enumerate() {
        if configs[..index].iter().any(|other| other.name == config.name) {
            return Err(StudyError::DuplicateName(config.name.clone()));
        }
    }
    Ok(())
}

fn seeded(config: &RunConfig, seed: u64, quick_run: bool) -> RunConfig {
    let config = RunConfig { seed, ..config.clone() };
    if quick_run {
        quick(config)
    } else {
        config
    }
}

fn seed_dir(root: &Path, config: &str, seed: u64) -> PathBuf {
    root.join(config).join(format!("seed-{seed}"))
}

fn whale_dir(root: &Path, config: &str, seed: u64) -> PathBuf {
    seed_dir(root, config, seed).join(Condition::Whale.as_str())
}

fn progress_bar(total: u64, show: bool) -> ProgressBar {
    let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let style =
        ProgressStyle::with_template("study {bar:30} {pos}/{len} comparisons and coupling matrices, ETA {eta} ({msg})")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// The study as its run directories say it went: per config, the seeds whose every arm
/// finished.
pub fn read(plan: &StudyPlan, root: &Path) -> Result<Study, StudyError> {
    let mut domains = Vec::new();
    for config in &plan.configs {
        let mut per_seed = Vec::new();
        let mut couplings = Vec::new();
        let mut seeds = Vec::new();
        for &seed in &plan.seeds {
            let Some(runs) = finished_runs(&seed_dir(root, &config.name, seed), plan.arms.len())? else { continue };
            seeds.push(seed);
            per_seed.push(runs);
            let file = whale_dir(root, &config.name, seed).join(COUPLING_FILE);
            if file.is_file() {
                let matrix = read_json::<Coupling>(&file)
                    .map_err(|e| StudyError::Read { path: file.clone(), reason: e.to_string() })?;
                couplings.push(SeedCoupling { seed, matrix });
            }
        }
        let domain = config.tasks.domain.to_string();
        domains.push(domain_study(&config.name, &domain, &seeds, &per_seed, couplings));
    }
    Ok(Study { seeds: plan.seeds.clone(), arms: plan.arms.iter().map(Arm::name).collect(), quick: plan.quick, domains })
}

/// The runs of one seed when all `arms` of them have finished (a study stopped early is
/// reported on the seeds it completed).
fn finished_runs(dir: &Path, arms: usize) -> Result<Option<Vec<Series>>, StudyError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let runs = report::run_dirs(dir)?.iter().map(|run| Series::read(run)).collect::<Result<Vec<_>, _>>()?;
    Ok((runs.len() == arms && runs.iter().all(|run| run.finished)).then_some(runs))
}

/// The statistics of one config from its series, `per_seed[s]` the runs of seed `seeds[s]`,
/// and the coupling matrices of its WHALE runs.
pub fn domain_study(
    name: &str,
    domain: &str,
    seeds: &[u64],
    per_seed: &[Vec<Series>],
    couplings: Vec<SeedCoupling>,
) -> DomainStudy {
    let arms: Vec<String> = per_seed.first().map_or(Vec::new(), |runs| runs.iter().map(arm_name).collect());
    let mut differences = Vec::new();
    for arm in arms.iter().filter(|arm| arm.as_str() != "whale") {
        for metric in ["best", "final"] {
            if let Some(difference) = difference(per_seed, arm, metric) {
                differences.push(difference);
            }
        }
    }
    let movements = arms.iter().filter_map(|arm| movement(per_seed, arm)).collect();
    let peak_rollouts = arms.iter().map(|arm| peak_rollouts(per_seed, arm)).collect();
    let curves = arms.iter().map(|arm| band(per_seed, arm)).collect();
    let verdicts = vec![
        whale_beats_the_baselines(&differences),
        bottleneck(domain, per_seed, &couplings),
        alternating_beats_sequential(per_seed, &differences),
    ];
    let k = per_seed.iter().flatten().find_map(|s| s.points.first().map(|p| p.k)).unwrap_or(8);
    DomainStudy {
        name: name.to_string(),
        domain: domain.to_string(),
        seeds: seeds.to_vec(),
        k,
        differences,
        movements,
        peak_rollouts,
        curves,
        couplings,
        verdicts,
    }
}

/// An arm's curve over seeds.
fn band(per_seed: &[Vec<Series>], arm: &str) -> BandCurve {
    let seeds: Vec<Vec<(u64, f64)>> = per_seed
        .iter()
        .filter_map(|runs| find(runs, arm))
        .map(|series| series.points.iter().map(|p| (p.training_rollouts, p.mean.value)).collect())
        .collect();
    BandCurve::over_seeds(arm, &seeds)
}

/// A run's arm, from its directory name (`weight-only-grpo`), as `compare` names them.
fn arm_name(series: &Series) -> String {
    series.dir.file_name().map_or_else(|| series.label.clone(), |n| n.to_string_lossy().into_owned())
}

fn find<'a>(runs: &'a [Series], arm: &str) -> Option<&'a Series> {
    runs.iter().find(|series| arm_name(series) == arm)
}

/// The task means of a run's best or final test evaluation.
fn task_means<'a>(series: &'a Series, metric: &str) -> Option<&'a [f64]> {
    let (best, last) = series.best_and_final()?;
    Some(if metric == "best" { &best.task_means } else { &last.task_means })
}

fn difference(per_seed: &[Vec<Series>], arm: &str, metric: &'static str) -> Option<Difference> {
    let paired = per_seed
        .iter()
        .map(|runs| task_differences(task_means(find(runs, "whale")?, metric)?, task_means(find(runs, arm)?, metric)?))
        .collect::<Option<Vec<_>>>()?;
    let (estimate, seeds_agreeing) = pooled(&paired);
    let tasks_for_target = tasks_for_target(&paired);
    Some(Difference {
        arm: arm.to_string(),
        metric,
        estimate,
        seeds_agreeing,
        seeds: paired.len(),
        tasks: paired.first().map_or(0, Vec::len),
        tasks_for_target,
        seeds_for_target: tasks_for_target.map_or_else(|| seeds_for_target(&paired), |_| None),
    })
}

fn movement(per_seed: &[Vec<Series>], arm: &str) -> Option<Movement> {
    let paired = per_seed
        .iter()
        .map(|runs| {
            let points = &find(runs, arm)?.points;
            task_differences(&points.first()?.task_means, &points.last()?.task_means)
        })
        .collect::<Option<Vec<_>>>()?;
    let (estimate, seeds_agreeing) = pooled(&paired);
    Some(Movement { arm: arm.to_string(), estimate, seeds_agreeing, seeds: paired.len() })
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

fn peak_rollouts(per_seed: &[Vec<Series>], arm: &str) -> PeakRollouts {
    let per_seed: Vec<Option<u64>> = per_seed
        .iter()
        .map(|runs| {
            let peak = find(runs, "weight-only")?.best_and_final()?.0.mean.value;
            find(runs, arm)?.rollouts_to_reach(peak)
        })
        .collect();
    let reached: Vec<u64> = per_seed.iter().flatten().copied().collect();
    PeakRollouts {
        arm: arm.to_string(),
        mean: (!reached.is_empty()).then(|| reached.iter().sum::<u64>() as f64 / reached.len() as f64),
        min: reached.iter().min().copied(),
        max: reached.iter().max().copied(),
        per_seed,
    }
}

/// Finding (a): WHALE beats weight-only, harness-only, fast-slow and sequential on best
/// mean@k. Supported when every such difference (baseline − WHALE) has its interval below
/// zero; contradicted when one lies above zero; inconclusive otherwise.
pub fn whale_beats_the_baselines(differences: &[Difference]) -> Verdict {
    let baselines = [Condition::WeightOnly, Condition::HarnessOnly, Condition::FastSlow, Condition::Sequential];
    let best: Vec<&Difference> =
        differences.iter().filter(|d| d.metric == "best" && baselines.iter().any(|c| c.as_str() == d.arm)).collect();
    let shown: Vec<String> = best.iter().map(|d| format!("{} {}", d.arm, signed(&d.estimate))).collect();
    let status = if best.len() < baselines.len() {
        "inconclusive"
    } else if best.iter().any(|d| d.estimate.lo > 0.0) {
        "contradicted"
    } else if best.iter().all(|d| d.estimate.hi < 0.0) {
        "supported"
    } else {
        "inconclusive"
    };
    let detail = if best.len() < baselines.len() {
        format!("needs all four baselines beside whale; ran {}", best.len())
    } else {
        format!("best mean@k, baseline minus whale: {}", shown.join("; "))
    };
    Verdict { finding: "(a) WHALE beats weight-only, harness-only, fast-slow and sequential", status, detail }
}

/// The training rollouts `arm` took in each seed to first reach `target(seed)`; a seed that
/// never reached it counts with everything it spent (censored: never fewer than it needed).
fn rollouts_to(per_seed: &[Vec<Series>], arm: &str, target: impl Fn(&[Series]) -> Option<f64>) -> Vec<Option<f64>> {
    per_seed
        .iter()
        .map(|runs| {
            let series = find(runs, arm)?;
            let reached = series.rollouts_to_reach(target(runs)?);
            Some(reached.unwrap_or_else(|| series.ledger.training_rollouts()) as f64)
        })
        .collect()
}

/// The mean over seeds of `a - b` with a bootstrap interval over seeds; `None` unless both are
/// known in every seed.
fn seed_difference(a: &[Option<f64>], b: &[Option<f64>]) -> Option<Estimate> {
    let pairs: Vec<Vec<f64>> = a.iter().zip(b).map(|(a, b)| Some(vec![(*a)? - (*b)?])).collect::<Option<_>>()?;
    (!pairs.is_empty()).then(|| bootstrap_nested_mean(&pairs, RESAMPLES, BOOTSTRAP_SEED))
}

fn best_of(runs: &[Series], arm: &str) -> Option<f64> {
    Some(find(runs, arm)?.best_and_final()?.0.mean.value)
}

fn status_of(estimate: &Estimate, favourable_above_zero: bool) -> &'static str {
    let (favourable, against) = if favourable_above_zero {
        (estimate.lo > 0.0, estimate.hi < 0.0)
    } else {
        (estimate.hi < 0.0, estimate.lo > 0.0)
    };
    match (favourable, against) {
        (true, _) => "supported",
        (_, true) => "contradicted",
        _ => "inconclusive",
    }
}

/// Finding (b): the bottleneck depends on the domain. In search QA, harness-only reaches the
/// weight-only peak with fewer rollouts than weight-only (weight-only's minus harness-only's,
/// over seeds, above zero). In math, harness gains appear only after weight updates: in the
/// coupling matrix, the last accepted harness's gain over the initial one is larger under the
/// last weights than under the starting ones (that interaction, per task, pooled over seeds,
/// above zero). The paper states no bottleneck for chess; its numbers are reported.
pub fn bottleneck(domain: &str, per_seed: &[Vec<Series>], couplings: &[SeedCoupling]) -> Verdict {
    let peak = |runs: &[Series]| best_of(runs, "weight-only");
    let weight_only = rollouts_to(per_seed, "weight-only", peak);
    let harness_only = rollouts_to(per_seed, "harness-only", peak);
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
    let (finding, status, detail) = match domain {
        "qa" => (
            "(b) search QA: harness-only reaches the weight-only peak with fewer rollouts",
            search_first.as_ref().map_or("inconclusive", |e| status_of(e, true)),
            format!("{search_text}; {interaction_text}"),
        ),
        "math" => (
            "(b) math: harness gains appear only after weight updates",
            interaction.as_ref().map_or("inconclusive", |(e, _, _)| status_of(e, true)),
            format!("{interaction_text}; {search_text}"),
        ),
        _ => (
            "(b) the paper states no bottleneck for this domain",
            "inconclusive",
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

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// Finding (c): small alternating steps beat sequential, in final accuracy (sequential minus
/// WHALE on final mean@k below zero) and in rollouts (to reach sequential's best mean@k,
/// sequential's minus WHALE's above zero). Supported when both hold, contradicted when either
/// is reversed with its interval.
pub fn alternating_beats_sequential(per_seed: &[Vec<Series>], differences: &[Difference]) -> Verdict {
    let finding = "(c) small alternating steps beat sequential, in final accuracy and in rollouts";
    let last = differences.iter().find(|d| d.arm == Condition::Sequential.as_str() && d.metric == "final");
    let target = |runs: &[Series]| best_of(runs, "sequential");
    let rollouts =
        seed_difference(&rollouts_to(per_seed, "sequential", target), &rollouts_to(per_seed, "whale", target));
    let (Some(last), Some(rollouts)) = (last, rollouts) else {
        return Verdict {
            finding,
            status: "inconclusive",
            detail: "needs whale and sequential in every seed".to_string(),
        };
    };
    let (accuracy, spend) = (status_of(&last.estimate, false), status_of(&rollouts, true));
    let status = if accuracy == "contradicted" || spend == "contradicted" {
        "contradicted"
    } else if accuracy == "supported" && spend == "supported" {
        "supported"
    } else {
        "inconclusive"
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

fn signed(estimate: &Estimate) -> String {
    format!("{:+.3} [{:+.3}, {:+.3}]", estimate.value, estimate.lo, estimate.hi)
}

/// One figure of a config: its file stem under `figures/` and its SVG.
struct Figure {
    stem: String,
    svg: String,
}

/// Every figure of one config: the curves, the forest plot, one heat map per coupling matrix.
fn figures_of(domain: &DomainStudy) -> Result<Vec<Figure>, StudyError> {
    let title = format!("{} ({}), seeds {:?}", domain.name, domain.domain, domain.seeds);
    let rows: Vec<ForestRow> = domain
        .differences
        .iter()
        .map(|d| ForestRow {
            label: format!("{} ({})", d.arm, d.metric),
            value: d.estimate.value,
            lo: d.estimate.lo,
            hi: d.estimate.hi,
        })
        .collect();
    let mut figures = vec![
        Figure { stem: format!("{}-curves", domain.name), svg: figures::curves_svg(&title, domain.k, &domain.curves)? },
        Figure { stem: format!("{}-forest", domain.name), svg: figures::forest_svg(&title, &rows)? },
    ];
    for SeedCoupling { seed, matrix: coupling } in &domain.couplings {
        let title = format!(
            "{}, seed {seed}: test mean@{} of each accepted harness under each weights",
            domain.name, coupling.k
        );
        let svg = figures::heat_map_svg(&title, coupling)?;
        figures.push(Figure { stem: format!("{}-coupling-seed-{seed}", domain.name), svg });
    }
    Ok(figures)
}

/// Writes `study.json`, `report.html` and `figures/<config>-*.png` into `root`.
pub fn write(study: &Study, root: &Path) -> Result<(), StudyError> {
    let mut page = String::new();
    let dir = root.join("figures");
    std::fs::create_dir_all(&dir).map_err(|e| StudyError::Write { path: dir.clone(), reason: e.to_string() })?;
    for domain in &study.domains {
        let figures = figures_of(domain)?;
        for figure in &figures {
            let path = dir.join(format!("{}.png", figure.stem));
            let png = figures::png(&figure.svg)?;
            write_atomic(&path, &png).map_err(|e| StudyError::Write { path, reason: e.to_string() })?;
        }
        page.push_str(&domain_html(domain, &figures));
    }
    let json = serde_json::to_string_pretty(study).unwrap_or_default();
    for (file, text) in [("study.json", json), ("report.html", html(study, &page))] {
        let path = root.join(file);
        write_atomic(&path, text.as_bytes()).map_err(|e| StudyError::Write { path, reason: e.to_string() })?;
    }
    Ok(())
}

/// The study as plain text: per config, the paired differences, the coupling matrices and the
/// verdicts.
pub fn text(study: &Study) -> String {
    let mut out = String::new();
    for domain in &study.domains {
        let _ = writeln!(out, "{} ({}), seeds {:?}", domain.name, domain.domain, domain.seeds);
        let _ = writeln!(
            out,
            "  {:<22} {:<6} {:>28} {:>8} {:>7} {:>14}",
            "condition - whale", "metric", "paired [95% CI]", "seeds", "tasks", "tasks for ±0.03"
        );
        for d in &domain.differences {
            let seeds = format!("{}/{}", d.seeds_agreeing, d.seeds);
            let _ = writeln!(
                out,
                "  {:<22} {:<6} {:>28} {:>8} {:>7} {:>14}",
                d.arm,
                d.metric,
                signed(&d.estimate),
                seeds,
                d.tasks,
                sized(d)
            );
        }
        let _ = writeln!(out, "  {:<22} {:>28} {:>8}", "condition", "final - start [95% CI]", "seeds");
        for m in &domain.movements {
            let seeds = format!("{}/{}", m.seeds_agreeing, m.seeds);
            let _ = writeln!(out, "  {:<22} {:>28} {:>8}", m.arm, signed(&m.estimate), seeds);
        }
        for SeedCoupling { seed, matrix: coupling } in &domain.couplings {
            let _ = writeln!(out, "  coupling matrix, seed {seed}:");
            for line in coupling.text().lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
        for verdict in &domain.verdicts {
            let _ = writeln!(out, "  {}: {} ({})", verdict.finding, verdict.status, verdict.detail);
        }
    }
    out
}

/// The projected test tasks per seed, or where only more seeds would do, how many.
fn sized(difference: &Difference) -> String {
    match (difference.tasks_for_target, difference.seeds_for_target) {
        (Some(tasks), _) => tasks.to_string(),
        (None, Some(seeds)) => format!("{seeds} seeds"),
        (None, None) => "more seeds".to_string(),
    }
}

fn domain_html(domain: &DomainStudy, figures: &[Figure]) -> String {
    let mut body = format!("<h2>{} ({})</h2>\n<ul>\n", domain.name, domain.domain);
    for verdict in &domain.verdicts {
        let _ = writeln!(body, "<li><b>{}</b>: {} — {}</li>", verdict.finding, verdict.status, verdict.detail);
    }
    body.push_str("</ul>\n");
    for figure in figures {
        let _ = writeln!(body, "<div>{}</div>", figure.svg);
    }
    body.push_str("<table><tr><th>condition − whale</th><th>metric</th>");
    let _ = writeln!(
        body,
        "<th>paired difference [95% CI]</th><th>seeds agreeing</th><th>test tasks</th>\
         <th>tasks for ±{TARGET_HALF_WIDTH} (projected)</th></tr>"
    );
    for d in &domain.differences {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td></tr>",
            d.arm,
            d.metric,
            signed(&d.estimate),
            d.seeds_agreeing,
            d.seeds,
            d.tasks,
            sized(d)
        );
    }
    body.push_str(
        "</table>\n<table><tr><th>condition</th><th>final − start [95% CI]</th><th>seeds agreeing</th></tr>\n",
    );
    for m in &domain.movements {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}/{}</td></tr>",
            m.arm,
            signed(&m.estimate),
            m.seeds_agreeing,
            m.seeds
        );
    }
    body.push_str("</table>\n<table><tr><th>condition</th><th>rollouts to the weight-only peak, per seed</th></tr>\n");
    for peak in &domain.peak_rollouts {
        let cells: Vec<String> =
            peak.per_seed.iter().map(|r| r.map_or("not reached".to_string(), |r| r.to_string())).collect();
        let _ = writeln!(body, "<tr><td>{}</td><td>{}</td></tr>", peak.arm, cells.join(", "));
    }
    body.push_str("</table>\n");
    body
}

fn html(study: &Study, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>whale study</title><style>body{{font-family:sans-serif}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style></head>\
         <body><h1>whale study</h1><p>seeds {:?}{}; differences paired over test tasks, pooled over seeds \
         (bootstrap over seeds, then tasks within seeds). Curves: the mean over seeds, the band their range. \
         Coupling: each harness the WHALE run accepted, scored on the test split under each weights it held at \
         a phase boundary.</p>\n{body}</body></html>\n",
        study.seeds,
        if study.quick { ", --quick" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn difference(arm: &str, value: f64, lo: f64, hi: f64) -> Difference {
        Difference {
            arm: arm.to_string(),
            metric: "best",
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
        let baselines = ["weight-only", "harness-only", "fast-slow", "sequential"];
        let tied: Vec<Difference> = baselines.iter().map(|arm| difference(arm, 0.0, 0.0, 0.0)).collect();
        assert_eq!(whale_beats_the_baselines(&tied).status, "inconclusive", "conditions that tie decide nothing");
        let below: Vec<Difference> = baselines.iter().map(|arm| difference(arm, -0.05, -0.08, -0.02)).collect();
        assert_eq!(whale_beats_the_baselines(&below).status, "supported");
        let mut one_above = below.clone();
        one_above[1] = difference("harness-only", 0.06, 0.03, 0.09);
        let verdict = whale_beats_the_baselines(&one_above);
        assert_eq!(verdict.status, "contradicted");
        assert!(verdict.detail.contains("harness-only +0.060 [+0.030, +0.090]"), "{}", verdict.detail);
        let mut straddling = below.clone();
        straddling[2] = difference("fast-slow", -0.01, -0.04, 0.02);
        assert_eq!(whale_beats_the_baselines(&straddling).status, "inconclusive");
        assert_eq!(whale_beats_the_baselines(&below[..3]).status, "inconclusive", "a baseline missing");
    }

    /// A run of `arm` whose curve is `(rollouts, mean@k)` and that spent `spent` rollouts.
    fn run(arm: &str, curve: &[(u64, f64)], spent: u64) -> Series {
        let mut ledger = whale_core::Ledger::default();
        ledger.record(whale_core::Purpose::WeightPhase, whale_core::Spend { rollouts: spent, ..Default::default() });
        let points = curve
            .iter()
            .map(|&(rollouts, mean)| crate::report::CurvePoint {
                training_rollouts: rollouts,
                mean: Estimate { value: mean, lo: mean, hi: mean },
                pass: mean,
                maj: mean,
                k: 8,
                task_means: Vec::new(),
            })
            .collect();
        Series {
            label: arm.to_string(),
            condition: None,
            dir: PathBuf::from("seed").join(arm),
            points,
            boundaries: Vec::new(),
            ledger,
            finished: true,
        }
    }

    fn matrix(cells: [[f64; 2]; 2]) -> SeedCoupling {
        use crate::coupling::{AcceptedHarness, Cell, WeightsColumn};
        let harness = |i: usize| AcceptedHarness { id: format!("c{i}"), hash: format!("h{i}"), iteration: i as u64 };
        let weights = |v: u64| WeightsColumn { version: v, dir: PathBuf::from(format!("v{v}")) };
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
                run("weight-only", &[(0, 0.1), (400, 0.3)], 512),
                run("harness-only", &[(0, 0.1), (harness_only_at, 0.3)], 512),
            ]
        };
        let early = [seed(100), seed(150)];
        let verdict = bottleneck("qa", &early, &[]);
        assert_eq!(verdict.status, "supported", "{}", verdict.detail);
        assert!(verdict.detail.contains("+275 [+250, +300]"), "{}", verdict.detail);
        let late = [seed(500), seed(450)];
        assert_eq!(bottleneck("qa", &late, &[]).status, "contradicted");
        let never = [early[0].clone(), vec![early[0][0].clone(), run("harness-only", &[(0, 0.1)], 512)]];
        assert_eq!(bottleneck("qa", &never, &[]).status, "inconclusive", "not reached counts as everything spent");

        let weights_first = [matrix([[0.2, 0.3], [0.2, 0.5]]), matrix([[0.1, 0.3], [0.12, 0.45]])];
        let verdict = bottleneck("math", &early, &weights_first);
        assert_eq!(verdict.status, "supported", "{}", verdict.detail);
        assert!(verdict.detail.contains("gain at the start +0.010"), "{}", verdict.detail);
        let additive = [matrix([[0.2, 0.3], [0.3, 0.4]])];
        assert_eq!(
            bottleneck("math", &early, &additive).status,
            "inconclusive",
            "a harness gain that needs no training"
        );
        assert_eq!(bottleneck("math", &early, &[]).status, "inconclusive", "no matrix, no verdict");
        assert_eq!(bottleneck("chess", &early, &weights_first).status, "inconclusive");
    }

    #[test]
    fn finding_c_needs_whale_ahead_of_sequential_in_final_accuracy_and_in_rollouts() {
        let seed = |whale_at: u64| {
            vec![
                run("whale", &[(0, 0.1), (whale_at, 0.4), (500, 0.45)], 512),
                run("sequential", &[(0, 0.1), (400, 0.4)], 512),
            ]
        };
        let mut last = difference("sequential", -0.05, -0.08, -0.02);
        last.metric = "final";
        let verdict = alternating_beats_sequential(&[seed(200), seed(300)], std::slice::from_ref(&last));
        assert_eq!(verdict.status, "supported", "{}", verdict.detail);
        assert_eq!(
            alternating_beats_sequential(&[seed(450), seed(480)], std::slice::from_ref(&last)).status,
            "contradicted",
            "whale needed more rollouts"
        );
        let tied = difference("sequential", 0.0, -0.03, 0.03);
        let tied = Difference { metric: "final", ..tied };
        assert_eq!(alternating_beats_sequential(&[seed(200), seed(300)], &[tied]).status, "inconclusive");
        assert_eq!(alternating_beats_sequential(&[seed(200)], &[]).status, "inconclusive", "no final difference");
    }

    fn with_task_means(arm: &str, start: &[f64], last: &[f64]) -> Series {
        let mut series = run(arm, &[(0, mean(start)), (64, mean(last))], 64);
        series.points[0].task_means = start.to_vec();
        series.points[1].task_means = last.to_vec();
        series
    }

    #[test]
    fn a_movement_is_final_minus_start_paired_over_tasks_and_pooled_over_seeds() {
        let seeds = vec![
            vec![with_task_means("weight-only", &[0.0, 0.5, 1.0], &[0.5, 0.5, 1.0])],
            vec![with_task_means("weight-only", &[0.0, 0.0, 0.0, 0.0], &[0.0, 0.25, 0.0, 0.25])],
        ];
        let moved = movement(&seeds, "weight-only").expect("both seeds have a start and an end");
        let expected = (0.5 / 3.0 + 0.5 / 4.0) / 2.0;
        assert!((moved.estimate.value - expected).abs() < 1e-12, "{moved:?}");
        assert!(moved.estimate.lo >= 0.0 && moved.estimate.hi <= 0.5, "no task moved down: {moved:?}");
        assert_eq!((moved.seeds_agreeing, moved.seeds), (2, 2));
        assert!(movement(&seeds, "harness-only").is_none(), "an arm that did not run");
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

    #[test]
    fn quick_shrinks_splits_and_budget_and_keeps_the_rest() {
        let config = RunConfig::default();
        let small = quick(config.clone());
        assert_eq!((small.tasks.search, small.tasks.test, small.eval.k), (16, 32, 4));
        assert_eq!((small.schedule.weight_steps, small.schedule.search_iterations), (2, 2));
        assert_eq!(small.schedule.budget, (config.schedule.budget / 8).max(128));
        assert_eq!(
            (small.seed, small.condition, small.tasks.domain),
            (config.seed, config.condition, config.tasks.domain)
        );
    }
}
