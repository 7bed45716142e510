//! WHALE — Weight-Harness Alternating LEarning: the `whale` command.
//!
//! The experiment engine lives in `whale-loop`, the analysis of finished runs (reports,
//! compare, study, coupling) in `whale-study`, the default base model in `whale-pretrain`;
//! this crate is the command line on top ([`cli`]), the commands that are only glue between
//! files and the lower crates ([`data`], [`lm`], [`archive_view`], [`fetch`]), the benchmarks
//! ([`bench`], [`harness_bench`], [`lm_bench`], [`serve_bench`]) and the demo ([`demo`]).

pub mod archive_view;
pub mod bench;
pub mod cli;
pub mod data;
pub mod demo;
pub mod fetch;
pub mod harness_bench;
pub mod lm;
pub mod lm_bench;
pub mod serve_bench;
