//! The coupling matrix of a run: every harness its search accepted, scored on the test split
//! under every set of weights the run held at a phase boundary (the starting weights, then the
//! weights each search phase started from, then the final ones).
//!
//! A run's own curve only visits the diagonal (the harness and the weights of the moment). The
//! matrix shows where the bottleneck sits: whether a harness accepted late also helps the early
//! weights (a harness gain that needs no training), and whether late weights make the early
//! harness better (a weight gain that needs no search). Cells are scored as the run's test
//! evaluations are (same tasks, same rollout seeds, same sampling), so a cell equals `whale
//! harness run` of that harness on that model directory with `--seed` the run's evaluation
//! seed. A cell the run evaluated itself (its harness and weights at a phase boundary) is
//! taken from that evaluation's row in `metrics.jsonl` instead of being scored again: the same
//! rollouts give the same scores (checked on SmolLM2, where such a cell can take 40 minutes).
//! Each cell is written to `coupling.json` as soon as it is scored, so a killed
//! computation continues where it stopped. It writes into the run directory, so it runs under
//! the run's [`DirLock`] (and never beside a resume of that run).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use whale_core::{Estimate, Task};
use whale_engine::LocalPolicy;
use whale_harness::scoring::environment;
use whale_harness::Harness;
use whale_loop::config::RunConfig;
use whale_loop::experiment::{self, task_splits, ExperimentError};
use whale_loop::lock::{DirLock, LockError};
use whale_loop::metrics_row::MetricsRow;
use whale_loop::run_dir::{read_json, write_atomic, RunDir, RunDirError, CONFIG_FILE};
use whale_loop::test_eval::{eval_seed, EvalReason, TestSet};
use whale_policy::Policy;
use whale_search::{Archive, SummaryEvent};

/// The matrix, in the run directory.
pub const COUPLING_FILE: &str = "coupling.json";

#[derive(Debug, thiserror::Error)]
pub enum CouplingError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("{}: {source}", run.display())]
    Run { run: PathBuf, source: Box<ExperimentError> },
    #[error("{}: the archive: {source}", run.display())]
    Archive { run: PathBuf, source: whale_search::ArchiveError },
    #[error("{}: {reason}", run.display())]
    NoWeights { run: PathBuf, reason: String },
    #[error("loading the weights in {}: {reason}", dir.display())]
    Model { dir: PathBuf, reason: String },
    #[error("scoring harness {harness} under weights version {version}: {source}")]
    Evaluate { harness: String, version: u64, source: whale_harness::scoring::EvaluateError },
}

/// A harness the search accepted (the initial one is accepted at iteration 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedHarness {
    /// The candidate's directory name in the archive.
    pub id: String,
    /// Its content hash: what cells are keyed by.
    pub hash: String,
    /// The search iteration that made it the incumbent.
    pub iteration: u64,
}

/// A set of weights the run held at a phase boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightsColumn {
    /// The weights version (updates applied): 0 is the starting model.
    pub version: u64,
    /// The model directory the cells were scored with (a kept one relative to the run
    /// directory).
    pub dir: PathBuf,
}

/// One harness under one set of weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub harness: String,
    pub weights_version: u64,
    /// Test mean@k with its 95% bootstrap interval over tasks.
    pub mean: Estimate,
    /// Each test task's mean reward, in test-split order (for paired comparisons of cells).
    pub task_means: Vec<f64>,
}

/// `coupling.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coupling {
    pub k: usize,
    /// The seed of every test rollout (`whale harness run --seed` replays a cell with it).
    pub eval_seed: u64,
    pub harnesses: Vec<AcceptedHarness>,
    pub weights: Vec<WeightsColumn>,
    pub cells: Vec<Cell>,
}

impl Coupling {
    /// The cell of harness row `row` under weights column `column`.
    pub fn cell(&self, row: usize, column: usize) -> Option<&Cell> {
        let (harness, weights) = (self.harnesses.get(row)?, self.weights.get(column)?);
        self.cells.iter().find(|c| c.harness == harness.hash && c.weights_version == weights.version)
    }

    /// A row's label: `h0 (initial)`, `h2 (it 5)`.
    pub fn harness_label(&self, row: usize) -> String {
        match self.harnesses[row].iteration {
            0 => format!("h{row} (initial)"),
            iteration => format!("h{row} (it {iteration})"),
        }
    }

    /// A column's label: `w0 (start)`, `w3 (v3)`.
    pub fn weights_label(&self, column: usize) -> String {
        match self.weights[column].version {
            0 => format!("w{column} (start)"),
            version => format!("w{column} (v{version})"),
        }
    }

    /// The matrix as a plain-text table of test mean@k.
    pub fn text(&self) -> String {
        let mut out = format!("{:<16}", format!("mean@{}", self.k));
        for column in 0..self.weights.len() {
            let _ = write!(out, " {:>12}", self.weights_label(column));
        }
        out.push('\n');
        for row in 0..self.harnesses.len() {
            let _ = write!(out, "{:<16}", self.harness_label(row));
            for column in 0..self.weights.len() {
                let value = self.cell(row, column).map_or("-".to_string(), |c| format!("{:.3}", c.mean.value));
                let _ = write!(out, " {value:>12}");
            }
            out.push('\n');
        }
        out
    }
}

/// The initial harness and every later incumbent, in the order the search accepted them.
pub fn accepted_harnesses(archive: &Archive) -> Vec<(AcceptedHarness, Harness)> {
    let mut accepted: Vec<(AcceptedHarness, Harness)> = Vec::new();
    for event in archive.events() {
        let (candidate, iteration) = match event {
            SummaryEvent::Seeded { candidate } => (candidate, 0),
            SummaryEvent::Concluded { iteration, incumbent, new_best: true, .. } => (incumbent, *iteration),
            _ => continue,
        };
        if accepted.iter().any(|(a, _)| a.hash == candidate.hash) {
            continue;
        }
        if let Some(found) = archive.candidates().find(|c| c.meta.hash == candidate.hash) {
            let row = AcceptedHarness { id: found.meta.id.clone(), hash: found.meta.hash.clone(), iteration };
            accepted.push((row, found.harness()));
        }
    }
    accepted
}

/// What scoring a run's cells needs.
struct RunSetting {
    config: RunConfig,
    test: Vec<Task>,
    environment: whale_tasks::Environment,
}

fn run_setting(run: &Path) -> Result<RunSetting, CouplingError> {
    let failed = |source: ExperimentError| CouplingError::Run { run: run.to_path_buf(), source: Box::new(source) };
    let config = RunConfig::load(&run.join(CONFIG_FILE)).map_err(|e| failed(e.into()))?;
    if config.server.is_some() || config.weights.trainer.is_some() {
        return Err(CouplingError::NoWeights {
            run: run.to_path_buf(),
            reason: "a served or externally trained run keeps its weights outside whale; the coupling matrix \
                     needs an in-process run"
                .to_string(),
        });
    }
    let splits = task_splits(&config).map_err(failed)?;
    let all: Vec<Task> = [&splits.train[..], &splits.search[..], &splits.test[..]].concat();
    let environment = environment(config.tasks.domain, &all, config.tasks.corpus.as_deref(), None)
        .map_err(|e| failed(ExperimentError::Evaluate(e)))?;
    Ok(RunSetting { config, test: splits.test, environment })
}

/// The starting model and every kept phase-boundary model of the run.
fn weight_columns(run: &RunDir, config: &RunConfig) -> Result<Vec<WeightsColumn>, CouplingError> {
    let base = experiment::model_dir(config)
        .map_err(|source| CouplingError::Run { run: run.root().to_path_buf(), source: Box::new(source) })?;
    let mut columns = vec![WeightsColumn { version: 0, dir: base }];
    let kept = run.phase_weights()?;
    let trained = run.read_state()?.weights_version;
    if trained > 0 && kept.is_empty() {
        return Err(CouplingError::NoWeights {
            run: run.root().to_path_buf(),
            reason: format!(
                "the run trained {trained} update(s) but kept no phase-boundary weights (phase-weights/ is empty: \
                 `keep_phase_weights = false`, or a run from before they were kept)"
            ),
        });
    }
    for (version, dir) in kept {
        let dir = dir.strip_prefix(run.root()).map_or(dir.clone(), Path::to_path_buf);
        columns.push(WeightsColumn { version, dir });
    }
    Ok(columns)
}

/// What a cell needs of one of the run's evaluation rows in `metrics.jsonl`.
#[derive(Deserialize)]
struct EvaluationRow {
    /// Both absent in runs from before they were recorded; such a row is never taken.
    #[serde(default)]
    harness_id: Option<String>,
    #[serde(default)]
    weights_version: Option<u64>,
    scores: EvaluationScores,
    #[serde(default)]
    task_means: Vec<f64>,
}

#[derive(Deserialize)]
struct EvaluationScores {
    k: usize,
    mean: Estimate,
}

impl EvaluationRow {
    /// The cell of `harness` under weights `version` that this row is, if it is one.
    fn cell(&self, harness: &str, version: u64, k: usize, tasks: usize) -> Option<Cell> {
        let same = self.harness_id.as_deref() == Some(harness)
            && self.weights_version == Some(version)
            && self.scores.k == k
            && self.task_means.len() == tasks;
        same.then(|| Cell {
            harness: harness.to_string(),
            weights_version: version,
            mean: self.scores.mean,
            task_means: self.task_means.clone(),
        })
    }
}

/// What [`compute`] did.
pub struct Computed {
    pub matrix: Coupling,
    /// Cells scored by this call.
    pub scored: usize,
    /// Cells this call took from the run's own evaluations.
    pub from_evaluations: usize,
}

/// Computes (or completes) the coupling matrix of the finished run in the locked directory
/// `run`, writing `coupling.json` after each cell.
pub fn compute(run: &DirLock, progress: bool) -> Result<Computed, CouplingError> {
    let run = run.dir();
    let dir = RunDir::open(run)?;
    let setting = run_setting(run)?;
    let config = &setting.config;
    let archive =
        Archive::open(dir.archive_dir()).map_err(|source| CouplingError::Archive { run: run.to_path_buf(), source })?;
    let accepted = accepted_harnesses(&archive);
    let weights = weight_columns(&dir, config)?;
    let eval_seed = eval_seed(config.seed);
    let path = dir.path(COUPLING_FILE);
    let earlier: Vec<Cell> = match read_json::<Coupling>(&path) {
        Ok(old) if old.k == config.eval.k && old.eval_seed == eval_seed => old.cells,
        _ => Vec::new(),
    };
    let mut coupling = Coupling {
        k: config.eval.k,
        eval_seed,
        harnesses: accepted.iter().map(|(row, _)| row.clone()).collect(),
        weights,
        cells: Vec::new(),
    };
    coupling.cells = earlier
        .into_iter()
        .filter(|c| {
            coupling.harnesses.iter().any(|h| h.hash == c.harness)
                && coupling.weights.iter().any(|w| w.version == c.weights_version)
        })
        .collect();
    let evaluations: Vec<EvaluationRow> = MetricsRow::read_evaluations(&dir)?;
    let (mut scored, mut from_evaluations) = (0, 0);
    let bar = bar((coupling.harnesses.len() * coupling.weights.len()) as u64, progress);
    bar.set_position(coupling.cells.len() as u64);
    for column in coupling.weights.clone() {
        let mut policy = None;
        for (row, harness) in &accepted {
            if coupling.cells.iter().any(|c| c.harness == row.hash && c.weights_version == column.version) {
                continue;
            }
            let evaluated =
                evaluations.iter().find_map(|e| e.cell(&row.hash, column.version, config.eval.k, setting.test.len()));
            let cell = match evaluated {
                Some(cell) => {
                    from_evaluations += 1;
                    cell
                }
                None => {
                    bar.set_message(format!("{} under v{}", &row.id, column.version));
                    let policy = match &policy {
                        Some(policy) => policy,
                        None => policy.insert(load(config, &run.join(&column.dir))?),
                    };
                    scored += 1;
                    score(&setting, harness, policy, row, column.version)?
                }
            };
            coupling.cells.push(cell);
            write_atomic(&path, serde_json::to_string_pretty(&coupling).unwrap_or_default().as_bytes())?;
            whale_kernels::runtime::release_freed_memory();
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    write_atomic(&path, serde_json::to_string_pretty(&coupling).unwrap_or_default().as_bytes())?;
    Ok(Computed { matrix: coupling, scored, from_evaluations })
}

fn load(config: &RunConfig, dir: &Path) -> Result<Arc<dyn Policy>, CouplingError> {
    let failed = |reason: String| CouplingError::Model { dir: dir.to_path_buf(), reason };
    let device = experiment::device(config).map_err(|e| failed(e.to_string()))?;
    let policy = LocalPolicy::load(dir, experiment::dtype(config), &device, experiment::engine_config(config))
        .map_err(|e| failed(e.to_string()))?;
    Ok(Arc::new(policy))
}

fn score(
    setting: &RunSetting,
    harness: &Harness,
    policy: &Arc<dyn Policy>,
    row: &AcceptedHarness,
    version: u64,
) -> Result<Cell, CouplingError> {
    let config = &setting.config;
    let test = TestSet {
        tasks: &setting.test,
        environment: &setting.environment,
        k: config.eval.k,
        seed: config.seed,
        threads: config.threads,
        limits: &config.harness.limits,
        sampling: &config.sampling.params(),
        progress: false,
    };
    let record = test.evaluate(EvalReason::End, harness, policy, &[]).map_err(|source| CouplingError::Evaluate {
        harness: row.id.clone(),
        version,
        source,
    })?;
    Ok(Cell {
        harness: row.hash.clone(),
        weights_version: version,
        mean: record.scores.mean,
        task_means: record.task_means,
    })
}

fn bar(total: u64, show: bool) -> ProgressBar {
    let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let style = ProgressStyle::with_template("coupling {bar:30} {pos}/{len} cells, ETA {eta} ({msg})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
