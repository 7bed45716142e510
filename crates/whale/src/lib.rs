//! WHALE — Weight-Harness Alternating LEarning.
//!
//! This crate is the experiment driver on top of the domain, model and harness crates, and
//! the `whale` command. Today it holds the data commands: checking real data files against
//! their verifiers ([`data::check`]), generating synthetic tasks ([`data::generate`]) and
//! scoring predictions made anywhere ([`data::score`]), plus their benchmark ([`bench`]).

pub mod bench;
pub mod cli;
pub mod data;
