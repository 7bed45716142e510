//! A candidate harness as the archive keeps it: `candidates/<id>/harness.js` and `meta.json`.

use super::error::ArchiveError;
use super::summary::CandidateRef;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::Path;
use whale_harness::{content_hash, Harness};

/// A candidate directory's harness source.
pub(super) const SOURCE_FILE: &str = "harness.js";
/// A candidate directory's [`CandidateMeta`].
pub(super) const META_FILE: &str = "meta.json";

/// `meta.json` of a candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateMeta {
    pub id: String,
    /// The candidate it was derived from (`None` for the seed).
    pub parent: Option<String>,
    pub hypothesis: String,
    /// [`content_hash`] of `harness.js`: the key of its results.
    pub hash: String,
    /// The iteration that proposed it (0 for the seed).
    pub iteration: u64,
    /// Which proposer wrote it (`mutate`, `agent`, `command`, `seed`).
    pub proposer: String,
    /// Why it was not scored (it failed validation or its smoke rollout); `None` if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<String>,
}

/// A candidate: its meta and its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub meta: CandidateMeta,
    pub source: String,
}

impl Candidate {
    /// The harness to run, identified by content hash (so trajectories are keyed by content).
    pub fn harness(&self) -> Harness {
        Harness::new(self.meta.hash.clone(), self.source.clone())
    }

    pub fn reference(&self) -> CandidateRef {
        CandidateRef { id: self.meta.id.clone(), hash: self.meta.hash.clone() }
    }

    /// Reads `dir`. The directory name is the id and the source decides the hash, whatever
    /// `meta.json` says: a renamed or hand-edited candidate keeps its results by content.
    pub(super) fn read(dir: &Path, id: &str) -> Result<Self, ArchiveError> {
        let read = |name: &str| {
            let path = dir.join(name);
            fs::read_to_string(&path).map_err(|source| ArchiveError::Io { path, source })
        };
        let source = read(SOURCE_FILE)?;
        let mut meta: CandidateMeta = serde_json::from_str(&read(META_FILE)?)
            .map_err(|e| ArchiveError::Corrupt { path: dir.join(META_FILE), reason: e.to_string() })?;
        meta.id = id.to_string();
        meta.hash = content_hash(&source);
        Ok(Self { meta, source })
    }
}
