//! The weight phase: one step of online rejection-sampling fine-tuning (online RFT), or of a
//! policy gradient (GRPO, RLOO).
//!
//! A step draws B training tasks and runs k fresh rollouts of each under the current harness
//! (or, for fast-slow, a harness drawn per task from the population). RFT keeps the rollouts
//! whose reward is above the threshold and takes one supervised pass, in mini-batches, over the
//! trainable model calls of the kept rollouts. A policy gradient gives each rollout an
//! advantage from the k rewards of its task, leaves out the tasks whose rollouts all scored
//! the same (no signal), and takes `epochs` passes of clipped-surrogate updates over the
//! trainable calls of the rest, their tokens as sampled, against the log-probabilities the
//! step's starting weights give those tokens.
//! Only the model's own completions are trained on: each call's messages (prompt, tool
//! results, observations) become the prompt of an example, never a target. Nothing to train on
//! means no update.
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

use crate::config::{Algorithm, WeightConfig};
use candle_core::Device;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use whale_core::{ModelCall, SampledTokens, Task, Trajectory};
use whale_engine::{EngineError, LocalPolicy};
use whale_harness::scoring::rollout_seed;
use whale_harness::{run_rollouts, EpisodeSource, Harness, Limits, RolloutJob, RunOptions};
use whale_lm::{Decoder, LoraConfig, TrainableModel, WithTrainable};
use whale_policy::{Policy, PolicyError, SamplingParams};
use whale_tasks::{task_domain, Environment, EnvironmentError};
use whale_train::{
    completion_logprobs, ChatCodec, LrSchedule, PgExample, PgObjective, SftExample, SftTrainer, TrainError,
    TrainerConfig, TrainerState,
};

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
    #[error("keeping the phase-boundary weights in {}: {reason}", dir.display())]
    PhaseWeights { dir: std::path::PathBuf, reason: String },
    #[error("no harness to roll out with (the population is empty)")]
    NoHarness,
    #[error("no training tasks")]
    NoTasks,
    #[error(
        "a policy gradient needs the sampled token ids and their log-probabilities, and the policy did not \
         report them for a call of task {task_id} (a server must return `logprobs` and token ids)"
    )]
    NoLogprobs { task_id: String },
}

impl From<EngineError> for WeightPhaseError {
    fn from(error: EngineError) -> Self {
        Self::Engine(Box::new(error))
    }
}

/// One training example in the journal: token ids of the prompt and of the completion and,
/// for a policy gradient, the rollout's advantage and the log-probabilities of the sampling
/// policy (and of the reference weights, with a KL penalty) per completion token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalExample {
    pub prompt: Vec<u32>,
    pub completion: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantage: Option<f32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behaviour: Vec<f32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference: Vec<f32>,
}

impl JournalExample {
    /// A supervised example: the completion is the target.
    pub fn supervised(prompt: Vec<u32>, completion: Vec<u32>) -> Self {
        Self { prompt, completion, advantage: None, behaviour: Vec::new(), reference: Vec::new() }
    }

    fn to_example(&self) -> SftExample {
        SftExample { prompt: self.prompt.clone(), completion: self.completion.clone() }
    }

    fn to_pg_example(&self) -> Result<PgExample, TrainError> {
        let advantage = self
            .advantage
            .ok_or_else(|| TrainError::Batch("a policy-gradient journal example without an advantage".into()))?;
        Ok(PgExample {
            prompt: self.prompt.clone(),
            completion: self.completion.clone(),
            advantage,
            behaviour: self.behaviour.clone(),
            reference: self.reference.clone(),
        })
    }
}

/// The updates of one step, in order: what a resumed run replays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepJournal {
    pub step: u64,
    pub mini_batches: Vec<Vec<JournalExample>>,
    /// Passes over the mini-batches (a policy gradient's `epochs`).
    #[serde(default = "one_pass", skip_serializing_if = "is_one_pass")]
    pub epochs: usize,
}

fn one_pass() -> usize {
    1
}

fn is_one_pass(epochs: &usize) -> bool {
    *epochs == 1
}

/// What a policy-gradient step did besides the common counts; part of its [`StepReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyGradientReport {
    /// Tasks drawn (each a group of k rollouts).
    pub groups: usize,
    /// Groups whose rollouts all scored the same: no advantage, no gradient.
    pub zero_signal_groups: usize,
    /// Mean advantage and mean absolute advantage over the trained examples.
    pub advantage_mean: f64,
    pub advantage_abs_mean: f64,
    /// Tokens whose clipped term won (no gradient), over all updates.
    pub clip_fraction: Option<f64>,
    /// Mean k3 estimate of KL(policy || starting weights) per token, with a KL penalty.
    pub kl: Option<f64>,
    /// The largest |ratio - 1| seen by an update (0 at a step's first update; later updates
    /// and epochs are off-policy).
    pub ratio_deviation: Option<f64>,
    /// The largest `|p_trainer / p_sampler - 1|` over the sampled tokens, before any update:
    /// how far the engine's log-probabilities are from the trainer's (float rounding only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_deviation: Option<f64>,
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
    /// Completion tokens trained on, summed over the updates (a policy gradient's epochs each
    /// count); with an external trainer, the samples' completion tokens once.
    pub trained_tokens: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Rollouts per harness id (more than one under fast-slow).
    pub harnesses: Vec<(String, usize)>,
    pub rollout_seconds: f64,
    /// Everything after the rollouts: the examples, a policy gradient's passes for the old and
    /// reference log-probabilities, and the updates.
    pub train_seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_gradient: Option<PolicyGradientReport>,
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
        micro_batch_tokens: config.micro_batch_tokens,
        max_seq_len: config.max_seq_len,
        pad_token_id,
        ..TrainerConfig::default()
    }
}

/// The in-process trainer of a run, over the model of whichever architecture its engine serves.
pub struct RunTrainer(Box<dyn ArchitectureTrainer>);

/// What a run does with its trainer; implemented once for the trainer of every
/// [`TrainableModel`], so nothing here names an architecture.
trait ArchitectureTrainer {
    fn decoder(&self) -> Decoder;
    fn state(&self) -> TrainerState;
    fn apply(&mut self, journal: &StepJournal, config: &WeightConfig) -> Result<PassStats, TrainError>;
    fn save(&self, dir: &Path, base_model: &Path) -> Result<(), TrainError>;
    fn save_merged(&self, dir: &Path) -> Result<(), String>;
    fn step(
        &mut self,
        phase: &WeightPhase<'_>,
        step: u64,
        population: &[Harness],
        policy: &Arc<LocalPolicy>,
        reference: Option<&Decoder>,
    ) -> Result<(StepReport, StepJournal, Vec<Trajectory>), WeightPhaseError>;
}

impl<M: TrainableModel> ArchitectureTrainer for SftTrainer<M> {
    fn decoder(&self) -> Decoder {
        self.model().clone().into()
    }

    fn state(&self) -> TrainerState {
        *SftTrainer::state(self)
    }

    fn apply(&mut self, journal: &StepJournal, config: &WeightConfig) -> Result<PassStats, TrainError> {
        apply(self, journal, config)
    }

    /// The adapter (a PEFT directory naming `base_model`) when the model carries one, the
    /// checkpoint otherwise; the optimizer state either way.
    fn save(&self, dir: &Path, base_model: &Path) -> Result<(), TrainError> {
        match self.model().has_adapter() {
            true => self.save_adapter(dir, &base_model.display().to_string()),
            false => self.save_checkpoint(dir),
        }
    }

    fn save_merged(&self, dir: &Path) -> Result<(), String> {
        let model = self.model().merged().map_err(|e| e.to_string())?;
        model.save(dir).map_err(|e| e.to_string())
    }

    fn step(
        &mut self,
        phase: &WeightPhase<'_>,
        step: u64,
        population: &[Harness],
        policy: &Arc<LocalPolicy>,
        reference: Option<&Decoder>,
    ) -> Result<(StepReport, StepJournal, Vec<Trajectory>), WeightPhaseError> {
        phase.step(step, population, policy, self, reference.and_then(M::of_decoder))
    }
}

impl RunTrainer {
    /// The model being trained, as the engine serves it.
    pub fn decoder(&self) -> Decoder {
        self.0.decoder()
    }

    /// The trainer's counters.
    pub fn state(&self) -> TrainerState {
        self.0.state()
    }

    /// The journal's updates ([`apply`]).
    pub fn apply(&mut self, journal: &StepJournal, config: &WeightConfig) -> Result<PassStats, TrainError> {
        self.0.apply(journal, config)
    }
}

/// Builds a fresh trainer over the model it is given, with a new adapter under `[weights.lora]`.
struct FreshTrainer<'a> {
    settings: TrainerConfig,
    lora: Option<&'a LoraConfig>,
    seed: u64,
}

impl WithTrainable for FreshTrainer<'_> {
    type Output = Result<RunTrainer, TrainError>;

    fn run<M: TrainableModel>(self, base: M) -> Self::Output {
        let model = match self.lora {
            Some(lora) => base.with_new_adapter(lora, self.seed)?,
            None => base,
        };
        Ok(RunTrainer(Box::new(SftTrainer::new(model, self.settings)?)))
    }
}

/// Builds the trainer saved in `dir` over the model it is given: its adapter under
/// `[weights.lora]`, otherwise the checkpoint there, loaded in the model's dtype.
struct SavedTrainer<'a> {
    settings: TrainerConfig,
    dir: &'a Path,
    adapter: bool,
    device: &'a Device,
}

impl WithTrainable for SavedTrainer<'_> {
    type Output = Result<RunTrainer, TrainError>;

    fn run<M: TrainableModel>(self, base: M) -> Self::Output {
        let model = match self.adapter {
            true => base.with_saved_adapter(self.dir)?,
            false => M::load(self.dir, base.dtype(), self.device)?,
        };
        Ok(RunTrainer(Box::new(SftTrainer::resumed(model, self.settings, self.dir)?)))
    }
}

/// The trainer of a run's weight phase, fresh: over the policy's model, or, with
/// `[weights.lora]`, over a new adapter (initial matrices drawn from `seed`) that the policy
/// serves from now on, sharing its matrices.
pub fn new_trainer(config: &WeightConfig, policy: &LocalPolicy, seed: u64) -> Result<RunTrainer, WeightPhaseError> {
    let settings = trainer_config(config, policy.tokenizer().specials().endoftext);
    let trainer = policy.decoder().with_trainable(FreshTrainer { settings, lora: config.lora.as_ref(), seed })?;
    if config.lora.is_some() {
        policy.reload(trainer.decoder(), policy.weights_version())?;
    }
    Ok(trainer)
}

/// The trainer saved by [`save_trainer`] in `dir` (a checkpoint, or with `[weights.lora]` an
/// adapter of the policy's base model), whose model the policy serves from now on.
pub fn resume_trainer(
    config: &WeightConfig,
    policy: &LocalPolicy,
    dir: &Path,
    device: &Device,
) -> Result<RunTrainer, WeightPhaseError> {
    let settings = trainer_config(config, policy.tokenizer().specials().endoftext);
    let saved = SavedTrainer { settings, dir, adapter: config.lora.is_some(), device };
    let trainer = policy.decoder().with_trainable(saved)?;
    policy.reload(trainer.decoder(), policy.weights_version())?;
    Ok(trainer)
}

/// Saves the trainer into `dir`: a checkpoint, or the PEFT adapter of `base_model` (its
/// `base_model_name_or_path`), with the optimizer state either way.
pub fn save_trainer(trainer: &RunTrainer, dir: &Path, base_model: &Path) -> Result<(), TrainError> {
    trainer.0.save(dir, base_model)
}

/// Writes the trainer's weights (an adapter merged into its base) as a model directory that
/// `LocalPolicy::load` and `whale harness run --model` read: config, weights, generation
/// config, and the tokenizer files of `base_model`. No optimizer state: nothing resumes from it.
pub fn save_phase_weights(trainer: &RunTrainer, dir: &Path, base_model: &Path) -> Result<(), WeightPhaseError> {
    let failed = |reason: String| WeightPhaseError::PhaseWeights { dir: dir.to_path_buf(), reason };
    trainer.0.save_merged(dir).map_err(failed)?;
    ChatCodec::copy_files(base_model, dir).map_err(|e| failed(e.to_string()))
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

    /// One step: rollouts, then one RFT pass or the policy-gradient passes. `reference` is
    /// the starting weights a KL penalty measures against. The caller bumps the policy's
    /// weights version when `report.updates > 0`.
    pub fn step<M: TrainableModel>(
        &self,
        step: u64,
        population: &[Harness],
        policy: &Arc<LocalPolicy>,
        trainer: &mut SftTrainer<M>,
        reference: Option<&M>,
    ) -> Result<(StepReport, StepJournal, Vec<Trajectory>), WeightPhaseError> {
        if self.train.is_empty() {
            return Err(WeightPhaseError::NoTasks);
        }
        let started = Instant::now();
        let rollout_policy: Arc<dyn Policy> = policy.clone();
        let trajectories = self.rollouts(step, population, &rollout_policy)?;
        let rollout_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let kept = kept(&trajectories, self.config.reward_threshold);
        let (examples, signal) = if self.config.algorithm.is_policy_gradient() {
            let mut signal = self.signal(&trajectories);
            let (mut examples, advantages) =
                signal.examples(&trajectories, |call| policy.prompt_ids(&call.messages))?;
            let deviation = recompute_behaviour(&mut examples, trainer)?;
            signal.sampler_deviation = deviation;
            if let Some(reference) = reference.filter(|_| self.config.policy_gradient.kl_coef > 0.0) {
                add_reference(&mut examples, reference, trainer.config())?;
            }
            (examples, Some((signal, advantages)))
        } else {
            (training_examples(&kept, self.config.skip_truncated, |call| call_example(policy, call))?, None)
        };
        let journal = StepJournal {
            step,
            mini_batches: self.mini_batches(step, examples.clone()),
            epochs: if signal.is_some() { self.config.policy_gradient.epochs } else { 1 },
        };
        let pass = apply(trainer, &journal, self.config)?;
        let report = StepReport {
            updates: pass.updates,
            loss: pass.loss,
            trained_tokens: pass.tokens,
            train_seconds: started.elapsed().as_secs_f64(),
            policy_gradient: signal.map(|(signal, advantages)| signal.report(&advantages, &pass)),
            ..rollout_report(step, &trajectories, kept.len(), examples.len(), rollout_seconds)
        };
        let kept = kept.into_iter().cloned().collect();
        Ok((report, journal, kept))
    }

    /// [`Self::step`] with the run's trainer; `reference` is used when it is of the trainer's
    /// architecture.
    pub fn step_run(
        &self,
        step: u64,
        population: &[Harness],
        policy: &Arc<LocalPolicy>,
        trainer: &mut RunTrainer,
        reference: Option<&Decoder>,
    ) -> Result<(StepReport, StepJournal, Vec<Trajectory>), WeightPhaseError> {
        trainer.0.step(self, step, population, policy, reference)
    }

    /// The advantages of a step's rollouts, from the groups of k rollouts of each task.
    pub fn signal(&self, trajectories: &[Trajectory]) -> Signal {
        let rewards: Vec<f64> = trajectories.iter().map(|t| t.reward).collect();
        let policy_gradient = &self.config.policy_gradient;
        Signal::new(&rewards, self.config.rollouts_per_task, self.config.algorithm, policy_gradient.normalize_std)
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
            let view = task_domain(domain).public_view(task);
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

/// Each rollout's advantage, computed within its group (the k consecutive rollouts of one
/// task); `None` for every rollout of a group whose rewards are all equal.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    pub advantages: Vec<Option<f64>>,
    /// Rollouts per group (k).
    pub group_size: usize,
    pub groups: usize,
    pub zero_signal_groups: usize,
    /// In-process: the largest gap between the engine's and the trainer's probability of a
    /// sampled token (see [`recompute_behaviour`]).
    pub sampler_deviation: Option<f64>,
}

impl Signal {
    /// GRPO: `(r - mean) / (std + 1e-6)` with the group's sample standard deviation, or
    /// `r - mean` without `normalize_std`; RLOO: `r` less the mean of the group's other rewards.
    pub fn new(rewards: &[f64], k: usize, algorithm: Algorithm, normalize_std: bool) -> Self {
        let mut advantages = Vec::with_capacity(rewards.len());
        let mut zero_signal_groups = 0;
        let groups = rewards.chunks(k.max(1));
        let count = groups.len();
        for group in groups {
            let n = group.len() as f64;
            let mean = group.iter().sum::<f64>() / n;
            let spread = group.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b))
                - group.iter().fold(f64::INFINITY, |a, &b| a.min(b));
            if group.len() < 2 || spread <= 1e-12 {
                zero_signal_groups += 1;
                advantages.extend(std::iter::repeat_n(None, group.len()));
                continue;
            }
            let std = (group.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
            advantages.extend(group.iter().map(|&r| {
                Some(match algorithm {
                    Algorithm::Rloo => r - (mean * n - r) / (n - 1.0),
                    _ if normalize_std => (r - mean) / (std + 1e-6),
                    _ => r - mean,
                })
            }));
        }
        Self { advantages, group_size: k.max(1), groups: count, zero_signal_groups, sampler_deviation: None }
    }

    /// The calls a policy-gradient step trains on: every trainable call of every rollout with
    /// an advantage, in rollout and call order.
    pub fn trained_calls<'a>(&'a self, trajectories: &'a [Trajectory]) -> impl Iterator<Item = TrainedCall<'a>> {
        trajectories.iter().zip(&self.advantages).enumerate().flat_map(move |(rollout, (trajectory, advantage))| {
            let advantage = *advantage;
            let calls = trajectory.model_calls.iter().filter(move |call| call.trainable && advantage.is_some());
            calls.map(move |call| TrainedCall {
                rollout,
                group: rollout / self.group_size,
                advantage: advantage.unwrap_or_default(),
                task_id: &trajectory.task_id,
                call,
            })
        })
    }

    /// The examples of a policy-gradient step: every trainable call of every rollout with an
    /// advantage, in rollout and call order, its sampled tokens the completion; and each
    /// example's advantage at full precision.
    pub fn examples(
        &self,
        trajectories: &[Trajectory],
        prompt: impl Fn(&ModelCall) -> Result<Vec<u32>, PolicyError>,
    ) -> Result<(Vec<JournalExample>, Vec<f64>), WeightPhaseError> {
        let (mut examples, mut advantages) = (Vec::new(), Vec::new());
        for trained in self.trained_calls(trajectories) {
            let sampled = trained.sampled()?;
            examples.push(JournalExample {
                prompt: prompt(trained.call)?,
                completion: sampled.ids.clone(),
                advantage: Some(trained.advantage as f32),
                behaviour: sampled.logprobs.clone(),
                reference: Vec::new(),
            });
            advantages.push(trained.advantage);
        }
        Ok((examples, advantages))
    }

    /// The step's policy-gradient report, from the advantages of its trained examples and
    /// what its updates did.
    pub fn report(&self, advantages: &[f64], pass: &PassStats) -> PolicyGradientReport {
        let n = advantages.len().max(1) as f64;
        PolicyGradientReport {
            groups: self.groups,
            zero_signal_groups: self.zero_signal_groups,
            advantage_mean: advantages.iter().sum::<f64>() / n,
            advantage_abs_mean: advantages.iter().map(|a| a.abs()).sum::<f64>() / n,
            clip_fraction: pass.clip_fraction,
            kl: pass.kl,
            ratio_deviation: pass.ratio_deviation,
            sampler_deviation: self.sampler_deviation,
        }
    }
}

/// A call a policy-gradient step trains on, with where it sits and its rollout's advantage.
pub struct TrainedCall<'a> {
    /// The rollout's index within the step.
    pub rollout: usize,
    /// Its group's (task's) index within the step.
    pub group: usize,
    pub advantage: f64,
    pub task_id: &'a str,
    pub call: &'a ModelCall,
}

impl TrainedCall<'_> {
    /// The sampled tokens of the call; a policy that did not report them is an error naming
    /// the task.
    pub fn sampled(&self) -> Result<&SampledTokens, WeightPhaseError> {
        self.call.sampled.as_ref().ok_or_else(|| WeightPhaseError::NoLogprobs { task_id: self.task_id.to_string() })
    }
}

/// Replaces each example's sampler log-probabilities with the trainer's under the same
/// weights, before any update, and returns the largest `|exp(trainer - sampler) - 1|` over the
/// tokens. The two agree up to float rounding, but the engine's last bits depend on how it
/// batched a sequence with others, and the trainer's do not: learning against the trainer's
/// keeps a step a function of its tokens alone, so a resumed run replays it bit for bit (verl
/// recomputes its `old_log_prob` the same way).
fn recompute_behaviour<M: TrainableModel>(
    examples: &mut [JournalExample],
    trainer: &SftTrainer<M>,
) -> Result<Option<f64>, TrainError> {
    let logprobs = logprobs_under(trainer.model(), examples, trainer.config())?;
    let mut deviation: Option<f64> = None;
    for (example, logprobs) in examples.iter_mut().zip(logprobs) {
        for (&trained, &sampled) in logprobs.iter().zip(&example.behaviour) {
            let gap = (f64::from(trained) - f64::from(sampled)).exp() - 1.0;
            deviation = Some(deviation.unwrap_or(0.0).max(gap.abs()));
        }
        example.behaviour = logprobs;
    }
    Ok(deviation)
}

/// Fills each example's reference log-probabilities: the reference model's, per completion
/// token.
fn add_reference<M: TrainableModel>(
    examples: &mut [JournalExample],
    reference: &M,
    settings: &TrainerConfig,
) -> Result<(), TrainError> {
    let logprobs = logprobs_under(reference, examples, settings)?;
    for (example, logprobs) in examples.iter_mut().zip(logprobs) {
        example.reference = logprobs;
    }
    Ok(())
}

/// The log-probabilities `model` gives each completion token of `examples`, in the trainer's
/// micro-batches.
fn logprobs_under<M: TrainableModel>(
    model: &M,
    examples: &[JournalExample],
    settings: &TrainerConfig,
) -> Result<Vec<Vec<f32>>, TrainError> {
    let plain: Vec<SftExample> = examples.iter().map(JournalExample::to_example).collect();
    completion_logprobs(model, &plain, settings)
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
        policy_gradient: None,
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
    let length = whale_policy::FinishReason::Length.as_str();
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
    if call.finish_reason == whale_policy::FinishReason::Stop.as_str() {
        completion.push(policy.tokenizer().specials().im_end);
    }
    Ok(JournalExample::supervised(prompt, completion))
}

/// What a step's passes did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PassStats {
    pub updates: usize,
    pub loss: Option<f64>,
    pub tokens: usize,
    /// Policy gradient only: token-weighted over the updates.
    pub clip_fraction: Option<f64>,
    pub kl: Option<f64>,
    pub ratio_deviation: Option<f64>,
}

/// The journal's updates: per pass, one optimizer update per mini-batch (supervised for RFT,
/// the clipped surrogate for a policy gradient); nothing when it is empty.
pub fn apply<M: TrainableModel>(
    trainer: &mut SftTrainer<M>,
    journal: &StepJournal,
    config: &WeightConfig,
) -> Result<PassStats, TrainError> {
    if config.algorithm.is_policy_gradient() {
        return apply_policy_gradient(trainer, journal, config);
    }
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

fn apply_policy_gradient<M: TrainableModel>(
    trainer: &mut SftTrainer<M>,
    journal: &StepJournal,
    config: &WeightConfig,
) -> Result<PassStats, TrainError> {
    let settings = &config.policy_gradient;
    let objective = PgObjective { clip_epsilon: settings.clip_epsilon, kl_coef: settings.kl_coef };
    let mut stats = PassStats::default();
    let (mut loss, mut clipped, mut kl, mut deviation) = (0.0, 0.0, None::<f64>, 0.0f64);
    for _ in 0..journal.epochs {
        for batch in &journal.mini_batches {
            let examples: Vec<PgExample> = batch.iter().map(JournalExample::to_pg_example).collect::<Result<_, _>>()?;
            let update = match trainer.policy_gradient_step(&examples, &objective) {
                Ok(update) => update,
                Err(TrainError::NoTrainableTokens) => continue,
                Err(error) => return Err(error),
            };
            let tokens = update.tokens as f64;
            stats.updates += 1;
            stats.tokens += update.tokens;
            loss += update.loss * tokens;
            clipped += update.clip_fraction * tokens;
            kl = update.kl.map(|value| kl.unwrap_or(0.0) + value * tokens);
            deviation = deviation.max(update.ratio_deviation);
        }
    }
    if stats.tokens > 0 {
        let tokens = stats.tokens as f64;
        stats.loss = Some(loss / tokens);
        stats.clip_fraction = Some(clipped / tokens);
        stats.kl = kl.map(|sum| sum / tokens);
        stats.ratio_deviation = Some(deviation);
    }
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
            sampled: None,
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
            Ok(JournalExample::supervised(
                c.messages[0].content.bytes().map(u32::from).collect(),
                vec![c.completion.len() as u32],
            ))
        };
        let text = |examples: Vec<JournalExample>| -> Vec<String> {
            examples.iter().map(|e| e.prompt.iter().map(|&b| b as u8 as char).collect()).collect()
        };
        let examples = training_examples(&kept, true, encode).expect("examples");
        assert_eq!(text(examples), ["question for a", "question for b"]);
        let examples = training_examples(&kept, false, encode).expect("examples");
        assert_eq!(text(examples), ["question for a", "question for b", "question for rambling"]);
    }

    #[test]
    fn advantages_come_from_each_group_and_groups_without_spread_give_none() {
        let rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.0];
        let rloo = Signal::new(&rewards, 4, Algorithm::Rloo, true);
        assert_eq!((rloo.groups, rloo.zero_signal_groups), (3, 1));
        assert!(rloo.advantages[4..8].iter().all(Option::is_none));
        let first: Vec<f64> = rloo.advantages[..4].iter().map(|a| a.expect("spread")).collect();
        assert_eq!(first, [1.0, -1.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0], "reward less the mean of the other three");
        for group in [0..4, 8..12] {
            let sum: f64 = rloo.advantages[group].iter().map(|a| a.expect("spread")).sum();
            assert!(sum.abs() < 1e-12, "an RLOO group's advantages sum to zero");
        }
        let grpo = Signal::new(&rewards, 4, Algorithm::Grpo, true);
        let last: Vec<f64> = grpo.advantages[8..].iter().map(|a| a.expect("spread")).collect();
        let mean = last.iter().sum::<f64>() / 4.0;
        let variance = last.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / 3.0;
        assert!(mean.abs() < 1e-12 && (variance.sqrt() - 1.0).abs() < 1e-5, "GRPO: mean 0, std 1");
        let unscaled = Signal::new(&rewards, 4, Algorithm::Grpo, false);
        assert_eq!(unscaled.advantages[8], Some(0.5 - 0.375));
    }
}
