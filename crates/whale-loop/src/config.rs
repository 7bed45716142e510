//! The experiment config: one TOML file says everything a run does, every number included,
//! so that a run directory's `config.toml` alone reproduces it.
//!
//! Every table and key has a documented default (the CPU-sized defaults of `whale demo`), so a
//! file names only what it changes; a misspelt key is an error naming the file, line and key
//! rather than a silently ignored setting. Relative paths are resolved against the file's own
//! directory, and the resolved config (absolute paths, every default filled in) is what a run
//! directory keeps.

use crate::condition::Condition;
use crate::scale_out::server::ServerConfig;
use crate::scale_out::trainer_command::TrainerCommandConfig;
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use whale_core::Domain;
use whale_engine::EngineConfig;
use whale_harness::Limits;
use whale_lm::LoraConfig;
use whale_policy::SamplingParams;
use whale_search::{Acceptance, AgentConfig, CommandConfig};

/// A whole experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// The run's name: its directory is `runs/<name>/`.
    pub name: String,
    /// Every random choice of the run (task order, rollout seeds, proposals) derives from it.
    pub seed: u64,
    /// What `whale run` runs when `--condition` is not given.
    pub condition: Condition,
    /// Rollouts in flight at once.
    pub threads: usize,
    pub model: ModelConfig,
    /// Rollouts on an inference server instead of the in-process engine (no local model is
    /// loaded); absent: the in-process engine.
    pub server: Option<ServerConfig>,
    pub tasks: TaskConfig,
    pub sampling: SamplingConfig,
    pub harness: HarnessConfig,
    pub weights: WeightConfig,
    pub search: SearchConfig,
    pub schedule: ScheduleConfig,
    pub eval: EvalConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            name: "math".to_string(),
            seed: 0,
            condition: Condition::Whale,
            threads: 64,
            model: ModelConfig::default(),
            server: None,
            tasks: TaskConfig::default(),
            sampling: SamplingConfig::default(),
            harness: HarnessConfig::default(),
            weights: WeightConfig::default(),
            search: SearchConfig::default(),
            schedule: ScheduleConfig::default(),
            eval: EvalConfig::default(),
        }
    }
}

/// The policy: a local checkpoint in the Hugging Face layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// A model directory (Qwen3 or Qwen3.5); absent: the default tiny base model (trained on first use).
    pub path: Option<PathBuf>,
    /// `cpu`, or `cuda` (a build with the `cuda` feature).
    pub device: String,
    /// The weights' and activations' dtype: `f32`, or `bf16` (a GPU's; slow on the CPU). A bf16
    /// model trains through f32 master copies of its weights, with f32 optimizer moments.
    pub dtype: String,
    /// Most sequences the engine generates at once.
    pub max_batch_size: usize,
    /// Most tokens of prompt plus completion.
    pub max_context: usize,
    /// Most padded prompt tokens (sequences x longest prompt) prefilled in one forward pass.
    /// Small suits a CPU, where padding costs more than batching saves; raise it on a GPU.
    pub max_prefill_tokens: usize,
    /// Most tokens of finished model calls the engine keeps, so that a later prompt beginning
    /// with the same tokens (a rollout's next turn, a repeated call, a harness's fixed
    /// instructions and examples) feeds only the rest. 0, the default, feeds every prompt
    /// whole: a copied prefix holds what feeding it would up to rounding, so with it a run's
    /// log-probabilities (and, rarely, a sampled token) also depend on which calls the engine
    /// kept, as they already depend on which calls share a batched step. The keys and values
    /// take memory: about 0.75 GB for SmolLM2-135M at 16,384.
    #[serde(skip_serializing_if = "is_no_prefix_cache")]
    pub prefix_cache_tokens: usize,
    /// Sample from 8-bit (Q8_0) copies of the weights, remade after every weight step; training
    /// and scoring keep f32. Off by default. Faster where the model's products are wide
    /// (Qwen2.5-Coder-1.5B), not at SmolLM2's or the 0.5B's widths (docs/benchmarks.md,
    /// "`[model] quantized`"); the policy sampled then differs slightly from the one trained.
    /// An f32 model on a CPU with VNNI only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub quantized: bool,
}

/// Whether `tokens` is 0, the default: a config that leaves it so serializes as it did before
/// the key.
fn is_no_prefix_cache(tokens: &usize) -> bool {
    *tokens == 0
}

impl ModelConfig {
    /// The dtype `dtype` names (validated: f32 or bf16). A bf16 model keeps its weights and
    /// activations in bf16; its trainer keeps f32 master copies of them (`whale_train::SftTrainer`).
    pub fn candle_dtype(&self) -> DType {
        match self.dtype.as_str() {
            "bf16" => DType::BF16,
            _ => DType::F32,
        }
    }

    /// Opens the device `device` names: the CPU, or CUDA device 0. `cuda` in a build without the
    /// `cuda` feature is refused before anything is tried; every refusal names the field.
    pub fn open_device(&self) -> Result<Device, String> {
        match self.device.as_str() {
            "cuda" if !candle_core::utils::cuda_is_available() => Err("model.device = \"cuda\": this whale was \
                 built without the `cuda` feature (build one with scripts/cuda-build.sh, or \
                 `cargo build --release -p whale --features cuda`)"
                .to_string()),
            "cuda" => {
                Device::new_cuda(0).map_err(|e| format!("model.device = \"cuda\": cannot open CUDA device 0: {e}"))
            }
            _ => Ok(Device::Cpu),
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Self {
            path: None,
            device: "cpu".to_string(),
            dtype: "f32".to_string(),
            max_batch_size: 64,
            max_context: 2048,
            max_prefill_tokens: engine.max_prefill_tokens,
            prefix_cache_tokens: engine.prefix_cache_tokens,
            quantized: engine.quantized,
        }
    }
}

/// Which tasks, and how they are split into disjoint train / search / test subsets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    pub domain: Domain,
    /// Data files in any form the domain's loader reads.
    pub files: Vec<PathBuf>,
    /// Synthetic tasks generated besides the files' tasks.
    pub generate: usize,
    /// Difficulties of the generated tasks, an equal share each.
    pub difficulties: Vec<u32>,
    /// Tasks in the training split (drawn by weight steps).
    pub train: usize,
    /// Tasks in the search split (each candidate harness runs once on each).
    pub search: usize,
    /// Tasks in the test split (never seen by training or search). 192 by default: at 64 the
    /// paired differences of `whale study` were about twice the ±0.03 it asks for.
    pub test: usize,
    /// QA: search this corpus file instead of the tasks' own context paragraphs.
    pub corpus: Option<PathBuf>,
    /// Draws the generated tasks and the split instead of the run's `seed`, which then varies
    /// only the rest (rollouts, proposals, training): replicate runs on one set of tasks, whose
    /// spread is what training itself varies. Absent: the run's `seed`.
    pub seed: Option<u64>,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            domain: Domain::Math,
            files: Vec::new(),
            generate: 1200,
            difficulties: vec![1],
            train: 944,
            search: 64,
            test: 192,
            corpus: None,
            seed: None,
        }
    }
}

/// Sampling of every model call (train, search and test alike), unless a harness overrides it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    /// The default `max_tokens` of a model call.
    pub max_tokens: usize,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self { temperature: 1.0, top_p: 1.0, top_k: 20, max_tokens: 256 }
    }
}

impl SamplingConfig {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_tokens: self.max_tokens,
            ..SamplingParams::default()
        }
    }
}

/// The harness the run starts from and the limits every rollout runs under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HarnessConfig {
    /// A stock harness name (`math/plain`) or a harness file.
    pub initial: String,
    pub limits: Limits,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        Self { initial: "math/plain".to_string(), limits: Limits::default() }
    }
}

/// How a weight step learns from its rollouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Online rejection-sampling fine-tuning: supervised passes over the rollouts above the
    /// reward threshold (the paper's weight phase).
    #[default]
    Rft,
    /// Group-relative policy optimisation: each rollout's advantage is its reward less its
    /// group's mean (the k rollouts of one task), divided by the group's standard deviation.
    Grpo,
    /// REINFORCE leave-one-out: each rollout's advantage is its reward less the mean of the
    /// other k - 1 rollouts of its task.
    Rloo,
}

impl Algorithm {
    pub fn is_policy_gradient(self) -> bool {
        self != Algorithm::Rft
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Rft => "rft",
            Algorithm::Grpo => "grpo",
            Algorithm::Rloo => "rloo",
        }
    }
}

/// `[weights.policy_gradient]`: the settings of GRPO and RLOO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyGradientConfig {
    /// PPO's clip range: the ratio of new to sampling probability is clipped to
    /// `[1 - clip_epsilon, 1 + clip_epsilon]`.
    pub clip_epsilon: f64,
    /// GRPO: divide the centred rewards by the group's standard deviation (false: Dr. GRPO's
    /// unscaled advantages).
    pub normalize_std: bool,
    /// The weight of the k3 KL penalty to the run's starting weights; 0 turns it off (and
    /// spares the reference model's pass).
    pub kl_coef: f64,
    /// Passes over a step's samples, each in mini-batches of `weights.mini_batch` (verl's
    /// `ppo_epochs`).
    pub epochs: usize,
}

impl Default for PolicyGradientConfig {
    fn default() -> Self {
        Self { clip_epsilon: 0.2, normalize_std: true, kl_coef: 0.0, epochs: 1 }
    }
}

impl PolicyGradientConfig {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(self.clip_epsilon > 0.0 && self.clip_epsilon < 1.0) {
            return Err(("weights.policy_gradient.clip_epsilon", "must lie in (0, 1)".to_string()));
        }
        if !(self.kl_coef >= 0.0 && self.kl_coef.is_finite()) {
            return Err(("weights.policy_gradient.kl_coef", "must be a number >= 0".to_string()));
        }
        if self.epochs == 0 {
            return Err(("weights.policy_gradient.epochs", "must be positive".to_string()));
        }
        Ok(())
    }
}

/// The weight phase: online RFT (the paper's) or a policy gradient, over fresh rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WeightConfig {
    /// `rft` (default), `grpo` or `rloo`.
    #[serde(skip_serializing_if = "is_rft")]
    pub algorithm: Algorithm,
    /// `[weights.policy_gradient]`: used by `grpo` and `rloo`.
    #[serde(skip_serializing_if = "is_default_policy_gradient")]
    pub policy_gradient: PolicyGradientConfig,
    /// Training tasks drawn per step (B).
    pub tasks_per_step: usize,
    /// Fresh rollouts per task (k).
    pub rollouts_per_task: usize,
    /// RFT: rollouts with a reward strictly above this are kept (a negative threshold keeps
    /// every rollout: plain self-distillation, useful to exercise training on an untrained
    /// model). Either algorithm: the kept rollouts are the examples the proposer is shown.
    pub reward_threshold: f64,
    /// Examples (trainable model calls) per optimizer update; a step is one pass (a policy
    /// gradient: `epochs` passes) over its examples in mini-batches of this size.
    pub mini_batch: usize,
    /// Examples per forward/backward pass (gradient accumulation within a mini-batch).
    pub micro_batch: usize,
    /// At most this many tokens (prompts plus completions) in one forward/backward pass: a
    /// micro-batch that would hold more closes early. A pass's memory grows with its tokens,
    /// and a harness that lengthens the prompts lengthens every example after it. Absent: no
    /// cap, `micro_batch` examples whatever their length. The gradient is the same either way,
    /// up to float rounding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch_tokens: Option<usize>,
    pub learning_rate: f64,
    pub warmup_steps: u64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    /// Examples longer than this (prompt plus completion) lose their end.
    pub max_seq_len: usize,
    /// RFT: leave out model calls cut off at `max_tokens`: a kept rollout's rambling reply would
    /// teach the model to ramble (its replies grow step after step). A policy gradient trains
    /// on them, with their rollout's advantage.
    pub skip_truncated: bool,
    /// Write a full checkpoint (weights and optimizer) every this many weight steps; the steps
    /// in between are replayed from their journal on resume.
    pub checkpoint_every: u64,
    /// Keep the weights each search phase starts from (and the final ones) in
    /// `phase-weights/vN/`, a loadable model directory per weights version: what `whale
    /// coupling` scores every accepted harness under. In-process training only; a full copy of
    /// the model each time, so turn it off for large models.
    pub keep_phase_weights: bool,
    /// `[weights.lora]`: train a LoRA adapter of the model instead of all its weights (the
    /// rollouts then sample from the base plus the adapter, and checkpoints are PEFT adapter
    /// directories); absent: full fine-tuning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// `[weights.trainer]`: train with this command instead of in-process (required with
    /// `[server]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerCommandConfig>,
}

fn is_rft(algorithm: &Algorithm) -> bool {
    *algorithm == Algorithm::Rft
}

fn is_default_policy_gradient(config: &PolicyGradientConfig) -> bool {
    *config == PolicyGradientConfig::default()
}

impl Default for WeightConfig {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::Rft,
            policy_gradient: PolicyGradientConfig::default(),
            tasks_per_step: 16,
            rollouts_per_task: 4,
            reward_threshold: 0.5,
            mini_batch: 32,
            micro_batch: 16,
            micro_batch_tokens: None,
            learning_rate: 1e-4,
            warmup_steps: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            max_seq_len: 1024,
            skip_truncated: true,
            checkpoint_every: 5,
            keep_phase_weights: true,
            lora: None,
            trainer: None,
        }
    }
}

/// The proposer of the harness search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposerKind {
    /// Offline source mutations (no network).
    Mutate,
    /// An LLM over an OpenAI-compatible API with file tools confined to the archive
    /// (`[search.agent]`; the key comes from `WHALE_PROPOSER_API_KEY` or `OPENAI_API_KEY`).
    Agent,
    /// Any coding-agent command line, run in a copy of the archive (`[search.command]`).
    Command,
}

/// The harness phase: Meta-Harness search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    pub proposer: ProposerKind,
    /// Candidates proposed per iteration (M).
    pub candidates: usize,
    pub acceptance: Acceptance,
    /// Fast-slow: the number of best harnesses kept as the population (P).
    pub population: usize,
    /// Settings of the `agent` proposer.
    pub agent: AgentConfig,
    /// Settings of the `command` proposer (required by it).
    pub command: Option<CommandConfig>,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            proposer: ProposerKind::Mutate,
            candidates: 3,
            acceptance: Acceptance::Pareto,
            population: 4,
            agent: AgentConfig::default(),
            command: None,
        }
    }
}

/// When to switch phases and when to stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Training rollouts (weight phase plus search) every condition may spend; a step or an
    /// iteration starts only while the spend is below it.
    pub budget: u64,
    /// Fixed schedule: weight steps per weight phase (E).
    pub weight_steps: u64,
    /// Fixed schedule: search iterations per harness phase (I); the incumbent's re-evaluation
    /// under new weights counts as the first, so at least 2.
    pub search_iterations: u64,
    /// Sequential: the share of the budget spent on weight steps before the search starts;
    /// absent: the share the fixed schedule spends on them.
    pub sequential_weight_share: Option<f64>,
    /// A search that runs to the end of the budget (harness-only, the second half of
    /// sequential) stops after this many iterations in a row that cost no rollout (the
    /// proposer only re-proposes harnesses already scored).
    pub search_stale_limit: u64,
    pub adaptive: AdaptiveConfig,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            budget: 2048,
            weight_steps: 8,
            search_iterations: 3,
            sequential_weight_share: None,
            search_stale_limit: 3,
            adaptive: AdaptiveConfig::default(),
        }
    }
}

/// The adaptive switching rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdaptiveConfig {
    /// A harness phase runs at least this many iterations ...
    pub search_min: u64,
    /// ... stops after this many iterations in a row without a new best ...
    pub search_patience: u64,
    /// ... and runs at most this many.
    pub search_max: u64,
    /// A weight phase runs at least this many steps ...
    pub weight_min: u64,
    /// ... and stops when the mean training reward over the last `weight_window` steps has not
    /// improved on its best for `weight_patience` steps ...
    pub weight_window: u64,
    pub weight_patience: u64,
    /// ... or after this many steps.
    pub weight_max: u64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            search_min: 5,
            search_patience: 2,
            search_max: 15,
            weight_min: 4,
            weight_window: 3,
            weight_patience: 3,
            weight_max: 30,
        }
    }
}

/// Test evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Rollouts per test task (mean@k, pass@k, maj@k).
    pub k: usize,
    /// Evaluate every this many weight steps (besides the start, phase boundaries and the end).
    pub every_steps: u64,
    /// Evaluate every this many search iterations (besides the start, boundaries and the end).
    pub every_iterations: u64,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self { k: 8, every_steps: 8, every_iterations: 3 }
    }
}

/// Why a config could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", file.display())]
    Read { file: PathBuf, source: std::io::Error },
    #[error("{}:{line}:{column}: {reason}", file.display())]
    Parse { file: PathBuf, line: usize, column: usize, reason: String },
    #[error("{}: `{field}`: {reason}", file.display())]
    Invalid { file: PathBuf, field: String, reason: String },
    #[error("cannot write the config: {0}")]
    Write(String),
}

/// The absolute directory of a config file, which its relative paths resolve against; a bare
/// file name's parent is the empty path, meaning the current directory.
fn config_dir(file: &Path) -> std::io::Result<PathBuf> {
    let dir = file.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::path::absolute(dir)
}

impl RunConfig {
    /// Reads, resolves (paths against the file's directory) and validates a config file.
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(file).map_err(|source| ConfigError::Read { file: file.to_path_buf(), source })?;
        let base = config_dir(file).map_err(|source| ConfigError::Read { file: file.to_path_buf(), source })?;
        Self::parse(&text, file, &base)
    }

    /// Parses TOML text as if read from `file`, resolving relative paths against `base`.
    pub fn parse(text: &str, file: &Path, base: &Path) -> Result<Self, ConfigError> {
        let mut config: RunConfig = toml::from_str(text).map_err(|error| parse_error(text, file, &error))?;
        config.resolve_paths(base);
        config.validate().map_err(|(field, reason)| ConfigError::Invalid {
            file: file.to_path_buf(),
            field: field.to_string(),
            reason,
        })?;
        Ok(config)
    }

    /// The config as TOML, every default written out.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string_pretty(self).map_err(|e| ConfigError::Write(e.to_string()))
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        self.tasks.files.iter_mut().for_each(resolve);
        self.tasks.corpus.iter_mut().for_each(resolve);
        self.model.path.iter_mut().for_each(resolve);
        self.search.agent.local_model.iter_mut().for_each(resolve);
        if let Some(trainer) = &mut self.weights.trainer {
            let workdir = trainer.workdir.get_or_insert_with(|| base.to_path_buf());
            resolve(workdir);
        }
        let initial = Path::new(&self.harness.initial);
        if whale_harness::stock_harness(&self.harness.initial).is_none() && initial.is_relative() {
            self.harness.initial = base.join(initial).display().to_string();
        }
    }

    /// The config a run of its condition runs: fast-slow trains its slow weights with a policy
    /// gradient, as Fast-Slow Training does (GRPO where the config says RFT; RLOO stays).
    pub fn for_condition(mut self) -> Self {
        if self.condition == Condition::FastSlow && self.weights.algorithm == Algorithm::Rft {
            self.weights.algorithm = Algorithm::Grpo;
        }
        self
    }

    /// Checks ranges and cross-field rules; the error names the key at fault.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let positive = [
            ("threads", self.threads as u64),
            ("model.max_batch_size", self.model.max_batch_size as u64),
            ("model.max_context", self.model.max_context as u64),
            ("tasks.train", self.tasks.train as u64),
            ("tasks.search", self.tasks.search as u64),
            ("tasks.test", self.tasks.test as u64),
            ("sampling.max_tokens", self.sampling.max_tokens as u64),
            ("weights.tasks_per_step", self.weights.tasks_per_step as u64),
            ("weights.rollouts_per_task", self.weights.rollouts_per_task as u64),
            ("weights.mini_batch", self.weights.mini_batch as u64),
            ("weights.micro_batch", self.weights.micro_batch as u64),
            ("weights.micro_batch_tokens", self.weights.micro_batch_tokens.unwrap_or(1) as u64),
            ("weights.checkpoint_every", self.weights.checkpoint_every),
            ("search.candidates", self.search.candidates as u64),
            ("search.population", self.search.population as u64),
            ("schedule.budget", self.schedule.budget),
            ("schedule.weight_steps", self.schedule.weight_steps),
            ("schedule.search_iterations", self.schedule.search_iterations),
            ("schedule.search_stale_limit", self.schedule.search_stale_limit),
            ("schedule.adaptive.search_max", self.schedule.adaptive.search_max),
            ("schedule.adaptive.weight_window", self.schedule.adaptive.weight_window),
            ("schedule.adaptive.weight_max", self.schedule.adaptive.weight_max),
            ("eval.k", self.eval.k as u64),
            ("eval.every_steps", self.eval.every_steps),
            ("eval.every_iterations", self.eval.every_iterations),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err((field, "must be positive".to_string()));
        }
        if self.tasks.files.is_empty() && self.tasks.generate == 0 {
            return Err(("tasks.generate", "no task files and nothing to generate".to_string()));
        }
        if self.tasks.generate > 0 && self.tasks.difficulties.is_empty() {
            return Err(("tasks.difficulties", "empty while tasks are generated".to_string()));
        }
        if !(-1.0..=1.0).contains(&self.weights.reward_threshold) {
            return Err(("weights.reward_threshold", "must lie in [-1, 1]".to_string()));
        }
        if !(self.weights.learning_rate > 0.0 && self.weights.learning_rate.is_finite()) {
            return Err(("weights.learning_rate", "must be a positive number".to_string()));
        }
        self.weights.policy_gradient.validate()?;
        if self.weights.algorithm.is_policy_gradient() && self.weights.rollouts_per_task < 2 {
            let reason =
                format!("{} compares the rollouts of a task: needs at least 2", self.weights.algorithm.as_str());
            return Err(("weights.rollouts_per_task", reason));
        }
        if let Some(lora) = &self.weights.lora {
            lora.validate().map_err(|error| ("weights.lora", error.to_string()))?;
        }
        if self.schedule.search_iterations < 2 {
            let reason = "must be at least 2: the incumbent's re-scoring under new weights counts as a phase's first \
                          iteration, so a phase of 1 would propose nothing";
            return Err(("schedule.search_iterations", reason.to_string()));
        }
        if let Some(share) = self.schedule.sequential_weight_share {
            if !(0.0..=1.0).contains(&share) {
                return Err(("schedule.sequential_weight_share", "must lie in [0, 1]".to_string()));
            }
        }
        let adaptive = &self.schedule.adaptive;
        if adaptive.search_min > adaptive.search_max {
            return Err(("schedule.adaptive.search_min", "exceeds search_max".to_string()));
        }
        if adaptive.weight_min > adaptive.weight_max {
            return Err(("schedule.adaptive.weight_min", "exceeds weight_max".to_string()));
        }
        if self.search.proposer == ProposerKind::Command && self.search.command.is_none() {
            return Err(("search.command", "the command proposer needs a [search.command] table".to_string()));
        }
        if !matches!(self.model.device.as_str(), "cpu" | "cuda") {
            return Err(("model.device", format!("`{}` is neither cpu nor cuda", self.model.device)));
        }
        if !matches!(self.model.dtype.as_str(), "f32" | "bf16") {
            return Err(("model.dtype", format!("`{}` is neither f32 nor bf16", self.model.dtype)));
        }
        if self.model.quantized && (self.model.device != "cpu" || self.model.dtype != "f32") {
            return Err(("model.quantized", "needs an f32 model on the CPU".to_string()));
        }
        if self.model.quantized && self.server.is_some() {
            return Err(("model.quantized", "quantizes the in-process engine; a [server] runs its own".to_string()));
        }
        if let Err(reason) = self.sampling.params().validate() {
            return Err(("sampling", reason.to_string()));
        }
        self.validate_scale_out()
    }

    /// The `[server]` and `[weights.trainer]` tables, and how they go together.
    fn validate_scale_out(&self) -> Result<(), (&'static str, String)> {
        if let Some(server) = &self.server {
            server.validate()?;
        }
        if let Some(trainer) = &self.weights.trainer {
            trainer.validate()?;
            if self.weights.policy_gradient != PolicyGradientConfig::default() {
                let reason = "an external trainer takes its own settings on its command line (pg_transformers.py \
                              --clip-epsilon, --epochs; whale lm train --clip-epsilon); leave this table out"
                    .to_string();
                return Err(("weights.policy_gradient", reason));
            }
        }
        if self.weights.trainer.is_some() && self.weights.micro_batch_tokens.is_some() {
            let reason =
                "caps the passes of whale's own trainer; an external trainer ([weights.trainer]) sizes its own";
            return Err(("weights.micro_batch_tokens", reason.to_string()));
        }
        if self.weights.trainer.is_some() && self.weights.lora.is_some() {
            let reason = "configures whale's own trainer; an external trainer ([weights.trainer]) takes its LoRA \
                          settings on its command line";
            return Err(("weights.lora", reason.to_string()));
        }
        let trains = self.condition != Condition::HarnessOnly;
        if trains && self.server.is_some() && self.weights.trainer.is_none() {
            return Err((
                "weights.trainer",
                format!(
                    "the {} condition trains the weights, and a model on a [server] is trained by an external \
                     command: add a [weights.trainer] table (or run condition = \"harness-only\")",
                    self.condition
                ),
            ));
        }
        Ok(())
    }
}

/// A TOML error as `file:line:column: reason`, the position taken from the error's span.
fn parse_error(text: &str, file: &Path, error: &toml::de::Error) -> ConfigError {
    let offset = error.span().map_or(0, |span| span.start).min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    ConfigError::Parse { file: file.to_path_buf(), line, column, reason: error.message().to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale_out::trainer_command::TrainerOutput;

    fn parse(text: &str) -> Result<RunConfig, ConfigError> {
        RunConfig::parse(text, Path::new("x.toml"), Path::new("/base"))
    }

    #[test]
    fn an_empty_file_is_the_default_config() {
        assert_eq!(parse("").expect("config"), RunConfig::default());
    }

    #[test]
    fn a_partial_table_keeps_the_other_defaults_and_paths_resolve_against_the_file() {
        let config =
            parse("name = \"q\"\n[weights]\ntasks_per_step = 3\n[tasks]\nfiles = [\"d/a.jsonl\"]\n").expect("config");
        assert_eq!(config.name, "q");
        assert_eq!(config.weights.tasks_per_step, 3);
        assert_eq!(config.weights.rollouts_per_task, WeightConfig::default().rollouts_per_task);
        assert_eq!(config.tasks.files, vec![PathBuf::from("/base/d/a.jsonl")]);
        assert_eq!(config.harness.initial, "math/plain", "stock names are not paths");
    }

    #[test]
    fn an_unknown_key_names_its_file_line_and_key() {
        let error = parse("seed = 1\n\n[weights]\nlearning_rat = 0.1\n").expect_err("misspelt");
        let text = error.to_string();
        assert!(text.starts_with("x.toml:4:1:"), "{text}");
        assert!(text.contains("learning_rat"), "{text}");
    }

    #[test]
    fn out_of_range_values_name_the_key() {
        let error = parse("[weights]\nreward_threshold = 1.5\n").expect_err("range");
        assert!(error.to_string().contains("weights.reward_threshold"), "{error}");
        let error = parse("[schedule.adaptive]\nsearch_min = 20\n").expect_err("min > max");
        assert!(error.to_string().contains("search_min"), "{error}");
        let error = parse("[eval]\nk = 0\n").expect_err("k");
        assert!(error.to_string().contains("eval.k"), "{error}");
        let error = parse("[weights.lora]\nrank = 0\n").expect_err("rank");
        assert!(error.to_string().contains("weights.lora") && error.to_string().contains("`rank`"), "{error}");
        let error = parse("[weights.lora]\ntarget_modules = [\"qproj\"]\n").expect_err("module");
        assert!(error.to_string().contains("`qproj`"), "{error}");
        let error = parse("[weights.lora]\nranks = 4\n").expect_err("unknown key");
        assert!(error.to_string().contains("ranks"), "{error}");
        let error = parse("[model]\ndtype = \"fp16\"\n").expect_err("dtype");
        assert!(error.to_string().contains("model.dtype") && error.to_string().contains("fp16"), "{error}");
        parse("[model]\ndtype = \"bf16\"\n").expect("bf16");
        let error = parse("[model]\ndtype = \"bf16\"\nquantized = true\n").expect_err("bf16 quantized");
        assert!(error.to_string().contains("model.quantized"), "{error}");
        parse("[model]\nquantized = true\n").expect("quantized f32");
    }

    /// Off, `quantized` is not written: the configs (and the study result files' hashes of
    /// them) of runs before it stay as they were.
    #[test]
    fn quantized_decoding_is_written_only_when_on() {
        let plain = toml::to_string(&parse("").expect("defaults")).expect("serialize");
        assert!(!plain.contains("quantized"), "{plain}");
        let on = toml::to_string(&parse("[model]\nquantized = true\n").expect("on")).expect("serialize");
        assert!(on.contains("quantized = true"), "{on}");
    }

    /// The token cap is whale's own trainer's; absent, it is not written, so that the configs
    /// (and the study result files' hashes of them) of runs before it stay as they were.
    #[test]
    fn the_micro_batch_token_cap_is_positive_optional_and_not_for_external_trainers() {
        let capped = parse("[weights]\nmicro_batch_tokens = 3072\n").expect("a cap");
        assert_eq!(capped.weights.micro_batch_tokens, Some(3072));
        assert!(capped.to_toml().expect("toml").contains("micro_batch_tokens = 3072"));
        let trainer = crate::weight_phase::trainer_config(&capped.weights, 0);
        assert_eq!(trainer.micro_batch_tokens, Some(3072), "the cap reaches whale's trainer");
        assert!(!RunConfig::default().to_toml().expect("toml").contains("micro_batch_tokens"));
        let error = parse("[weights]\nmicro_batch_tokens = 0\n").expect_err("zero");
        assert!(error.to_string().contains("weights.micro_batch_tokens"), "{error}");
        let external = "[weights]\nmicro_batch_tokens = 3072\n[weights.trainer]\ncommand = [\"train\", \"{data}\", \"{output}\"]\n";
        let error = parse(external).expect_err("an external trainer");
        assert!(error.to_string().contains("weights.micro_batch_tokens"), "{error}");
    }

    /// What `[model]` selects, checked without a GPU. A config naming `cuda` loads in any build
    /// (a CPU build still reads a GPU run's directory); opening the device is what is refused,
    /// naming the field: by a build without the `cuda` feature, and by one with it on a machine
    /// without a GPU (such as scripts/cuda-build.sh's stub driver).
    #[test]
    fn the_model_table_selects_the_device_and_dtype() {
        let cpu = parse("").expect("the default").model;
        assert!(matches!(cpu.open_device(), Ok(Device::Cpu)));
        assert_eq!(cpu.candle_dtype(), DType::F32);
        let bf16 = parse("[model]\ndtype = \"bf16\"\n").expect("bf16").model;
        assert_eq!(bf16.candle_dtype(), DType::BF16, "a bf16 run loads its model in bf16");
        let cuda = parse("[model]\ndevice = \"cuda\"\n").expect("a cuda config loads in any build").model;
        match (candle_core::utils::cuda_is_available(), cuda.open_device()) {
            (false, Err(error)) => {
                assert!(error.starts_with("model.device = \"cuda\"") && error.contains("`cuda` feature"), "{error}")
            }
            (true, Err(error)) => {
                assert!(error.starts_with("model.device = \"cuda\": cannot open CUDA device 0"), "{error}")
            }
            (true, Ok(device)) => assert!(device.is_cuda()),
            (false, Ok(device)) => panic!("a build without the cuda feature opened {device:?}"),
        }
        for device in ["gpu", "cuda:1"] {
            let error = parse(&format!("[model]\ndevice = \"{device}\"\n")).expect_err(device);
            let named =
                error.to_string().contains("model.device") && error.to_string().contains(&format!("`{device}`"));
            assert!(named, "{error}");
        }
    }

    #[test]
    fn a_search_phase_of_one_iteration_is_refused_as_it_would_propose_nothing() {
        let error = parse("[schedule]\nsearch_iterations = 1\n").expect_err("the re-scoring alone");
        let named =
            error.to_string().contains("schedule.search_iterations") && error.to_string().contains("re-scoring");
        assert!(named, "{error}");
        assert_eq!(
            parse("[schedule]\nsearch_iterations = 2\n").expect("one round of proposals").schedule.search_iterations,
            2
        );
    }

    #[test]
    fn a_server_and_an_external_trainer_go_together() {
        let server = "[server]\nmodel = \"Qwen/Qwen3-8B\"\n";
        let trainer = "[weights.trainer]\ncommand = [\"train\", \"{data}\", \"{output}\"]\n";
        let key = |text: &str| match parse(text) {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(key(server), "weights.trainer", "a weight phase on a server needs a trainer");
        let config = parse(&format!("condition = \"harness-only\"\n{server}")).expect("search only");
        assert_eq!(config.server.expect("a server").admin_root(), "http://127.0.0.1:8000");
        let config = parse(&format!("{server}{trainer}")).expect("server and trainer");
        let trainer_config = config.weights.trainer.expect("a trainer");
        assert_eq!(trainer_config.output, TrainerOutput::Adapter);
        assert_eq!(trainer_config.workdir.as_deref(), Some(Path::new("/base")), "it runs beside the file");
        let checkpoint = format!("{server}{trainer}output = \"checkpoint\"\n");
        for kind in ["vllm", "sglang", "whale"] {
            let text = checkpoint.replace("[server]\n", &format!("[server]\nkind = \"{kind}\"\n"));
            assert_eq!(
                parse(&text).expect("every kind loads checkpoints").weights.trainer.map(|t| t.output),
                Some(TrainerOutput::Checkpoint)
            );
        }
        assert_eq!(key(&format!("{trainer}[weights.lora]\nrank = 4\n")), "weights.lora");
        assert_eq!(key("[server]\nmodel = \" \"\n"), "server.model");
        let error = parse("[server]\nmodel = \"m\"\nbase_ur = \"http://h/v1\"\n").expect_err("misspelt");
        assert!(error.to_string().starts_with("x.toml:3:1:") && error.to_string().contains("base_ur"), "{error}");
        let error = parse(&format!("{trainer}timeout_s = -1.0\n")).expect_err("negative");
        assert!(error.to_string().contains("weights.trainer.timeout_s"), "{error}");
    }

    #[test]
    fn a_lora_table_keeps_the_adapter_defaults() {
        assert_eq!(RunConfig::default().weights.lora, None, "full fine-tuning by default");
        let config = parse("[weights.lora]\nrank = 4\ntarget_modules = [\"q_proj\", \"v_proj\"]\n").expect("config");
        let lora = config.weights.lora.expect("a lora table");
        assert_eq!((lora.rank, lora.alpha, lora.dropout), (4, LoraConfig::default().alpha, 0.0));
        assert_eq!(lora.target_modules, ["q_proj", "v_proj"]);
    }

    #[test]
    fn every_example_parses_and_math_toml_documents_the_defaults() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let math = RunConfig::load(&examples.join("math.toml")).expect("math.toml");
        assert_eq!(math, RunConfig::default(), "examples/math.toml shows every default");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&examples).expect("examples/") {
            let path = entry.expect("an entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let config = RunConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
                assert_eq!(config.name, stem, "{}", path.display());
                names.push(config.name);
            }
        }
        names.sort();
        for domain in Domain::ALL {
            let config = RunConfig::load(&examples.join(format!("{domain}.toml"))).expect("a domain's example");
            let starting = whale_pretrain::eval::starting_harness(domain);
            assert_eq!(config.harness.initial, starting, "pretraining measures the example's starting harness");
        }
        let expected = [
            "chess",
            "chess-qwen3",
            "chess-qwen3.5",
            "math",
            "math-qwen2.5",
            "math-qwen2.5-one-shot",
            "math-qwen3",
            "math-qwen3.5",
            "math-qwen3.5-local",
            "qa",
        ];
        assert_eq!(names[..10], expected, "{names:?}");
        let served = RunConfig::load(&examples.join("qa-qwen3.5.toml")).expect("qa-qwen3.5");
        let server = served.server.expect("rollouts on a server");
        assert_eq!(
            (server.model.as_str(), server.kind),
            ("Qwen/Qwen3.5-2B", crate::scale_out::server::ServerKind::Vllm)
        );
        let trainer = served.weights.trainer.expect("an external trainer");
        let workdir = trainer.workdir.expect("resolved").canonicalize().expect("a directory");
        assert_eq!(workdir, examples.canonicalize().expect("examples/"), "the command runs beside the file");
    }

    #[test]
    fn a_bare_file_name_resolves_against_the_current_directory() {
        let here = std::env::current_dir().expect("cwd");
        let bare = config_dir(Path::new("run.toml")).expect("absolute");
        assert!(bare.is_absolute() && bare.starts_with(&here), "{}", bare.display());
        assert_eq!(config_dir(Path::new("sub/run.toml")).expect("absolute"), here.join("sub"));
        assert_eq!(config_dir(Path::new("/etc/run.toml")).expect("absolute"), Path::new("/etc"));
    }

    #[test]
    fn the_resolved_config_round_trips_through_toml() {
        let mut config = RunConfig::default();
        config.model.path = Some(PathBuf::from("/models/base"));
        config.schedule.sequential_weight_share = Some(0.5);
        config.weights.lora = Some(LoraConfig { rank: 4, dropout: 0.1, ..LoraConfig::default() });
        let text = config.to_toml().expect("toml");
        assert_eq!(parse(&text).expect("config"), config);
    }
}
