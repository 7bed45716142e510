//! `whale run`, `whale compare`, `whale study`, `whale coupling`, `whale report` and `whale demo`: the WHALE loop and its
//! baselines, their run directories and their reports.

use crate::demo;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use whale_loop::condition::Condition;
use whale_loop::config::RunConfig;
use whale_loop::experiment::{Experiment, Verbosity};
use whale_loop::lock::DirLock;
use whale_study::compare::{compare, compare_with, Arm, ArmEvent, Comparison};
use whale_study::coupling;
use whale_study::figures;
use whale_study::report::{self, comparison, table_text};
use whale_study::study;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The experiment config (TOML; see examples/).
    #[arg(required_unless_present = "resume", conflicts_with = "resume")]
    config: Option<PathBuf>,
    /// Run this condition instead of the config's: whale, whale-adaptive, weight-only,
    /// harness-only, sequential or fast-slow.
    #[arg(long)]
    condition: Option<Condition>,
    /// The run's name (default: the config's, with `-CONDITION` appended when --condition is
    /// given); its directory is RUNS/NAME.
    #[arg(long)]
    name: Option<String>,
    /// Continue the run in this directory from its last completed step or iteration.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Where run directories go.
    #[arg(long, default_value = "runs")]
    runs: PathBuf,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

impl CommonArgs {
    fn verbosity(&self) -> Verbosity {
        Verbosity { progress: !self.quiet }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The earlier demo instead: the tiny base model (trained on first use, about 15 minutes) on
    /// synthetic math with the settings of examples/math.toml, into RUNS/demo/.
    #[arg(long)]
    tiny: bool,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The experiment config (TOML; see examples/).
    config: PathBuf,
    /// Only these conditions (default: all six). `CONDITION:ALGORITHM` runs a condition with
    /// another weight-phase algorithm (rft, grpo, rloo) beside it, e.g.
    /// `--conditions weight-only,weight-only:grpo` (run directory `weight-only-grpo`).
    #[arg(long, value_delimiter = ',')]
    conditions: Vec<Arm>,
    /// The comparison's name (default: the config's); its directory is RUNS/NAME.
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct StudyArgs {
    /// Experiment configs (TOML), one per domain; each config's name names its part.
    #[arg(required = true)]
    configs: Vec<PathBuf>,
    /// The seeds: a count N (seeds 0 to N-1) or a comma-separated list (`7,8`), each once.
    #[arg(long, default_value = "3")]
    seeds: Seeds,
    /// Only these conditions (default: all six); `CONDITION:ALGORITHM` as in `whale compare`.
    #[arg(long, value_delimiter = ',')]
    conditions: Vec<Arm>,
    /// Smaller splits and budgets (at most 16 search and 32 test tasks, an eighth of the
    /// budget, phases of at most 2 weight steps and 2 search iterations, mean@4), the same
    /// code path.
    #[arg(long)]
    quick: bool,
    /// The study's name; its directory is RUNS/NAME.
    #[arg(long, default_value = "study")]
    name: String,
    /// Where the result files are, one per (config, seed) (default: RUNS/NAME/results): a
    /// (config, seed) whose file is there is not run again, and each one run writes its file
    /// there. Until a seed is done, each finished arm's file is in DIR/arms/ and that arm is
    /// not run again either. Copy files from other machines into it to grow one study. One
    /// study writes DIR at a time (a second one is refused).
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
    /// Run nothing: write study.json, report.html and the figures from the result files alone,
    /// saying which seeds have none yet.
    #[arg(long)]
    report_only: bool,
    #[command(flatten)]
    common: CommonArgs,
}

/// `--seeds`: a count or a list.
#[derive(Debug, Clone)]
struct Seeds(Vec<u64>);

impl std::str::FromStr for Seeds {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let numbers: Vec<u64> = text
            .split(',')
            .map(|part| part.trim().parse::<u64>().map_err(|_| format!("`{part}` is not a seed")))
            .collect::<Result<_, _>>()?;
        match numbers.as_slice() {
            [0] => Err("at least one seed".to_string()),
            [count] if !text.contains(',') => Ok(Seeds((0..*count).collect())),
            _ => Ok(Seeds(numbers)),
        }
    }
}

#[derive(Debug, Args)]
pub struct CouplingArgs {
    /// A finished in-process run directory (a WHALE run keeps its weights at every phase
    /// boundary in phase-weights/).
    run: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run directories, or directories of runs (as `whale compare` makes).
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// The HTML file to write (default: DIR/report.html for one directory, else ./report.html).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

/// A run config with its `[model] path` (and the proposer's `[search.agent] local_model`) made
/// a checkpoint directory: a GGUF file or a known model's name (`path = "smollm2"`) is fetched
/// and converted once, as `--model` is, so the run records the directory it loaded. The
/// proposer's model is served under the name it was given unless `[search.agent] model` says
/// otherwise.
fn load_config(file: &Path) -> Result<RunConfig> {
    let mut config = RunConfig::load(file)?;
    if let Some(path) = &config.model.path {
        let dir = super::lm::model_dir(path).with_context(|| format!("{}: [model] path", file.display()))?;
        config.model.path = Some(dir);
    }
    if let Some(given) = config.search.agent.local_model.clone() {
        let dir =
            super::lm::model_dir(&given).with_context(|| format!("{}: [search.agent] local_model", file.display()))?;
        let name = given.file_name().map(|name| name.to_string_lossy().into_owned());
        config.search.agent.model = config.search.agent.model.take().or(name);
        config.search.agent.local_model = Some(dir);
    }
    Ok(config)
}

/// A run config whose `[model] path` names the directory [`load_config`] would convert it
/// into, fetching and converting nothing (for reports from result files alone).
fn read_config(file: &Path) -> Result<RunConfig> {
    let mut config = RunConfig::load(file)?;
    config.model.path = config.model.path.as_deref().map(super::lm::converted_dir);
    config.search.agent.local_model = config.search.agent.local_model.as_deref().map(super::lm::converted_dir);
    Ok(config)
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let verbosity = args.common.verbosity();
    let started = Instant::now();
    let (mut experiment, dir) = match (&args.resume, &args.config) {
        (Some(dir), _) => (Experiment::resume(dir, verbosity)?, dir.clone()),
        (None, Some(file)) => {
            let mut config = load_config(file)?;
            if let Some(condition) = args.condition {
                config.condition = condition;
                config.name = format!("{}-{condition}", config.name);
            }
            if let Some(name) = &args.name {
                config.name = name.clone();
            }
            let dir = args.common.runs.join(&config.name);
            (Experiment::create(config, &dir, verbosity)?, dir)
        }
        (None, None) => bail!("give a config file or --resume DIR"),
    };
    let outcome = experiment.run().with_context(|| {
        format!(
            "the run stopped; every unit it completed is kept, and once the cause is fixed \
             `whale run --resume {}` continues from there",
            dir.display()
        )
    })?;
    let page = report::write_run_report(&outcome.dir)
        .with_context(|| format!("the run finished; `whale report {}` writes its report", outcome.dir.display()))?;
    let series = report::Series::read(&outcome.dir)?;
    print!("{}", table_text(&comparison(&[series])));
    println!("run directory: {}", outcome.dir.display());
    println!("report: {}", page.display());
    println!("wall time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

pub fn compare_command(args: CompareArgs) -> Result<ExitCode> {
    let mut config = load_config(&args.config)?;
    if let Some(name) = &args.name {
        config.name = name.clone();
    }
    let conditions: Vec<Arm> = if args.conditions.is_empty() {
        Condition::ALL.into_iter().map(Arm::from).collect()
    } else {
        args.conditions.clone()
    };
    let started = Instant::now();
    let result = compare(&config, &args.common.runs.join(&config.name), &conditions, args.common.verbosity())?;
    print_comparison(&result, started);
    Ok(ExitCode::SUCCESS)
}

pub fn study_command(args: StudyArgs) -> Result<ExitCode> {
    if !args.report_only {
        print_cpu();
    }
    let load = if args.report_only { read_config } else { load_config };
    let configs = args.configs.iter().map(|file| load(file)).collect::<Result<Vec<_>>>()?;
    let arms = if args.conditions.is_empty() {
        Condition::ALL.into_iter().map(Arm::from).collect()
    } else {
        args.conditions.clone()
    };
    let plan = study::StudyPlan { configs, seeds: args.seeds.0.clone(), arms, quick: args.quick };
    let root = args.common.runs.join(&args.name);
    let results = args.results.clone().unwrap_or_else(|| root.join(study::RESULTS_DIR));
    let started = Instant::now();
    let result = if args.report_only {
        let _lock = DirLock::create(&root)?;
        let study = study::read(&plan, &results)?;
        study::write(&study, &root)?;
        study
    } else {
        study::run(&plan, &root, &results, args.common.verbosity()).context(
            "the study stopped; every finished run and result file is kept, and the same command continues \
             from there",
        )?
    };
    print!("{}", study::text(&result));
    println!("results: {}", display(&results));
    println!("study: {}", display(&root.join("study.json")));
    println!("report: {}", display(&root.join("report.html")));
    println!("wall time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

pub fn coupling_command(args: CouplingArgs) -> Result<ExitCode> {
    whale_loop::run_dir::RunDir::open(&args.run)?;
    let lock = DirLock::acquire(&args.run)?;
    let computed = coupling::compute(&lock, !args.quiet)
        .with_context(|| format!("the coupling matrix of {} (run it again to continue)", args.run.display()))?;
    let matrix = computed.matrix;
    let title = format!("{}: test mean@{} of each accepted harness under each weights", args.run.display(), matrix.k);
    let svg = figures::heat_map_svg(&title, &matrix)?;
    let (svg_path, png_path) = (args.run.join("coupling.svg"), args.run.join("coupling.png"));
    std::fs::write(&svg_path, &svg).with_context(|| format!("writing {}", svg_path.display()))?;
    std::fs::write(&png_path, figures::png(&svg)?).with_context(|| format!("writing {}", png_path.display()))?;
    print!("{}", matrix.text());
    for (row, harness) in matrix.harnesses.iter().enumerate() {
        println!("{}: archive/candidates/{}/harness.js", matrix.harness_label(row), harness.id);
    }
    for (column, weights) in matrix.weights.iter().enumerate() {
        println!("{}: {}", matrix.weights_label(column), weights.dir.display());
    }
    println!("test rollout seed: {} (`whale harness run --seed` replays a cell)", matrix.eval_seed);
    let earlier = matrix.cells.len() - computed.scored - computed.from_evaluations;
    println!(
        "cells: {} scored now, {} taken from the run's own evaluations, {earlier} from an earlier computation",
        computed.scored, computed.from_evaluations
    );
    println!("matrix: {}", display(&args.run.join(coupling::COUPLING_FILE)));
    println!("heat map: {}", display(&png_path));
    Ok(ExitCode::SUCCESS)
}

pub fn report_command(args: ReportArgs) -> Result<ExitCode> {
    let out = match (&args.out, args.dirs.as_slice()) {
        (Some(out), _) => out.clone(),
        (None, [one]) => one.join(whale_loop::run_dir::REPORT_FILE),
        (None, _) => PathBuf::from(whale_loop::run_dir::REPORT_FILE),
    };
    let _lock = lock_if_written_into(&args.dirs, &out)
        .with_context(|| format!("writing {} (`--out FILE` writes the report elsewhere)", out.display()))?;
    let title = args.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ");
    let series = report::write_report(&args.dirs, &out, &format!("whale report: {title}"))
        .with_context(|| format!("writing {}", out.display()))?;
    print!("{}", table_text(&comparison(&series)));
    println!("report: {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// The lock of the directory `out` is written into when that is one of `dirs` or a run
/// directory: a report written there is a write into a run or compare directory. A report
/// written elsewhere reads the runs without a lock, even while they are being written.
fn lock_if_written_into(dirs: &[PathBuf], out: &Path) -> Result<Option<DirLock>> {
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Ok(canonical) = parent.canonicalize() else { return Ok(None) };
    let given = dirs.iter().any(|dir| dir.canonicalize().is_ok_and(|dir| dir == canonical));
    if !given && !parent.join(whale_loop::run_dir::STATE_FILE).is_file() {
        return Ok(None);
    }
    Ok(Some(DirLock::acquire(parent)?))
}

pub fn demo_command(args: DemoArgs) -> Result<ExitCode> {
    print_cpu();
    let started = Instant::now();
    let verbosity = args.common.verbosity();
    let config = if args.tiny {
        say(
            verbosity,
            "whale demo --tiny: WHALE and its five baselines on the tiny model, synthetic math, the mutate proposer",
        );
        demo::tiny_config()?
    } else {
        say(verbosity, "whale demo: WHALE and its five baselines on SmolLM2-135M-Instruct, QA (examples/qa-smollm2.toml under --quick, seed 0)");
        let mut config = demo::qa_config()?;
        let model = config.model.path.take().unwrap_or_default();
        config.model.path =
            Some(super::lm::model_dir(&model).context("the demo's model (`whale demo --tiny` needs none)")?);
        config
    };
    let mut finished = Vec::new();
    let mut on_arm = |event: ArmEvent| {
        if let ArmEvent::Finished { seconds, .. } = event {
            finished.push(seconds);
        }
        say(verbosity, &format!("demo [{}] {}", elapsed(started), demo::arm_line(event, &finished)));
    };
    let root = args.common.runs.join(&config.name);
    let result = compare_with(&config, &root, &demo::arms(), verbosity, &mut on_arm)?;
    print_comparison(&result, started);
    Ok(ExitCode::SUCCESS)
}

fn say(verbosity: Verbosity, line: &str) {
    if verbosity.progress {
        eprintln!("{line}");
    }
}

/// `12m05s`.
fn elapsed(since: Instant) -> String {
    let seconds = since.elapsed().as_secs();
    format!("{}m{:02}s", seconds / 60, seconds % 60)
}

/// The CPU the run uses, first: its tables reproduce bit for bit only on the same CPU family.
fn print_cpu() {
    println!("cpu: {}", whale_core::CpuInfo::detect());
}

fn print_comparison(result: &Comparison, started: Instant) {
    print!("{}", table_text(&comparison(&result.series)));
    let seconds: Vec<String> = result.seconds.iter().map(|(c, s)| format!("{c} {s:.0}s")).collect();
    println!("runs: {}", display(&result.root));
    println!("report: {}", display(&result.report));
    println!("curves: {}", display(&result.curves));
    println!("wall time: {:.0} s ({})", started.elapsed().as_secs_f64(), seconds.join(", "));
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
