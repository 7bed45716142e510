//! The hard limits every rollout runs under, so that one bad harness (a proposer's experiment)
//! costs at most a bounded slice of a run and never takes the run down.

use serde::{Deserialize, Serialize};

/// Per-rollout limits. Every field has a default, so a config may name only what it changes.
/// As in QuickJS, `memory_bytes` or `stack_bytes` of 0 turns that limit off. A run holds at most
/// `threads x memory_bytes` of JavaScript heap at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Heap of the rollout's JavaScript runtime (bytes). Breaking it: `out_of_memory`.
    pub memory_bytes: usize,
    /// The harness's own compute time (milliseconds). Time spent waiting for the model, a tool
    /// or the environment does not count. Breaking it: `timeout`.
    pub compute_ms: u64,
    /// Native stack the interpreter may use (bytes); bounds recursion. Breaking it: `stack_overflow`.
    pub stack_bytes: usize,
    /// `ctx.llm.chat` calls. Breaking it: `call_limit`.
    pub model_calls: usize,
    /// `ctx.tools.*` calls. Breaking it: `call_limit`.
    pub tool_calls: usize,
    /// `ctx.env.play` / `ctx.env.submit` calls (and the implicit submit of `solve`'s return
    /// value). Breaking it: `call_limit`.
    pub env_actions: usize,
    /// Characters of message content summed over all model calls. Breaking it: `call_limit`.
    pub prompt_chars: usize,
    /// Largest `max_tokens` one model call may ask for; a larger request throws a catchable error.
    pub max_tokens_per_call: usize,
    /// Characters of one answer or move. Breaking it: `bad_answer`.
    pub answer_chars: usize,
    /// Characters of `ctx.log` output kept in the trajectory; later lines are dropped.
    pub log_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 64 << 20,
            compute_ms: 5_000,
            stack_bytes: 512 << 10,
            model_calls: 16,
            tool_calls: 64,
            env_actions: 64,
            prompt_chars: 200_000,
            max_tokens_per_call: 4_096,
            answer_chars: 10_000,
            log_chars: 20_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_config_keeps_the_other_defaults() {
        let limits: Limits = serde_json::from_str(r#"{"compute_ms": 100, "model_calls": 3}"#).unwrap();
        assert_eq!(limits.compute_ms, 100);
        assert_eq!(limits.model_calls, 3);
        assert_eq!(limits.memory_bytes, Limits::default().memory_bytes);
        assert_eq!(limits.answer_chars, 10_000);
    }

    #[test]
    fn a_misspelt_limit_is_rejected() {
        let err = serde_json::from_str::<Limits>(r#"{"compute_secs": 1}"#).unwrap_err();
        assert!(err.to_string().contains("compute_secs"), "{err}");
    }
}
