//! Meta-Harness search, the harness phase of WHALE.
//!
//! With the weights fixed, a proposer reads an [`Archive`] of every earlier harness (source,
//! scores and raw traces per weights version) and writes candidate harness programs; the
//! [`HarnessSearch`] validates each, scores it with one rollout per search task through an
//! [`Evaluator`] the caller provides, and keeps the best by an [`Acceptance`] rule, the
//! incumbent included so that "no change" can win. Results are keyed by (content hash,
//! weights version), the archive survives a kill, and it never holds a test task. A candidate
//! that adds a search task's question to its parent is rejected unscored ([`copied_task_text`]).
//!
//! Proposers ([`Proposer`]): [`MutateProposer`] (offline source edits), [`AgentProposer`]
//! (an LLM over an OpenAI-compatible API, with tools confined to the archive) and
//! [`CommandProposer`] (any coding-agent command line).

mod acceptance;
mod archive;
mod copied_text;
mod durable;
mod guide;
mod prompt_text;
mod proposer;
mod score;
mod search;

pub use acceptance::{probability_of_gain, Acceptance};
pub use archive::{
    Archive, ArchiveError, Candidate, CandidateMeta, CandidateRef, Frontier, FrontierEntry, ProposalRecord,
    SummaryEvent,
};
pub use copied_text::{copied_task_text, CopiedText, MIN_COPIED_CHARS};
pub use guide::SEARCH_RULES;
pub use prompt_text::only_prompt_text_differs;
pub use proposer::{
    agent_proposer_name, AgentConfig, AgentProposer, CommandConfig, CommandProposer, MutateProposer, Mutation,
    Proposal, ProposalContext, Proposer, ProposerError, TokenUsage,
};
pub use score::{instance_frontier, ScoreCard, TaskOutcome};
pub use search::{
    CandidateReport, CandidateResult, Evaluator, EvaluatorError, HarnessSearch, IterationReport, Rescore, SearchConfig,
    SearchError,
};
