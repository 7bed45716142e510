//! A base model's headline figure: mean@k on held-out generated tasks of its domain, under the
//! domain's starting harness, sampled with the paper's settings (temperature 1.0, top_p 1.0,
//! top_k 20). Math asks the plain one-call prompt ([`super::corpus::plain_math_prompt`]) and
//! scores it with the math verifier; chess and QA run their starting stock harness
//! ([`starting_harness`]) through the sandbox, as a WHALE run would.
//!
//! The figure has to sit well inside (0, 1) for WHALE to have something to improve on both
//! sides (weights and harness), so pretraining reports it with its bootstrap interval.

use super::corpus::plain_math_prompt;
use crate::error::PretrainError;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use whale_core::metrics::{self, Scores, TaskSamples};
use whale_core::{ChatMessage, Domain, Task};
use whale_engine::{EngineConfig, LocalPolicy};
use whale_harness::scoring::{self, EvalSettings};
use whale_math_answer::{extract_answer, DEFAULT_ORDER};
use whale_policy::{ChatRequest, Policy, PolicyError, SamplingParams};
use whale_tasks::{math, task_domain};

/// Which tasks, how many samples, how long an answer may be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalSpec {
    /// The domain of the tasks (and so the harness they are run with).
    #[serde(default = "math_domain")]
    pub domain: Domain,
    pub tasks: usize,
    pub samples: usize,
    pub difficulty: u32,
    /// The generator seed of the evaluation tasks (kept out of the corpus).
    pub seed: u64,
    /// The reply budget of the math prompt (harnesses set their own).
    pub max_tokens: usize,
}

fn math_domain() -> Domain {
    Domain::Math
}

impl Default for EvalSpec {
    fn default() -> Self {
        Self::for_domain(Domain::Math)
    }
}

impl EvalSpec {
    /// 64 tasks x 8 samples of the domain's evaluation difficulty: math word problems of
    /// difficulty 1, endgame mates in one, QA questions with one and two hops mixed.
    pub fn for_domain(domain: Domain) -> Self {
        let difficulty = match domain {
            Domain::Math | Domain::Chess => 1,
            Domain::Qa => 2,
        };
        Self { domain, tasks: 64, samples: 8, difficulty, seed: 0xE7A1, max_tokens: 192 }
    }
}

/// The stock harness a domain's base model is measured with: the `initial` harness of the
/// domain's example config (`examples/<domain>.toml`), one model call per task or per move.
pub fn starting_harness(domain: Domain) -> &'static str {
    match domain {
        Domain::Math => "math/plain",
        Domain::Chess => "chess/legal-moves",
        Domain::Qa => "qa/search",
    }
}

/// One task's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    pub id: String,
    pub gold: String,
    pub rewards: Vec<f64>,
    /// The answer read from each sample (`None` when none could be read).
    pub answers: Vec<Option<String>>,
}

/// mean@k, pass@k and maj@k with intervals, and every task's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub spec: EvalSpec,
    /// The user message sent for a math question (with `{question}` standing for it), or
    /// `harness <name>` for the stock harness the tasks were run with.
    pub prompt: String,
    pub scores: Scores,
    pub completion_tokens: usize,
    pub seconds: f64,
    pub per_task: Vec<TaskResult>,
}

/// The evaluation tasks of `spec`.
pub fn tasks(spec: &EvalSpec) -> Vec<Task> {
    task_domain(spec.domain).generate(spec.tasks, spec.seed, spec.difficulty)
}

/// What identifies each of `tasks` in a corpus (its question; a chess puzzle's starting FEN),
/// to keep them out of the training corpus.
pub fn held_out(tasks: &[Task]) -> HashSet<String> {
    tasks.iter().filter_map(super::corpus::identity).collect()
}

/// Serves the checkpoint in `dir` and evaluates it on `tasks`.
pub fn evaluate_dir(dir: &Path, spec: &EvalSpec, tasks: &[Task]) -> Result<EvalReport, PretrainError> {
    let policy = LocalPolicy::load(dir, candle_core::DType::F32, &candle_core::Device::Cpu, EngineConfig::default())?;
    let policy = Arc::new(policy);
    let report = match spec.domain {
        Domain::Math => evaluate(policy.as_ref(), spec, tasks)?,
        Domain::Chess | Domain::Qa => evaluate_harness(policy.clone(), spec, tasks)?,
    };
    policy.shutdown();
    Ok(report)
}

/// Runs the domain's starting harness ([`starting_harness`]) `spec.samples` times per task.
pub fn evaluate_harness(policy: Arc<dyn Policy>, spec: &EvalSpec, tasks: &[Task]) -> Result<EvalReport, PretrainError> {
    let started = Instant::now();
    let name = starting_harness(spec.domain);
    let harness =
        whale_harness::stock_harness(name).map(|stock| stock.harness()).ok_or(PretrainError::NoHarness(name))?;
    let environment = scoring::environment(spec.domain, tasks, None, None)?;
    let settings = EvalSettings { k: spec.samples, seed: spec.seed, ..EvalSettings::default() };
    let run = scoring::evaluate(&harness, &environment, tasks, policy, &settings, None)?;
    let per_task: Vec<TaskResult> = tasks
        .iter()
        .zip(run.per_task)
        .map(|(task, samples)| TaskResult {
            id: task.id.clone(),
            gold: task_domain(spec.domain).gold_actions(task).join(" "),
            rewards: samples.rewards,
            answers: samples.answers,
        })
        .collect();
    Ok(EvalReport {
        spec: spec.clone(),
        prompt: format!("harness {name}"),
        scores: run.scores,
        completion_tokens: run.usage.completion_tokens,
        seconds: started.elapsed().as_secs_f64(),
        per_task,
    })
}

/// The seed of sample `sample` of task `task`: distinct for every pair.
fn sample_seed(spec: &EvalSpec, task: usize, sample: usize) -> u64 {
    spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((task as u64) << 20) ^ sample as u64
}

/// Samples `spec.samples` replies per task from `policy`, all requests in flight at once so
/// a batching policy can serve them together.
pub fn evaluate(policy: &dyn Policy, spec: &EvalSpec, tasks: &[Task]) -> Result<EvalReport, PolicyError> {
    let started = Instant::now();
    let jobs: Vec<(usize, usize)> = (0..tasks.len()).flat_map(|t| (0..spec.samples).map(move |s| (t, s))).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Reply>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let workers = jobs.len().clamp(1, 64);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(task, sample)) = jobs.get(index) else { break };
                let outcome = ask(policy, spec, &tasks[task], sample_seed(spec, task, sample));
                results.lock().unwrap_or_else(std::sync::PoisonError::into_inner)[index] = Some(outcome);
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut per_task: Vec<TaskResult> = tasks
        .iter()
        .map(|t| TaskResult {
            id: t.id.clone(),
            gold: t.payload.get("answer").and_then(|a| a.as_str()).unwrap_or_default().to_string(),
            rewards: Vec::new(),
            answers: Vec::new(),
        })
        .collect();
    let mut completion_tokens = 0;
    for (&(task, _), outcome) in jobs.iter().zip(results) {
        let Some(outcome) = outcome else { continue };
        let (text, tokens) = outcome?;
        completion_tokens += tokens;
        let verdict = math::score(&tasks[task], &text);
        per_task[task].rewards.push(verdict.reward);
        per_task[task].answers.push(extract_answer(&text, &DEFAULT_ORDER));
    }
    let samples: Vec<TaskSamples> =
        per_task.iter().map(|t| TaskSamples { rewards: t.rewards.clone(), answers: t.answers.clone() }).collect();
    Ok(EvalReport {
        spec: spec.clone(),
        prompt: plain_math_prompt("{question}"),
        scores: metrics::score(&samples, spec.samples),
        completion_tokens,
        seconds: started.elapsed().as_secs_f64(),
        per_task,
    })
}

/// A reply's text and its number of tokens.
type Reply = Result<(String, usize), PolicyError>;

fn ask(policy: &dyn Policy, spec: &EvalSpec, task: &Task, seed: u64) -> Reply {
    let question = task.payload.get("question").and_then(|q| q.as_str()).unwrap_or_default();
    let request = ChatRequest {
        messages: vec![ChatMessage::new("user", plain_math_prompt(question))],
        params: SamplingParams { max_tokens: spec.max_tokens, seed, ..SamplingParams::default() },
    };
    let completion = policy.chat(request)?;
    Ok((completion.text, completion.completion_tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::PLAIN_MATH_INSTRUCTION;
    use std::collections::HashMap;
    use whale_policy::{Completion, FinishReason};

    /// Answers the plain prompt right for tasks of even index and wrong for the others, and
    /// records the seeds it was asked with.
    struct Scripted {
        gold: HashMap<String, (usize, String)>,
        seeds: Mutex<Vec<u64>>,
    }

    impl Policy for Scripted {
        fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
            let [message] = request.messages.as_slice() else { panic!("one message expected") };
            assert_eq!(message.role, "user");
            let question = message.content.strip_suffix(&format!("\n{PLAIN_MATH_INSTRUCTION}")).expect("plain prompt");
            let (index, gold) = &self.gold[question];
            let text = if index % 2 == 0 { format!("It is {gold}.\n#### {gold}") } else { "#### -1".to_string() };
            self.seeds.lock().expect("lock").push(request.params.seed);
            assert_eq!((request.params.top_k, request.params.top_p, request.params.temperature), (20, 1.0, 1.0));
            Ok(Completion {
                text,
                token_ids: vec![1, 2],
                logprobs: vec![0.0, 0.0],
                finish_reason: FinishReason::Stop,
                prompt_tokens: 10,
                completion_tokens: 2,
            })
        }

        fn name(&self) -> String {
            "scripted".to_string()
        }

        fn weights_version(&self) -> u64 {
            0
        }
    }

    #[test]
    fn mean_at_k_counts_each_sample_of_each_task() {
        let spec = EvalSpec { tasks: 10, samples: 4, ..EvalSpec::default() };
        let tasks = tasks(&spec);
        let gold = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let field = |key: &str| t.payload[key].as_str().expect("text").to_string();
                (field("question"), (i, field("answer")))
            })
            .collect();
        let policy = Scripted { gold, seeds: Mutex::new(Vec::new()) };
        let report = evaluate(&policy, &spec, &tasks).expect("evaluated");
        assert_eq!(report.scores.tasks, 10);
        assert_eq!(report.scores.mean.value, 0.5);
        assert_eq!(report.scores.pass.value, 0.5);
        assert!(report.scores.mean.lo < 0.5 && report.scores.mean.hi > 0.5);
        assert_eq!(report.completion_tokens, 10 * 4 * 2);
        assert!(report.per_task.iter().all(|t| t.rewards.len() == 4 && t.answers.len() == 4));
        assert_eq!(report.per_task[0].answers[0].as_deref(), Some(report.per_task[0].gold.as_str()));
        let mut seeds = policy.seeds.into_inner().expect("lock");
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), 40, "every sample has its own seed");
    }
}
