//! `whale harness ...`: list the stock harnesses, check a harness file, run a harness over
//! tasks, benchmark the runtime.

use crate::harness_bench::{self, BenchReport, BenchSettings};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::{Args, Subcommand};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use whale_core::{Domain, Task};
use whale_engine::{EngineConfig, LocalPolicy};
use whale_harness::scoring::{self as evaluate, EvalSettings, Evaluation};
use whale_harness::{stock_harness, validate, Harness, HarnessError, Limits, HARNESS_FILE, STOCK_HARNESSES};
use whale_policy::{Policy, SamplingParams};
use whale_tasks::task_domain;

/// Generated tasks in the smoke test of `whale harness check`.
const SMOKE_TASKS: usize = 3;

#[derive(Debug, Subcommand)]
pub enum HarnessCommand {
    /// List the stock harnesses (`<domain>/<name>`) with their descriptions.
    List {
        /// Only this domain's.
        #[arg(long)]
        domain: Option<Domain>,
    },
    /// Print a stock harness's source (a starting point for your own).
    Show {
        /// A stock harness name, like math/plain.
        name: String,
    },
    /// Compile a harness, check its exports and run it once on each of 3 generated tasks with
    /// the model. Errors are printed as FILE:LINE:COLUMN; exits 1 when anything failed.
    Check {
        /// A harness file, or a stock harness name.
        harness: String,
        /// math, chess or qa (default: a stock harness's own domain).
        #[arg(long)]
        domain: Option<Domain>,
        #[command(flatten)]
        model: ModelArgs,
        /// Seed of the generated tasks and of the rollouts.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Run a harness k times on each task and print mean@k, pass@k and maj@k with 95%
    /// confidence intervals, tokens, calls and errors by kind.
    Run(RunArgs),
    /// Benchmark the harness runtime: rollouts/s with an instantly answering policy, the share
    /// of a real run's time spent outside the model, and generation throughput with 1, 8 and 64
    /// concurrent rollouts.
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// Rollouts per stock harness with the instant policy.
        #[arg(long, default_value_t = 512)]
        runtime_rollouts: usize,
        /// Rollouts per domain with the model.
        #[arg(long, default_value_t = 128)]
        model_rollouts: usize,
    },
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A model directory in the Hugging Face layout, or a GGUF file or a fetched model's name
    /// such as `smollm2` or `qwen2.5-coder-0.5b` (converted once into $WHALE_HOME/models)
    /// (default: the base model of the harness's domain, trained on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Most tokens of finished model calls the engine keeps for later prompts that begin with
    /// them (a rollout's next turn, a repeated call, the harness's fixed instructions): faster,
    /// equal up to rounding. 0 feeds every prompt whole.
    #[arg(long, default_value_t = EngineConfig::default().prefix_cache_tokens)]
    prefix_cache_tokens: usize,
    /// Sample from 8-bit (Q8_0) copies of the weights, as a run config's `[model] quantized =
    /// true`: faster on wide models (Qwen2.5-Coder-1.5B), slightly different samples.
    #[arg(long)]
    quantized: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A harness file, or a stock harness name (see `whale harness list`).
    harness: String,
    /// math, chess or qa (default: a stock harness's own domain).
    #[arg(long)]
    domain: Option<Domain>,
    /// Tasks from a data file in any form the domain's loader reads.
    #[arg(long, conflicts_with = "gen", required_unless_present = "gen")]
    data: Option<PathBuf>,
    /// Generate this many synthetic tasks instead.
    #[arg(long)]
    gen: Option<usize>,
    /// Difficulty of generated tasks (see `whale data gen`).
    #[arg(long, default_value_t = 1)]
    difficulty: u32,
    /// Use only the first N tasks.
    #[arg(long)]
    limit: Option<usize>,
    /// Rollouts per task.
    #[arg(long, default_value_t = 8)]
    k: usize,
    /// Every rollout's seed derives from it (and generated tasks use it too).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Rollouts in flight at once.
    #[arg(long, default_value_t = whale_harness::DEFAULT_THREADS)]
    threads: usize,
    /// Sampling temperature of every model call.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// The default `max_tokens` of a model call (a run's `[sampling] max_tokens`, 256 by
    /// default, replays its evaluations).
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    #[command(flatten)]
    model: ModelArgs,
    /// QA: search this corpus file instead of the tasks' own context paragraphs.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// QA: keep the search index in this directory (reused while the corpus is unchanged).
    #[arg(long)]
    index: Option<PathBuf>,
    /// Write every trajectory as a JSON line here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(command: HarnessCommand) -> Result<ExitCode> {
    match command {
        HarnessCommand::List { domain } => list(domain),
        HarnessCommand::Show { name } => show(&name),
        HarnessCommand::Check { harness, domain, model, seed } => check(&harness, domain, &model, seed),
        HarnessCommand::Run(args) => run_harness(&args),
        HarnessCommand::Bench { model, runtime_rollouts, model_rollouts } => {
            let settings = BenchSettings { runtime_rollouts, model_rollouts, ..BenchSettings::default() };
            let policy = load_policy(&model, Domain::Math)?;
            print_bench(&harness_bench::run(policy, &settings)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn list(domain: Option<Domain>) -> Result<ExitCode> {
    for stock in STOCK_HARNESSES.iter().filter(|s| domain.is_none_or(|d| d == s.domain)) {
        let meta = validate(stock.source, &Limits::default())
            .with_context(|| format!("stock harness {} is broken", stock.name))?
            .meta;
        let description = meta.as_ref().and_then(|m| m["description"].as_str()).unwrap_or_default().to_string();
        println!("{:<20} {description}", stock.name);
    }
    Ok(ExitCode::SUCCESS)
}

fn show(name: &str) -> Result<ExitCode> {
    let Some(stock) = stock_harness(name) else {
        bail!("no stock harness `{name}` (see `whale harness list`)");
    };
    print!("{}", stock.source);
    Ok(ExitCode::SUCCESS)
}

/// A harness named on the command line: its source, a name to print errors against, and the
/// domain it runs in.
struct NamedHarness {
    harness: Harness,
    display: String,
    domain: Domain,
}

/// A path that exists is a file; otherwise the argument must be a stock harness name.
fn resolve(argument: &str, domain: Option<Domain>) -> Result<NamedHarness> {
    let path = Path::new(argument);
    if path.exists() {
        let source = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let Some(domain) = domain else {
            bail!("{argument}: say which domain the harness is for with --domain math|chess|qa");
        };
        return Ok(NamedHarness { harness: Harness::from_source(source), display: argument.to_string(), domain });
    }
    let Some(stock) = stock_harness(argument) else {
        bail!("{argument}: no such file, and not a stock harness (see `whale harness list`)");
    };
    if let Some(asked) = domain.filter(|d| *d != stock.domain) {
        bail!("{} is a {} harness, not {asked}", stock.name, stock.domain);
    }
    Ok(NamedHarness { harness: stock.harness(), display: format!("{}.js", stock.name), domain: stock.domain })
}

/// The model of `--model`, else the base model that serves `domain`.
fn load_policy(args: &ModelArgs, domain: Domain) -> Result<Arc<dyn Policy>> {
    let dir = match &args.model {
        Some(given) => super::lm::model_dir(given)?,
        None => whale_pretrain::ensure_base_model(domain)
            .with_context(|| format!("cannot prepare the {domain} base model"))?,
    };
    let engine = EngineConfig {
        prefix_cache_tokens: args.prefix_cache_tokens,
        quantized: args.quantized,
        ..EngineConfig::default()
    };
    let policy = LocalPolicy::load(&dir, DType::F32, &Device::Cpu, engine)
        .with_context(|| format!("cannot load the model in {}", dir.display()))?;
    Ok(Arc::new(policy))
}

fn check(argument: &str, domain: Option<Domain>, model: &ModelArgs, seed: u64) -> Result<ExitCode> {
    let named = resolve(argument, domain)?;
    let limits = Limits::default();
    match validate(&named.harness.source, &limits) {
        Ok(_) => println!("{}: compiles; exports solve", named.display),
        Err(error) => {
            println!("{}", located(&named.display, &error));
            return Ok(ExitCode::FAILURE);
        }
    }
    let tasks = task_domain(named.domain).generate(SMOKE_TASKS, seed, 1);
    let environment = evaluate::environment(named.domain, &tasks, None, None)?;
    let settings = EvalSettings { k: 1, seed, limits, ..EvalSettings::default() };
    let run =
        evaluate::evaluate(&named.harness, &environment, &tasks, load_policy(model, named.domain)?, &settings, None)?;
    let mut failed = false;
    for (task, trajectory) in tasks.iter().zip(&run.trajectories) {
        match &trajectory.error {
            Some(error) => {
                failed = true;
                let message = error.message.replace(HARNESS_FILE, &named.display);
                println!("{}: {}: {message}", task.id, evaluate::error_kind_name(error.kind));
            }
            None => println!("{}: ok, reward {}, {} model call(s)", task.id, trajectory.reward, trajectory.turns),
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// A validation error as `FILE:LINE:COLUMN: message` when it has a location.
fn located(display: &str, error: &HarnessError) -> String {
    let location = match error {
        HarnessError::Compile { location, .. } | HarnessError::Evaluate { location, .. } => *location,
        _ => None,
    };
    match location {
        Some(at) => format!("{display}:{}:{}: {error}", at.line, at.column),
        None => format!("{display}: {error}"),
    }
}

/// The domains whose episodes search a corpus, comma-separated (`qa`).
fn searching_domains() -> String {
    let names: Vec<&str> =
        Domain::ALL.into_iter().filter(|d| task_domain(*d).searches_a_corpus()).map(Domain::as_str).collect();
    names.join(", ")
}

fn load_tasks(args: &RunArgs, domain: Domain) -> Result<Vec<Task>> {
    let mut tasks = match (&args.data, args.gen) {
        (Some(path), _) => {
            let report = task_domain(domain).load(path);
            if let Some(first) = report.rejected.first() {
                eprintln!("{}: {} record(s) rejected, the first: {first}", path.display(), report.rejected.len());
            }
            report.into_tasks()
        }
        (None, Some(n)) => task_domain(domain).generate(n, args.seed, args.difficulty),
        (None, None) => bail!("pass --data FILE or --gen N"),
    };
    if let Some(limit) = args.limit {
        tasks.truncate(limit);
    }
    Ok(tasks)
}

fn run_harness(args: &RunArgs) -> Result<ExitCode> {
    let named = resolve(&args.harness, args.domain)?;
    if !task_domain(named.domain).searches_a_corpus() && (args.corpus.is_some() || args.index.is_some()) {
        bail!("--corpus and --index are for {}; {} tasks have no search", searching_domains(), named.domain);
    }
    let tasks = load_tasks(args, named.domain)?;
    let environment = evaluate::environment(named.domain, &tasks, args.corpus.as_deref(), args.index.as_deref())?;
    let policy = load_policy(&args.model, named.domain)?;
    let model = policy.name();
    let sampling =
        SamplingParams { temperature: args.temperature, max_tokens: args.max_tokens, ..SamplingParams::default() };
    sampling.validate().context("--temperature / --max-tokens")?;
    let settings = EvalSettings {
        k: args.k,
        seed: args.seed,
        threads: args.threads,
        progress: true,
        sampling,
        ..Default::default()
    };
    let run = match &args.out {
        Some(path) => {
            let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            let mut out = BufWriter::new(file);
            evaluate::evaluate(&named.harness, &environment, &tasks, policy, &settings, Some(&mut out))?
        }
        None => evaluate::evaluate(&named.harness, &environment, &tasks, policy, &settings, None)?,
    };
    if args.json {
        println!("{}", serde_json::to_string(&run)?);
    } else {
        print_run(&named.display, &model, &run);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_run(harness: &str, model: &str, run: &Evaluation) {
    let scores = &run.scores;
    let (usage, time) = (&run.usage, &run.time);
    let per = |n: usize| n as f64 / usage.rollouts.max(1) as f64;
    println!("harness {harness} ({}), model {model}", &run.harness_id[..12.min(run.harness_id.len())]);
    println!("{} {} tasks x {} rollouts", run.domain, scores.tasks, scores.k);
    println!("mean@{}  {}", scores.k, scores.mean);
    println!("pass@{}  {}", scores.k, scores.pass);
    println!("maj@{}   {}", scores.k, scores.maj);
    println!(
        "tokens  prompt {} completion {} ({:.1} completion tokens per rollout)",
        usage.prompt_tokens,
        usage.completion_tokens,
        per(usage.completion_tokens)
    );
    println!(
        "calls   model {} ({:.2} per rollout), tools {}, env actions {}",
        usage.model_calls,
        per(usage.model_calls),
        usage.tool_calls,
        usage.env_actions
    );
    let errors: Vec<String> = run.errors.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
    println!("errors  {}", if errors.is_empty() { "none".to_string() } else { errors.join(", ") });
    println!(
        "time    {:.1} s wall, {:.1} rollouts/s, {:.1}% of rollout time outside the model",
        time.wall_seconds,
        usage.rollouts as f64 / time.wall_seconds.max(1e-9),
        100.0 * time.outside_model_share()
    );
}

fn print_bench(report: &BenchReport) {
    println!("runtime alone (instant policy)");
    println!("  {:<20} {:>9} {:>9} {:>12} {:>7}", "harness", "rollouts", "seconds", "rollouts/s", "errors");
    for row in &report.runtime {
        let rate = row.rollouts as f64 / row.seconds.max(1e-9);
        println!("  {:<20} {:>9} {:>9.3} {:>12.0} {:>7}", row.harness, row.rollouts, row.seconds, rate, row.errors);
    }
    println!("with the model (64 concurrent rollouts; goal: under 5% of rollout time outside the model)");
    println!("  {:<20} {:>9} {:>9} {:>14} {:>12}", "harness", "rollouts", "seconds", "outside model", "mean reward");
    for row in &report.model_runs {
        println!(
            "  {:<20} {:>9} {:>9.2} {:>13.2}% {:>12.3}",
            row.harness,
            row.rollouts,
            row.seconds,
            100.0 * row.outside_model_share,
            row.mean_reward
        );
    }
    println!("generation throughput by concurrent rollouts ({})", report.throughput_harness);
    println!(
        "  {:>11} {:>9} {:>18} {:>9} {:>10} {:>8}",
        "concurrency", "rollouts", "completion tokens", "seconds", "tokens/s", "speed-up"
    );
    let base = report.throughput.first().map_or(1.0, |row| row.tokens_per_second());
    for row in &report.throughput {
        println!(
            "  {:>11} {:>9} {:>18} {:>9.2} {:>10.0} {:>7.1}x",
            row.concurrency,
            row.rollouts,
            row.completion_tokens,
            row.seconds,
            row.tokens_per_second(),
            row.tokens_per_second() / base.max(1e-9)
        );
    }
}
