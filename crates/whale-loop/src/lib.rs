//! The WHALE experiment engine: one run of one condition, from its config to its finished run
//! directory.
//!
//! The modules read in the order of the loop. A [`config::RunConfig`] names the tasks, the
//! model, the initial harness and a [`condition::Condition`]; the [`schedule`] turns the
//! condition into a plan and decides, from the outcomes so far, which phase runs next and when
//! to stop. The [`weight_phase`] rolls out a batch of training tasks under the current harness
//! and updates the weights (online RFT, GRPO or RLOO); the [`search_phase`] runs Meta-Harness
//! iterations with the weights fixed. [`test_eval`] scores the current agent on the test split
//! at the points the schedule marks. [`run_dir`] writes every completed unit (its
//! [`metrics_row`]s typed by kind) so that [`experiment`] resumes a killed run exactly, and
//! [`lock`] lets one process at a time write a directory. [`scale_out`] replaces the in-process
//! model by an inference server and an external trainer.
//!
//! What is made of finished runs (a run's report, the comparison of conditions, the study over
//! seeds, the coupling matrix, the figures) is whale-study's: it reads the run directories this
//! crate writes, and this crate knows nothing of it.

pub mod condition;
pub mod config;
pub mod experiment;
pub mod lock;
pub mod metrics_row;
pub mod proposer_server;
pub mod run_dir;
pub mod scale_out;
pub mod schedule;
pub mod search_phase;
pub mod test_eval;
pub mod weight_phase;
