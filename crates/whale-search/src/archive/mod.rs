//! The archive: a plain directory that a proposer reads and the search writes.
//!
//! ```text
//! candidates/<id>/{harness.js, meta.json}
//! results/<hash>/w<version>/{scores.json, traces.jsonl}
//! summary.jsonl   frontier.json   sessions/   README.md   harness-api.md
//! ```
//!
//! Results are keyed by (content hash, weights version), so renaming a candidate or proposing
//! the same source again never loses or repeats a score. Every write is crash-safe (see
//! `durable`), and opening an existing archive replays `summary.jsonl` to restore the
//! incumbent and the iteration counter, so a killed search resumes where it stopped. The
//! archive refuses test tasks: results of a task whose split is `Test`, or whose id is
//! registered with [`Archive::forbid_task_ids`], are never written.

mod candidate;
mod error;
mod proposals;
mod summary;

pub use candidate::{Candidate, CandidateMeta};
pub use error::ArchiveError;
pub use proposals::ProposalRecord;
pub use summary::{CandidateRef, SummaryEvent};

use crate::durable;
use crate::guide;
use crate::score::ScoreCard;
use candidate::{META_FILE, SOURCE_FILE};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use whale_core::{pareto, Objectives, Split, Task, Trajectory};
use whale_harness::content_hash;

const CANDIDATES: &str = "candidates";
const RESULTS: &str = "results";
const SUMMARY: &str = "summary.jsonl";
const FRONTIER: &str = "frontier.json";
const SESSIONS: &str = "sessions";
const SCORES_FILE: &str = "scores.json";
const TRACES_FILE: &str = "traces.jsonl";

/// One entry of the Pareto front: a source (by hash) and every candidate id that carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrontierEntry {
    pub hash: String,
    pub ids: Vec<String>,
    pub objectives: Objectives,
}

/// `frontier.json`: the non-dominated candidates under one weights version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frontier {
    pub weights_version: u64,
    pub incumbent: CandidateRef,
    pub front: Vec<FrontierEntry>,
}

/// An open archive directory.
#[derive(Debug)]
pub struct Archive {
    root: PathBuf,
    candidates: BTreeMap<String, Candidate>,
    events: Vec<SummaryEvent>,
    forbidden: HashSet<String>,
}

impl Archive {
    /// Opens the archive at `root`, creating it if needed, and restores its state.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ArchiveError> {
        let root = root.into();
        for dir in [CANDIDATES, RESULTS, SESSIONS] {
            let path = root.join(dir);
            fs::create_dir_all(&path).map_err(|source| ArchiveError::Io { path, source })?;
        }
        write_if_changed(&root.join("README.md"), &guide::archive_readme())?;
        write_if_changed(&root.join("harness-api.md"), guide::HARNESS_API)?;
        let archive =
            Self { candidates: read_candidates(&root)?, events: read_summary(&root)?, root, forbidden: HashSet::new() };
        archive.incumbent_ref().map(|r| archive.resolve(&r)).transpose()?;
        Ok(archive)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Registers task ids that must never enter the archive (the test split).
    pub fn forbid_task_ids(&mut self, ids: impl IntoIterator<Item = String>) {
        self.forbidden.extend(ids);
    }

    /// Refuses any test task: a `Test` split or a forbidden id.
    pub fn admit(&self, tasks: &[Task]) -> Result<(), ArchiveError> {
        match tasks.iter().find(|t| t.split == Some(Split::Test) || self.forbidden.contains(&t.id)) {
            Some(task) => Err(ArchiveError::TestTask { task_id: task.id.clone() }),
            None => Ok(()),
        }
    }

    /// Whether `task_id` is a registered test id.
    pub fn is_forbidden(&self, task_id: &str) -> bool {
        self.forbidden.contains(task_id)
    }

    pub fn candidates(&self) -> impl Iterator<Item = &Candidate> {
        self.candidates.values()
    }

    pub fn candidate(&self, id: &str) -> Option<&Candidate> {
        self.candidates.get(id)
    }

    /// Every event of `summary.jsonl`, oldest first.
    pub fn events(&self) -> &[SummaryEvent] {
        &self.events
    }

    /// The current incumbent: the latest one the summary names, found by content hash if its
    /// candidate was renamed. `None` before [`Archive::seed`].
    pub fn incumbent(&self) -> Option<&Candidate> {
        self.incumbent_ref().and_then(|r| self.resolve(&r).ok())
    }

    /// The number the next iteration gets (iterations count from 1).
    pub fn next_iteration(&self) -> u64 {
        let last = self.events.iter().rev().find_map(|e| match e {
            SummaryEvent::Concluded { iteration, .. } => Some(*iteration),
            _ => None,
        });
        last.map_or(1, |n| n + 1)
    }

    /// Enters the first incumbent. Seeding again with the source it was seeded with is a no-op
    /// (a resumed run, whose incumbent may since have been replaced by a search); with another
    /// source it is an error.
    pub fn seed(&mut self, source: &str, hypothesis: &str) -> Result<Candidate, ArchiveError> {
        if let Some(seeded) = self.seeded_ref() {
            let seeded = self.resolve(&seeded)?;
            return if seeded.meta.hash == content_hash(source) {
                Ok(seeded.clone())
            } else {
                Err(ArchiveError::AlreadySeeded { id: seeded.meta.id.clone() })
            };
        }
        let draft = CandidateDraft { source, hypothesis, parent: None, proposer: "seed", rejection: None };
        let candidate = self.add_candidate(0, draft)?;
        self.append(SummaryEvent::Seeded { candidate: candidate.reference() })?;
        Ok(candidate)
    }

    /// The candidate with content `hash` proposed in `iteration`, if any.
    pub fn proposed(&self, iteration: u64, hash: &str) -> Option<&Candidate> {
        self.candidates.values().find(|c| c.meta.iteration == iteration && c.meta.hash == hash)
    }

    /// Writes a new candidate (or, when this iteration already holds the same source, returns
    /// that one: a resumed iteration re-proposing a candidate does not duplicate it).
    pub(crate) fn add_candidate(
        &mut self,
        iteration: u64,
        draft: CandidateDraft<'_>,
    ) -> Result<Candidate, ArchiveError> {
        let hash = content_hash(draft.source);
        if let Some(existing) = self.proposed(iteration, &hash) {
            return Ok(existing.clone());
        }
        let id = self.fresh_id();
        let meta = CandidateMeta {
            id: id.clone(),
            parent: draft.parent.map(str::to_string),
            hypothesis: draft.hypothesis.to_string(),
            hash,
            iteration,
            proposer: draft.proposer.to_string(),
            rejection: draft.rejection,
        };
        let meta_json = pretty(&meta);
        let path = self.root.join(CANDIDATES).join(&id);
        durable::write_dir(&path, &[(SOURCE_FILE, draft.source.as_bytes()), (META_FILE, meta_json.as_bytes())])
            .map_err(|source| ArchiveError::Io { path, source })?;
        let candidate = Candidate { meta, source: draft.source.to_string() };
        self.candidates.insert(id, candidate.clone());
        Ok(candidate)
    }

    /// The scores of (`hash`, `weights_version`), if they were recorded.
    pub fn scores(&self, hash: &str, weights_version: u64) -> Result<Option<ScoreCard>, ArchiveError> {
        read_scores(&self.root, hash, weights_version)
    }

    /// The raw trajectories behind (`hash`, `weights_version`), empty if none were recorded.
    pub fn traces(&self, hash: &str, weights_version: u64) -> Result<Vec<Trajectory>, ArchiveError> {
        let path = self.results_dir(hash, weights_version).join(TRACES_FILE);
        let lines = durable::read_lines(&path).map_err(|source| ArchiveError::Io { path: path.clone(), source })?;
        lines
            .iter()
            .map(|line| {
                serde_json::from_str(line)
                    .map_err(|e| ArchiveError::Corrupt { path: path.clone(), reason: e.to_string() })
            })
            .collect()
    }

    /// Records `card` and its trajectories, once: results already there are kept as they are.
    /// Refuses test tasks and trajectories of tasks outside `tasks`.
    pub fn record_results(
        &self,
        tasks: &[Task],
        card: &ScoreCard,
        trajectories: &[Trajectory],
    ) -> Result<(), ArchiveError> {
        self.admit(tasks)?;
        let known: HashSet<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
        if let Some(stray) = trajectories.iter().find(|t| !known.contains(t.task_id.as_str())) {
            return Err(ArchiveError::UnknownTask { task_id: stray.task_id.clone() });
        }
        let dir = self.results_dir(&card.hash, card.weights_version);
        if dir.exists() {
            return Ok(());
        }
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent).map_err(|source| ArchiveError::Io { path: parent.to_path_buf(), source })?;
        }
        let traces: String = trajectories.iter().map(|t| t.to_json_line() + "\n").collect();
        let scores = pretty(card);
        durable::write_dir(&dir, &[(SCORES_FILE, scores.as_bytes()), (TRACES_FILE, traces.as_bytes())])
            .map_err(|source| ArchiveError::Io { path: dir, source })
    }

    /// Appends `event` to `summary.jsonl` unless the same fact is already logged. Returns
    /// whether it was appended.
    pub(crate) fn append(&mut self, event: SummaryEvent) -> Result<bool, ArchiveError> {
        if let Some(key) = event.dedup_key() {
            if self.events.iter().any(|e| e.dedup_key() == Some(key)) {
                return Ok(false);
            }
        }
        let path = self.root.join(SUMMARY);
        let line = serde_json::to_string(&event)
            .map_err(|e| ArchiveError::Corrupt { path: path.clone(), reason: e.to_string() })?;
        durable::append_line(&path, &line).map_err(|source| ArchiveError::Io { path, source })?;
        self.events.push(event);
        Ok(true)
    }

    /// Whether the summary already accounts for the rollouts behind (`hash`, `weights_version`).
    pub fn is_paid_for(&self, hash: &str, weights_version: u64) -> bool {
        self.events.iter().any(|e| e.paid_for(hash, weights_version))
    }

    /// The Pareto front of every scored candidate under `weights_version` (of a seeded archive).
    pub fn frontier(&self, weights_version: u64) -> Result<Frontier, ArchiveError> {
        let incumbent = self.incumbent().map(Candidate::reference).ok_or(ArchiveError::Unseeded)?;
        let mut by_hash: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for candidate in self.candidates.values().filter(|c| c.meta.rejection.is_none()) {
            by_hash.entry(&candidate.meta.hash).or_default().push(candidate.meta.id.clone());
        }
        let mut entries = Vec::new();
        for (hash, ids) in by_hash {
            if let Some(card) = self.scores(hash, weights_version)? {
                entries.push(FrontierEntry { hash: hash.to_string(), ids, objectives: card.objectives });
            }
        }
        let objectives: Vec<Objectives> = entries.iter().map(|e| e.objectives).collect();
        let keep: HashSet<usize> = pareto::front(&objectives).into_iter().collect();
        let front = entries.into_iter().enumerate().filter(|(i, _)| keep.contains(i)).map(|(_, e)| e).collect();
        Ok(Frontier { weights_version, incumbent, front })
    }

    /// Rewrites `frontier.json` for `weights_version`.
    pub fn write_frontier(&self, weights_version: u64) -> Result<Frontier, ArchiveError> {
        let frontier = self.frontier(weights_version)?;
        let path = self.root.join(FRONTIER);
        durable::write_file(&path, pretty(&frontier).as_bytes()).map_err(|source| ArchiveError::Io { path, source })?;
        Ok(frontier)
    }

    fn results_dir(&self, hash: &str, weights_version: u64) -> PathBuf {
        results_dir(&self.root, hash, weights_version)
    }

    fn seeded_ref(&self) -> Option<CandidateRef> {
        self.events.iter().find_map(|e| match e {
            SummaryEvent::Seeded { candidate } => Some(candidate.clone()),
            _ => None,
        })
    }

    fn incumbent_ref(&self) -> Option<CandidateRef> {
        self.events.iter().rev().find_map(|e| match e {
            SummaryEvent::Seeded { candidate } | SummaryEvent::Concluded { incumbent: candidate, .. } => {
                Some(candidate.clone())
            }
            _ => None,
        })
    }

    /// The candidate `r` names: by id if that id still carries the hash, else any candidate
    /// with the hash (the candidate was renamed).
    fn resolve(&self, r: &CandidateRef) -> Result<&Candidate, ArchiveError> {
        self.candidates
            .get(&r.id)
            .filter(|c| c.meta.hash == r.hash)
            .or_else(|| self.candidates.values().find(|c| c.meta.hash == r.hash))
            .ok_or_else(|| ArchiveError::MissingIncumbent { id: r.id.clone(), hash: r.hash.clone() })
    }

    fn fresh_id(&self) -> String {
        let next = self
            .candidates
            .keys()
            .filter_map(|id| id.strip_prefix('c')?.parse::<u64>().ok())
            .max()
            .map_or(0, |n| n + 1);
        (next..)
            .map(|n| format!("c{n:04}"))
            .find(|id| !self.root.join(CANDIDATES).join(id).exists())
            .unwrap_or_default()
    }
}

/// A candidate about to enter the archive.
pub(crate) struct CandidateDraft<'a> {
    pub source: &'a str,
    pub hypothesis: &'a str,
    pub parent: Option<&'a str>,
    pub proposer: &'a str,
    pub rejection: Option<String>,
}

fn read_candidates(root: &Path) -> Result<BTreeMap<String, Candidate>, ArchiveError> {
    let dir = root.join(CANDIDATES);
    let entries = fs::read_dir(&dir).map_err(|source| ArchiveError::Io { path: dir.clone(), source })?;
    let mut candidates = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| ArchiveError::Io { path: dir.clone(), source })?;
        let id = entry.file_name().to_string_lossy().into_owned();
        if id.starts_with('.') || !entry.path().is_dir() {
            continue;
        }
        let candidate = Candidate::read(&entry.path(), &id)?;
        candidates.insert(id, candidate);
    }
    Ok(candidates)
}

fn read_summary(root: &Path) -> Result<Vec<SummaryEvent>, ArchiveError> {
    let path = root.join(SUMMARY);
    let lines = durable::read_lines(&path).map_err(|source| ArchiveError::Io { path, source })?;
    lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| ArchiveError::Summary { line: i + 1, reason: e.to_string() })
        })
        .collect()
}

fn write_if_changed(path: &Path, text: &str) -> Result<(), ArchiveError> {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    durable::write_file(path, text.as_bytes()).map_err(|source| ArchiveError::Io { path: path.to_path_buf(), source })
}

fn pretty(value: &impl Serialize) -> String {
    serde_json::to_string_pretty(value).expect("archive records always serialise")
}

/// `results/<hash>/w<version>/` of the archive at `root`.
fn results_dir(root: &Path, hash: &str, weights_version: u64) -> PathBuf {
    root.join(RESULTS).join(hash).join(format!("w{weights_version}"))
}

/// The scores of (`hash`, `weights_version`) in the archive at `root`, if they were recorded:
/// for a proposer, which reads the archive without opening it.
pub(crate) fn read_scores(root: &Path, hash: &str, weights_version: u64) -> Result<Option<ScoreCard>, ArchiveError> {
    let path = results_dir(root, hash, weights_version).join(SCORES_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            serde_json::from_str(&text).map(Some).map_err(|e| ArchiveError::Corrupt { path, reason: e.to_string() })
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ArchiveError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "export function solve(task, ctx) { return \"1\"; }\n";

    #[test]
    fn seeding_is_idempotent_for_the_same_source_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut archive = Archive::open(dir.path()).expect("open");
        assert!(archive.incumbent().is_none());
        let seed = archive.seed(SOURCE, "start").expect("seed");
        assert_eq!(seed.meta.id, "c0000");
        assert_eq!(archive.seed(SOURCE, "again").expect("same source"), seed);
        let other = archive.seed("export function solve() {}\n", "other");
        assert!(matches!(other, Err(ArchiveError::AlreadySeeded { id }) if id == "c0000"));
        let reopened = Archive::open(dir.path()).expect("reopen");
        assert_eq!(reopened.incumbent(), Some(&seed));
        assert_eq!(reopened.next_iteration(), 1);
        assert!(dir.path().join("README.md").exists() && dir.path().join("harness-api.md").exists());
    }

    #[test]
    fn a_resumed_search_seeds_again_after_its_incumbent_was_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut archive = Archive::open(dir.path()).expect("open");
        let seed = archive.seed(SOURCE, "start").expect("seed");
        let draft = CandidateDraft {
            source: "export function solve(task, ctx) { return \"2\"; }\n",
            hypothesis: "answer 2",
            parent: Some("c0000"),
            proposer: "test",
            rejection: None,
        };
        let better = archive.add_candidate(1, draft).expect("candidate");
        let concluded =
            SummaryEvent::Concluded { iteration: 1, weights_version: 0, incumbent: better.reference(), new_best: true };
        archive.append(concluded).expect("conclude");
        let mut reopened = Archive::open(dir.path()).expect("reopen");
        assert_eq!(reopened.seed(SOURCE, "start").expect("the same seed"), seed);
        assert_eq!(reopened.incumbent(), Some(&better));
        assert_eq!(reopened.next_iteration(), 2);
        let other = reopened.seed("export function solve() {}\n", "other");
        assert!(matches!(other, Err(ArchiveError::AlreadySeeded { id }) if id == "c0000"));
    }

    #[test]
    fn a_corrupt_summary_line_is_reported_with_its_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut archive = Archive::open(dir.path()).expect("open");
        archive.seed(SOURCE, "start").expect("seed");
        let summary = dir.path().join(SUMMARY);
        let text = fs::read_to_string(&summary).expect("summary");
        fs::write(&summary, format!("{{\"event\": \"nonsense\"}}\n{text}")).expect("corrupt");
        let error = Archive::open(dir.path()).expect_err("corrupt");
        assert!(matches!(error, ArchiveError::Summary { line: 1, .. }), "{error}");
    }

    #[test]
    fn a_missing_incumbent_source_is_an_error_not_a_silent_reset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut archive = Archive::open(dir.path()).expect("open");
        archive.seed(SOURCE, "start").expect("seed");
        fs::remove_dir_all(dir.path().join(CANDIDATES).join("c0000")).expect("remove");
        assert!(matches!(Archive::open(dir.path()), Err(ArchiveError::MissingIncumbent { .. })));
    }
}
