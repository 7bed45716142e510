//! The policy vocabulary: what a rollout says to a chat model and what it gets back, whether
//! the model runs in-process (whale-engine's `LocalPolicy`, in candle) or behind an OpenAI-compatible
//! server ([`RemotePolicy`]).
//!
//! Why apart from whale-lm: the harness runtime and the search only talk to a [`Policy`], so they
//! depend on this crate and compile no tensor library. [`PolicyError`] therefore carries what the
//! layers above act on (which kind of failure, and its message), never the model crate's own
//! error types; whale-lm and whale-engine convert their errors into it.

pub mod policy;
pub mod remote;
pub mod sampling;

pub use policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};
pub use remote::{RemoteConfig, RemoteError, RemotePolicy, RemoteStats};
pub use sampling::{SamplingParams, SamplingParamsError};
