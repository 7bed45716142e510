//! `whale study`: every condition of every config (one per domain) under several seeds, and
//! what the paper's comparison needs from them: each condition's difference from WHALE, paired
//! over test tasks and pooled over seeds, with a bootstrap interval that resamples seeds and
//! then tasks within them; in how many seeds its sign holds; the rollouts each condition took to
//! reach weight-only's peak; and a verdict on the paper's first finding.
//!
//! One seed of one config is a `whale compare` directory, `runs/<study>/<config>/seed-<s>/`, so a
//! study killed at any moment continues where it stopped (finished runs are kept, an
//! unfinished one resumes from its last unit). `study.json` and `report.html` are written from
//! the run directories at the end, and can be rewritten from them at any time.

use crate::compare::{self, Arm, CompareError};
use crate::condition::Condition;
use crate::config::RunConfig;
use crate::experiment::Verbosity;
use crate::report::{self, ReportError, Series};
use crate::run_dir::write_atomic;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use whale_core::{bootstrap_nested_mean, Estimate};

/// Bootstrap resamples of every paired interval, and their seed.
const RESAMPLES: usize = 2000;
const BOOTSTRAP_SEED: u64 = 0x57AD_0001;

#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("{config}, seed {seed}: {source}")]
    Compare { config: String, seed: u64, source: Box<CompareError> },
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("writing {}: {reason}", path.display())]
    Write { path: PathBuf, reason: String },
    #[error("two configs are both named `{0}`: a study keeps one directory per config name")]
    DuplicateName(String),
}

/// What a study runs.
#[derive(Debug, Clone)]
pub struct StudyPlan {
    /// One config per domain (any number), each run under every seed.
    pub configs: Vec<RunConfig>,
    pub seeds: Vec<u64>,
    pub arms: Vec<Arm>,
    /// Smaller splits and budgets, the same code path ([`quick`]).
    pub quick: bool,
}

/// `--quick`: at most 16 search and 32 test tasks, an eighth of the budget (at least 128
/// rollouts), weight steps of 8 tasks, phases of at most 2 weight steps and 2 search
/// iterations (so that the conditions still alternate within the smaller budget), and mean@4.
pub fn quick(mut config: RunConfig) -> RunConfig {
    config.tasks.search = config.tasks.search.min(16);
    config.tasks.test = config.tasks.test.min(32);
    config.schedule.budget = (config.schedule.budget / 8).max(128);
    config.schedule.weight_steps = config.schedule.weight_steps.min(2);
    config.schedule.search_iterations = config.schedule.search_iterations.min(2);
    config.weights.tasks_per_step = config.weights.tasks_per_step.min(8);
    config.eval.k = config.eval.k.min(4);
    config
}

/// One condition's difference from WHALE on one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// The arm's name (`weight-only`, `weight-only-grpo`, ...).
    pub arm: String,
    /// `best` or `final` test mean@k.
    pub metric: &'static str,
    /// The arm's minus WHALE's, paired over test tasks, pooled over seeds.
    pub estimate: Estimate,
    /// Seeds whose own difference has the pooled estimate's sign (0 counts with either).
    pub seeds_agreeing: usize,
    pub seeds: usize,
}

/// The training rollouts an arm spent before its test mean@k first reached the weight-only
/// peak of the same seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeakRollouts {
    pub arm: String,
    /// Per seed, in seed order; `None` where the arm never reached the peak.
    pub per_seed: Vec<Option<u64>>,
    /// Mean, least and most over the seeds that reached it.
    pub mean: Option<f64>,
    pub min: Option<u64>,
    pub max: Option<u64>,
}

/// A finding of the paper, judged on this study's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub finding: &'static str,
    /// `supported`, `contradicted` or `inconclusive`.
    pub status: &'static str,
    pub detail: String,
}

/// One config's results over all seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DomainStudy {
    pub name: String,
    pub domain: String,
    pub seeds: Vec<u64>,
    pub differences: Vec<Difference>,
    pub peak_rollouts: Vec<PeakRollouts>,
    pub verdicts: Vec<Verdict>,
}

/// `study.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Study {
    pub seeds: Vec<u64>,
    pub arms: Vec<String>,
    pub quick: bool,
    pub domains: Vec<DomainStudy>,
}

/// Runs (or resumes) every arm of every config under every seed in `root`, then writes
/// `root/study.json` and `root/report.html`.
pub fn run(plan: &StudyPlan, root: &Path, verbosity: Verbosity) -> Result<Study, StudyError> {
    check_names(&plan.configs)?;
    let bar = progress_bar((plan.configs.len() * plan.seeds.len()) as u64, verbosity.progress);
    for config in &plan.configs {
        for &seed in &plan.seeds {
            bar.set_message(format!("{} seed {seed}", config.name));
            let config = seeded(config, seed, plan.quick);
            let quiet = Verbosity { progress: false };
            compare::compare(&config, &seed_dir(root, &config.name, seed), &plan.arms, quiet).map_err(|source| {
                StudyError::Compare { config: config.name.clone(), seed, source: Box::new(source) }
            })?;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let study = read(plan, root)?;
    write(&study, root)?;
    Ok(study)
}

fn check_names(configs: &[RunConfig]) -> Result<(), StudyError> {
    for (index, config) in configs.iter().enumerate() {
        if configs[..index].iter().any(|other| other.name == config.name) {
            return Err(StudyError::DuplicateName(config.name.clone()));
        }
    }
    Ok(())
}

fn seeded(config: &RunConfig, seed: u64, quick_run: bool) -> RunConfig {
    let config = RunConfig { seed, ..config.clone() };
    if quick_run {
        quick(config)
    } else {
        config
    }
}

fn seed_dir(root: &Path, config: &str, seed: u64) -> PathBuf {
    root.join(config).join(format!("seed-{seed}"))
}

fn progress_bar(total: u64, show: bool) -> ProgressBar {
    let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let style = ProgressStyle::with_template("study {bar:30} {pos}/{len} comparisons, ETA {eta} ({msg})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// The study as its run directories say it went.
pub fn read(plan: &StudyPlan, root: &Path) -> Result<Study, StudyError> {
    let mut domains = Vec::new();
    for config in &plan.configs {
        let mut per_seed = Vec::new();
        for &seed in &plan.seeds {
            let dirs = report::run_dirs(&seed_dir(root, &config.name, seed))?;
            per_seed.push(dirs.iter().map(|dir| Series::read(dir)).collect::<Result<Vec<_>, _>>()?);
        }
        domains.push(domain_study(&config.name, &config.tasks.domain.to_string(), &plan.seeds, &per_seed));
    }
    Ok(Study { seeds: plan.seeds.clone(), arms: plan.arms.iter().map(Arm::name).collect(), quick: plan.quick, domains })
}

/// The statistics of one config from its series, `per_seed[s]` the runs of seed `seeds[s]`.
pub fn domain_study(name: &str, domain: &str, seeds: &[u64], per_seed: &[Vec<Series>]) -> DomainStudy {
    let arms: Vec<String> = per_seed.first().map_or(Vec::new(), |runs| runs.iter().map(arm_name).collect());
    let mut differences = Vec::new();
    for arm in arms.iter().filter(|arm| arm.as_str() != "whale") {
        for metric in ["best", "final"] {
            if let Some(difference) = difference(per_seed, arm, metric) {
                differences.push(difference);
            }
        }
    }
    let peak_rollouts = arms.iter().map(|arm| peak_rollouts(per_seed, arm)).collect();
    let verdicts = vec![whale_beats_the_baselines(&differences)];
    DomainStudy {
        name: name.to_string(),
        domain: domain.to_string(),
        seeds: seeds.to_vec(),
        differences,
        peak_rollouts,
        verdicts,
    }
}

/// A run's arm, from its directory name (`weight-only-grpo`), as `compare` names them.
fn arm_name(series: &Series) -> String {
    series.dir.file_name().map_or_else(|| series.label.clone(), |n| n.to_string_lossy().into_owned())
}

fn find<'a>(runs: &'a [Series], arm: &str) -> Option<&'a Series> {
    runs.iter().find(|series| arm_name(series) == arm)
}

/// The task means of a run's best or final test evaluation.
fn task_means<'a>(series: &'a Series, metric: &str) -> Option<&'a [f64]> {
    let (best, last) = series.best_and_final()?;
    Some(if metric == "best" { &best.task_means } else { &last.task_means })
}

fn difference(per_seed: &[Vec<Series>], arm: &str, metric: &'static str) -> Option<Difference> {
    let mut paired: Vec<Vec<f64>> = Vec::new();
    for runs in per_seed {
        let (other, whale) = (task_means(find(runs, arm)?, metric)?, task_means(find(runs, "whale")?, metric)?);
        if other.len() != whale.len() || other.is_empty() {
            return None;
        }
        paired.push(other.iter().zip(whale).map(|(a, b)| a - b).collect());
    }
    let estimate = bootstrap_nested_mean(&paired, RESAMPLES, BOOTSTRAP_SEED);
    let mean = |values: &Vec<f64>| values.iter().sum::<f64>() / values.len() as f64;
    let agrees = |d: f64| d == 0.0 || estimate.value == 0.0 || (d > 0.0) == (estimate.value > 0.0);
    let seeds_agreeing = paired.iter().filter(|seed| agrees(mean(seed))).count();
    Some(Difference { arm: arm.to_string(), metric, estimate, seeds_agreeing, seeds: paired.len() })
}

fn peak_rollouts(per_seed: &[Vec<Series>], arm: &str) -> PeakRollouts {
    let per_seed: Vec<Option<u64>> = per_seed
        .iter()
        .map(|runs| {
            let peak = find(runs, "weight-only")?.best_and_final()?.0.mean.value;
            find(runs, arm)?.rollouts_to_reach(peak)
        })
        .collect();
    let reached: Vec<u64> = per_seed.iter().flatten().copied().collect();
    PeakRollouts {
        arm: arm.to_string(),
        mean: (!reached.is_empty()).then(|| reached.iter().sum::<u64>() as f64 / reached.len() as f64),
        min: reached.iter().min().copied(),
        max: reached.iter().max().copied(),
        per_seed,
    }
}

/// Finding (a): WHALE beats weight-only, harness-only, fast-slow and sequential on best
/// mean@k. Supported when every such difference (baseline − WHALE) has its interval below
/// zero; contradicted when one lies above zero; inconclusive otherwise.
pub fn whale_beats_the_baselines(differences: &[Difference]) -> Verdict {
    let baselines = [Condition::WeightOnly, Condition::HarnessOnly, Condition::FastSlow, Condition::Sequential];
    let best: Vec<&Difference> =
        differences.iter().filter(|d| d.metric == "best" && baselines.iter().any(|c| c.as_str() == d.arm)).collect();
    let shown: Vec<String> = best.iter().map(|d| format!("{} {}", d.arm, signed(&d.estimate))).collect();
    let status = if best.len() < baselines.len() {
        "inconclusive"
    } else if best.iter().any(|d| d.estimate.lo > 0.0) {
        "contradicted"
    } else if best.iter().all(|d| d.estimate.hi < 0.0) {
        "supported"
    } else {
        "inconclusive"
    };
    let detail = if best.len() < baselines.len() {
        format!("needs all four baselines beside whale; ran {}", best.len())
    } else {
        format!("best mean@k, baseline minus whale: {}", shown.join("; "))
    };
    Verdict { finding: "(a) WHALE beats weight-only, harness-only, fast-slow and sequential", status, detail }
}

fn signed(estimate: &Estimate) -> String {
    format!("{:+.3} [{:+.3}, {:+.3}]", estimate.value, estimate.lo, estimate.hi)
}

/// Writes `study.json` and `report.html` into `root`.
pub fn write(study: &Study, root: &Path) -> Result<(), StudyError> {
    let json = serde_json::to_string_pretty(study).unwrap_or_default();
    for (file, text) in [("study.json", json), ("report.html", html(study))] {
        let path = root.join(file);
        write_atomic(&path, text.as_bytes()).map_err(|e| StudyError::Write { path, reason: e.to_string() })?;
    }
    Ok(())
}

/// The study as plain text: per config, the paired differences and the verdicts.
pub fn text(study: &Study) -> String {
    let mut out = String::new();
    for domain in &study.domains {
        let _ = writeln!(out, "{} ({}), seeds {:?}", domain.name, domain.domain, domain.seeds);
        let _ = writeln!(out, "  {:<22} {:<6} {:>28} {:>8}", "condition - whale", "metric", "paired [95% CI]", "seeds");
        for d in &domain.differences {
            let seeds = format!("{}/{}", d.seeds_agreeing, d.seeds);
            let _ = writeln!(out, "  {:<22} {:<6} {:>28} {:>8}", d.arm, d.metric, signed(&d.estimate), seeds);
        }
        for verdict in &domain.verdicts {
            let _ = writeln!(out, "  {}: {} ({})", verdict.finding, verdict.status, verdict.detail);
        }
    }
    out
}

fn html(study: &Study) -> String {
    let mut body = String::new();
    for domain in &study.domains {
        let _ = write!(
            body,
            "<h2>{} ({})</h2>\n<table><tr><th>condition − whale</th><th>metric</th>",
            domain.name, domain.domain
        );
        let _ = writeln!(body, "<th>paired difference [95% CI]</th><th>seeds agreeing</th></tr>");
        for d in &domain.differences {
            let _ = writeln!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td></tr>",
                d.arm,
                d.metric,
                signed(&d.estimate),
                d.seeds_agreeing,
                d.seeds
            );
        }
        body.push_str(
            "</table>\n<table><tr><th>condition</th><th>rollouts to the weight-only peak, per seed</th></tr>\n",
        );
        for peak in &domain.peak_rollouts {
            let cells: Vec<String> =
                peak.per_seed.iter().map(|r| r.map_or("not reached".to_string(), |r| r.to_string())).collect();
            let _ = writeln!(body, "<tr><td>{}</td><td>{}</td></tr>", peak.arm, cells.join(", "));
        }
        body.push_str("</table>\n<ul>\n");
        for verdict in &domain.verdicts {
            let _ = writeln!(body, "<li><b>{}</b>: {} — {}</li>", verdict.finding, verdict.status, verdict.detail);
        }
        body.push_str("</ul>\n");
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>whale study</title><style>body{{font-family:sans-serif}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style></head>\
         <body><h1>whale study</h1><p>seeds {:?}{}; differences paired over test tasks, pooled over seeds \
         (bootstrap over seeds, then tasks within seeds).</p>\n{body}</body></html>\n",
        study.seeds,
        if study.quick { ", --quick" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn difference(arm: &str, value: f64, lo: f64, hi: f64) -> Difference {
        Difference {
            arm: arm.to_string(),
            metric: "best",
            estimate: Estimate { value, lo, hi },
            seeds_agreeing: 3,
            seeds: 3,
        }
    }

    #[test]
    fn finding_a_is_supported_only_when_every_baseline_is_below_whale() {
        let baselines = ["weight-only", "harness-only", "fast-slow", "sequential"];
        let tied: Vec<Difference> = baselines.iter().map(|arm| difference(arm, 0.0, 0.0, 0.0)).collect();
        assert_eq!(whale_beats_the_baselines(&tied).status, "inconclusive", "conditions that tie decide nothing");
        let below: Vec<Difference> = baselines.iter().map(|arm| difference(arm, -0.05, -0.08, -0.02)).collect();
        assert_eq!(whale_beats_the_baselines(&below).status, "supported");
        let mut one_above = below.clone();
        one_above[1] = difference("harness-only", 0.06, 0.03, 0.09);
        let verdict = whale_beats_the_baselines(&one_above);
        assert_eq!(verdict.status, "contradicted");
        assert!(verdict.detail.contains("harness-only +0.060 [+0.030, +0.090]"), "{}", verdict.detail);
        let mut straddling = below.clone();
        straddling[2] = difference("fast-slow", -0.01, -0.04, 0.02);
        assert_eq!(whale_beats_the_baselines(&straddling).status, "inconclusive");
        assert_eq!(whale_beats_the_baselines(&below[..3]).status, "inconclusive", "a baseline missing");
    }

    #[test]
    fn quick_shrinks_splits_and_budget_and_keeps_the_rest() {
        let config = RunConfig::default();
        let small = quick(config.clone());
        assert_eq!((small.tasks.search, small.tasks.test, small.eval.k), (16, 32, 4));
        assert_eq!((small.schedule.weight_steps, small.schedule.search_iterations), (2, 2));
        assert_eq!(small.schedule.budget, (config.schedule.budget / 8).max(128));
        assert_eq!(
            (small.seed, small.condition, small.tasks.domain),
            (config.seed, config.condition, config.tasks.domain)
        );
    }
}
