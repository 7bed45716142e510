//! Running one harness over a set of tasks: k rollouts per task, each with its own seed, and
//! the summary every harness comparison in whale rests on — mean@k, pass@k and maj@k with
//! bootstrap intervals, tokens, calls and errors by kind, and where the wall time went.
//!
//! Seeds are a function of (run seed, task index, sample index) only, so the same run seed
//! reproduces every trajectory whatever the thread count, and a harness change is compared with
//! its parent on the same draws. The same code serves `whale harness run`, the smoke test of
//! `whale harness check` and the benchmark.

use crate::{run_rollouts, EngineError, EpisodeSource, Harness, Limits, RolloutJob, RunOptions};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use whale_core::metrics::{self, Scores, TaskSamples};
use whale_core::{Domain, ErrorKind, Task, Trajectory};
use whale_policy::{Policy, SamplingParams};
use whale_tasks::{task_domain, CorpusSource, Environment, EnvironmentError};

/// How to run an evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalSettings {
    /// Rollouts per task.
    pub k: usize,
    /// The run seed every rollout seed derives from.
    pub seed: u64,
    /// Rollouts in flight at once.
    pub threads: usize,
    pub limits: Limits,
    /// Sampling defaults of model calls (the paper's: temperature 1, top_p 1, top_k 20).
    pub sampling: SamplingParams,
    /// Draw a progress bar on a terminal.
    pub progress: bool,
}

impl Default for EvalSettings {
    fn default() -> Self {
        Self {
            k: 8,
            seed: 0,
            threads: crate::DEFAULT_THREADS,
            limits: Limits::default(),
            sampling: SamplingParams::default(),
            progress: false,
        }
    }
}

/// What the rollouts of an evaluation consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    pub rollouts: usize,
    pub model_calls: usize,
    /// Calls of the domain's tools (`ctx.tools.*`).
    pub tool_calls: usize,
    /// `ctx.env.play` / `ctx.env.submit` calls.
    pub env_actions: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// Where the rollouts' time went, summed over rollouts, and the run's wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TimeSplit {
    pub model_ms: f64,
    pub tools_ms: f64,
    pub harness_ms: f64,
    pub wall_seconds: f64,
}

impl TimeSplit {
    /// The share of the rollouts' time spent outside the model (tools, environment, the
    /// harness's own JavaScript and the runtime around it).
    pub fn outside_model_share(&self) -> f64 {
        let total = self.model_ms + self.tools_ms + self.harness_ms;
        if total > 0.0 {
            (self.tools_ms + self.harness_ms) / total
        } else {
            0.0
        }
    }
}

/// The outcome of an evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub harness_id: String,
    pub domain: Domain,
    pub scores: Scores,
    pub usage: Usage,
    /// Rollouts that ended with an error, by error kind (`exception`, `call_limit`, ...).
    pub errors: BTreeMap<String, usize>,
    pub time: TimeSplit,
    /// Each task's rewards and answer keys, in task order: what the scores were computed from,
    /// and what paired comparisons of two evaluations on the same tasks need.
    #[serde(skip)]
    pub per_task: Vec<TaskSamples>,
    /// Every rollout, task by task, sample by sample.
    #[serde(skip)]
    pub trajectories: Vec<Trajectory>,
}

#[derive(Debug, thiserror::Error)]
pub enum EvaluateError {
    #[error("no tasks to run")]
    NoTasks,
    #[error("k must be at least 1")]
    NoSamples,
    #[error(transparent)]
    Environment(#[from] EnvironmentError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(
        "the {0} corpus is empty: these tasks carry no context paragraphs to search; pass a corpus file (--corpus)"
    )]
    EmptyCorpus(String),
}

/// The seed of rollout `sample` of the task at `task_index`: a SplitMix64 mix of the three,
/// so neighbouring indices give unrelated seeds.
pub fn rollout_seed(seed: u64, task_index: usize, sample: usize) -> u64 {
    let mut z = seed ^ (task_index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (sample as u64).rotate_left(32);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The environment for `tasks` of `domain`. A domain that searches a corpus (QA) searches the
/// corpus file when one is given, else the tasks' own context paragraphs, indexed in memory or
/// in `index_dir`, and refuses a corpus with nothing in it.
pub fn environment(
    domain: Domain,
    tasks: &[Task],
    corpus: Option<&Path>,
    index_dir: Option<&Path>,
) -> Result<Environment, EvaluateError> {
    let environment = task_domain(domain).environment(tasks, CorpusSource { file: corpus, index_dir })?;
    match environment.passages() {
        Some(0) => Err(EvaluateError::EmptyCorpus(domain.as_str().to_uppercase())),
        Some(_) | None => Ok(environment),
    }
}

/// Runs `settings.k` rollouts of `harness` on every task and summarises them. Trajectories
/// stream to `sink` as JSON lines as they finish. A task the environment cannot play stops the
/// evaluation before any rollout runs.
pub fn evaluate(
    harness: &Harness,
    environment: &Environment,
    tasks: &[Task],
    policy: Arc<dyn Policy>,
    settings: &EvalSettings,
    sink: Option<&mut dyn Write>,
) -> Result<Evaluation, EvaluateError> {
    if tasks.is_empty() {
        return Err(EvaluateError::NoTasks);
    }
    if settings.k == 0 {
        return Err(EvaluateError::NoSamples);
    }
    let jobs = jobs(harness, environment, tasks, policy.weights_version(), settings)?;
    let options = RunOptions {
        threads: settings.threads,
        sampling: settings.sampling.clone(),
        progress: settings.progress,
        sink,
    };
    let started = Instant::now();
    let trajectories = run_rollouts(jobs, policy, &settings.limits, options)?;
    let wall_seconds = started.elapsed().as_secs_f64();
    Ok(summarise(harness, environment.domain(), settings.k, trajectories, wall_seconds))
}

fn jobs(
    harness: &Harness,
    environment: &Environment,
    tasks: &[Task],
    weights_version: u64,
    settings: &EvalSettings,
) -> Result<Vec<RolloutJob>, EvaluateError> {
    let harness = Arc::new(harness.clone());
    let domain = environment.domain();
    let mut jobs = Vec::with_capacity(tasks.len() * settings.k);
    for (index, task) in tasks.iter().enumerate() {
        let view = task_domain(domain).public_view(task);
        for sample in 0..settings.k {
            jobs.push(RolloutJob {
                task_id: task.id.clone(),
                task_view: view.clone(),
                episode: EpisodeSource::Ready(environment.episode(task)?),
                seed: rollout_seed(settings.seed, index, sample),
                harness: harness.clone(),
                weights_version,
            });
        }
    }
    Ok(jobs)
}

/// Scores and totals of trajectories that come task by task, `k` per task.
fn summarise(
    harness: &Harness,
    domain: Domain,
    k: usize,
    trajectories: Vec<Trajectory>,
    wall_seconds: f64,
) -> Evaluation {
    let samples: Vec<TaskSamples> = trajectories
        .chunks(k)
        .map(|rollouts| TaskSamples {
            rewards: rollouts.iter().map(|t| t.reward).collect(),
            answers: rollouts.iter().map(|t| answer_key(domain, t)).collect(),
        })
        .collect();
    let mut usage = Usage { rollouts: trajectories.len(), ..Usage::default() };
    let mut time = TimeSplit { wall_seconds, ..TimeSplit::default() };
    let mut errors = BTreeMap::new();
    for t in &trajectories {
        let actions = t.tool_calls.iter().filter(|c| c.name.starts_with("env.")).count();
        usage.model_calls += t.model_calls.len();
        usage.env_actions += actions;
        usage.tool_calls += t.tool_calls.len() - actions;
        usage.prompt_tokens += t.prompt_tokens;
        usage.completion_tokens += t.completion_tokens;
        time.model_ms += t.wall.model_ms;
        time.tools_ms += t.wall.tools_ms;
        time.harness_ms += t.wall.harness_ms;
        if let Some(error) = &t.error {
            *errors.entry(error_kind_name(error.kind)).or_insert(0) += 1;
        }
    }
    Evaluation {
        harness_id: harness.id.clone(),
        domain,
        scores: metrics::score(&samples, k),
        per_task: samples,
        usage,
        errors,
        time,
        trajectories,
    }
}

/// The snake_case name of an error kind, as trajectories spell it.
pub fn error_kind_name(kind: ErrorKind) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| format!("{kind:?}"))
}

/// The rollout's answer in a form where equal answers are equal strings, for maj@k, as its
/// domain declares it ([`TaskDomain::answer_key`](whale_tasks::TaskDomain::answer_key)); none
/// for a rollout without an answer or with an empty key.
fn answer_key(domain: Domain, trajectory: &Trajectory) -> Option<String> {
    let key = task_domain(domain).answer_key(trajectory.answer.as_ref()?);
    (!key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use whale_core::{RolloutError, WallTime};

    fn trajectory(answer: Option<serde_json::Value>, reward: f64, error: Option<ErrorKind>) -> Trajectory {
        Trajectory {
            task_id: "t".into(),
            harness_id: "h".into(),
            weights_version: 0,
            seed: 0,
            model_calls: vec![],
            tool_calls: vec![],
            order: vec![],
            answer,
            reward,
            success: reward > 0.5,
            verdict_detail: String::new(),
            error: error.map(|kind| RolloutError { kind, message: "m".into(), stack: None }),
            turns: 0,
            prompt_tokens: 10,
            completion_tokens: 5,
            wall: WallTime { model_ms: 90.0, tools_ms: 2.0, harness_ms: 8.0 },
            log: vec![],
        }
    }

    #[test]
    fn rollout_seeds_differ_per_task_and_sample_and_follow_the_run_seed() {
        let mut seen = std::collections::HashSet::new();
        for task in 0..50 {
            for sample in 0..8 {
                assert!(seen.insert(rollout_seed(7, task, sample)), "({task}, {sample})");
            }
        }
        assert_eq!(rollout_seed(7, 3, 2), rollout_seed(7, 3, 2));
        assert_ne!(rollout_seed(7, 3, 2), rollout_seed(8, 3, 2));
        assert_ne!(rollout_seed(0, 1, 0), rollout_seed(0, 0, 1));
    }

    #[test]
    fn equal_answers_in_different_spellings_vote_together() {
        let key = |domain, answer: serde_json::Value| answer_key(domain, &trajectory(Some(answer), 0.0, None));
        assert_eq!(key(Domain::Math, json!("#### 1,000")), key(Domain::Math, json!("1000")));
        assert_eq!(key(Domain::Math, json!("2/4")), Some("1/2".to_string()));
        assert_eq!(key(Domain::Math, json!("Evelyn")), Some("Evelyn".to_string()));
        assert_eq!(key(Domain::Qa, json!("The Eiffel Tower.")), key(Domain::Qa, json!("eiffel tower")));
        assert_eq!(key(Domain::Chess, json!(["e2e4", "d7d5"])), Some("e2e4 d7d5".to_string()));
        assert_eq!(key(Domain::Qa, json!("  ")), None);
        assert_eq!(answer_key(Domain::Math, &trajectory(None, 0.0, None)), None);
    }

    #[test]
    fn a_summary_scores_tasks_and_counts_usage_errors_and_time() {
        let harness = Harness::new("h", "export function solve() {}");
        let trajectories = vec![
            trajectory(Some(json!("7")), 1.0, None),
            trajectory(Some(json!("7")), 1.0, None),
            trajectory(Some(json!("8")), 0.0, Some(ErrorKind::CallLimit)),
            trajectory(Some(json!("9")), 0.0, None),
            trajectory(Some(json!("9")), 0.0, Some(ErrorKind::Exception)),
            trajectory(None, 0.0, Some(ErrorKind::Exception)),
        ];
        let evaluation = summarise(&harness, Domain::Math, 3, trajectories, 1.5);
        assert_eq!((evaluation.scores.tasks, evaluation.scores.k), (2, 3));
        assert!((evaluation.scores.mean.value - (2.0 / 3.0) / 2.0).abs() < 1e-12);
        assert!((evaluation.scores.pass.value - 0.5).abs() < 1e-12);
        assert!((evaluation.scores.maj.value - 0.5).abs() < 1e-12);
        let rewards: Vec<&[f64]> = evaluation.per_task.iter().map(|t| t.rewards.as_slice()).collect();
        assert_eq!(rewards, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], "task by task, in order");
        assert_eq!(evaluation.per_task[1].answers, [Some("9".to_string()), Some("9".to_string()), None]);
        assert_eq!(evaluation.usage.rollouts, 6);
        assert_eq!((evaluation.usage.prompt_tokens, evaluation.usage.completion_tokens), (60, 30));
        let errors: Vec<(&str, usize)> = evaluation.errors.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(errors, [("call_limit", 1), ("exception", 2)]);
        assert!((evaluation.time.outside_model_share() - 0.1).abs() < 1e-12);
        assert_eq!(evaluation.time.wall_seconds, 1.5);
    }
}
