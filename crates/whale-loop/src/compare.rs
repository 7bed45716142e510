//! `whale compare`: every condition on the same tasks, seeds, model and rollout budget, each in
//! its own run directory `runs/<name>/<condition>/`, and one report over them all.
//!
//! The conditions run one after the other (they would only compete for the same cores), and
//! an evaluation of the base weights one condition took (the start of every curve: same model,
//! same harness, same seeds) is handed to the next instead of being repeated. A
//! comparison interrupted at any point continues where it stopped when run again: finished
//! conditions are kept, an unfinished one resumes from its last completed unit.

use crate::condition::Condition;
use crate::config::RunConfig;
use crate::experiment::{Experiment, ExperimentError, Verbosity};
use crate::report::{self, ReportError, Series};
use crate::run_dir::{EvalMemo, RunDir, REPORT_FILE};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{condition}: {source}")]
    Run { condition: Condition, source: ExperimentError },
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// What a comparison produced.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub root: PathBuf,
    pub series: Vec<Series>,
    pub report: PathBuf,
    /// Seconds per condition spent in this invocation.
    pub seconds: Vec<(Condition, f64)>,
}

/// Runs (or resumes, or keeps) each of `conditions` under `root` and writes `root/report.html`.
pub fn compare(
    config: &RunConfig,
    root: &Path,
    conditions: &[Condition],
    verbosity: Verbosity,
) -> Result<Comparison, CompareError> {
    let mut seconds = Vec::new();
    let mut base_evals: Vec<EvalMemo> = Vec::new();
    for &condition in conditions {
        let started = Instant::now();
        let dir = root.join(condition.as_str());
        let state = RunDir::open(&dir).and_then(|d| d.read_state()).ok();
        if !state.as_ref().is_some_and(|s| s.finished) {
            let run_config = RunConfig { condition, ..config.clone() };
            let wrap = |source| CompareError::Run { condition, source };
            let mut experiment =
                Experiment::create_or_resume(run_config, &dir, verbosity, base_evals.clone()).map_err(wrap)?;
            experiment.run().map_err(wrap)?;
        }
        let state = RunDir::open(&dir).and_then(|d| d.read_state()).ok();
        for memo in state.into_iter().flat_map(|s| s.evals).filter(|m| m.weights_version == 0) {
            if !base_evals.contains(&memo) {
                base_evals.push(memo);
            }
        }
        seconds.push((condition, started.elapsed().as_secs_f64()));
    }
    let report = root.join(REPORT_FILE);
    let title = format!("whale compare: {}", config.name);
    let series = report::write_report(&[root.to_path_buf()], &report, &title)?;
    Ok(Comparison { root: root.to_path_buf(), series, report, seconds })
}
