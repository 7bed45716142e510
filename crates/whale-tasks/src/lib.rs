//! The three whale domains: math, chess and search-based QA.
//!
//! Each domain module owns the whole life of its tasks: a loader for real data files
//! (every bad record becomes a [`RecordError`] naming `file:line`, the field and what was
//! expected — loading never stops at the first problem), a seeded generator of synthetic
//! tasks at graded difficulty, an [`Episode`] (initial observation, tools, how it ends) and
//! a verifier. [`Domain`](whale_core::Domain)-generic code goes through [`domain::DomainTasks`].

pub mod chess;
pub mod domain;
pub mod episode;
pub mod math;
pub mod qa;
pub mod record;
pub mod split;

pub use domain::{replay_gold, DomainTasks, Environment, EnvironmentError, PredictionScore, QaCorpus};
pub use episode::{Episode, StepOutcome, ToolError, ToolSpec};
pub use record::{json_kind, read_jsonl, LoadReport, RecordError};
