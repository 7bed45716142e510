//! Proposers write candidate harnesses. Three kinds sit behind one trait: an offline mutation
//! proposer ([`MutateProposer`]), an LLM with file tools confined to the archive
//! ([`AgentProposer`]), and any coding-agent command line ([`CommandProposer`]). The search
//! treats them alike: it validates, scores and records whatever they return, and a proposer
//! that fails only costs its iteration its candidates.

mod agent;
mod command;
mod confine;
pub(crate) mod mutate;

pub use agent::{agent_proposer_name, AgentConfig, AgentProposer};
pub use command::{CommandConfig, CommandProposer};
pub use mutate::{MutateProposer, Mutation};

use crate::archive::Candidate;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use whale_core::{Domain, Trajectory};
use whale_harness::Limits;

/// A new harness and the idea behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub source: String,
    /// What changed, why it should help, what would refute it.
    pub hypothesis: String,
    /// The candidate it derives from; `None` means the incumbent.
    #[serde(default)]
    pub parent: Option<String>,
}

/// What a proposer may know when it proposes.
#[derive(Debug, Clone, Copy)]
pub struct ProposalContext<'a> {
    /// The archive directory (read it; proposers never write candidates there themselves).
    pub archive: &'a Path,
    pub incumbent: &'a Candidate,
    pub domain: Domain,
    /// How many candidates to write (M).
    pub candidates: usize,
    pub iteration: u64,
    /// The weights the candidates will be scored under (results are in `w<version>`).
    pub weights_version: u64,
    /// Seeds every random choice of the proposal.
    pub seed: u64,
    /// Successful training-split trajectories, for few-shot examples (never test tasks).
    pub examples: &'a [Trajectory],
    /// The limits every rollout runs under; a candidate must validate under them.
    pub limits: &'a Limits,
    /// Candidates may change only the incumbent's prompt text (fast-slow's fast half); the
    /// search rejects any other change unscored.
    pub prompt_only: bool,
    /// The incumbent's failed rollouts on the search tasks under the current weights, for a
    /// proposer to reflect on.
    pub failures: &'a [Trajectory],
}

impl ProposalContext<'_> {
    /// Where this iteration's proposer session is kept: `sessions/<iteration>.<extension>`, or
    /// `sessions/<iteration>-<n>.<extension>` when a resumed iteration already left one there.
    pub fn session_path(&self, extension: &str) -> PathBuf {
        let sessions = self.archive.join("sessions");
        let first = sessions.join(format!("{}.{extension}", self.iteration));
        if !first.exists() {
            return first;
        }
        (2..)
            .map(|n| sessions.join(format!("{}-{n}.{extension}", self.iteration)))
            .find(|path| !path.exists())
            .unwrap_or(first)
    }
}

/// Tokens a proposer spent (counted apart from rollouts in the ledger).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl TokenUsage {
    pub fn add(&mut self, other: TokenUsage) {
        self.requests += other.requests;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }

    /// What was spent after `earlier` (a reading of the same running total).
    pub fn since(self, earlier: TokenUsage) -> TokenUsage {
        TokenUsage {
            requests: self.requests.saturating_sub(earlier.requests),
            prompt_tokens: self.prompt_tokens.saturating_sub(earlier.prompt_tokens),
            completion_tokens: self.completion_tokens.saturating_sub(earlier.completion_tokens),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProposerError {
    #[error("the proposer's API{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Api { status: Option<u16>, message: String },
    #[error("the proposer command {0}")]
    Command(String),
    #[error("pending.json: {0}")]
    Pending(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("proposer configuration: {0}")]
    Config(String),
    /// The server of the proposer's model, which the run starts itself, did not load or start.
    #[error("the proposer's model server: {0}")]
    Server(String),
    /// The proposer's model answered, but with no usable turn (a tool call without an id or a
    /// name): its output is poor, not its server.
    #[error("the proposer's model gave an unusable reply: {0}")]
    Reply(String),
    /// The incumbent's source holds what the proposer cannot read (a layer marker of an unknown
    /// kind): what it was given is at fault, not its infrastructure.
    #[error("the incumbent harness: {0}")]
    Incumbent(String),
}

impl ProposerError {
    /// Whether the proposer's infrastructure failed (its model server after retries or at its
    /// start, its command, the disk) rather than what it wrote.
    pub fn is_infrastructure(&self) -> bool {
        matches!(
            self,
            ProposerError::Api { .. } | ProposerError::Server(_) | ProposerError::Command(_) | ProposerError::Io { .. }
        )
    }
}

/// Writes candidate harnesses for one iteration.
pub trait Proposer: Send {
    /// A short name recorded with every candidate (`mutate`, `agent`, `command`).
    fn name(&self) -> &str;

    /// Up to `ctx.candidates` new harnesses (the search ignores any beyond that).
    fn propose(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError>;

    /// Tokens spent so far, over every call (failed ones included).
    fn usage(&self) -> TokenUsage {
        TokenUsage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::CandidateMeta;

    #[test]
    fn a_resumed_iteration_keeps_the_earlier_session_beside_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("sessions")).expect("sessions");
        let meta = CandidateMeta {
            id: "c0000".into(),
            parent: None,
            hypothesis: String::new(),
            hash: String::new(),
            iteration: 0,
            proposer: "seed".into(),
            rejection: None,
        };
        let incumbent = Candidate { meta, source: String::new() };
        let limits = Limits::default();
        let ctx = ProposalContext {
            archive: dir.path(),
            incumbent: &incumbent,
            domain: Domain::Math,
            candidates: 3,
            iteration: 7,
            weights_version: 0,
            seed: 0,
            examples: &[],
            limits: &limits,
            prompt_only: false,
            failures: &[],
        };
        let first = ctx.session_path("json");
        assert_eq!(first, dir.path().join("sessions/7.json"));
        std::fs::write(&first, "{}").expect("write");
        assert_eq!(ctx.session_path("json"), dir.path().join("sessions/7-2.json"));
    }
}
