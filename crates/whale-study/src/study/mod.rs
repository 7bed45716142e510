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
//! When a seed is done, its [`result`] file is written, and everything the study reports is
//! computed from those files alone: a study grows across machines by copying result files into
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
pub use result::{result_path, ArmResult, Evaluation, SeedResult, WhaleBuild, RESULTS_DIR};
pub use statistics::{
    seeds_for_target, tasks_for_target, Difference, Metric, Movement, PeakRollouts, SeedCoupling, TARGET_HALF_WIDTH,
};
pub use summary::{domain_study, DomainStudy, SeedProvenance, Study};
pub use verdicts::{alternating_beats_sequential, bottleneck, whale_beats_the_baselines, Status, Verdict};

use crate::compare::{self, Arm, ArmEvent};
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
/// `results`, writing each one's file there as it finishes; then writes `root/study.json`,
/// `root/report.html` and the figures from the files. Every file already in `results` is checked
/// first, so that one of another config stops the study before it runs anything. Seeds are the
/// outer loop, and a seed's coupling matrices follow its runs, so a study stopped early has
/// every config on the seeds it finished. `root` stays locked throughout ([`DirLock`]), each
/// comparison and coupling matrix under its own directory's lock too.
pub fn run(plan: &StudyPlan, root: &Path, results: &Path, verbosity: Verbosity) -> Result<Study, StudyError> {
    check_names(&plan.configs)?;
    let has_whale = plan.arms.contains(&Arm::from(Condition::Whale));
    if has_whale {
        check_phase_weights(&plan.configs)?;
    }
    let _lock = DirLock::create(root)?;
    let pending = pending(plan, results)?;
    let bar = progress_bar((pending.len() * (1 + usize::from(has_whale))) as u64, verbosity.progress);
    let progress =
        Progress { bar: &bar, lines: verbosity.progress && !std::io::stderr().is_terminal(), since: Instant::now() };
    for config in &pending {
        let (name, seed) = (config.name.clone(), config.seed);
        let started = Instant::now();
        let dir = seed_dir(root, &name, seed);
        // A run's own lines (one per unit) go to a log, not under the bar on a terminal.
        let arms = Verbosity { progress: progress.lines };
        let mut on_arm = |event| progress.arm(&name, seed, event);
        compare::compare_with(config, &dir, &plan.arms, arms, &mut on_arm).map_err(|source| StudyError::Compare {
            config: name.clone(),
            seed,
            source: Box::new(source),
        })?;
        bar.inc(1);
        let mut matrix = None;
        if has_whale {
            progress.say(format!("{name} seed {seed}: coupling matrix"));
            let whale = dir.join(Condition::Whale.as_str());
            matrix = Some(coupling_of(&whale).map_err(|source| StudyError::Coupling {
                config: name.clone(),
                seed,
                source: Box::new(source),
            })?);
            bar.inc(1);
        }
        let result = SeedResult::of_runs(config, &plan.arms, &dir, matrix, started.elapsed().as_secs_f64())?;
        result.write(&result_path(results, &name, seed))?;
    }
    bar.finish_and_clear();
    let study = read(plan, results)?;
    write(&study, root)?;
    Ok(study)
}

/// The configs, seeded, of every (config, seed) without a result file in `results`, seeds the
/// outer loop; every file there is read and checked on the way.
fn pending(plan: &StudyPlan, results: &Path) -> Result<Vec<RunConfig>, StudyError> {
    let mut pending = Vec::new();
    for &seed in &plan.seeds {
        for config in &plan.configs {
            let config = seeded(config, seed, plan.quick);
            if result_of(plan, results, &config)?.is_none() {
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
    SeedResult::read(&path, &Expected::of(config, &plan.arms)).map(Some)
}

/// The coupling matrix of the finished run in `run`, under its lock, as its file holds it (so
/// that a matrix finished now and one finished before a kill are read alike).
fn coupling_of(run: &Path) -> Result<Coupling, CouplingError> {
    let lock = DirLock::acquire(run)?;
    coupling::compute(&lock, false)?;
    Ok(read_json(&run.join(COUPLING_FILE))?)
}

fn check_names(configs: &[RunConfig]) -> Result<(), StudyError> {
    for (index, config) in configs.iter().enumerate() {
        if configs[..index].iter().any(|other| other.name == config.name) {
            return Err(StudyError::DuplicateName(config.name.clone()));
        }
    }
    Ok(())
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

    fn arm(&self, name: &str, seed: u64, event: ArmEvent) {
        match event {
            ArmEvent::Started { arm, index, total } => {
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
        ProgressStyle::with_template("study {bar:30} {pos}/{len} comparisons and coupling matrices, ETA {eta} ({msg})")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// The study as the result files in `results` say it went: per config, the seeds that have a
/// file, and those that have none.
pub fn read(plan: &StudyPlan, results: &Path) -> Result<Study, StudyError> {
    check_names(&plan.configs)?;
    let mut domains = Vec::new();
    for config in &plan.configs {
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for &seed in &plan.seeds {
            match result_of(plan, results, &seeded(config, seed, plan.quick))? {
                Some(result) => found.push(result),
                None => missing.push(seed),
            }
        }
        domains.push(domain_study(&config.name, config.tasks.domain, found, missing));
    }
    Ok(Study { seeds: plan.seeds.clone(), arms: plan.arms.iter().map(Arm::name).collect(), quick: plan.quick, domains })
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
}
