//! WHALE — Weight-Harness Alternating LEarning.
//!
//! This crate is the experiment driver on top of the domain, model and harness crates, and
//! the `whale` command. Today it holds the data commands: checking real data files against
//! their verifiers ([`data::check`]), generating synthetic tasks ([`data::generate`]) and
//! scoring predictions made anywhere ([`data::score`]), plus their benchmark ([`bench`]).

pub mod archive_view;
pub mod bench;
pub mod cli;
pub mod compare;
pub mod condition;
pub mod config;
pub mod data;
pub mod demo;
pub mod evaluate;
pub mod evaluation;
pub mod experiment;
pub mod external_weights;
pub mod harness_bench;
pub mod lm;
pub mod pretrain;
pub mod report;
pub mod run_dir;
pub mod scheduler;
pub mod search_phase;
pub mod serve_bench;
pub mod server;
pub mod trainer_command;
pub mod weight_phase;
