//! `whale compare`: every condition on the same tasks, seeds, model and rollout budget, each in
//! its own run directory `runs/<name>/<condition>/`, and one report over them all.
//!
//! The conditions run one after the other (they would only compete for the same cores), and
//! an evaluation of the base weights one condition took (the start of every curve: same model,
//! same harness, same seeds) is handed to the next instead of being repeated. A
//! comparison interrupted at any point continues where it stopped when run again: finished
//! conditions are kept, an unfinished one resumes from its last completed unit. Beside the
//! report, `curves.png` draws every condition's test mean@k against its training rollouts.

use crate::figures::{self, BandCurve, FigureError};
use crate::report::{self, ReportError, Series};
use std::path::{Path, PathBuf};
use std::time::Instant;
use whale_loop::condition::Condition;
use whale_loop::config::{Algorithm, RunConfig, WeightConfig};
use whale_loop::experiment::{Experiment, ExperimentError, Verbosity};
use whale_loop::lock::{DirLock, LockError};
use whale_loop::run_dir::{EvalMemo, RunDir, CONFIG_FILE, REPORT_FILE};

/// One arm of a comparison: a condition, with the config's weight-phase algorithm or another
/// one (`weight-only:grpo`), so that RFT and a policy gradient can run side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arm {
    pub condition: Condition,
    pub algorithm: Option<Algorithm>,
}

impl Arm {
    /// The arm's run directory name: `weight-only`, or `weight-only-grpo`.
    pub fn name(&self) -> String {
        match self.algorithm {
            None => self.condition.to_string(),
            Some(algorithm) => format!("{}-{}", self.condition, algorithm.as_str()),
        }
    }

    /// The config of this arm's run.
    pub fn config(&self, config: &RunConfig) -> RunConfig {
        let algorithm = self.algorithm.unwrap_or(config.weights.algorithm);
        RunConfig {
            condition: self.condition,
            weights: WeightConfig { algorithm, ..config.weights.clone() },
            ..config.clone()
        }
    }
}

impl From<Condition> for Arm {
    fn from(condition: Condition) -> Self {
        Self { condition, algorithm: None }
    }
}

impl std::fmt::Display for Arm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Arm {
    type Err = String;

    /// `CONDITION` or `CONDITION:ALGORITHM` (rft, grpo, rloo).
    fn from_str(text: &str) -> Result<Self, String> {
        let (condition, algorithm) = match text.split_once(':') {
            None => (text, None),
            Some((condition, algorithm)) => {
                let algorithm = match algorithm {
                    "rft" => Algorithm::Rft,
                    "grpo" => Algorithm::Grpo,
                    "rloo" => Algorithm::Rloo,
                    other => return Err(format!("unknown algorithm `{other}` (expected rft, grpo or rloo)")),
                };
                (condition, Some(algorithm))
            }
        };
        let condition: Condition = condition.parse()?;
        if condition == Condition::FastSlow && algorithm == Some(Algorithm::Rft) {
            return Err(
                "fast-slow trains its slow weights with a policy gradient: fast-slow:grpo or fast-slow:rloo".into()
            );
        }
        Ok(Self { condition, algorithm })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{arm}: {source}")]
    Run { arm: Arm, source: ExperimentError },
    /// The report of one arm's finished run.
    #[error("{arm}: {source}")]
    RunReport { arm: Arm, source: ReportError },
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("{path}: {source}")]
    Figure { path: PathBuf, source: FigureError },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    /// One run directory per arm: an arm given twice would be reported twice.
    #[error("the condition `{0}` is given twice")]
    DuplicateArm(Arm),
}

/// What a comparison produced.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub root: PathBuf,
    pub series: Vec<Series>,
    pub report: PathBuf,
    /// `curves.png`: test mean@k against training rollouts, a line per arm.
    pub curves: PathBuf,
    /// Seconds per arm spent in this invocation.
    pub seconds: Vec<(Arm, f64)>,
}

/// Where an arm of a comparison stands, for whoever shows progress ([`compare_with`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArmEvent {
    /// The arm starts running, or resumes; `index` counts from 0 among `total`.
    Started { arm: Arm, index: usize, total: usize },
    /// The arm's run finished in this invocation, after `seconds`.
    Finished { arm: Arm, seconds: f64 },
}

/// Runs (or resumes, or keeps) each of `arms` under `root` and writes `root/report.html`,
/// holding `root`'s lock throughout (and each run's while it runs).
pub fn compare(
    config: &RunConfig,
    root: &Path,
    arms: &[Arm],
    verbosity: Verbosity,
) -> Result<Comparison, CompareError> {
    compare_with(config, root, arms, verbosity, &mut |_| {})
}

/// The first item equal to one before it.
pub(crate) fn repeated<T: PartialEq>(items: &[T]) -> Option<&T> {
    items.iter().enumerate().find(|&(index, item)| items[..index].contains(item)).map(|(_, item)| item)
}

/// [`compare`], telling `on_arm` when each arm it runs starts and ends (an arm that had
/// finished before is kept, not run, and not told).
pub fn compare_with(
    config: &RunConfig,
    root: &Path,
    arms: &[Arm],
    verbosity: Verbosity,
    on_arm: &mut dyn FnMut(ArmEvent),
) -> Result<Comparison, CompareError> {
    if let Some(&arm) = repeated(arms) {
        return Err(CompareError::DuplicateArm(arm));
    }
    let _lock = DirLock::create(root)?;
    let mut seconds = Vec::new();
    let mut base_evals: Vec<EvalMemo> = Vec::new();
    for dir in report::run_dirs(root).unwrap_or_default() {
        add_base_evals(config, &dir, &mut base_evals);
    }
    for (index, &arm) in arms.iter().enumerate() {
        let started = Instant::now();
        let dir = root.join(arm.name());
        let state = RunDir::open(&dir).and_then(|d| d.read_state()).ok();
        let run_config = arm.config(config);
        let wrap = |source| CompareError::Run { arm, source };
        if state.as_ref().is_some_and(|s| s.finished) {
            Experiment::check_stored_config(&run_config, &dir).map_err(wrap)?;
        } else {
            on_arm(ArmEvent::Started { arm, index, total: arms.len() });
            let mut experiment =
                Experiment::create_or_resume(run_config, &dir, verbosity, base_evals.clone()).map_err(wrap)?;
            experiment.run().map_err(wrap)?;
            report::write_run_report(experiment.dir()).map_err(|source| CompareError::RunReport { arm, source })?;
            on_arm(ArmEvent::Finished { arm, seconds: started.elapsed().as_secs_f64() });
        }
        add_base_evals(config, &dir, &mut base_evals);
        seconds.push((arm, started.elapsed().as_secs_f64()));
    }
    let report = root.join(REPORT_FILE);
    let title = format!("whale compare: {}", config.name);
    let series = report::write_report(&[root.to_path_buf()], &report, &title)?;
    let curves = root.join(CURVES_FILE);
    write_curves(&series, &title, config.eval.k, &curves)?;
    Ok(Comparison { root: root.to_path_buf(), series, report, curves, seconds })
}

/// The comparison's picture, beside its report.
pub const CURVES_FILE: &str = "curves.png";

/// Draws each series' test mean@k against its training rollouts into the PNG `path`.
fn write_curves(series: &[Series], title: &str, k: usize, path: &Path) -> Result<(), CompareError> {
    let curves: Vec<BandCurve> = series
        .iter()
        .map(|s| {
            let points = s.points.iter().map(|p| (p.training_rollouts, p.mean.value)).collect();
            BandCurve::over_seeds(&s.label, &[points])
        })
        .collect();
    let figure = |source| CompareError::Figure { path: path.to_path_buf(), source };
    let png = figures::curves_svg(title, k, &curves).and_then(|svg| figures::png(&svg)).map_err(figure)?;
    std::fs::write(path, png).map_err(|source| CompareError::Write { path: path.to_path_buf(), source })
}

/// Adds the evaluations of the base weights of the finished run in `dir` to `memos`, if it is a
/// run of `config` under some condition and algorithm (a run left from a comparison of another
/// config evaluated other tasks, seeds or sampling): the runs of one comparison share them.
fn add_base_evals(config: &RunConfig, dir: &Path, memos: &mut Vec<EvalMemo>) {
    let Ok(stored) = RunConfig::load(&dir.join(CONFIG_FILE)) else {
        return;
    };
    let arm = Arm { condition: stored.condition, algorithm: Some(stored.weights.algorithm) };
    if Experiment::check_stored_config(&arm.config(config), dir).is_err() {
        return;
    }
    let state = RunDir::open(dir).and_then(|d| d.read_state()).ok().filter(|state| state.finished);
    for memo in state.into_iter().flat_map(|s| s.evals).filter(|m| m.weights_version == 0) {
        if !memos.contains(&memo) {
            memos.push(memo);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arm_given_twice_is_refused_before_anything_is_made() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("comparison");
        let arms: Vec<Arm> = ["whale", "weight-only", "whale"].iter().map(|arm| arm.parse().expect("an arm")).collect();
        let error =
            compare(&RunConfig::default(), &dir, &arms, Verbosity { progress: false }).expect_err("whale twice");
        assert_eq!(error.to_string(), "the condition `whale` is given twice");
        assert!(!dir.exists(), "nothing is created");
    }

    #[test]
    fn an_arm_is_a_condition_with_an_optional_algorithm() {
        let arm: Arm = "weight-only:grpo".parse().expect("an arm");
        assert_eq!(arm, Arm { condition: Condition::WeightOnly, algorithm: Some(Algorithm::Grpo) });
        assert_eq!(arm.name(), "weight-only-grpo");
        let config = RunConfig::default();
        assert_eq!(arm.config(&config).weights.algorithm, Algorithm::Grpo);
        assert_eq!(arm.config(&config).condition, Condition::WeightOnly);
        let plain: Arm = "whale".parse().expect("an arm");
        assert_eq!((plain.name(), plain.config(&config).weights.algorithm), ("whale".to_string(), Algorithm::Rft));
        assert!("whale:ppo".parse::<Arm>().expect_err("unknown").contains("expected rft, grpo or rloo"));
        assert!("nothing:grpo".parse::<Arm>().expect_err("unknown").contains("unknown condition"));
        assert!("fast-slow:rft".parse::<Arm>().expect_err("fast-slow learns by RL").contains("policy gradient"));
    }
}
