//! The one interface rollouts talk to, whether the model runs in-process (candle) or behind an
//! OpenAI-compatible server. Many rollout threads call one policy at once, so implementations
//! are `Send + Sync` and batch or queue internally; each call carries its own seed so concurrent
//! scheduling never changes what a rollout samples.

use serde::{Deserialize, Serialize};
use whale_core::{ChatMessage, ModelCall, SampledTokens};
use whale_http::HttpError as RemoteError;

use crate::sampling::{SamplingParams, SamplingParamsError};

/// One chat call: the conversation so far and how to sample the reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub params: SamplingParams,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-turn token or a stop string.
    Stop,
    /// `max_tokens` (or the context window) ran out.
    Length,
}

impl FinishReason {
    /// The OpenAI API spelling, as recorded in [`ModelCall::finish_reason`].
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The policy's reply to one [`ChatRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The reply, cut before any stop string and without the end-of-turn token.
    pub text: String,
    /// The sampled token ids, the end-of-turn token included when one was sampled.
    pub token_ids: Vec<u32>,
    /// Per sampled token, its log-probability under the model's full distribution at
    /// temperature 1, before temperature, top-k and top-p.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Completion {
    /// The sampled tokens with their log-probabilities; `None` when the policy did not report
    /// one finite log-probability per token (a server that returns neither, not both, or a
    /// `null` log-probability).
    pub fn sampled(&self) -> Option<SampledTokens> {
        let complete = !self.token_ids.is_empty() && self.token_ids.len() == self.logprobs.len();
        (complete && self.logprobs.iter().all(|l| l.is_finite()))
            .then(|| SampledTokens { ids: self.token_ids.clone(), logprobs: self.logprobs.clone() })
    }

    /// The trace record of this call (trainable, as every policy call is by default).
    pub fn model_call(&self, messages: Vec<ChatMessage>, latency_ms: f64) -> ModelCall {
        ModelCall {
            messages,
            completion: self.text.clone(),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            trainable: true,
            finish_reason: self.finish_reason.as_str().to_string(),
            latency_ms,
            sampled: self.sampled(),
        }
    }
}

/// Why a policy could not answer. Each variant is one kind of failure the layers above treat
/// differently (a harness may catch a prompt that is too long; a server maps each to its status),
/// carrying the message of the error that caused it.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("prompt of {prompt_tokens} tokens does not fit the context window of {context_window}")]
    PromptTooLong { prompt_tokens: usize, context_window: usize },
    /// A server refused the prompt (with the reply asked for) as longer than its model's
    /// context: the served form of [`PolicyError::PromptTooLong`], the numbers in its message.
    #[error("the server refused the prompt as too long for the model's context: {0}")]
    ContextExceeded(String),
    #[error("the generation engine has stopped")]
    EngineStopped,
    /// The caller of a streamed generation asked to stop (its client went away).
    #[error("the generation was cancelled by its caller")]
    Cancelled,
    /// The prompt cannot be fed to the model (empty, or ids outside its vocabulary).
    #[error("invalid prompt: {0}")]
    InvalidPrompt(String),
    /// The model's forward pass failed (e.g. out of device memory); every request batched
    /// with it gets this error.
    #[error("the model failed: {0}")]
    Model(String),
    /// The OpenAI-compatible server failed the request (see [`crate::remote`]).
    #[error("remote policy: {0}")]
    Remote(#[from] RemoteError),
    /// The sampling parameters are invalid, or the sampler could not draw from the logits.
    #[error("{0}")]
    Sampling(String),
    /// The chat template could not render the messages.
    #[error("{0}")]
    Template(String),
    /// The chat template's own `raise_exception` refused the messages (e.g. a system message
    /// after the first): the request's fault, told apart from a failed render.
    #[error("{0}")]
    TemplateRefused(String),
    /// The tokenizer could not encode the prompt or decode the reply.
    #[error("{0}")]
    Tokenizer(String),
}

impl From<SamplingParamsError> for PolicyError {
    fn from(error: SamplingParamsError) -> Self {
        PolicyError::Sampling(error.to_string())
    }
}

/// A chat model that rollouts can call concurrently.
pub trait Policy: Send + Sync {
    /// Generates one reply to `request.messages`.
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError>;

    /// A human-readable name (model path, served model or adapter name).
    fn name(&self) -> String;

    /// Which weights answer now; bumped on every weight update so results can be keyed by it.
    fn weights_version(&self) -> u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_without_params_gets_the_default_sampling() {
        let request: ChatRequest =
            serde_json::from_str(r#"{"messages": [{"role": "user", "content": "hi"}]}"#).expect("json");
        assert_eq!(request.messages, vec![ChatMessage::new("user", "hi")]);
        assert_eq!(request.params, SamplingParams::default());
    }

    #[test]
    fn invalid_sampling_parameters_are_a_sampling_error_with_their_message() {
        let params = SamplingParams { temperature: -1.0, ..SamplingParams::default() };
        let error = PolicyError::from(params.validate().expect_err("negative temperature"));
        assert!(matches!(&error, PolicyError::Sampling(message) if message.contains("temperature")), "{error}");
        assert_eq!(error.to_string(), "temperature must be finite and >= 0, got -1");
    }

    #[test]
    fn a_completion_becomes_the_trace_record_of_its_call() {
        let completion = Completion {
            text: "42".to_string(),
            token_ids: vec![7, 9, 2],
            logprobs: vec![-0.1, -0.2, -0.01],
            finish_reason: FinishReason::Length,
            prompt_tokens: 15,
            completion_tokens: 3,
        };
        let messages = vec![ChatMessage::new("user", "6*7?")];
        let call = completion.model_call(messages.clone(), 12.5);
        assert_eq!(call.messages, messages);
        assert_eq!(call.completion, "42");
        assert_eq!((call.prompt_tokens, call.completion_tokens), (15, 3));
        assert_eq!(call.finish_reason, "length");
        assert!(call.trainable);
        let sampled = call.sampled.expect("tokens and log-probabilities");
        assert_eq!((sampled.ids, sampled.logprobs), (vec![7, 9, 2], vec![-0.1, -0.2, -0.01]));
        assert_eq!(serde_json::to_string(&FinishReason::Stop).expect("json"), "\"stop\"");
    }
}
