//! A [`Policy`] behind any OpenAI-compatible `/v1/chat/completions` server: vLLM, SGLang, a
//! hosted API or `whale serve`.
//!
//! Every request goes through [`whale_http::JsonClient`]: a WHALE step launches hundreds of
//! rollouts against one server, and a rollout lost to a transient fault would bias the step
//! towards the prompts that happened to get through, so transient faults are retried with
//! jittered backoff and other 4xx statuses are reported at once with the server's message. At
//! most `max_concurrency` requests are in flight, which is how a rollout pool of any size is kept
//! within what the server batches well.
//!
//! The adapter or served model is the `model` of each request: [`RemotePolicy::set_model`]
//! routes later requests to another one (a LoRA adapter just loaded, a new checkpoint) and bumps
//! [`Policy::weights_version`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
pub use whale_http::{server_message, HttpError as RemoteError, TransportFault};
use whale_http::{ClientConfig, JsonClient, RetryPolicy};

use crate::policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};

/// The longest timeout a config may set (a year), so that no deadline overflows.
const MAX_TIMEOUT_S: f64 = 365.0 * 86_400.0;

/// Where the server is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteConfig {
    /// The API root, e.g. `http://127.0.0.1:8000/v1`; requests go to
    /// `<base_url>/chat/completions`.
    pub base_url: String,
    /// The served model or adapter name, sent as each request's `model`.
    pub model: String,
    /// Sent as a bearer token; when unset, the environment variable `api_key_env` is read.
    pub api_key: Option<String>,
    /// Default `OPENAI_API_KEY`; empty reads nothing. A local server needs no key.
    pub api_key_env: String,
    /// Most requests in flight at once (default 64); more callers wait for a free slot.
    pub max_concurrency: usize,
    /// Seconds one attempt may take, from connecting to the last byte of the reply (default 600).
    pub request_timeout_s: f64,
    /// Seconds to establish a connection (default 10).
    pub connect_timeout_s: f64,
    /// Retries after the first attempt of a request on transient faults (default 8).
    pub max_retries: u32,
    /// Cap of the first backoff draw, doubled per retry up to `backoff_max_ms` (defaults 500 and
    /// 30,000).
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// Send the vLLM / SGLang sampling extensions `top_k`, `return_token_ids` and (when asked
    /// for) `ignore_eos` (default true).
    /// APIs that reject unknown fields (OpenAI's own) need false, and requests with `top_k` 0.
    pub extensions: bool,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            base_url: "http://127.0.0.1:8000/v1".to_string(),
            model: String::new(),
            api_key: None,
            api_key_env: "OPENAI_API_KEY".to_string(),
            max_concurrency: 64,
            request_timeout_s: 600.0,
            connect_timeout_s: 10.0,
            max_retries: 8,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
            extensions: true,
        }
    }
}

impl RemoteConfig {
    fn validate(&self) -> Result<(), RemoteError> {
        let config = |key: &'static str, reason: &str| Err(RemoteError::Config { key, reason: reason.to_string() });
        if !(self.base_url.starts_with("http://") || self.base_url.starts_with("https://")) {
            return config("base_url", "must start with http:// or https://");
        }
        if self.model.is_empty() {
            return config("model", "must name the served model or adapter");
        }
        if self.max_concurrency == 0 {
            return config("max_concurrency", "must be positive");
        }
        for (key, seconds) in
            [("request_timeout_s", self.request_timeout_s), ("connect_timeout_s", self.connect_timeout_s)]
        {
            if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TIMEOUT_S) {
                return config(key, "must be a positive number of seconds, at most a year");
            }
        }
        if self.backoff_max_ms < self.backoff_initial_ms {
            return config("backoff_max_ms", "must be at least backoff_initial_ms");
        }
        Ok(())
    }

    /// `api_key`, else the non-empty value of the variable `api_key_env`.
    fn resolved_api_key(&self) -> Option<String> {
        self.api_key.clone().or_else(|| {
            (!self.api_key_env.is_empty())
                .then(|| std::env::var(&self.api_key_env).ok().filter(|key| !key.is_empty()))
                .flatten()
        })
    }
}

/// Counters since the policy was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Calls answered with completions.
    pub succeeded: u64,
    /// Calls that ended in an error (permanent, or retries exhausted).
    pub failed: u64,
    /// Attempts repeated after a transient fault.
    pub retries: u64,
}

/// A policy served over HTTP; see the module documentation.
pub struct RemotePolicy {
    http: JsonClient,
    chat_url: String,
    config: RemoteConfig,
    model: RwLock<String>,
    weights_version: AtomicU64,
    stats: Mutex<RemoteStats>,
}

impl RemotePolicy {
    pub fn new(config: RemoteConfig) -> Result<Self, RemoteError> {
        config.validate()?;
        let http = JsonClient::new(ClientConfig {
            request_timeout: Duration::from_secs_f64(config.request_timeout_s),
            connect_timeout: Duration::from_secs_f64(config.connect_timeout_s),
            api_key: config.resolved_api_key(),
            retry: RetryPolicy::from_millis(config.max_retries, config.backoff_initial_ms, config.backoff_max_ms),
            max_in_flight: Some(config.max_concurrency),
        })?;
        Ok(Self {
            http,
            chat_url: format!("{}/chat/completions", config.base_url.trim_end_matches('/')),
            model: RwLock::new(config.model.clone()),
            weights_version: AtomicU64::new(0),
            stats: Mutex::new(RemoteStats::default()),
            config,
        })
    }

    pub fn config(&self) -> &RemoteConfig {
        &self.config
    }

    /// The served model or adapter requests go to now.
    pub fn model(&self) -> String {
        self.model.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Routes requests from now on to the served model or adapter `name` and returns the new
    /// weights version (the previous one plus one). Requests in flight finish where they went.
    pub fn set_model(&self, name: impl Into<String>) -> u64 {
        *self.model.write().unwrap_or_else(PoisonError::into_inner) = name.into();
        self.weights_version.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn stats(&self) -> RemoteStats {
        RemoteStats { retries: self.http.retries(), ..*self.stats.lock().unwrap_or_else(PoisonError::into_inner) }
    }

    /// `n` completions of one request in a single HTTP call (the server's `n`). How the
    /// choices are seeded is the server's: vLLM draws them in turn from the request's seed,
    /// `whale serve` gives choice `i` the seed `seed + i`.
    pub fn chat_n(&self, request: &ChatRequest, n: usize) -> Result<Vec<Completion>, PolicyError> {
        let outcome =
            self.request_body(request, n).and_then(|body| self.http.post(&self.chat_url, &body)).and_then(|text| {
                parse_completions(&text, n).map_err(|reason| RemoteError::Reply {
                    url: self.chat_url.clone(),
                    expected: "chat completion",
                    reason,
                })
            });
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        match &outcome {
            Ok(_) => stats.succeeded += 1,
            Err(_) => stats.failed += 1,
        }
        outcome.map_err(request_refusal)
    }

    fn request_body(&self, request: &ChatRequest, n: usize) -> Result<Value, RemoteError> {
        if n == 0 {
            return Err(RemoteError::Config { key: "n", reason: "at least one completion must be asked for".into() });
        }
        let params = &request.params;
        let mut body = json!({
            "model": self.model(),
            "messages": request.messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            // vLLM takes seeds in i64's range only (HTTP 400 above it), so the seed goes as the same
            // 64 bits read as a signed number: vLLM and whale serve (which reads them back as the
            // same u64) are tested with it, SGLang and hosted APIs are not.
            "seed": params.seed as i64,
            "n": n,
            "logprobs": true,
            "top_logprobs": 0,
            "stream": false,
        });
        if !params.stop.is_empty() {
            body["stop"] = json!(params.stop);
        }
        if self.config.extensions {
            // vLLM and SGLang spell "no top-k" as -1.
            body["top_k"] = if params.top_k == 0 { json!(-1) } else { json!(params.top_k) };
            body["return_token_ids"] = json!(true);
            if params.ignore_eos {
                body["ignore_eos"] = json!(true);
            }
        } else if params.ignore_eos {
            return Err(RemoteError::Config {
                key: "extensions",
                reason: "ignore_eos cannot be sent without the extensions".to_string(),
            });
        } else if params.top_k != 0 {
            return Err(RemoteError::Config {
                key: "extensions",
                reason: format!("top_k {} cannot be sent without the extensions; use top_k 0", params.top_k),
            });
        }
        Ok(body)
    }
}

/// A server's refusal that is the request's own to handle, as the harness may catch it in
/// process: a prompt over the model's context ([`PolicyError::ContextExceeded`]) and `whale
/// serve`'s `template_refused` ([`PolicyError::TemplateRefused`]); any other failure as it is.
fn request_refusal(error: RemoteError) -> PolicyError {
    match &error {
        RemoteError::Status { status: 422, code: Some(code), message, .. } if code == "template_refused" => {
            PolicyError::TemplateRefused(message.clone())
        }
        RemoteError::Status { url, status: 400, message, .. } if prompt_over_context(message) => {
            PolicyError::ContextExceeded(format!("{url}: {message}"))
        }
        _ => PolicyError::Remote(error),
    }
}

/// Whether a server's message says the prompt itself does not fit the model's context: vLLM's
/// and OpenAI's "maximum context length" when the messages alone reach it, SGLang's "context
/// length", llama.cpp's "context size", whale serve's "context window". A prompt that fits with
/// a `max_tokens` that does not (vLLM: "'max_tokens' ... is too large"; OpenAI: "N in the
/// messages, M in the completion" with N under the context) is the run's setting, not the
/// harness's prompt: in process whale shortens such a reply instead.
fn prompt_over_context(message: &str) -> bool {
    let message = message.to_lowercase();
    if message.contains("max_tokens") || message.contains("max_completion_tokens") {
        return false;
    }
    let context = number_after(&message, "maximum context length is ");
    let prompt = number_before(&message, " in the messages").or_else(|| number_before(&message, " input tokens"));
    if let (Some(context), Some(prompt)) = (context, prompt) {
        return prompt >= context;
    }
    ["context length", "context window", "context size"].iter().any(|phrase| message.contains(phrase))
}

/// The whole number right after the first `marker` in `text`.
fn number_after(text: &str, marker: &str) -> Option<u64> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..digits].parse().ok()
}

/// The whole number right before the first `marker` in `text`.
fn number_before(text: &str, marker: &str) -> Option<u64> {
    let before = &text[..text.find(marker)?];
    let start = before.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |at| at + 1);
    before[start..].parse().ok()
}

impl Policy for RemotePolicy {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let mut completions = self.chat_n(&request, 1)?;
        completions.pop().ok_or(PolicyError::Remote(RemoteError::Reply {
            url: self.chat_url.clone(),
            expected: "chat completion",
            reason: "no choice".to_string(),
        }))
    }

    fn name(&self) -> String {
        self.model()
    }

    fn weights_version(&self) -> u64 {
        self.weights_version.load(Ordering::SeqCst)
    }
}

#[derive(Deserialize)]
struct WireReply {
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    index: Option<usize>,
    message: WireMessage,
    finish_reason: Option<String>,
    logprobs: Option<WireLogprobs>,
    /// vLLM's `return_token_ids`, and `whale serve`.
    token_ids: Option<Vec<u32>>,
}

#[derive(Deserialize)]
struct WireMessage {
    content: Option<String>,
}

#[derive(Deserialize)]
struct WireLogprobs {
    content: Option<Vec<WireTokenLogprob>>,
}

#[derive(Deserialize)]
struct WireTokenLogprob {
    /// `null` where the server could not write an infinite value in JSON.
    logprob: Option<f32>,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: usize,
    completion_tokens: usize,
}

/// The `n` completions of a chat-completion reply, in choice order.
fn parse_completions(text: &str, n: usize) -> Result<Vec<Completion>, String> {
    let mut reply: WireReply = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if reply.choices.len() != n {
        return Err(format!("{} choices for n = {n}", reply.choices.len()));
    }
    reply.choices.sort_by_key(|choice| choice.index);
    if reply.choices.iter().enumerate().any(|(position, choice)| choice.index.is_some_and(|i| i != position)) {
        return Err(format!("choice indices are not 0..{n}"));
    }
    let (prompt_tokens, total_completion_tokens) =
        reply.usage.map_or((0, None), |usage| (usage.prompt_tokens, Some(usage.completion_tokens)));
    reply
        .choices
        .into_iter()
        .map(|choice| {
            let finish_reason = match choice.finish_reason.as_deref() {
                Some("stop" | "eos" | "tool_calls" | "function_call") => FinishReason::Stop,
                Some("length") => FinishReason::Length,
                other => return Err(format!("unsupported finish_reason {other:?}")),
            };
            let logprobs: Vec<f32> = choice
                .logprobs
                .and_then(|logprobs| logprobs.content)
                .unwrap_or_default()
                .iter()
                .map(|token| token.logprob.unwrap_or(f32::NEG_INFINITY))
                .collect();
            let token_ids = choice.token_ids.unwrap_or_default();
            // Per-choice counts where the server says them; the usage total otherwise (exact
            // for n = 1, an even share for more).
            let completion_tokens = match (token_ids.len(), logprobs.len(), total_completion_tokens) {
                (0, 0, Some(total)) => total / n,
                (0, counted, _) => counted,
                (counted, _, _) => counted,
            };
            Ok(Completion {
                text: choice.message.content.unwrap_or_default(),
                token_ids,
                logprobs,
                finish_reason,
                prompt_tokens,
                completion_tokens,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use whale_core::ChatMessage;

    fn policy(config: RemoteConfig) -> RemotePolicy {
        RemotePolicy::new(RemoteConfig { model: "m".into(), ..config }).expect("valid config")
    }

    #[test]
    fn a_reply_becomes_completions_with_ids_logprobs_and_usage() {
        let reply = json!({"id": "x", "choices": [
            {"index": 1, "message": {"role": "assistant", "content": "b"}, "finish_reason": "length",
             "logprobs": {"content": [{"token": "b", "logprob": -0.5}, {"token": "c", "logprob": null}]}},
            {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop",
             "token_ids": [5, 2], "logprobs": null}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}});
        let completions = parse_completions(&reply.to_string(), 2).expect("valid");
        assert_eq!(completions[0].text, "a");
        assert_eq!(completions[0].token_ids, [5, 2]);
        assert_eq!((completions[0].completion_tokens, completions[0].finish_reason), (2, FinishReason::Stop));
        assert_eq!(completions[1].logprobs, [-0.5, f32::NEG_INFINITY]);
        assert_eq!((completions[1].completion_tokens, completions[1].prompt_tokens), (2, 9));
        assert!(parse_completions(&reply.to_string(), 1).unwrap_err().contains("2 choices"));
        let odd = json!({"choices": [{"message": {"content": "a"}, "finish_reason": "abort"}]});
        assert!(parse_completions(&odd.to_string(), 1).unwrap_err().contains("abort"));
        let choice = |index: usize| json!({"index": index, "message": {"content": "a"}, "finish_reason": "stop"});
        let twice = json!({"choices": [choice(0), choice(0)]});
        assert!(parse_completions(&twice.to_string(), 2).unwrap_err().contains("indices"));
        let bad_timeout = RemoteConfig { model: "m".into(), request_timeout_s: 1e20, ..RemoteConfig::default() };
        assert!(matches!(RemotePolicy::new(bad_timeout), Err(RemoteError::Config { key: "request_timeout_s", .. })));
    }

    #[test]
    fn the_request_carries_every_sampling_parameter() {
        let remote = policy(RemoteConfig::default());
        let mut request = ChatRequest { messages: vec![ChatMessage::new("user", "hi")], params: Default::default() };
        request.params.stop = vec!["\n".into()];
        request.params.top_k = 0;
        let body = remote.request_body(&request, 3).expect("body");
        assert_eq!(body["model"], "m");
        assert_eq!(body["messages"][0]["content"], "hi");
        assert_eq!(
            (body["n"].clone(), body["top_k"].clone(), body["stop"][0].clone()),
            (json!(3), json!(-1), json!("\n"))
        );
        assert_eq!((body["logprobs"].clone(), body["return_token_ids"].clone()), (json!(true), json!(true)));
        assert!(body.get("ignore_eos").is_none(), "sent only when asked for");
        request.params.seed = u64::MAX;
        let body = remote.request_body(&request, 1).expect("body");
        assert_eq!(body["seed"], json!(-1), "a seed past i64 goes as its bits, which vLLM accepts");
        request.params.ignore_eos = true;
        assert_eq!(remote.request_body(&request, 1).expect("body")["ignore_eos"], json!(true));
        let plain = policy(RemoteConfig { extensions: false, ..RemoteConfig::default() });
        assert!(matches!(plain.request_body(&request, 1), Err(RemoteError::Config { key: "extensions", .. })));
        request.params.ignore_eos = false;
        let plain = policy(RemoteConfig { extensions: false, ..RemoteConfig::default() });
        assert!(plain.request_body(&request, 1).expect("top_k 0").get("top_k").is_none());
        request.params.top_k = 20;
        assert!(matches!(plain.request_body(&request, 1), Err(RemoteError::Config { key: "extensions", .. })));
    }

    /// The refusals of a prompt over the context that vLLM, OpenAI, SGLang, llama.cpp and whale
    /// serve send, and whale serve's template refusal, are the harness's to catch; a `max_tokens`
    /// past the context with a prompt that fits, other 400s and other statuses stay the server's.
    #[test]
    fn a_refusal_of_the_request_itself_is_told_apart() {
        let status = |status, message: &str, code: Option<&str>| RemoteError::Status {
            url: "u".into(),
            status,
            message: message.into(),
            code: code.map(String::from),
            retry_after: None,
        };
        let too_long = [
            "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2090 in the \
             messages, 10 in the completion).",
            "This model's maximum context length is 2048 tokens. However, your request has 3000 input tokens.",
            "The prompt (total length 3000) is too long to fit into the model (context length 2048).",
            "The input (3000 tokens) is longer than the model's context length (2048 tokens).",
            "the request exceeds the available context size, try increasing it",
            "prompt of 300 tokens does not fit the context window of 256",
        ];
        for message in too_long {
            assert!(
                matches!(request_refusal(status(400, message, None)), PolicyError::ContextExceeded(_)),
                "{message}"
            );
        }
        let reply_too_long = [
            "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (1900 in the \
             messages, 200 in the completion).",
            "'max_tokens' or 'max_completion_tokens' is too large: 300. This model's maximum context length is 2048 \
             tokens and your request has 1900 input tokens (300 > 2048 - 1900).",
        ];
        for message in reply_too_long {
            assert!(matches!(request_refusal(status(400, message, None)), PolicyError::Remote(_)), "{message}");
        }
        let refused = status(422, "chat template x refused the messages: no", Some("template_refused"));
        assert!(matches!(request_refusal(refused), PolicyError::TemplateRefused(_)));
        assert!(matches!(request_refusal(status(422, "undefined value", None)), PolicyError::Remote(_)));
        for (code, message) in [(400, "temperature must be non-negative"), (500, "context length"), (404, "no model")] {
            assert!(matches!(request_refusal(status(code, message, None)), PolicyError::Remote(_)), "{code} {message}");
        }
    }

    #[test]
    fn errors_are_sorted_into_transient_and_permanent_and_configs_checked() {
        let status = |status| RemoteError::Status {
            url: "u".into(),
            status,
            message: "m".into(),
            code: None,
            retry_after: None,
        };
        assert!([408, 429, 500, 502, 503].iter().all(|&s| status(s).is_transient()));
        assert!([400, 401, 404, 422].iter().all(|&s| !status(s).is_transient()));
        let bad = RemoteConfig { base_url: "localhost:8000".into(), model: "m".into(), ..RemoteConfig::default() };
        assert!(matches!(RemotePolicy::new(bad), Err(RemoteError::Config { key: "base_url", .. })));
        assert!(matches!(RemotePolicy::new(RemoteConfig::default()), Err(RemoteError::Config { key: "model", .. })));
    }

    #[test]
    fn set_model_routes_later_requests_and_bumps_the_version() {
        let remote = policy(RemoteConfig::default());
        assert_eq!((remote.model(), remote.weights_version()), ("m".to_string(), 0));
        assert_eq!(remote.set_model("adapter-1"), 1);
        let request = ChatRequest { messages: vec![ChatMessage::new("user", "hi")], params: Default::default() };
        assert_eq!(remote.request_body(&request, 1).expect("body")["model"], "adapter-1");
        assert_eq!((remote.name(), remote.weights_version()), ("adapter-1".to_string(), 1));
    }
}
