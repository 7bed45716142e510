//! The agentic proposer: an LLM behind an OpenAI-compatible chat API, with tool calling,
//! that reads the archive (list, read, grep), checks candidates and writes them. Its system
//! prompt carries the rules of good harness search and the harness API (whole, or in brief
//! with the incumbent and its failures inline for a small model: `prompt.rs`); its whole session
//! (messages, tool calls and their replies, tokens) is kept in the archive as
//! `sessions/<iteration>.json`, whether the session succeeded or not. Its one-shot mode
//! (`one_shot.rs`) asks for each candidate in one request without tools.

mod client;
mod fragment;
mod one_shot;
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
    /// One request per candidate and no tools: the compact prompt's incumbent and failures in,
    /// a hypothesis line and a whole harness in a code block out (`max_tokens` defaults to 2,048
    /// here). Candidates are recorded as proposed by `one-shot`. For a model that cannot hold a
    /// tool-calling loop. Left out of the config's JSON when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub one_shot: bool,
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
            one_shot: false,
        }
    }
}

/// The name an agent proposer records with its candidates: `one-shot` or `agent`.
pub fn agent_proposer_name(one_shot: bool) -> &'static str {
    if one_shot {
        "one-shot"
    } else {
        "agent"
    }
}

/// The agentic proposer.
pub struct AgentProposer {
    client: ChatClient,
    model: String,
    base_url: String,
    max_turns: usize,
    compact: bool,
    one_shot: bool,
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
        let max_tokens = config.max_tokens.or(config.one_shot.then_some(one_shot::DEFAULT_MAX_TOKENS));
        let sampling = Sampling { temperature: config.temperature, max_tokens };
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
        Ok(Self {
            client,
            model,
            base_url,
            max_turns,
            compact: config.compact,
            one_shot: config.one_shot,
            usage: TokenUsage::default(),
        })
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
            let turn = self.client.complete(messages, Some(&specs))?;
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

    /// One request per candidate, each harness read out of its reply into `written`; `session`
    /// records each reply and what became of it. A reply without a harness costs its candidate
    /// only; an API failure ends the session.
    fn ask_one_shot(
        &mut self,
        ctx: &ProposalContext<'_>,
        session: &mut Session,
        written: &mut Vec<Proposal>,
    ) -> Result<(), ProposerError> {
        for index in 0..ctx.candidates {
            let (system, task) = prompt::one_shot_prompts(ctx, index)?;
            if index == 0 {
                session.messages.push(json!({"role": "system", "content": system}));
            }
            let messages = [json!({"role": "system", "content": system}), json!({"role": "user", "content": task})];
            let (reply, outcome) = match self.client.complete(&messages, None) {
                Ok(turn) => {
                    self.usage.add(turn.usage);
                    session.usage.add(turn.usage);
                    session.turns += 1;
                    let outcome = self.read_one_shot(ctx, &turn.message, written);
                    (turn.message, outcome)
                }
                Err(ProposerError::Reply(why)) => (Value::Null, format!("no candidate: an unusable reply: {why}")),
                Err(error) => return Err(error),
            };
            session.replies.push(OneShotReply { task, reply, outcome });
        }
        if written.is_empty() && ctx.candidates > 0 {
            let outcomes: Vec<&str> = session.replies.iter().map(|r| r.outcome.as_str()).collect();
            return Err(ProposerError::Reply(format!("no reply held a harness ({})", outcomes.join("; "))));
        }
        Ok(())
    }

    /// The harness of one reply, added to `written`, and what became of the reply.
    fn read_one_shot(&self, ctx: &ProposalContext<'_>, reply: &Value, written: &mut Vec<Proposal>) -> String {
        match one_shot::read_reply(reply["content"].as_str().unwrap_or_default()) {
            Ok(harness) => {
                let parent = &ctx.incumbent.meta.id;
                // A reply cut off inside its block is left as it is: merged, it would pass for whole.
                let completed = (!harness.cut_off).then(|| fragment::complete(&harness.source, &ctx.incumbent.source));
                let (source, hypothesis, merged) = match completed.flatten() {
                    Some(completed) => {
                        let lacked = completed.lacked.join(", ");
                        let note = format!(" [merged into {parent}: the reply lacked {lacked}]");
                        (completed.source, format!("{}{note}", harness.hypothesis), note)
                    }
                    None => (harness.source, harness.hypothesis, String::new()),
                };
                written.push(Proposal { source, hypothesis, parent: Some(parent.clone()) });
                format!("candidate {}{merged}", written.len())
            }
            Err(why) => format!("no candidate: {why}"),
        }
    }

    fn propose_one_shot(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError> {
        let mut session = Session { model: self.model.clone(), base_url: self.base_url.clone(), ..Session::default() };
        let mut written = Vec::new();
        let outcome = self.ask_one_shot(ctx, &mut session, &mut written);
        session.iteration = ctx.iteration;
        session.error = outcome.as_ref().err().map(ToString::to_string);
        session.candidates = written.iter().map(|p| p.hypothesis.clone()).collect();
        write_session(ctx, &session)?;
        outcome.map(|()| written)
    }
}

impl Proposer for AgentProposer {
    fn name(&self) -> &str {
        agent_proposer_name(self.one_shot)
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError> {
        if self.one_shot {
            return self.propose_one_shot(ctx);
        }
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
        write_session(ctx, &session)?;
        outcome.map(|()| tools.written)
    }

    fn usage(&self) -> TokenUsage {
        self.usage
    }
}

/// Keeps `session` in the archive as `sessions/<iteration>.json` (or the next free name).
fn write_session(ctx: &ProposalContext<'_>, session: &Session) -> Result<(), ProposerError> {
    let path = ctx.session_path("json");
    let text = serde_json::to_string_pretty(session).unwrap_or_default();
    durable::write_file(&path, text.as_bytes())
        .map_err(|source| ProposerError::Io { context: format!("session {}", path.display()), source })
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
    /// The whole conversation: system and task prompts, model turns, tool calls and replies
    /// (in one-shot mode, the system prompt only: the rest is in `replies`).
    messages: Vec<Value>,
    /// One-shot mode: each request's task prompt, the model's reply and what became of it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    replies: Vec<OneShotReply>,
}

#[derive(Debug, Serialize)]
struct OneShotReply {
    task: String,
    reply: Value,
    /// `candidate N`, or `no candidate: <why>`.
    outcome: String,
}
