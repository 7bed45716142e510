//! `summary.jsonl`: the append-only log of a search, one JSON object per line. It is what a
//! proposer greps first, and what a reopened archive replays to know the incumbent and the
//! next iteration; every event carries what it cost, and an event is never logged twice, so
//! summing the log never double-counts a rollout.

use serde::{Deserialize, Serialize};
use whale_core::Objectives;

/// A candidate named by its id (a directory name, which may change) and its content hash
/// (which does not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateRef {
    pub id: String,
    pub hash: String,
}

/// One line of `summary.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum SummaryEvent {
    /// The first incumbent entered the archive.
    Seeded { candidate: CandidateRef },
    /// The incumbent was scored at the start of a harness phase.
    Rescored {
        candidate: CandidateRef,
        weights_version: u64,
        objectives: Objectives,
        /// The results were already in the archive (no rollout ran).
        reused: bool,
        rollouts: usize,
    },
    /// A proposer failed. After a panic or bad output its iteration goes on without candidates;
    /// after a failure of its server or command the search stops, and the iteration (not
    /// concluded) runs again when the run resumes.
    ProposerFailed { iteration: u64, proposer: String, error: String },
    /// A candidate entered the archive; `rejection` says why it was not scored.
    Proposed {
        iteration: u64,
        candidate: CandidateRef,
        parent: Option<String>,
        hypothesis: String,
        proposer: String,
        rejection: Option<String>,
        /// Rollouts spent validating it (the smoke rollout).
        rollouts: usize,
    },
    /// A candidate was scored on the search tasks.
    Scored {
        iteration: u64,
        candidate: CandidateRef,
        weights_version: u64,
        objectives: Objectives,
        reused: bool,
        rollouts: usize,
    },
    /// An iteration ended; `incumbent` is the incumbent after it.
    Concluded { iteration: u64, weights_version: u64, incumbent: CandidateRef, new_best: bool },
}

impl SummaryEvent {
    /// Two events with the same key record the same fact (a resumed iteration re-proposing or
    /// re-scoring a candidate); only the first is logged.
    pub(crate) fn dedup_key(&self) -> Option<(u64, &str, Option<u64>)> {
        match self {
            SummaryEvent::Proposed { iteration, candidate, .. } => Some((*iteration, &candidate.hash, None)),
            SummaryEvent::Scored { iteration, candidate, weights_version, .. } => {
                Some((*iteration, &candidate.hash, Some(*weights_version)))
            }
            _ => None,
        }
    }

    /// Rollouts this event paid for.
    pub fn rollouts(&self) -> usize {
        match self {
            SummaryEvent::Rescored { rollouts, .. }
            | SummaryEvent::Proposed { rollouts, .. }
            | SummaryEvent::Scored { rollouts, .. } => *rollouts,
            _ => 0,
        }
    }

    /// Whether this event paid for the results of (`hash`, `weights_version`).
    pub(crate) fn paid_for(&self, hash: &str, version: u64) -> bool {
        match self {
            SummaryEvent::Rescored { candidate, weights_version, reused, .. }
            | SummaryEvent::Scored { candidate, weights_version, reused, .. } => {
                !reused && candidate.hash == hash && *weights_version == version
            }
            _ => false,
        }
    }
}
