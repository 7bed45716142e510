//! whale's batching engine: [`LocalPolicy`], whale-policy's [`whale_policy::Policy`] served
//! in-process over a whale-lm [`whale_lm::Decoder`], and the seeded sampler it draws tokens with.
//!
//! Why a crate of its own: serving (scheduling, batching, sampling, stop strings, streaming)
//! is the same for every architecture and is needed by rollouts, `whale serve` and the bench,
//! while training is not; the trainer (whale-train) updates the weights the engine shares
//! without either crate knowing the other.
//!
//! Data flow: each rollout thread's `Policy::chat` renders the messages with the model's
//! chat template, tokenizes them and hands the prompt to the engine's scheduler thread
//! ([`engine`]), which keeps one `DecoderCache` per live sequence and calls
//! `Decoder::forward_step` with a chunk of new tokens for each sequence it serves (prompts to
//! prefill in one call, the last sampled tokens in another; a prompt that begins with tokens
//! some cache holds, a live sequence's or a finished one's kept by the `prefixes` module,
//! starts from a copy of them); it gets the next-token logits back, one row per sequence,
//! samples each row with the request's own seeded [`Sampler`] ([`sampling`]), and sends each
//! finished `Completion` back. After a trainer step the owner calls
//! [`LocalPolicy::set_weights_version`], which bumps `Policy::weights_version`, drops the kept
//! caches and rebuilds the caches of requests in flight. The sampler's errors become
//! `PolicyError`s by the conversion beside [`SamplingError`].

pub mod engine;
mod prefixes;
pub mod sampling;

pub use engine::{ChoiceEvent, EngineConfig, EngineError, EngineStats, LocalPolicy};
pub use sampling::{SampledToken, Sampler, SamplingError, StopMatch, StopMatcher};
