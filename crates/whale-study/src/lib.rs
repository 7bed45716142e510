//! The analysis of finished WHALE runs: what is made of the run directories whale-loop writes.
//!
//! whale-loop is the engine of one run; this crate sits above it, runs its experiments to the end
//! where a comparison needs them, and otherwise only reads what they wrote. Data flows one way:
//! a run directory (`metrics.jsonl`, `ledger.json`, `state.json`, the archive) → [`report`]'s
//! [`report::Series`] → its table and the run's or a comparison's `report.html`. [`compare`]
//! runs every condition on one config under `runs/<name>/<condition>/` and writes their
//! report; [`coupling`] scores every harness a run accepted under every weights it kept at a
//! phase boundary (`coupling.json`); [`study`] repeats comparisons over seeds and configs, keeps
//! one result file per (config, seed) and computes its statistics, verdicts and pages from those
//! files alone; [`figures`] draws the study's plots (SVG, rendered to PNG).

pub mod compare;
pub mod coupling;
pub mod figures;
mod palette;
pub mod report;
pub mod study;
