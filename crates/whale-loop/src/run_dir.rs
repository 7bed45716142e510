//! A run directory, `runs/<name>/`, and how it survives a kill.
//!
//! ```text
//! config.toml          the resolved config (every default written out)
//! state.json           the resume cursor: units done, scheduler history, ledger, evaluations
//! metrics.jsonl        one row per weight step, search iteration, evaluation, phase boundary
//! ledger.json          the ledger as of the last completed unit
//! journal/step-N.json  the training examples of each weight step since the last checkpoint
//! checkpoints/step-N/  full checkpoints (weights and optimizer), every `checkpoint_every` steps;
//!                      with `[weights.lora]`, PEFT adapter directories (adapter and optimizer)
//! phase-weights/vN/    in-process: the weights (version N) a search phase started from, and
//!                      the final ones, as loadable model directories (for `whale coupling`)
//! weights/step-N/      with an external trainer: the step's samples.jsonl, rollouts.json,
//!                      train.log and the adapter/ or checkpoint/ the trainer wrote
//! examples.jsonl       the last step's kept rollouts (few-shot material for the proposer)
//! search_spend.jsonl   rollouts the search paid for, once per (unit, harness, weights, tasks)
//! archive/             the harness archive (see whale-search)
//! report.html          the report, once the run is over (written by whale-study)
//! .lock                the writer's lock (see [`crate::lock`]) and who holds it
//! ```
//!
//! A unit of work (a weight step, a search iteration, an evaluation) writes its artifacts
//! first and `state.json` last, by an atomic rename; rows of `metrics.jsonl` past the count the
//! state records belong to a unit that did not complete and are cut on resume. So whatever
//! instant a run is killed at, it resumes from its last completed unit, nothing lost and
//! nothing counted twice. One process writes a run at a time ([`crate::lock::DirLock`]);
//! reading one (a report, the archive) writes nothing, so it is safe while the run goes on.

use crate::condition::Condition;
use crate::schedule::Outcome;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use whale_core::{Ledger, Spend};

pub const CONFIG_FILE: &str = "config.toml";
pub const STATE_FILE: &str = "state.json";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const LEDGER_FILE: &str = "ledger.json";
pub const REPORT_FILE: &str = "report.html";
const JOURNAL_DIR: &str = "journal";
const CHECKPOINTS_DIR: &str = "checkpoints";
const WEIGHTS_DIR: &str = "weights";
const PHASE_WEIGHTS_DIR: &str = "phase-weights";
const ARCHIVE_DIR: &str = "archive";
const EXAMPLES_FILE: &str = "examples.jsonl";
const SEARCH_SPEND_FILE: &str = "search_spend.jsonl";

#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{} is not a run directory (no {STATE_FILE} or config.toml)", .0.display())]
    NotARun(PathBuf),
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io { path: path.to_path_buf(), source }
}

/// One test evaluation as the state remembers it (for reuse and for the best/final figures).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMemo {
    pub harness_id: String,
    pub weights_version: u64,
    pub scores: whale_core::Scores,
    /// Each test task's mean reward, in test-split order (empty in runs from before it was kept).
    #[serde(default)]
    pub task_means: Vec<f64>,
}

/// Weights an external trainer wrote and the policy now answers with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedWeights {
    /// The weight step whose trainer wrote them.
    pub step: u64,
    /// The name rollouts send as their `model` (an adapter's name on the server).
    pub name: String,
    /// The adapter or checkpoint directory.
    pub path: PathBuf,
}

/// `state.json`: everything needed to continue after the last completed unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub condition: Condition,
    /// Units completed (weight steps, search units, evaluations).
    pub units: u64,
    /// What each weight step and search unit told the scheduler, in order.
    pub outcomes: Vec<Outcome>,
    pub weight_steps: u64,
    /// Weight steps that updated the weights: the policy's weights version.
    pub weights_version: u64,
    /// The step of the newest full checkpoint (0: the base model).
    pub checkpoint_step: u64,
    /// The last archive iteration this run accounted for.
    pub search_iterations: u64,
    /// Fast-slow: the population's harness hashes, best first.
    pub population: Vec<String>,
    /// Spend by purpose; the search part is recomputed from `search_spend.jsonl`.
    pub ledger: Ledger,
    /// Rows of `metrics.jsonl` written by completed units.
    pub metrics_rows: usize,
    /// How many `outcomes` there were at the last test evaluation (`None` before the first).
    pub last_eval_at: Option<usize>,
    pub evals: Vec<EvalMemo>,
    /// With an external trainer: the weights of its last update (`None`: the base model).
    #[serde(default)]
    pub served: Option<ServedWeights>,
    pub finished: bool,
}

impl RunState {
    pub fn new(condition: Condition) -> Self {
        Self {
            condition,
            units: 0,
            outcomes: Vec::new(),
            weight_steps: 0,
            weights_version: 0,
            checkpoint_step: 0,
            search_iterations: 0,
            population: Vec::new(),
            ledger: Ledger::default(),
            metrics_rows: 0,
            last_eval_at: None,
            evals: Vec::new(),
            served: None,
            finished: false,
        }
    }
}

/// One line of `search_spend.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchSpend {
    /// (unit, harness hash, weights version, task count, first task): the same rollouts run
    /// again after a kill carry the same key and are counted once.
    pub key: String,
    pub spend: Spend,
}

/// An open run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// Creates the directory (and its parents) for a new run.
    pub fn create(root: &Path) -> Result<Self, RunDirError> {
        for dir in [root.to_path_buf(), root.join(JOURNAL_DIR), root.join(CHECKPOINTS_DIR)] {
            fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        }
        Ok(Self { root: root.to_path_buf() })
    }

    /// Opens an existing run directory (creating nothing: readers open runs being written).
    pub fn open(root: &Path) -> Result<Self, RunDirError> {
        if !root.join(STATE_FILE).is_file() {
            return Err(RunDirError::NotARun(root.to_path_buf()));
        }
        Ok(Self { root: root.to_path_buf() })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn archive_dir(&self) -> PathBuf {
        self.root.join(ARCHIVE_DIR)
    }

    pub fn has_state(&self) -> bool {
        self.root.join(STATE_FILE).is_file()
    }

    pub fn read_state(&self) -> Result<RunState, RunDirError> {
        read_json(&self.root.join(STATE_FILE))
    }

    /// Commits a completed unit: the ledger, then the state (atomically, last).
    pub fn commit(&self, state: &RunState) -> Result<(), RunDirError> {
        write_json(&self.root.join(LEDGER_FILE), &state.ledger)?;
        write_json(&self.root.join(STATE_FILE), state)
    }

    /// Appends rows to `metrics.jsonl` (synced); they count once the state records them.
    pub fn append_metrics(&self, rows: &[serde_json::Value]) -> Result<(), RunDirError> {
        let path = self.root.join(METRICS_FILE);
        let text: String = rows.iter().map(|row| row.to_string() + "\n").collect();
        let mut file = OpenOptions::new().create(true).append(true).open(&path).map_err(io_error(&path))?;
        file.write_all(text.as_bytes()).map_err(io_error(&path))?;
        file.sync_data().map_err(io_error(&path))
    }

    /// The committed rows of `metrics.jsonl`.
    pub fn metrics(&self) -> Result<Vec<serde_json::Value>, RunDirError> {
        let path = self.root.join(METRICS_FILE);
        let rows = read_lines(&path)?;
        rows.iter()
            .map(|line| {
                serde_json::from_str(line)
                    .map_err(|e| RunDirError::Corrupt { path: path.clone(), reason: e.to_string() })
            })
            .collect()
    }

    /// Cuts `metrics.jsonl` to its first `rows` lines (rows of an unfinished unit go).
    pub fn truncate_metrics(&self, rows: usize) -> Result<(), RunDirError> {
        let path = self.root.join(METRICS_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(RunDirError::Io { path, source: e }),
        };
        let end = text.match_indices('\n').nth(rows.wrapping_sub(1)).map_or(0, |(at, _)| at + 1);
        let end = if rows == 0 { 0 } else { end };
        if end < text.len() {
            let file = OpenOptions::new().write(true).open(&path).map_err(io_error(&path))?;
            file.set_len(end as u64).map_err(io_error(&path))?;
            file.sync_all().map_err(io_error(&path))?;
        }
        Ok(())
    }

    pub fn journal_path(&self, step: u64) -> PathBuf {
        self.root.join(JOURNAL_DIR).join(format!("step-{step:06}.json"))
    }

    pub fn write_journal<T: Serialize>(&self, step: u64, journal: &T) -> Result<(), RunDirError> {
        write_json(&self.journal_path(step), journal)
    }

    pub fn read_journal<T: DeserializeOwned>(&self, step: u64) -> Result<T, RunDirError> {
        read_json(&self.journal_path(step))
    }

    /// The files of weight step `step` with an external trainer.
    pub fn weight_step_dir(&self, step: u64) -> PathBuf {
        self.root.join(WEIGHTS_DIR).join(format!("step-{step:06}"))
    }

    pub fn checkpoint_path(&self, step: u64) -> PathBuf {
        self.root.join(CHECKPOINTS_DIR).join(format!("step-{step:06}"))
    }

    /// The model directory of weights version `version` kept at a phase boundary.
    pub fn phase_weights_path(&self, version: u64) -> PathBuf {
        self.root.join(PHASE_WEIGHTS_DIR).join(format!("v{version:06}"))
    }

    /// Every kept phase-boundary model directory with its weights version, oldest first.
    pub fn phase_weights(&self) -> Result<Vec<(u64, PathBuf)>, RunDirError> {
        let dir = self.root.join(PHASE_WEIGHTS_DIR);
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut kept = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_error(&dir))? {
            let path = entry.map_err(io_error(&dir))?.path();
            let version = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix('v'));
            if let Some(version) = version.and_then(|v| v.parse::<u64>().ok()) {
                kept.push((version, path));
            }
        }
        kept.sort();
        Ok(kept)
    }

    /// Removes checkpoints other than `keep` and journal entries up to `keep` (they are in it).
    pub fn prune(&self, keep: u64) -> Result<(), RunDirError> {
        let keep_dir = self.checkpoint_path(keep);
        let checkpoints = self.root.join(CHECKPOINTS_DIR);
        for entry in fs::read_dir(&checkpoints).map_err(io_error(&checkpoints))? {
            let path = entry.map_err(io_error(&checkpoints))?.path();
            if path != keep_dir {
                fs::remove_dir_all(&path).map_err(io_error(&path))?;
            }
        }
        let journal = self.root.join(JOURNAL_DIR);
        for entry in fs::read_dir(&journal).map_err(io_error(&journal))? {
            let path = entry.map_err(io_error(&journal))?.path();
            let step = step_number(&path);
            if step.is_some_and(|s| s <= keep) {
                fs::remove_file(&path).map_err(io_error(&path))?;
            }
        }
        Ok(())
    }

    pub fn write_examples(&self, lines: &[String]) -> Result<(), RunDirError> {
        let text: String = lines.iter().map(|l| l.clone() + "\n").collect();
        write_atomic(&self.root.join(EXAMPLES_FILE), text.as_bytes())
    }

    pub fn read_examples(&self) -> Result<Vec<String>, RunDirError> {
        read_lines(&self.root.join(EXAMPLES_FILE))
    }

    /// Every recorded search spend, the first of each key.
    pub fn search_spends(&self) -> Result<Vec<SearchSpend>, RunDirError> {
        let path = self.root.join(SEARCH_SPEND_FILE);
        let mut spends: Vec<SearchSpend> = Vec::new();
        for line in read_lines(&path)? {
            let spend: SearchSpend = serde_json::from_str(&line)
                .map_err(|e| RunDirError::Corrupt { path: path.clone(), reason: e.to_string() })?;
            if !spends.iter().any(|s| s.key == spend.key) {
                spends.push(spend);
            }
        }
        Ok(spends)
    }

    /// Records a search spend unless its key is already there; returns whether it was new.
    pub fn record_search_spend(&self, spend: &SearchSpend) -> Result<bool, RunDirError> {
        if self.search_spends()?.iter().any(|s| s.key == spend.key) {
            return Ok(false);
        }
        let path = self.root.join(SEARCH_SPEND_FILE);
        cut_torn_line(&path)?;
        let line = serde_json::to_string(spend)
            .map_err(|e| RunDirError::Corrupt { path: path.clone(), reason: e.to_string() })?;
        let mut file = OpenOptions::new().create(true).append(true).open(&path).map_err(io_error(&path))?;
        file.write_all(format!("{line}\n").as_bytes()).map_err(io_error(&path))?;
        file.sync_data().map_err(io_error(&path))?;
        Ok(true)
    }
}

fn step_number(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("step-")?.split('.').next()?.parse().ok()
}

/// Complete lines of an append-only file; a last line without its newline (torn by a kill, or
/// still being written by the run) is left out, and left alone: reading writes nothing.
fn read_lines(path: &Path) -> Result<Vec<String>, RunDirError> {
    let bytes = read_if_present(path)?;
    let complete = complete_lines(&bytes);
    let text = std::str::from_utf8(&bytes[..complete])
        .map_err(|e| RunDirError::Corrupt { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect())
}

/// Cuts a torn last line off an append-only file, so that the next append starts a line.
fn cut_torn_line(path: &Path) -> Result<(), RunDirError> {
    let bytes = read_if_present(path)?;
    let complete = complete_lines(&bytes);
    if complete < bytes.len() {
        let file = OpenOptions::new().write(true).open(path).map_err(io_error(path))?;
        file.set_len(complete as u64).map_err(io_error(path))?;
    }
    Ok(())
}

/// The length of the text up to and with its last newline.
fn complete_lines(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b == b'\n').map_or(0, |end| end + 1)
}

/// The file's bytes; none when there is no file.
fn read_if_present(path: &Path) -> Result<Vec<u8>, RunDirError> {
    match fs::read(path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(RunDirError::Io { path: path.to_path_buf(), source: e }),
    }
}

/// Writes beside the target, syncs, then renames over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunDirError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let partial = path.with_file_name(format!(".{name}.partial"));
    let mut file = File::create(&partial).map_err(io_error(&partial))?;
    file.write_all(bytes).map_err(io_error(&partial))?;
    file.sync_all().map_err(io_error(&partial))?;
    fs::rename(&partial, path).map_err(io_error(path))?;
    if let Some(parent) = path.parent() {
        File::open(parent).and_then(|dir| dir.sync_all()).map_err(io_error(parent))?;
    }
    Ok(())
}

pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), RunDirError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| RunDirError::Corrupt { path: path.to_path_buf(), reason: e.to_string() })?;
    write_atomic(path, (text + "\n").as_bytes())
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, RunDirError> {
    let text = fs::read_to_string(path).map_err(io_error(path))?;
    serde_json::from_str(&text).map_err(|e| RunDirError::Corrupt { path: path.to_path_buf(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metrics_rows_past_the_committed_count_are_cut_and_a_torn_line_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = RunDir::create(dir.path()).expect("run dir");
        run.append_metrics(&[json!({"a": 1}), json!({"a": 2}), json!({"a": 3})]).expect("append");
        run.truncate_metrics(2).expect("truncate");
        assert_eq!(run.metrics().expect("rows"), vec![json!({"a": 1}), json!({"a": 2})]);
        let path = dir.path().join(METRICS_FILE);
        OpenOptions::new().append(true).open(&path).and_then(|mut f| f.write_all(b"{\"a\":")).expect("torn");
        assert_eq!(run.metrics().expect("rows").len(), 2);
        run.truncate_metrics(0).expect("truncate");
        assert!(run.metrics().expect("rows").is_empty());
    }

    #[test]
    fn a_search_spend_is_counted_once_per_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = RunDir::create(dir.path()).expect("run dir");
        let spend = SearchSpend { key: "u3/abc/w1/48/t0".into(), spend: Spend { rollouts: 48, ..Spend::default() } };
        assert!(run.record_search_spend(&spend).expect("record"));
        assert!(!run.record_search_spend(&spend).expect("record again"));
        let other = SearchSpend { key: "u4/abc/w1/48/t0".into(), ..spend.clone() };
        assert!(run.record_search_spend(&other).expect("record"));
        assert_eq!(run.search_spends().expect("spends").iter().map(|s| s.spend.rollouts).sum::<u64>(), 96);
    }

    #[test]
    fn reading_leaves_a_torn_line_to_the_writer_which_cuts_it_before_appending() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = RunDir::create(dir.path()).expect("run dir");
        let spend = SearchSpend { key: "u1".into(), spend: Spend { rollouts: 8, ..Spend::default() } };
        run.record_search_spend(&spend).expect("record");
        let path = dir.path().join(SEARCH_SPEND_FILE);
        OpenOptions::new().append(true).open(&path).and_then(|mut f| f.write_all(b"{\"key\":\"u")).expect("torn");
        let before = fs::read(&path).expect("read");
        assert_eq!(run.search_spends().expect("spends").len(), 1);
        assert_eq!(fs::read(&path).expect("read"), before, "a reader wrote");
        run.record_search_spend(&SearchSpend { key: "u2".into(), ..spend }).expect("record");
        assert_eq!(run.search_spends().expect("spends").len(), 2);
        assert!(fs::read_to_string(&path).expect("read").lines().all(|l| l.ends_with('}')));
    }

    #[test]
    fn pruning_keeps_the_newest_checkpoint_and_later_journal_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = RunDir::create(dir.path()).expect("run dir");
        for step in 1..=4 {
            run.write_journal(step, &json!({"step": step})).expect("journal");
        }
        fs::create_dir_all(run.checkpoint_path(2)).expect("old");
        fs::create_dir_all(run.checkpoint_path(4)).expect("new");
        run.prune(2).expect("prune");
        assert!(run.checkpoint_path(2).is_dir() && !run.checkpoint_path(4).exists());
        assert!(!run.journal_path(2).exists() && run.journal_path(3).exists());
    }
}
