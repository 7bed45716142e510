//! `whale data ...` and `whale score`.

use crate::{bench, data};
use anyhow::{Context, Result};
use clap::Subcommand;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use whale_core::Domain;

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Load every record, replay each gold answer through the environment and verifier, and
    /// report loaded / gold-solved / rejected, listing each rejection as `file:line`.
    /// Exits 1 when anything is rejected.
    Check {
        /// math, chess or qa.
        domain: Domain,
        file: PathBuf,
        /// Print only `{"loaded":N,"gold_solved":N,"rejected":N}` on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Generate synthetic tasks in the domain's native format (JSONL; Lichess CSV for chess).
    Gen {
        /// math, chess or qa.
        domain: Domain,
        /// How many tasks.
        #[arg(long)]
        n: usize,
        /// The same seed always gives the same tasks.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// math: 1-5 (steps and number size); chess: 1 = mate in 1, 2 = mate in 2;
        /// qa: 1 = one-hop, 2 = mixed, 3 = two-hop.
        #[arg(long, default_value_t = 1)]
        difficulty: u32,
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Benchmark the verifiers (tasks/s per domain) and the BM25 index over HotpotQA.
    Bench {
        /// The shared data folder (default: ../shared/data beside the checkout, or $WHALE_SHARED_DATA).
        #[arg(long)]
        data: Option<PathBuf>,
    },
}

pub fn run(command: DataCommand) -> Result<ExitCode> {
    match command {
        DataCommand::Check { domain, file, json } => check(domain, &file, json),
        DataCommand::Gen { domain, n, seed, difficulty, output } => generate(domain, n, seed, difficulty, output),
        DataCommand::Bench { data } => {
            let dir = data.unwrap_or_else(bench::default_data_dir);
            bench::run(&dir)?.print();
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(domain: Domain, file: &std::path::Path, json: bool) -> Result<ExitCode> {
    let report = data::check(domain, file);
    for p in &report.problems {
        eprintln!("{p}");
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{}: loaded {}, gold-solved {}, rejected {}",
            file.display(),
            report.loaded,
            report.gold_solved,
            report.rejected
        );
    }
    Ok(if report.rejected == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn generate(domain: Domain, n: usize, seed: u64, difficulty: u32, output: Option<PathBuf>) -> Result<ExitCode> {
    match output {
        Some(path) => {
            let file = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
            let mut out = BufWriter::new(file);
            data::generate(domain, n, seed, difficulty, &mut out)
                .and_then(|_| out.flush())
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("wrote {n} {domain} tasks to {}", path.display());
        }
        None => {
            let mut out = std::io::stdout().lock();
            data::generate(domain, n, seed, difficulty, &mut out).context("cannot write to stdout")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn score(domain: Domain, file: &std::path::Path) -> Result<ExitCode> {
    let lines = data::score(domain, file);
    let mut out = std::io::stdout().lock();
    for l in &lines {
        writeln!(out, "{}", serde_json::to_string(l)?)?;
    }
    let scored: Vec<_> = lines.iter().filter(|l| l.error.is_none()).collect();
    let failed = lines.len() - scored.len();
    let mean =
        |f: &dyn Fn(&data::ScoreLine) -> f64| scored.iter().map(|l| f(l)).sum::<f64>() / scored.len().max(1) as f64;
    eprint!("{}: scored {}, mean reward {:.4}", file.display(), scored.len(), mean(&|l| l.reward));
    if whale_tasks::task_domain(domain).scores_em_f1() {
        eprint!(", EM {:.4}, F1 {:.4}", mean(&|l| l.em.unwrap_or(0.0)), mean(&|l| l.f1.unwrap_or(0.0)));
    }
    eprintln!(", unreadable {failed}");
    for l in lines.iter().filter_map(|l| l.error.as_ref()) {
        eprintln!("{l}");
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
