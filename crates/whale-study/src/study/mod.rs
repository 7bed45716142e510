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
//! When an arm is done, its [`result`] file is written (a seed of a real model can outlast
//! the machine), and when a seed is done, its own; everything the study reports is computed
//! from those files alone: a study grows across machines by copying result files into
//! one results directory, where a (config, seed) with a file is never run again, and
//! `study.json`, `report.html` and `figures/*.png` can be rewritten from the files at any time.

mod error;
mod render;
pub mod result;
mod statistics;
mod summary;
mod verdicts;

pub use error::StudyError;
pub use render::{text, write};
pub use result::{
    arm_path, result_path, ArmProvenance, ArmResult, Evaluation, SeedResult, WhaleBuild, ARMS_DIR, RESULTS_DIR,
};
pub use statistics::{
    seeds_for_target, tasks_for_target, Difference, Metric, Movement, PeakRollouts, SeedCoupling, TARGET_HALF_WIDTH,
};
pub use summary::{domain_study, ArmSoFar, DomainStudy, SeedProvenance, Study, UnfinishedSeed};
pub use verdicts::{alternating_beats_sequential, bottleneck, whale_beats_the_baselines, Status, Verdict};

use crate::compare::{self, repeated, Arm, ArmEvent};
use crate::coupling::{self, Coupling, CouplingError, COUPLING_FILE};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use result::Expected;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;
use whale_loop::condition::Condition;
use whale_loop::config::RunConfig;
use whale_loop::experiment::Verbosity;
use whale_loop::lock::DirLock;
use whale_loop::run_dir::read_json;

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

/// Runs (or resumes) every arm of every config under every seed that has no result file in
/// `results`, writing each arm's file there as it finishes (and skipping an arm whose file is
/// there), and each seed's file once all its arms have one; then writes `root/study.json`,
/// `root/report.html` and the figures from the files. Every file already in `results` (the seed
/// files, and the arm files of the seeds to run) is checked first, so that one of another config
/// stops the study before it runs anything. Seeds are the outer loop, and the WHALE run's
/// coupling matrix follows it at once (its phase weights stay on this machine only), so a study
/// stopped early has every config on the seeds it finished and, on the seed it was in, the file
/// of every arm it finished. `root` and `results` stay
/// locked throughout ([`DirLock`]; two studies with different `--runs` and one `--results`
/// would otherwise run the same arms twice), each comparison and coupling matrix under its own
/// directory's lock too.
pub fn run(plan: &StudyPlan, root: &Path, results: &Path, verbosity: Verbosity) -> Result<Study, StudyError> {
    check_plan(plan)?;
    let has_whale = plan.arms.contains(&Arm::from(Condition::Whale));
    if has_whale {
        check_phase_weights(&plan.configs)?;
    }
    let _lock = DirLock::create(root)?;
    let _results_lock = results_lock(root, results)?;
    let pending = pending(plan, results)?;
    remove_joined_arm_files(plan, results)?;
    let bar = progress_bar((pending.len() * (plan.arms.len() + usize::from(has_whale))) as u64, verbosity.progress);
    let progress =
        Progress { bar: &bar, lines: verbosity.progress && !std::io::stderr().is_terminal(), since: Instant::now() };
    for config in &pending {
        let mut parts = Vec::new();
        for (index, &arm) in plan.arms.iter().enumerate() {
            parts.push(arm_result(plan, config, (index, arm), root, results, &progress)?);
        }
        if let Some(result) = SeedResult::joined(parts, results)? {
            result.write(&result_path(results, &config.name, config.seed))?;
            remove_arm_files(plan, results, config)?;
        }
    }
    bar.finish_and_clear();
    let study = read(plan, results)?;
    write(&study, root)?;
    Ok(study)
}

/// The lock on `results`, unless it is `root` itself (already locked by this process: a second
/// `flock` on the same file would refuse it).
fn results_lock(root: &Path, results: &Path) -> Result<Option<DirLock>, StudyError> {
    std::fs::create_dir_all(results)
        .map_err(|e| StudyError::Write { path: results.to_path_buf(), reason: e.to_string() })?;
    if canonical(root)? == canonical(results)? {
        return Ok(None);
    }
    Ok(Some(DirLock::acquire(results)?))
}

fn canonical(path: &Path) -> Result<PathBuf, StudyError> {
    path.canonicalize().map_err(|e| StudyError::Read { path: path.to_path_buf(), reason: e.to_string() })
}

/// The file of the `index`th arm of `config` (seeded): read if it is in `results`, else
/// written there once the arm's run (run or resumed now, or finished before) and, for the
/// WHALE arm, its coupling matrix are done.
fn arm_result(
    plan: &StudyPlan,
    config: &RunConfig,
    (index, arm): (usize, Arm),
    root: &Path,
    results: &Path,
    progress: &Progress,
) -> Result<SeedResult, StudyError> {
    let (name, seed) = (config.name.as_str(), config.seed);
    let is_whale = arm == Arm::from(Condition::Whale);
    let path = arm_path(results, name, seed, arm);
    if path.is_file() {
        progress.bar.inc(1 + u64::from(is_whale));
        return SeedResult::read_arm(&path, &Expected::of(config, &plan.arms)?, arm);
    }
    let started = Instant::now();
    let dir = seed_dir(root, name, seed);
    // A run's own lines (one per unit) go to a log, not under the bar on a terminal.
    let lines = Verbosity { progress: progress.lines };
    let mut on_arm = |event| progress.arm(name, seed, event, (index, plan.arms.len()));
    compare::compare_with(config, &dir, &[arm], lines, &mut on_arm).map_err(|source| StudyError::Compare {
        config: name.to_string(),
        seed,
        source: Box::new(source),
    })?;
    progress.bar.inc(1);
    let mut matrix = None;
    if is_whale {
        progress.say(format!("{name} seed {seed}: coupling matrix"));
        let whale = dir.join(Condition::Whale.as_str());
        matrix = Some(coupling_of(&whale).map_err(|source| StudyError::Coupling {
            config: name.to_string(),
            seed,
            source: Box::new(source),
        })?);
        progress.bar.inc(1);
    }
    let part = SeedResult::of_arm(config, arm, &dir, matrix, started.elapsed().as_secs_f64())?;
    part.write(&path)?;
    progress.say(format!("{name} seed {seed}: {arm}'s result in {} (commit it to keep it)", path.display()));
    Ok(part)
}

/// Removes the arm files of every (config, seed) whose seed file is in `results` (a study
/// killed between writing a seed's file and removing its arms' leaves them).
fn remove_joined_arm_files(plan: &StudyPlan, results: &Path) -> Result<(), StudyError> {
    for &seed in &plan.seeds {
        for config in &plan.configs {
            let config = seeded(config, seed, plan.quick);
            if result_path(results, &config.name, seed).is_file() {
                remove_arm_files(plan, results, &config)?;
            }
        }
    }
    Ok(())
}

fn remove_arm_files(plan: &StudyPlan, results: &Path, config: &RunConfig) -> Result<(), StudyError> {
    for &arm in &plan.arms {
        let path = arm_path(results, &config.name, config.seed, arm);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StudyError::Write { path, reason: e.to_string() });
            }
            _ => {}
        }
    }
    // The directory goes once it is empty; a failure only means it is not.
    let _ = std::fs::remove_dir(results.join(ARMS_DIR));
    Ok(())
}

/// The configs, seeded, of every (config, seed) without a result file in `results`, seeds the
/// outer loop; every file there is read and checked on the way, a pending seed's arm files too.
fn pending(plan: &StudyPlan, results: &Path) -> Result<Vec<RunConfig>, StudyError> {
    let mut pending = Vec::new();
    for &seed in &plan.seeds {
        for config in &plan.configs {
            let config = seeded(config, seed, plan.quick);
            if result_of(plan, results, &config)?.is_none() {
                let parts = finished_arms(plan, results, &config)?;
                if parts.len() < plan.arms.len() {
                    SeedResult::check_split(&config, &parts, results)?;
                }
                pending.push(config);
            }
        }
    }
    Ok(pending)
}

/// The result file of `config` (seeded) in `results`, refused unless it is this study's; `None`
/// when there is none.
fn result_of(plan: &StudyPlan, results: &Path, config: &RunConfig) -> Result<Option<SeedResult>, StudyError> {
    let path = result_path(results, &config.name, config.seed);
    if !path.is_file() {
        return Ok(None);
    }
    SeedResult::read(&path, &Expected::of(config, &plan.arms)?).map(Some)
}

/// The coupling matrix of the finished run in `run`, under its lock, as its file holds it (so
/// that a matrix finished now and one finished before a kill are read alike).
fn coupling_of(run: &Path) -> Result<Coupling, CouplingError> {
    let lock = DirLock::acquire(run)?;
    coupling::compute(&lock, false)?;
    Ok(read_json(&run.join(COUPLING_FILE))?)
}

/// Refuses two configs of one name, and a seed or an arm given twice (it would count twice).
fn check_plan(plan: &StudyPlan) -> Result<(), StudyError> {
    let names: Vec<&str> = plan.configs.iter().map(|config| config.name.as_str()).collect();
    if let Some(name) = repeated(&names) {
        return Err(StudyError::DuplicateName(name.to_string()));
    }
    if let Some(&seed) = repeated(&plan.seeds) {
        return Err(StudyError::DuplicateSeed(seed));
    }
    match repeated(&plan.arms) {
        Some(arm) => Err(StudyError::DuplicateArm(arm.name())),
        None => Ok(()),
    }
}

/// Before anything runs: every config trained in-process keeps the phase weights its WHALE
/// run's coupling matrix is scored under, so that a study does not stop hours in, at its first
/// matrix.
fn check_phase_weights(configs: &[RunConfig]) -> Result<(), StudyError> {
    match configs.iter().find(|c| c.weights.trainer.is_none() && !c.weights.keep_phase_weights) {
        Some(config) => Err(StudyError::PhaseWeightsOff(config.name.clone())),
        None => Ok(()),
    }
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

/// Where the study stands: the bar's message on a terminal; elsewhere (a log file, `nohup`),
/// where the bar does not draw, a line per arm and matrix with the time since the study began,
/// and each run's line per unit, so that a study of hours shows which run it is in and how far.
struct Progress<'a> {
    bar: &'a ProgressBar,
    lines: bool,
    since: Instant,
}

impl Progress<'_> {
    fn say(&self, message: String) {
        if self.lines {
            let minutes = self.since.elapsed().as_secs() / 60;
            eprintln!("study [{}h{:02}m] {message}", minutes / 60, minutes % 60);
        }
        self.bar.set_message(message);
    }

    /// `event` of the `index`th of `total` arms (the comparison runs one arm at a time).
    fn arm(&self, name: &str, seed: u64, event: ArmEvent, (index, total): (usize, usize)) {
        match event {
            ArmEvent::Started { arm, .. } => {
                self.say(format!("{name} seed {seed}: {} ({} of {total})", arm.name(), index + 1))
            }
            ArmEvent::Finished { arm, seconds } => {
                let minutes = seconds / 60.0;
                self.say(format!("{name} seed {seed}: {} finished ({minutes:.0} min in this process)", arm.name()))
            }
        }
    }
}

fn progress_bar(total: u64, show: bool) -> ProgressBar {
    let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let style =
        ProgressStyle::with_template("study {bar:30} {pos}/{len} runs and coupling matrices, ETA {eta} ({msg})")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// The study as the result files in `results` say it went: per config, the seeds that have a
/// file, and those that have none.
pub fn read(plan: &StudyPlan, results: &Path) -> Result<Study, StudyError> {
    check_plan(plan)?;
    let mut domains = Vec::new();
    for config in &plan.configs {
        let (mut found, mut missing, mut unfinished) = (Vec::new(), Vec::new(), Vec::new());
        for &seed in &plan.seeds {
            let config = seeded(config, seed, plan.quick);
            match result_of(plan, results, &config)? {
                Some(result) => found.push(result),
                None => {
                    missing.push(seed);
                    let parts = finished_arms(plan, results, &config)?;
                    if !parts.is_empty() {
                        let coupling = parts.iter().find_map(|part| part.coupling.clone());
                        let arms = parts.iter().flat_map(|part| &part.arms).filter_map(ArmSoFar::of).collect();
                        unfinished.push(UnfinishedSeed { seed, arms, coupling });
                    }
                }
            }
        }
        let mut domain = domain_study(&config.name, config.tasks.domain, found, missing);
        domain.unfinished = unfinished;
        domains.push(domain);
    }
    Ok(Study { seeds: plan.seeds.clone(), arms: plan.arms.iter().map(Arm::name).collect(), quick: plan.quick, domains })
}

/// The files of the arms of `config` (seeded) in `results`, each checked, and checked to pair
/// with each other.
fn finished_arms(plan: &StudyPlan, results: &Path, config: &RunConfig) -> Result<Vec<SeedResult>, StudyError> {
    let expected = Expected::of(config, &plan.arms)?;
    let mut parts = Vec::new();
    for &arm in &plan.arms {
        let path = arm_path(results, &config.name, config.seed, arm);
        if path.is_file() {
            parts.push(SeedResult::read_arm(&path, &expected, arm)?);
        }
    }
    SeedResult::check_parts(&parts, results)?;
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn plan(arms: &[Condition]) -> StudyPlan {
        let arms = arms.iter().copied().map(Arm::from).collect();
        StudyPlan { configs: vec![RunConfig::default()], seeds: vec![0], arms, quick: false }
    }

    #[test]
    fn a_condition_given_twice_is_refused_by_name() {
        let results = tempfile::tempdir().expect("tempdir");
        let twice = plan(&[Condition::Whale, Condition::WeightOnly, Condition::Whale]);
        let error = read(&twice, results.path()).expect_err("whale twice");
        assert!(matches!(&error, StudyError::DuplicateArm(arm) if arm == "whale"), "{error}");
        assert!(error.to_string().contains("the condition `whale` is given twice"), "{error}");
        assert!(read(&plan(&[Condition::Whale, Condition::WeightOnly]), results.path()).is_ok());
        let seeds_twice = StudyPlan { seeds: vec![0, 1, 0], ..plan(&[Condition::Whale]) };
        let error = read(&seeds_twice, results.path()).expect_err("seed 0 twice");
        assert!(matches!(error, StudyError::DuplicateSeed(0)), "{error}");
    }

    /// A file of arm `weight-only` of `config` (seeded 0), with one evaluation of 4 tasks.
    fn arm_file(config: &RunConfig, config_hash: String, test_split: Option<String>) -> SeedResult {
        let evaluation = result::Evaluation {
            training_rollouts: 0,
            mean: whale_core::Estimate { value: 0.5, lo: 0.0, hi: 1.0 },
            pass: 0.5,
            maj: 0.5,
            k: 2,
            task_means: vec![0.5; 4],
        };
        SeedResult {
            format: result::FORMAT,
            config: config.name.clone(),
            seed: 0,
            config_hash,
            whale: WhaleBuild::this(),
            cpu: whale_core::CpuInfo::detect(),
            wall_s: 1.0,
            arms: vec![ArmResult {
                condition: Condition::WeightOnly,
                algorithm: None,
                ledger: whale_core::Ledger::default(),
                evaluations: vec![evaluation],
                ran: None,
                test_split,
            }],
            coupling: None,
            config_used: result::portable(config).expect("portable"),
        }
    }

    #[test]
    fn an_arm_file_of_another_config_is_refused_before_any_arm_runs() {
        let results = tempfile::tempdir().expect("tempdir");
        let plan = plan(&[Condition::Whale, Condition::WeightOnly]);
        assert_eq!(pending(&plan, results.path()).expect("nothing there").len(), 1);
        let mut other = RunConfig::default();
        other.schedule.budget += 1;
        let stale = arm_file(&other, "0".repeat(64), None);
        let path = arm_path(results.path(), &other.name, 0, Arm::from(Condition::WeightOnly));
        stale.write(&path).expect("written");
        let error = pending(&plan, results.path()).expect_err("a stale arm file");
        let reason = error.to_string();
        assert!(
            matches!(error, StudyError::Refused { .. }) && reason.contains(&path.display().to_string()),
            "{reason}"
        );
        assert!(reason.contains("schedule.budget = "), "{reason}");
    }

    #[test]
    fn an_arm_file_evaluated_on_another_test_split_is_refused_before_any_arm_runs() {
        let results = tempfile::tempdir().expect("tempdir");
        let plan = plan(&[Condition::Whale, Condition::WeightOnly]);
        let config = seeded(&plan.configs[0], 0, false);
        let hash = result::hash(&result::portable(&config).expect("portable"));
        let path = arm_path(results.path(), &config.name, 0, Arm::from(Condition::WeightOnly));
        let here = result::split_digest(&config).expect("a test split");
        arm_file(&config, hash.clone(), Some(here)).write(&path).expect("written");
        assert_eq!(pending(&plan, results.path()).expect("the same test split").len(), 1);
        arm_file(&config, hash, Some("f".repeat(64))).write(&path).expect("written");
        let error = pending(&plan, results.path()).expect_err("another test split");
        let reason = error.to_string();
        assert!(matches!(error, StudyError::Unpaired { .. }), "{reason}");
        assert!(
            reason.contains(&path.display().to_string()) && reason.contains("this machine's task files make"),
            "{reason}"
        );
    }
}
