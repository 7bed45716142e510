//! whale's harness runtime: a harness is a JavaScript ES module exporting `solve(task, ctx)`;
//! this crate runs it against one episode of a task and one shared policy, inside a QuickJS
//! sandbox with hard limits, and records everything it did as a [`whale_core::Trajectory`].
//!
//! Harnesses are written by a proposer LLM and are therefore untrusted and often broken: every
//! failure (a limit, an exception, a malformed answer) ends only its own rollout, with reward 0
//! and an error kind, while the batch goes on. The harness-facing API is documented in
//! `docs/harness-api.md`; the stock harnesses every domain starts from are in [`STOCK_HARNESSES`].

mod bindings;
mod chat;
mod engine;
mod harness;
mod host;
mod limits;
mod rollout;
mod sandbox;
pub mod scoring;
mod stock;
mod watchdog;

pub use chat::{call_seed, CHAT_OPTIONS};
pub use engine::{run_rollouts, EngineError, RunOptions, DEFAULT_THREADS};
pub use harness::{content_hash, validate, Harness, HarnessError, HarnessInfo};
pub use limits::Limits;
pub use rollout::{EpisodeSource, RolloutJob};
pub use sandbox::{SourceLocation, HARNESS_FILE};
pub use stock::{stock_harness, StockHarness, STOCK_HARNESSES};
