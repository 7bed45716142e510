//! `whale archive`: the frontier, the top candidates, a diff of two candidates, a
//! candidate's traces and the proposers' record, read from a run's harness archive.

use crate::archive_view::{
    self, diff_text, frontier_text, latest_version, proposals_text, top_text, traces, traces_text,
};
use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct ArchiveArgs {
    /// A run directory (or its archive/).
    dir: PathBuf,
    #[command(subcommand)]
    command: ArchiveCommand,
}

#[derive(Debug, Subcommand)]
enum ArchiveCommand {
    /// The Pareto front (success up, turns and tokens down) and the incumbent.
    Frontier {
        /// Under this weights version (default: the latest scored).
        #[arg(long)]
        weights: Option<u64>,
    },
    /// The best candidates, best first.
    Top {
        #[arg(short, default_value_t = 10)]
        k: usize,
        /// Under this weights version (default: the latest scored).
        #[arg(long)]
        weights: Option<u64>,
    },
    /// The difference between two candidates' sources.
    Diff { a: String, b: String },
    /// A candidate's rollouts on the search tasks, one line each (or as JSON lines).
    Traces {
        id: String,
        /// Under this weights version (default: the latest scored).
        #[arg(long)]
        weights: Option<u64>,
        /// Only the rollouts that failed.
        #[arg(long)]
        failed: bool,
        /// Print the full trajectories as JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// What the proposers did: proposals made, the share that validated, why the others were
    /// rejected, harnesses accepted, the best search score, the proposers' failures, and (from
    /// the run's ledger) the proposer's tokens and wall time.
    Proposals,
}

pub fn run(args: ArchiveArgs) -> Result<ExitCode> {
    let archive = archive_view::open(&args.dir)?;
    let latest = latest_version(&archive);
    let text = match args.command {
        ArchiveCommand::Frontier { weights } => frontier_text(&archive, weights.unwrap_or(latest))?,
        ArchiveCommand::Top { k, weights } => top_text(&archive, weights.unwrap_or(latest), k)?,
        ArchiveCommand::Diff { a, b } => diff_text(&archive, &a, &b)?,
        ArchiveCommand::Proposals => proposals_text(&archive, &args.dir)?,
        ArchiveCommand::Traces { id, weights, failed, json } => {
            let found = traces(&archive, &id, weights.unwrap_or(latest), failed)?;
            if json {
                found.iter().map(|t| t.to_json_line() + "\n").collect()
            } else {
                traces_text(&found)
            }
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
