//! Command-line interface: argument parsing and printing; the work is done elsewhere.

mod data;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use whale_core::Domain;

/// whale trains LLM agents by alternating weight updates (online RFT) with search over
/// harness code (Meta-Harness): WHALE, Weight-Harness Alternating LEarning.
#[derive(Debug, Parser)]
#[command(name = "whale", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Datasets: check real files against their verifiers, generate synthetic tasks, benchmark.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Score model outputs produced anywhere: a JSONL of task records, each with a `prediction`.
    ///
    /// Each line is a record in any form the domain's loader accepts plus `prediction`
    /// (math: the model's text or final answer; chess: the solver's moves in order, UCI or SAN,
    /// space-separated or as an array; qa: the answer). Prints one JSON line per record,
    /// `{"line","id","reward"}` (+ `em`, `f1` for qa), and a summary on stderr. Exits 1 when a
    /// record could not be scored.
    Score {
        /// math, chess or qa.
        domain: Domain,
        file: PathBuf,
    },
}

/// Parses the arguments, runs the command and maps errors to exit statuses.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Data(command) => data::run(command),
        Command::Score { domain, file } => data::score(domain, &file),
    }
}

