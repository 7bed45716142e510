//! The weight phase: one step of online rejection-sampling fine-tuning (online RFT).
//!
//! A step draws B training tasks, runs k fresh rollouts of each under the current harness (or,
//! for fast-slow, a harness drawn per task from the population), keeps the rollouts whose
//! reward is above the threshold, and takes one supervised pass, in mini-batches, over the
//! trainable model calls of the kept rollouts. Only the model's own completions are trained on:
//! each call's messages (prompt, tool results, observations) become the prompt of an example,
//! never a target. An empty kept set means no update.
//!
//! Everything a step does is a function of (seed, step number, weights, harnesses), so a
//! resumed run repeats it exactly; the examples of every update are returned as a
//! [`StepJournal`], from which a resumed run replays the updates made since its last full
//! checkpoint instead of redoing their rollouts.
//!
//! With `[weights.lora]` the trainer updates a LoRA adapter instead of the model: the engine
//! serves the base plus that adapter, sharing its matrices, so rollouts always sample from the
//! weights just trained while the base stays untouched; checkpoints are then PEFT adapter
//! directories ([`save_trainer`], [`resume_trainer`]).

use crate::config::WeightConfig;
use candle_core::Device;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use whale_core::{ModelCall, Task, Trajectory};
use whale_harness::scoring::rollout_seed;
use whale_harness::{run_rollouts, EpisodeSource, Harness, Limits, RolloutJob, RunOptions};
use whale_lm::{
    EngineError, GenerationConfig, LocalPolicy, LoraAdapter, LrSchedule, Policy, PolicyError, SamplingParams,
    SftExample, SftTrainer, TrainError, TrainerConfig,
};
use whale_tasks::{DomainTasks, Environment, EnvironmentError};

/// Salts that keep the random streams of different uses of the run seed apart.
const DRAW_SALT: u64 = 0x7EA1_D8A3_0000_0001;
const ROLLOUT_SALT: u64 = 0x7EA1_D8A3_0000_0002;
const HARNESS_SALT: u64 = 0x7EA1_D8A3_0000_0003;
const SHUFFLE_SALT: u64 = 0x7EA1_D8A3_0000_0004;

#[derive(Debug, thiserror::Error)]
pub enum WeightPhaseError {
    #[error(transparent)]
    Environment(#[from] EnvironmentError),
    #[error(transparent)]
    Rollouts(#[from] whale_harness::EngineError),
    #[error("cannot render a kept model call for training: {0}")]
    Render(#[from] PolicyError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error("cannot serve the trained weights: {0}")]
    Engine(Box<EngineError>),
    #[error("no harness to roll out with (the population is empty)")]
    NoHarness,
    #[error("no training tasks")]
    NoTasks,
}

impl From<EngineError> for WeightPhaseError {
    fn from(error: EngineError) -> Self {
        Self::Engine(Box::new(error))
    }
}

/// One training example in the journal: token ids of the prompt and of the completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalExample {
    pub prompt: Vec<u32>,
    pub completion: Vec<u32>,
}

impl JournalExample {
    fn to_example(&self) -> SftExample {
        SftExample { prompt: self.prompt.clone(), completion: self.completion.clone() }
    }
}

/// The updates of one step, in order: what a resumed run replays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepJournal {
    pub step: u64,
    pub mini_batches: Vec<Vec<JournalExample>>,
}

/// What one weight step did; a row of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    /// 1-based.
    pub step: u64,
    pub rollouts: usize,
    /// Mean reward of the step's rollouts (the training reward).
    pub reward_mean: f64,
    pub kept: usize,
    /// Kept rollouts over rollouts.
    pub acceptance_rate: f64,
    /// Trainable model calls of the kept rollouts.
    pub examples: usize,
    /// Optimizer updates (mini-batches) taken; 0 when nothing was kept.
    pub updates: usize,
    /// Mean loss per completion token over the pass (before each update), if any.
    pub loss: Option<f64>,
    /// Completion tokens trained on.
    pub trained_tokens: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Rollouts per harness id (more than one under fast-slow).
    pub harnesses: Vec<(String, usize)>,
    pub rollout_seconds: f64,
    pub train_seconds: f64,
}

/// Everything a weight step needs besides the policy and the trainer.
pub struct WeightPhase<'a> {
    pub config: &'a WeightConfig,
    pub environment: &'a Environment,
    pub train: &'a [Task],
    pub limits: &'a Limits,
    pub sampling: &'a SamplingParams,
    pub threads: usize,
    pub seed: u64,
    pub progress: bool,
}

/// The trainer settings of a weight phase.
pub fn trainer_config(config: &WeightConfig, pad_token_id: u32) -> TrainerConfig {
    TrainerConfig {
        learning_rate: config.learning_rate,
        warmup_steps: config.warmup_steps,
        schedule: LrSchedule::Constant,
        weight_decay: config.weight_decay,
        max_grad_norm: Some(config.max_grad_norm),
        micro_batch_size: config.micro_batch,
        max_seq_len: config.max_seq_len,
        pad_token_id,
        ..TrainerConfig::default()
    }
}

/// The trainer of a run's weight phase, fresh: over the policy's model, or, with
/// `[weights.lora]`, over a new adapter (initial matrices drawn from `seed`) that the policy
/// serves from now on, sharing its matrices.
pub fn new_trainer(config: &WeightConfig, policy: &LocalPolicy, seed: u64) -> Result<SftTrainer, WeightPhaseError> {
    let settings = trainer_config(config, policy.tokenizer().specials().endoftext);
    let Some(lora) = &config.lora else {
        return Ok(SftTrainer::new(policy.model(), settings)?);
    };
    let base = policy.model();
    let adapter =
        LoraAdapter::new(lora.clone(), base.config(), seed, base.dtype(), base.device()).map_err(TrainError::from)?;
    let trainer = SftTrainer::new(base.with_adapter(&adapter).map_err(TrainError::from)?, settings)?;
    policy.reload(trainer.model().clone(), policy.weights_version())?;
    Ok(trainer)
}

/// The trainer saved by [`save_trainer`] in `dir` (a checkpoint, or with `[weights.lora]` an
/// adapter of the policy's base model), whose model the policy serves from now on.
pub fn resume_trainer(
    config: &WeightConfig,
    policy: &LocalPolicy,
    dir: &Path,
    device: &Device,
) -> Result<SftTrainer, WeightPhaseError> {
    let settings = trainer_config(config, policy.tokenizer().specials().endoftext);
    let trainer = match config.lora {
        Some(_) => SftTrainer::resume_adapter(dir, &policy.model(), settings)?,
        None => SftTrainer::resume(dir, settings, policy.model().dtype(), device)?,
    };
    policy.reload(trainer.model().clone(), policy.weights_version())?;
    Ok(trainer)
}

/// Saves the trainer into `dir`: a checkpoint, or the PEFT adapter of `base_model` (its
/// `base_model_name_or_path`), with the optimizer state either way.
pub fn save_trainer(trainer: &SftTrainer, dir: &Path, base_model: &Path) -> Result<(), TrainError> {
    if trainer.model().adapter().is_some() {
        trainer.save_adapter(dir, &base_model.display().to_string())
    } else {
        trainer.save(dir, &GenerationConfig::for_model(trainer.model().config()))
    }
}

impl WeightPhase<'_> {
    /// The training tasks of step `step` (1-based): consecutive slices of a per-epoch
    /// permutation of the training split, so every task is drawn once per epoch.
    pub fn draw(&self, step: u64) -> Vec<&Task> {
        let per_step = self.config.tasks_per_step;
        let len = self.train.len();
        let start = (step.saturating_sub(1) as usize) * per_step;
        let mut permutation: Option<(usize, Vec<usize>)> = None;
        (start..start + per_step)
            .map(|position| {
                let epoch = position / len;
                if permutation.as_ref().is_none_or(|(e, _)| *e != epoch) {
                    let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ DRAW_SALT);
                    rng.set_stream(epoch as u64);
                    let mut order: Vec<usize> = (0..len).collect();
                    order.shuffle(&mut rng);
                    permutation = Some((epoch, order));
                }
                let order = &permutation.as_ref().expect("set above").1;
                &self.train[order[position % len]]
            })
            .collect()
    }

    /// One step: rollouts, rejection, one SFT pass. The caller bumps the policy's weights
    /// version when `report.updates > 0`.
    pub fn step(
        &self,
        step: u64,
        population: &[Harness],
        policy: &Arc<LocalPolicy>,
        trainer: &mut SftTrainer,
    ) -> Result<(StepReport, StepJournal, Vec<Trajectory>), WeightPhaseError> {
        if self.train.is_empty() {
            return Err(WeightPhaseError::NoTasks);
        }
        let started = Instant::now();
        let rollout_policy: Arc<dyn Policy> = policy.clone();
        let trajectories = self.rollouts(step, population, &rollout_policy)?;
        let rollout_seconds = started.elapsed().as_secs_f64();
        let kept = kept(&trajectories, self.config.reward_threshold);
        let examples = training_examples(&kept, self.config.skip_truncated, |call| call_example(policy, call))?;
        let journal = StepJournal { step, mini_batches: self.mini_batches(step, examples.clone()) };
        let started = Instant::now();
        let pass = apply(trainer, &journal)?;
        let report = StepReport {
            updates: pass.updates,
            loss: pass.loss,
            trained_tokens: pass.tokens,
            train_seconds: started.elapsed().as_secs_f64(),
            ..rollout_report(step, &trajectories, kept.len(), examples.len(), rollout_seconds)
        };
        let kept = kept.into_iter().cloned().collect();
        Ok((report, journal, kept))
    }

    /// k rollouts of each drawn task, each task under one harness of the population.
    pub fn rollouts(
        &self,
        step: u64,
        population: &[Harness],
        policy: &Arc<dyn Policy>,
    ) -> Result<Vec<Trajectory>, WeightPhaseError> {
        if population.is_empty() {
            return Err(WeightPhaseError::NoHarness);
        }
        let population: Vec<Arc<Harness>> = population.iter().cloned().map(Arc::new).collect();
        let step_seed = self.seed ^ ROLLOUT_SALT ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut pick = ChaCha8Rng::seed_from_u64(self.seed ^ HARNESS_SALT);
        pick.set_stream(step);
        let domain = self.environment.domain();
        let mut jobs = Vec::new();
        for (index, task) in self.draw(step).into_iter().enumerate() {
            let harness = &population[pick.gen_range(0..population.len())];
            let view = domain.public_view(task);
            for sample in 0..self.config.rollouts_per_task {
                jobs.push(RolloutJob {
                    task_id: task.id.clone(),
                    task_view: view.clone(),
                    episode: EpisodeSource::Ready(self.environment.episode(task)?),
                    seed: rollout_seed(step_seed, index, sample),
                    harness: harness.clone(),
                    weights_version: policy.weights_version(),
                });
            }
        }
        let options =
            RunOptions { threads: self.threads, sampling: self.sampling.clone(), progress: self.progress, sink: None };
        Ok(run_rollouts(jobs, policy.clone(), self.limits, options)?)
    }

    /// The examples in training order and cut into mini-batches.
    fn mini_batches(&self, step: u64, examples: Vec<JournalExample>) -> Vec<Vec<JournalExample>> {
        let examples = self.training_order(step, examples);
        examples.chunks(self.config.mini_batch).map(<[JournalExample]>::to_vec).collect()
    }

    /// The order step `step` trains its examples in: shuffled, seeded by the step. Any list
    /// with one item per example (tokens, chat samples) gets the same permutation.
    pub fn training_order<T>(&self, step: u64, mut items: Vec<T>) -> Vec<T> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ SHUFFLE_SALT);
        rng.set_stream(step);
        items.shuffle(&mut rng);
        items
    }
}

/// The report of a step's rollouts, before any training: no update, no loss.
pub fn rollout_report(
    step: u64,
    trajectories: &[Trajectory],
    kept: usize,
    examples: usize,
    rollout_seconds: f64,
) -> StepReport {
    let rollouts = trajectories.len();
    StepReport {
        step,
        rollouts,
        reward_mean: trajectories.iter().map(|t| t.reward).sum::<f64>() / rollouts.max(1) as f64,
        kept,
        acceptance_rate: kept as f64 / rollouts.max(1) as f64,
        examples,
        updates: 0,
        loss: None,
        trained_tokens: 0,
        prompt_tokens: trajectories.iter().map(|t| t.prompt_tokens).sum(),
        completion_tokens: trajectories.iter().map(|t| t.completion_tokens).sum(),
        harnesses: harness_counts(trajectories),
        rollout_seconds,
        train_seconds: 0.0,
    }
}

/// The rollouts whose reward is strictly above `threshold`, in order.
pub fn kept(trajectories: &[Trajectory], threshold: f64) -> Vec<&Trajectory> {
    trajectories.iter().filter(|t| t.reward > threshold).collect()
}

/// The training examples of the kept rollouts: one per trainable model call, in rollout and
/// call order. Calls a harness marked `trainable: false` are left out, and so are calls cut
/// off at `max_tokens` when `skip_truncated`.
pub fn training_examples(
    kept: &[&Trajectory],
    skip_truncated: bool,
    encode: impl Fn(&ModelCall) -> Result<JournalExample, PolicyError>,
) -> Result<Vec<JournalExample>, PolicyError> {
    trained_calls(kept, skip_truncated).map(encode).collect()
}

/// The model calls of the kept rollouts a step trains on, in rollout and call order: the
/// trainable ones, less those cut off at `max_tokens` when `skip_truncated`.
pub fn trained_calls<'a>(kept: &'a [&Trajectory], skip_truncated: bool) -> impl Iterator<Item = &'a ModelCall> {
    let length = whale_lm::FinishReason::Length.as_str();
    kept.iter()
        .flat_map(|t| t.model_calls.iter())
        .filter(move |call| call.trainable && !(skip_truncated && call.finish_reason == length))
}

/// A model call as the policy saw it: the prompt rendered with the chat template, and the
/// completion's tokens, closed by the end-of-turn token when the model ended its turn.
/// Trajectories record text, so the completion is re-tokenized; for a model that samples the
/// tokenizer's own spelling of its text (any trained one, nearly always) that is the sampled ids.
pub fn call_example(policy: &LocalPolicy, call: &ModelCall) -> Result<JournalExample, PolicyError> {
    let prompt = policy.prompt_ids(&call.messages)?;
    let mut completion = policy.tokenizer().encode(&call.completion)?;
    if call.finish_reason == whale_lm::FinishReason::Stop.as_str() {
        completion.push(policy.tokenizer().specials().im_end);
    }
    Ok(JournalExample { prompt, completion })
}

/// What an SFT pass did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PassStats {
    pub updates: usize,
    pub loss: Option<f64>,
    pub tokens: usize,
}

/// One optimizer update per mini-batch of the journal; nothing when it is empty.
pub fn apply(trainer: &mut SftTrainer, journal: &StepJournal) -> Result<PassStats, TrainError> {
    let mut stats = PassStats::default();
    let mut weighted_loss = 0.0;
    for batch in &journal.mini_batches {
        let examples: Vec<SftExample> = batch.iter().map(JournalExample::to_example).collect();
        let update = match trainer.step(&examples) {
            Ok(update) => update,
            Err(TrainError::NoTrainableTokens) => continue,
            Err(error) => return Err(error),
        };
        stats.updates += 1;
        stats.tokens += update.tokens;
        weighted_loss += update.loss * update.tokens as f64;
    }
    stats.loss = (stats.tokens > 0).then(|| weighted_loss / stats.tokens as f64);
    Ok(stats)
}

fn harness_counts(trajectories: &[Trajectory]) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for t in trajectories {
        match counts.iter_mut().find(|(id, _)| *id == t.harness_id) {
            Some((_, n)) => *n += 1,
            None => counts.push((t.harness_id.clone(), 1)),
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use whale_core::{ChatMessage, WallTime};

    fn call(text: &str, trainable: bool) -> ModelCall {
        ModelCall {
            messages: vec![ChatMessage::new("user", format!("question for {text}"))],
            completion: text.to_string(),
            prompt_tokens: 3,
            completion_tokens: 1,
            trainable,
            finish_reason: "stop".to_string(),
            latency_ms: 0.0,
        }
    }

    fn rollout(reward: f64, calls: Vec<ModelCall>) -> Trajectory {
        Trajectory {
            task_id: "t".into(),
            harness_id: "h".into(),
            weights_version: 0,
            seed: 0,
            model_calls: calls,
            tool_calls: vec![],
            order: vec![],
            answer: None,
            reward,
            success: reward > 0.5,
            verdict_detail: String::new(),
            error: None,
            turns: 1,
            prompt_tokens: 3,
            completion_tokens: 1,
            wall: WallTime::default(),
            log: vec![],
        }
    }

    #[test]
    fn examples_come_from_trainable_calls_of_kept_rollouts_only() {
        let mut cut = call("rambling", true);
        cut.finish_reason = "length".to_string();
        let rollouts = vec![
            rollout(1.0, vec![call("a", true), call("check", false), call("b", true), cut]),
            rollout(0.5, vec![call("at the threshold", true)]),
            rollout(0.0, vec![call("wrong", true)]),
        ];
        let kept = kept(&rollouts, 0.5);
        assert_eq!(kept.len(), 1);
        let encode = |c: &ModelCall| {
            Ok(JournalExample {
                prompt: c.messages[0].content.bytes().map(u32::from).collect(),
                completion: vec![c.completion.len() as u32],
            })
        };
        let text = |examples: Vec<JournalExample>| -> Vec<String> {
            examples.iter().map(|e| e.prompt.iter().map(|&b| b as u8 as char).collect()).collect()
        };
        let examples = training_examples(&kept, true, encode).expect("examples");
        assert_eq!(text(examples), ["question for a", "question for b"]);
        let examples = training_examples(&kept, false, encode).expect("examples");
        assert_eq!(text(examples), ["question for a", "question for b", "question for rambling"]);
    }
}
