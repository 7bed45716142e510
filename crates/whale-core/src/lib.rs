//! The shared vocabulary of whale.
//!
//! Every other crate speaks in these types: a [`Task`] goes into an episode, a
//! [`Trajectory`] comes out, [`metrics`] summarise many trajectories, the [`Ledger`]
//! counts what they cost and [`pareto`] picks the best harnesses. The crate has no
//! heavy dependencies so that anything (a scorer, a report, an external tool) can
//! read whale's files with it.

pub mod cpu;
pub mod ledger;
pub mod metrics;
pub mod pareto;
pub mod task;
pub mod trajectory;

pub use cpu::CpuInfo;
pub use ledger::{Ledger, Purpose, Spend};
pub use metrics::{bootstrap_nested_mean, Estimate, Scores, TaskSamples};
pub use pareto::Objectives;
pub use task::{Domain, Split, Task};
pub use trajectory::{
    ChatMessage, ErrorKind, ModelCall, RolloutError, SampledTokens, ToolCall, Trajectory, Verdict, WallTime,
};
