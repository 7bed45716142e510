//! The three whale domains: math, chess and search-based QA.
//!
//! Each domain module owns the whole life of its tasks: a loader for real data files
//! (every bad record becomes a [`RecordError`] naming `file:line`, the field and what was
//! expected — loading never stops at the first problem), a seeded generator of synthetic
//! tasks at graded difficulty, an [`Episode`] (initial observation, tools, how it ends) and
//! a verifier. Each implements [`TaskDomain`], and [`task_domain`] is the one place that maps a
//! [`Domain`](whale_core::Domain) to it: a new domain is its folder, its impl and that line.

pub mod chess;
pub mod domain;
pub mod environment;
pub mod episode;
pub mod math;
pub mod qa;
pub mod record;
pub mod registry;
pub mod split;

pub use domain::{Bottleneck, CorpusSource, PredictionScore, TaskDomain};
pub use environment::{Environment, EnvironmentError, EpisodeFactory};
pub use episode::{Episode, StepOutcome, ToolError, ToolSpec};
pub use record::{json_kind, read_jsonl, LoadReport, RecordError};
pub use registry::{replay_gold, task_domain, GoldReplayError};
