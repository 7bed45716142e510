//! An episode: what a harness interacts with while solving one task.
//!
//! Math and QA episodes end when an answer is submitted; chess episodes take moves one at a
//! time and answer each with the stored reply. Tools are synchronous functions of JSON.

use serde::{Deserialize, Serialize};
use whale_core::Verdict;

/// A tool the harness may call, described for prompts and for `docs/harness-api.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// Names of the positional arguments.
    pub args: Vec<String>,
}

/// A tool call that failed: unknown tool, bad arguments, or a tool-level refusal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool `{0}`")]
    Unknown(String),
    #[error("tool `{tool}`: bad arguments: {reason}")]
    BadArgs { tool: String, reason: String },
    #[error("tool `{tool}`: {reason}")]
    Failed { tool: String, reason: String },
}

/// What the environment answers to one action (`submit` for math/qa, `play` for chess).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    /// The environment's reply as text (the opponent's move, "accepted", an error message).
    pub reply: String,
    /// The action was malformed or illegal and was not counted as a move.
    pub invalid: bool,
    pub done: bool,
    pub solved: bool,
}

/// One episode of one task.
pub trait Episode: Send {
    /// The text the harness shows the model first (the question, the position...).
    fn observation(&self) -> String;
    fn tools(&self) -> Vec<ToolSpec>;
    fn call_tool(&mut self, name: &str, args: &[serde_json::Value]) -> Result<serde_json::Value, ToolError>;
    /// Submit an answer (math, qa) or play a move (chess).
    fn act(&mut self, action: &str) -> StepOutcome;
    fn is_done(&self) -> bool;
    /// The verdict on the episode as it stands (an unfinished episode fails).
    fn verdict(&self) -> Verdict;
}
