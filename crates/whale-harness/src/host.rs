//! Everything a harness can reach outside its sandbox: the policy, the episode's tools and
//! actions, a seeded random source and a log. Each call is checked against the rollout's
//! limits, timed with the compute clock stopped, and recorded in order for the trajectory.

use crate::chat::{call_seed, parse_messages, ChatOptions};
use crate::watchdog::Watchdog;
use crate::Limits;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use whale_core::{ErrorKind, ModelCall, ToolCall, Verdict};
use whale_policy::{ChatRequest, FinishReason, Policy, PolicyError, SamplingParams};
use whale_tasks::{Episode, ToolSpec};

/// A host call that did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostFailure {
    /// The script gets an ordinary error it may catch (bad arguments, a tool's refusal).
    Catchable(String),
    /// The rollout ends with this error (a limit broken, the policy gone).
    Fatal(ErrorKind, String),
}

/// How the harness acted on the episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActionKind {
    Play,
    Submit,
}

impl ActionKind {
    /// The `ctx.env` method that takes this action.
    pub fn method(self) -> &'static str {
        match self {
            ActionKind::Play => "play",
            ActionKind::Submit => "submit",
        }
    }
}

/// What the rollout did, in the order it happened.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    pub model_calls: Vec<ModelCall>,
    pub tool_calls: Vec<ToolCall>,
    pub order: Vec<(String, usize)>,
    pub actions: Vec<(ActionKind, String)>,
    pub log: Vec<String>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub model_ms: f64,
    pub tools_ms: f64,
    model_attempts: usize,
    tool_attempts: usize,
    prompt_chars: usize,
    log_chars: usize,
    log_full: bool,
}

impl Trace {
    /// Submitted answers are a string (the last one); played moves are the list of moves.
    pub fn answer(&self) -> Option<Value> {
        if self.actions.iter().any(|(kind, _)| *kind == ActionKind::Play) {
            return Some(Value::Array(self.actions.iter().map(|(_, a)| Value::String(a.clone())).collect()));
        }
        self.actions.last().map(|(_, answer)| Value::String(answer.clone()))
    }

    fn push_tool_call(&mut self, call: ToolCall) {
        self.tools_ms += call.latency_ms;
        self.order.push(("tool".into(), self.tool_calls.len()));
        self.tool_calls.push(call);
    }
}

pub(crate) struct HostState {
    episode: Box<dyn Episode>,
    policy: Arc<dyn Policy>,
    pub(crate) limits: Limits,
    sampling: SamplingParams,
    seed: u64,
    rng: ChaCha8Rng,
    watchdog: Rc<Watchdog>,
    pub trace: Trace,
}

impl HostState {
    pub fn new(
        episode: Box<dyn Episode>,
        policy: Arc<dyn Policy>,
        limits: &Limits,
        sampling: &SamplingParams,
        seed: u64,
        watchdog: Rc<Watchdog>,
    ) -> Self {
        Self {
            episode,
            policy,
            limits: limits.clone(),
            sampling: sampling.clone(),
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            watchdog,
            trace: Trace::default(),
        }
    }

    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        self.episode.tools()
    }

    pub fn observation(&self) -> String {
        self.episode.observation()
    }

    pub fn is_done(&self) -> bool {
        self.episode.is_done()
    }

    pub fn verdict(&self) -> Verdict {
        self.episode.verdict()
    }

    pub fn has_acted(&self) -> bool {
        !self.trace.actions.is_empty()
    }

    /// Uniform in [0, 1), from the rollout's seeded stream.
    pub fn random(&mut self) -> f64 {
        self.rng.gen()
    }

    /// Keeps `line` unless the log budget is spent; the first dropped line leaves a marker.
    pub fn log(&mut self, line: String) {
        let trace = &mut self.trace;
        if trace.log_full {
            return;
        }
        // An empty line counts as one character, so the budget bounds the number of lines too.
        let chars = line.chars().count().max(1);
        if trace.log_chars + chars > self.limits.log_chars {
            trace.log_full = true;
            trace.log.push(format!("[log truncated: more than {} characters]", self.limits.log_chars));
            return;
        }
        trace.log_chars += chars;
        trace.log.push(line);
    }

    /// `ctx.llm.chat`: checks the budgets, asks the policy, records the call.
    pub fn chat(&mut self, messages: &Value, options: &Value) -> Result<Value, HostFailure> {
        let call_index = self.trace.model_attempts;
        if call_index >= self.limits.model_calls {
            return Err(HostFailure::Fatal(
                ErrorKind::CallLimit,
                format!("more than {} model calls (limit model_calls)", self.limits.model_calls),
            ));
        }
        self.trace.model_attempts += 1;
        let messages = parse_messages(messages).map_err(HostFailure::Catchable)?;
        let options = ChatOptions::parse(options, &self.sampling, self.limits.max_tokens_per_call)
            .map_err(HostFailure::Catchable)?;
        self.spend_prompt_chars(messages.iter().map(|m| m.content.chars().count()).sum())?;
        let mut params = options.params;
        params.seed = call_seed(self.seed, call_index as u64);
        let request = ChatRequest { messages: messages.clone(), params };
        let started = Instant::now();
        let reply = {
            let _paused = self.watchdog.pause();
            self.policy.chat(request)
        };
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        self.trace.model_ms += latency_ms;
        let completion = reply.map_err(policy_failure)?;
        let finish_reason = match completion.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        let trace = &mut self.trace;
        trace.prompt_tokens += completion.prompt_tokens;
        trace.completion_tokens += completion.completion_tokens;
        trace.order.push(("model".into(), trace.model_calls.len()));
        trace.model_calls.push(ModelCall {
            messages,
            completion: completion.text.clone(),
            prompt_tokens: completion.prompt_tokens,
            completion_tokens: completion.completion_tokens,
            trainable: options.trainable,
            finish_reason: finish_reason.into(),
            latency_ms,
            sampled: completion.sampled(),
        });
        Ok(json!({
            "text": completion.text,
            "finish_reason": finish_reason,
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
        }))
    }

    fn spend_prompt_chars(&mut self, chars: usize) -> Result<(), HostFailure> {
        let total = self.trace.prompt_chars + chars;
        if total > self.limits.prompt_chars {
            return Err(HostFailure::Fatal(
                ErrorKind::CallLimit,
                format!(
                    "prompts total {total} characters, more than the limit prompt_chars = {}",
                    self.limits.prompt_chars
                ),
            ));
        }
        self.trace.prompt_chars = total;
        Ok(())
    }

    /// `ctx.tools.<name>(...args)`.
    pub fn call_tool(&mut self, name: &str, args: Vec<Value>) -> Result<Value, HostFailure> {
        if self.trace.tool_attempts >= self.limits.tool_calls {
            return Err(HostFailure::Fatal(
                ErrorKind::CallLimit,
                format!("more than {} tool calls (limit tool_calls)", self.limits.tool_calls),
            ));
        }
        self.trace.tool_attempts += 1;
        let started = Instant::now();
        let result = {
            let _paused = self.watchdog.pause();
            self.episode.call_tool(name, &args)
        };
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        let (value, error) = match &result {
            Ok(value) => (value.clone(), None),
            Err(error) => (Value::Null, Some(error.to_string())),
        };
        self.trace.push_tool_call(ToolCall {
            name: name.into(),
            args: Value::Array(args),
            result: value,
            error,
            latency_ms,
        });
        result.map_err(|error| HostFailure::Catchable(error.to_string()))
    }

    /// `ctx.env.play(move)` / `ctx.env.submit(answer)` (and the submit of `solve`'s return value).
    pub fn act(&mut self, kind: ActionKind, action: String) -> Result<Value, HostFailure> {
        let chars = action.chars().count();
        if chars > self.limits.answer_chars {
            return Err(HostFailure::Fatal(
                ErrorKind::BadAnswer,
                format!(
                    "the answer has {chars} characters, more than the limit answer_chars = {}",
                    self.limits.answer_chars
                ),
            ));
        }
        if self.trace.actions.len() >= self.limits.env_actions {
            return Err(HostFailure::Fatal(
                ErrorKind::CallLimit,
                format!("more than {} env actions (limit env_actions)", self.limits.env_actions),
            ));
        }
        let started = Instant::now();
        let outcome = {
            let _paused = self.watchdog.pause();
            self.episode.act(&action)
        };
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        let result = json!({
            "reply": outcome.reply,
            "invalid": outcome.invalid,
            "done": outcome.done,
            "solved": outcome.solved,
        });
        self.trace.actions.push((kind, action.clone()));
        self.trace.push_tool_call(ToolCall {
            name: format!("env.{}", kind.method()),
            args: json!([action]),
            result: result.clone(),
            error: None,
            latency_ms,
        });
        Ok(result)
    }
}

/// A prompt the model cannot take (too long, in process or refused by a server, or refused by
/// the chat template's own `raise_exception`) is the harness's problem to handle; anything else
/// about the policy ends the rollout as a `policy` error. A template that fails to render for
/// another reason stays the policy's: it cannot be told apart from a template the engine
/// renders wrongly, which would otherwise be scored as failed tasks.
fn policy_failure(error: PolicyError) -> HostFailure {
    let catchable = matches!(
        error,
        PolicyError::PromptTooLong { .. } | PolicyError::ContextExceeded(_) | PolicyError::TemplateRefused(_)
    );
    if catchable {
        HostFailure::Catchable(format!("ctx.llm.chat: {error}"))
    } else {
        HostFailure::Fatal(ErrorKind::Policy, format!("the policy failed: {error}"))
    }
}
