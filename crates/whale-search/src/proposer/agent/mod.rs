//! The agentic proposer: an LLM behind an OpenAI-compatible chat API, with tool calling,
//! that reads the archive (list, read, grep), checks candidates and writes them. Its system
//! prompt carries the rules of good harness search and the harness API (whole, or in brief
//! with the incumbent and its failures inline for a small model: `prompt.rs`); its whole session
//! (messages, tool calls and their replies, tokens) is kept in the archive as
//! `sessions/<iteration>.json`, whether the session succeeded or not.

mod client;
mod prompt;
mod tools;

use super::confine::ConfinedDir;
use super::{Proposal, ProposalContext, Proposer, ProposerError, TokenUsage};
use crate::durable;
use client::{ChatClient, Sampling};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;
use tools::{ArchiveTools, ReplySizes};
use whale_http::{ClientConfig, RetryPolicy};

/// Where the proposer's model is served and how a session runs. `base_url`, `model` and
/// `api_key` fall back to `WHALE_PROPOSER_BASE_URL`, `WHALE_PROPOSER_MODEL` and
/// `WHALE_PROPOSER_API_KEY` (then `OPENAI_API_KEY`); a local server needs no key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The API root, e.g. `http://127.0.0.1:8000/v1` (requests go to `<base_url>/chat/completions`).
    pub base_url: Option<String>,
    pub model: Option<String>,
    /// A model the run serves itself for the proposer, on loopback, for as long as the run
    /// lasts (a checkpoint directory, a GGUF file, or a fetched model's name such as
    /// `qwen2.5-coder-1.5b`): no second terminal. `base_url` must then be unset; `model`
    /// defaults to this name. whale-loop starts the server (`proposer_server.rs`). Left out of
    /// the config's JSON when unset, so that configs without it keep their hashes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_model: Option<std::path::PathBuf>,
    pub api_key: Option<String>,
    /// Most model turns per session.
    pub max_turns: usize,
    /// Seconds one request may take.
    pub timeout_s: u64,
    /// Retries of a request after a transient fault (a 408, 429 or 5xx, a refused or broken
    /// connection), with jittered backoff from 1 s up to 30 s.
    pub max_retries: u32,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// A prompt sized for a small model: the harness API in brief, the incumbent's source, score
    /// and two of its failed rollouts inline, and tool replies of about 1,000 tokens at most
    /// (full: the whole API, the archive left to the tools, replies up to 20,000 characters).
    /// Left out of the config's JSON when false, so that configs without it keep their hashes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub compact: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            base_url: None,
            model: None,
            local_model: None,
            api_key: None,
            max_turns: 40,
            timeout_s: 600,
            max_retries: 4,
            temperature: None,
            max_tokens: None,
            compact: false,
        }
    }
}

/// The agentic proposer.
pub struct AgentProposer {
    client: ChatClient,
    model: String,
    base_url: String,
    max_turns: usize,
    compact: bool,
    usage: TokenUsage,
}

impl AgentProposer {
    pub fn new(config: AgentConfig) -> Result<Self, ProposerError> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let base_url = config
            .base_url
            .or_else(|| env("WHALE_PROPOSER_BASE_URL"))
            .ok_or_else(|| ProposerError::Config("no base_url (set it or WHALE_PROPOSER_BASE_URL)".into()))?;
        let model = config
            .model
            .or_else(|| env("WHALE_PROPOSER_MODEL"))
            .ok_or_else(|| ProposerError::Config("no model (set it or WHALE_PROPOSER_MODEL)".into()))?;
        let api_key = config.api_key.or_else(|| env("WHALE_PROPOSER_API_KEY")).or_else(|| env("OPENAI_API_KEY"));
        let sampling = Sampling { temperature: config.temperature, max_tokens: config.max_tokens };
        let retry = RetryPolicy::from_millis(config.max_retries, 1_000, 30_000);
        let http = ClientConfig {
            request_timeout: Duration::from_secs(config.timeout_s.max(1)),
            connect_timeout: Duration::from_secs(10),
            api_key,
            retry,
            max_in_flight: None,
        };
        let client = ChatClient::new(&base_url, &model, http, sampling)?;
        let max_turns = config.max_turns.max(1);
        Ok(Self { client, model, base_url, max_turns, compact: config.compact, usage: TokenUsage::default() })
    }

    /// Runs the conversation; `messages` holds it so far whatever happens.
    fn converse(
        &mut self,
        tools: &mut ArchiveTools<'_>,
        messages: &mut Vec<Value>,
        session: &mut Session,
    ) -> Result<(), ProposerError> {
        let specs = tools.specs();
        for _ in 0..self.max_turns {
            if tools.is_done() {
                return Ok(());
            }
            let turn = self.client.complete(messages, &specs)?;
            self.usage.add(turn.usage);
            session.usage.add(turn.usage);
            session.turns += 1;
            messages.push(turn.message);
            if turn.tool_requests.is_empty() {
                return Ok(());
            }
            for request in turn.tool_requests {
                let reply = tools.call(&request.name, &request.arguments);
                messages.push(json!({"role": "tool", "tool_call_id": request.id, "content": reply}));
            }
        }
        Ok(())
    }
}

impl Proposer for AgentProposer {
    fn name(&self) -> &str {
        "agent"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError> {
        let dir = ConfinedDir::new(ctx.archive)
            .map_err(|source| ProposerError::Io { context: format!("archive {}", ctx.archive.display()), source })?;
        let sizes = if self.compact { ReplySizes::COMPACT } else { ReplySizes::FULL };
        let mut tools = ArchiveTools::new(dir, ctx.limits, sizes, ctx.candidates, ctx.incumbent.meta.id.clone());
        let (system, task) = prompt::prompts(ctx, self.compact)?;
        let mut messages = vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": task})];
        let mut session = Session { model: self.model.clone(), base_url: self.base_url.clone(), ..Session::default() };
        let outcome = self.converse(&mut tools, &mut messages, &mut session);
        session.iteration = ctx.iteration;
        session.messages = messages;
        session.error = outcome.as_ref().err().map(ToString::to_string);
        session.candidates = tools.written.iter().map(|p| p.hypothesis.clone()).collect();
        let path = ctx.session_path("json");
        let text = serde_json::to_string_pretty(&session).unwrap_or_default();
        durable::write_file(&path, text.as_bytes())
            .map_err(|source| ProposerError::Io { context: format!("session {}", path.display()), source })?;
        outcome.map(|()| tools.written)
    }

    fn usage(&self) -> TokenUsage {
        self.usage
    }
}

/// `sessions/<iteration>.json`.
#[derive(Debug, Default, Serialize)]
struct Session {
    iteration: u64,
    model: String,
    base_url: String,
    turns: usize,
    usage: TokenUsage,
    /// The hypotheses of the candidates written.
    candidates: Vec<String>,
    error: Option<String>,
    /// The whole conversation: system and task prompts, model turns, tool calls and replies.
    messages: Vec<Value>,
}
