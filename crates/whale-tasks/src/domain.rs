//! Domain-generic entry points: one call that works for any [`Domain`].
//!
//! The CLI and the experiment driver name a domain at run time (`whale data check chess
//! FILE`); this module routes each operation to the domain's own module so that callers
//! never match on the domain themselves.

use crate::{chess, math, qa, LoadReport, RecordError};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use whale_core::{Domain, Task, Verdict};

/// The score of one prediction; QA adds exact match and F1.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictionScore {
    pub verdict: Verdict,
    pub em: Option<f64>,
    pub f1: Option<f64>,
}

/// The operations every domain offers, as methods of [`Domain`].
pub trait DomainTasks {
    /// Load every record of a file in any form the domain accepts.
    fn load(self, path: &Path) -> LoadReport;
    /// Parse one JSON record (any accepted form).
    fn parse_record(self, value: &serde_json::Value, file: &Path, line: usize) -> Result<Task, RecordError>;
    /// `n` synthetic tasks, deterministic for `seed`.
    fn generate(self, n: usize, seed: u64, difficulty: u32) -> Vec<Task>;
    /// Write tasks in the domain's native file format (JSONL; Lichess CSV for chess).
    fn write_native(self, tasks: &[Task], out: &mut dyn Write) -> std::io::Result<()>;
    /// The task as a harness may see it: no gold answer, no solution.
    fn public_view(self, task: &Task) -> serde_json::Value;
    /// Score a prediction made anywhere (model text, a move list, an answer string).
    fn score(self, task: &Task, prediction: &str) -> PredictionScore;
    /// The native file extension (`jsonl`, `csv`).
    fn native_extension(self) -> &'static str;
}

impl DomainTasks for Domain {
    fn load(self, path: &Path) -> LoadReport {
        match self {
            Domain::Math => math::load(path),
            Domain::Chess => chess::load(path),
            Domain::Qa => qa::load(path),
        }
    }

    fn parse_record(self, value: &serde_json::Value, file: &Path, line: usize) -> Result<Task, RecordError> {
        match self {
            Domain::Math => math::parse_record(value, file, line),
            Domain::Chess => chess::parse_record(value, file, line),
            Domain::Qa => qa::parse_record(value, file, line),
        }
    }

    fn generate(self, n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
        match self {
            Domain::Math => math::generate(n, seed, difficulty),
            Domain::Chess => chess::generate(n, seed, difficulty),
            Domain::Qa => qa::generate(n, seed, difficulty),
        }
    }

    fn write_native(self, tasks: &[Task], out: &mut dyn Write) -> std::io::Result<()> {
        match self {
            Domain::Math => math::write_native(tasks, out),
            Domain::Chess => chess::write_native(tasks, out),
            Domain::Qa => qa::write_native(tasks, out),
        }
    }

    fn public_view(self, task: &Task) -> serde_json::Value {
        match self {
            Domain::Math => math::public_view(task),
            Domain::Chess => chess::public_view(task),
            Domain::Qa => qa::public_view(task),
        }
    }

    fn score(self, task: &Task, prediction: &str) -> PredictionScore {
        match self {
            Domain::Math => PredictionScore { verdict: math::score(task, prediction), em: None, f1: None },
            Domain::Chess => PredictionScore { verdict: chess::score(task, prediction), em: None, f1: None },
            Domain::Qa => {
                let s = qa::score(task, prediction);
                PredictionScore { verdict: s.verdict, em: Some(s.em), f1: Some(s.f1) }
            }
        }
    }

    fn native_extension(self) -> &'static str {
        match self {
            Domain::Chess => "csv",
            Domain::Math | Domain::Qa => "jsonl",
        }
    }
}

/// Replays each task's gold answer through a fresh episode of its domain and returns the
/// verdicts in order. QA episodes search an in-memory index of the tasks' own contexts.
pub fn replay_gold(domain: Domain, tasks: &[Task]) -> Result<Vec<Verdict>, GoldReplayError> {
    match domain {
        Domain::Math => Ok(tasks
            .iter()
            .map(|t| match math::episode(t) {
                Ok(mut ep) => play(&mut ep, &math::gold_actions(t)),
                Err(e) => Verdict::fail(format!("cannot start an episode: {e}")),
            })
            .collect()),
        Domain::Chess => Ok(tasks
            .iter()
            .map(|t| match chess::episode(t, &chess::ChessConfig::default()) {
                Ok(mut ep) => play(&mut ep, &chess::gold_actions(t)),
                Err(e) => Verdict::fail(format!("cannot start an episode: {e}")),
            })
            .collect()),
        Domain::Qa => {
            let corpus = qa::corpus_from_tasks(tasks);
            let retriever =
                Arc::new(qa::Retriever::in_memory(&corpus).map_err(|e| GoldReplayError::Index(e.to_string()))?);
            let config = qa::QaConfig::default();
            Ok(tasks
                .iter()
                .map(|t| play(&mut qa::episode(t, retriever.clone(), &config), &qa::gold_actions(t)))
                .collect())
        }
    }
}

fn play(episode: &mut dyn crate::Episode, actions: &[String]) -> Verdict {
    for a in actions {
        if episode.is_done() {
            break;
        }
        episode.act(a);
    }
    episode.verdict()
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GoldReplayError {
    #[error("cannot index the QA contexts: {0}")]
    Index(String),
}
