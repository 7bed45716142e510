//! How to sample one completion: the parameters every policy takes, local or served. Drawing a
//! token from logits with them is the engine's business (whale-engine's `Sampler`).

use serde::{Deserialize, Serialize};

/// Most stop strings of one request, and most bytes of each, wherever a request is made or
/// served (`whale serve`, a harness's `ctx.llm.chat`): every stop string is searched for in the
/// text after every token, so an unbounded list would let one request slow a whole batch; one
/// limit keeps a harness's request from being accepted in process and refused by a server.
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 1024;

/// How to sample one completion. Defaults are the paper's sampling settings (temperature 1.0,
/// top_p 1.0, top_k 20); `max_tokens` 1024 and seed 0 are ours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Logits are divided by it; 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus: keep the smallest set of most likely tokens whose mass reaches `top_p`.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Most completion tokens to generate.
    pub max_tokens: usize,
    /// Generation ends before the earliest occurrence of any of these in the decoded text.
    pub stop: Vec<String>,
    pub seed: u64,
    /// Generate past end-of-sequence tokens, to `max_tokens` or a stop string (vLLM's and
    /// llama.cpp's `ignore_eos`): a benchmark's replies then all have the same length.
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self { temperature: 1.0, top_p: 1.0, top_k: 20, max_tokens: 1024, stop: Vec::new(), seed: 0, ignore_eos: false }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingParamsError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingParamsError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingParamsError::TopP(self.top_p));
        }
        if self.max_tokens == 0 {
            return Err(SamplingParamsError::MaxTokens);
        }
        Ok(())
    }
}

/// The parameter of a [`SamplingParams`] that is out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingParamsError {
    #[error("temperature must be finite and >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("max_tokens must be at least 1")]
    MaxTokens,
}

impl SamplingParamsError {
    /// The field at fault, as [`SamplingParams`] and the OpenAI API spell it.
    pub fn field(&self) -> &'static str {
        match self {
            SamplingParamsError::Temperature(_) => "temperature",
            SamplingParamsError::TopP(_) => "top_p",
            SamplingParamsError::MaxTokens => "max_tokens",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_out_of_range_parameter_is_named() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
        let cases = [
            (SamplingParams { temperature: f32::NAN, ..SamplingParams::default() }, "temperature"),
            (SamplingParams { top_p: 0.0, ..SamplingParams::default() }, "top_p"),
            (SamplingParams { top_p: 1.5, ..SamplingParams::default() }, "top_p"),
            (SamplingParams { max_tokens: 0, ..SamplingParams::default() }, "max_tokens"),
        ];
        for (params, field) in cases {
            assert_eq!(params.validate().expect_err(field).field(), field);
        }
    }
}
