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
//! seed. A cell the run evaluated itself (an evaluation of that harness under those weights:
//! at the start, a phase boundary, periodically or at the end) is taken from that evaluation's
//! row in `metrics.jsonl` instead of being scored again: the same tasks, rollout seeds and
//! sampling. In a LoRA run the evaluation ran with the adapter beside the base weights and a
//! scored cell runs on the merged copy in `phase-weights/`, the same model up to rounding: on
//! SmolLM2 (LoRA rank 16, where one such cell takes 40 minutes) the five cells of seed 0 scored
//! both ways agree task by task. Each cell is written to `coupling.json` as soon as it is
//! added, so a killed computation continues where it stopped. It writes into the run
//! directory, so it runs under the run's [`DirLock`] (and never beside a resume of that run).

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
use whale_loop::test_eval::{eval_seed, EvalReason, EvalRecord, TestSet};
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

/// The cell of `harness` under weights `version` that the run's evaluation `record` is, if
/// it is one.
fn evaluated_cell(record: &EvalRecord, harness: &str, version: u64, setting: &RunSetting) -> Option<Cell> {
    let same = record.harness_id == harness
        && record.weights_version == version
        && record.scores.k == setting.config.eval.k
        && record.task_means.len() == setting.test.len();
    same.then(|| Cell {
        harness: harness.to_string(),
        weights_version: version,
        mean: record.scores.mean,
        task_means: record.task_means.clone(),
    })
}

/// What [`compute`] did.
#[derive(Debug)]
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
    let archive =
        Archive::open(dir.archive_dir()).map_err(|source| CouplingError::Archive { run: run.to_path_buf(), source })?;
    let accepted = accepted_harnesses(&archive);
    let path = dir.path(COUPLING_FILE);
    let matrix = started_matrix(&path, &setting.config, &accepted, weight_columns(&dir, &setting.config)?);
    let evaluations: Vec<EvalRecord> = MetricsRow::read_evaluations(&dir)?;
    let mut growing = Growing::new(matrix, path, progress);
    for column in growing.computed.matrix.weights.clone() {
        let mut to_score = Vec::new();
        for (row, harness) in &accepted {
            if growing.has(&row.hash, column.version) {
                continue;
            }
            match evaluations.iter().find_map(|e| evaluated_cell(e, &row.hash, column.version, &setting)) {
                Some(cell) => growing.add(cell, true)?,
                None => to_score.push((row, harness)),
            }
        }
        if to_score.is_empty() {
            continue;
        }
        let policy = load(&setting.config, &run.join(&column.dir))?;
        for (row, harness) in to_score {
            growing.bar.set_message(format!("{} under v{}", &row.id, column.version));
            growing.add(score(&setting, harness, &policy, row, column.version)?, false)?;
        }
    }
    growing.finish()
}

/// The matrix of `accepted` under `weights`, with the cells of an earlier computation in `path`
/// (of the same k and seed) that it still has.
fn started_matrix(
    path: &Path,
    config: &RunConfig,
    accepted: &[(AcceptedHarness, Harness)],
    weights: Vec<WeightsColumn>,
) -> Coupling {
    let eval_seed = eval_seed(config.seed);
    let earlier: Vec<Cell> = match read_json::<Coupling>(path) {
        Ok(old) if old.k == config.eval.k && old.eval_seed == eval_seed => old.cells,
        _ => Vec::new(),
    };
    let harnesses: Vec<AcceptedHarness> = accepted.iter().map(|(row, _)| row.clone()).collect();
    let cells = earlier
        .into_iter()
        .filter(|c| {
            harnesses.iter().any(|h| h.hash == c.harness) && weights.iter().any(|w| w.version == c.weights_version)
        })
        .collect();
    Coupling { k: config.eval.k, eval_seed, harnesses, weights, cells }
}

/// A matrix being completed: each cell is written to `coupling.json` as it is added.
struct Growing {
    computed: Computed,
    path: PathBuf,
    bar: ProgressBar,
}

impl Growing {
    fn new(matrix: Coupling, path: PathBuf, progress: bool) -> Self {
        let bar = bar((matrix.harnesses.len() * matrix.weights.len()) as u64, progress);
        bar.set_position(matrix.cells.len() as u64);
        Self { computed: Computed { matrix, scored: 0, from_evaluations: 0 }, path, bar }
    }

    fn has(&self, harness: &str, version: u64) -> bool {
        self.computed.matrix.cells.iter().any(|c| c.harness == harness && c.weights_version == version)
    }

    fn add(&mut self, cell: Cell, from_evaluation: bool) -> Result<(), CouplingError> {
        if from_evaluation {
            self.computed.from_evaluations += 1;
        } else {
            self.computed.scored += 1;
        }
        self.computed.matrix.cells.push(cell);
        self.write()?;
        whale_kernels::runtime::release_freed_memory();
        self.bar.inc(1);
        Ok(())
    }

    fn write(&self) -> Result<(), CouplingError> {
        let text = serde_json::to_string_pretty(&self.computed.matrix).unwrap_or_default();
        Ok(write_atomic(&self.path, text.as_bytes())?)
    }

    fn finish(self) -> Result<Computed, CouplingError> {
        self.bar.finish_and_clear();
        self.write()?;
        Ok(self.computed)
    }
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
