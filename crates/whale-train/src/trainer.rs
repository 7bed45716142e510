//! Supervised fine-tuning on (prompt, completion) token pairs, the weight phase's update.
//!
//! Only completion tokens are trained on: in online RFT the prompt, the tool calls' results and
//! the observations come from the environment, not the model. One [`SftTrainer::step`] is one
//! optimizer update over a mini-batch; the mini-batch is cut into micro-batches (gradient
//! accumulation) and the loss is the mean over all completion tokens of the mini-batch, whatever
//! the cut. The optimizer is AdamW with decoupled weight decay on matrices, a linear warm-up and a
//! constant or cosine schedule, and clipping by global gradient norm. Its moments and step count
//! are saved beside the checkpoint so that a resumed run continues exactly.
//!
//! A model carrying a LoRA adapter ([`TrainableModel::with_new_adapter`]) is trained the same way, but
//! only the adapter's matrices are optimized: the base weights are constants of the pass and
//! stay bit-for-bit what they were. Such a trainer saves a PEFT adapter directory instead of a
//! checkpoint, with the optimizer state beside it.
//!
//! The trainer runs any [`TrainableModel`] (each architecture's folder in whale-lm implements
//! it): saving and resuming go through the model's own checkpoint and adapter formats.

use crate::memory::{self, MemoryShortfall, PassTokens, StepMemory};
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use whale_lm::checkpoint::{CheckpointError, GenerationConfig};
use whale_lm::config::optional;
use whale_lm::lora::LoraError;
use whale_lm::model::{ModelError, Packing};
use whale_lm::tensor_file::{read_tensors, write_atomic, write_tensors};
use whale_lm::trainable::{TrainableError, TrainableModel};

pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";

/// The suffix of a parameter's f32 master copy in [`OPTIMIZER_FILE`] (bf16 and f16 parameters).
const MASTER: &str = "master";

/// One training example: the prompt (context, not trained on) and the completion (trained on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    pub prompt: Vec<u32>,
    pub completion: Vec<u32>,
}

impl SftExample {
    /// Prompt and completion tokens together: what the example takes of a micro-batch.
    pub fn tokens(&self) -> usize {
        self.prompt.len() + self.completion.len()
    }
}

/// How the learning rate evolves after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrSchedule {
    Constant,
    /// Cosine decay from the peak at the end of warm-up to `min_lr_ratio * peak` at
    /// `total_steps`, constant afterwards.
    Cosine {
        total_steps: u64,
        min_lr_ratio: f64,
    },
}

/// The trainer's hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerConfig {
    /// The peak learning rate.
    pub learning_rate: f64,
    /// Steps of linear warm-up from `learning_rate / warmup_steps` to `learning_rate`.
    pub warmup_steps: u64,
    pub schedule: LrSchedule,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only (not to norm weights).
    pub weight_decay: f64,
    /// Clip the gradient to this global L2 norm; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
    /// Examples per forward/backward pass; a step accumulates gradients over its mini-batch.
    pub micro_batch_size: usize,
    /// At most this many tokens (each example's, cut to `max_seq_len`) in one pass: a
    /// micro-batch that would hold more closes early ([`micro_batch_ranges`]). `None`: no cap.
    pub micro_batch_tokens: Option<usize>,
    /// Examples longer than this (prompt plus completion) are cut to it from the end: they lose
    /// the end of their completion, or all of it when the prompt alone is this long.
    pub max_seq_len: usize,
    /// The token that fills padding positions (never attended to, never scored).
    pub pad_token_id: u32,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-4,
            warmup_steps: 10,
            schedule: LrSchedule::Constant,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: Some(1.0),
            micro_batch_size: 8,
            micro_batch_tokens: None,
            max_seq_len: 2048,
            pad_token_id: 0,
        }
    }
}

impl TrainerConfig {
    /// Checks the ranges; the error names the field at fault.
    pub fn validate(&self) -> Result<(), TrainError> {
        let invalid = |key: &str, reason: &str| TrainError::Config { key: key.to_string(), reason: reason.to_string() };
        let checks = [
            ("learning_rate", self.learning_rate.is_finite() && self.learning_rate > 0.0),
            ("beta1", (0.0..1.0).contains(&self.beta1)),
            ("beta2", (0.0..1.0).contains(&self.beta2)),
            ("eps", self.eps.is_finite() && self.eps > 0.0),
            ("weight_decay", self.weight_decay.is_finite() && self.weight_decay >= 0.0),
            ("max_grad_norm", self.max_grad_norm.is_none_or(|n| n.is_finite() && n > 0.0)),
            ("micro_batch_size", self.micro_batch_size > 0),
            ("micro_batch_tokens", self.micro_batch_tokens != Some(0)),
            ("max_seq_len", self.max_seq_len >= 2),
        ];
        if let Some((key, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(invalid(key, "out of range"));
        }
        if let LrSchedule::Cosine { min_lr_ratio, .. } = self.schedule {
            if !(0.0..=1.0).contains(&min_lr_ratio) {
                return Err(invalid("schedule.min_lr_ratio", "must lie in [0, 1]"));
            }
        }
        Ok(())
    }

    /// The learning rate of update number `step` (0 for the first update).
    pub fn learning_rate_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.learning_rate * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            LrSchedule::Constant => self.learning_rate,
            LrSchedule::Cosine { total_steps, min_lr_ratio } => {
                let span = total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                self.learning_rate * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
            }
        }
    }
}

/// Why training could not proceed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("trainer config: `{key}`: {reason}")]
    Config { key: String, reason: String },
    #[error("the batch has no completion token to train on")]
    NoTrainableTokens,
    #[error("invalid batch: {0}")]
    Batch(String),
    #[error("non-finite gradient norm {grad_norm} (loss {loss}); the update was skipped")]
    NonFinite { loss: f64, grad_norm: f64 },
    #[error("{0}")]
    Mode(&'static str),
    #[error(transparent)]
    WontFit(#[from] MemoryShortfall),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Lora(Box<LoraError>),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl From<LoraError> for TrainError {
    fn from(error: LoraError) -> Self {
        Self::Lora(Box::new(error))
    }
}

/// A model's adapter error as the trainer's: the adapter's configuration or files, a misfit,
/// or saving the adapter of a model without one.
impl From<TrainableError> for TrainError {
    fn from(error: TrainableError) -> Self {
        match error {
            TrainableError::Lora(error) => error.into(),
            TrainableError::Model(error) => Self::Model(error),
            TrainableError::NoAdapter => Self::Mode("the model carries no adapter"),
        }
    }
}

/// A padded batch in the usual causal-LM layout: position `t` of a row reads `input_ids[t]` and
/// is scored on predicting `labels[t]` (the next token) where `loss_mask[t]` holds. All vectors
/// are row-major `[rows, steps]`; rows are right-padded.
#[derive(Debug, Clone, PartialEq)]
pub struct SftBatch {
    pub rows: usize,
    pub steps: usize,
    pub input_ids: Vec<u32>,
    /// 1 for real tokens, 0 for padding.
    pub attention_mask: Vec<u8>,
    pub labels: Vec<u32>,
    pub loss_mask: Vec<bool>,
}

impl SftBatch {
    /// Lays out examples, each cut to `max_seq_len` tokens; also returns how many were cut.
    /// Only predictions of completion tokens are scored.
    pub fn from_examples(examples: &[SftExample], pad_token_id: u32, max_seq_len: usize) -> (Self, usize) {
        let mut truncated = 0;
        let sequences: Vec<(Vec<u32>, usize)> = examples
            .iter()
            .map(|example| {
                let mut tokens = [example.prompt.as_slice(), &example.completion].concat();
                if tokens.len() > max_seq_len {
                    tokens.truncate(max_seq_len);
                    truncated += 1;
                }
                (tokens, example.prompt.len())
            })
            .collect();
        let steps = sequences.iter().map(|(tokens, _)| tokens.len().saturating_sub(1)).max().unwrap_or(0).max(1);
        let rows = sequences.len();
        let mut batch = Self {
            rows,
            steps,
            input_ids: vec![pad_token_id; rows * steps],
            attention_mask: vec![0; rows * steps],
            labels: vec![pad_token_id; rows * steps],
            loss_mask: vec![false; rows * steps],
        };
        for (row, (tokens, prompt_len)) in sequences.iter().enumerate() {
            for (t, pair) in tokens.windows(2).enumerate() {
                let at = row * steps + t;
                batch.input_ids[at] = pair[0];
                batch.attention_mask[at] = 1;
                batch.labels[at] = pair[1];
                batch.loss_mask[at] = t + 1 >= *prompt_len;
            }
        }
        (batch, truncated)
    }

    /// The number of scored positions.
    pub fn tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&scored| scored).count()
    }

    /// The real tokens a pass over this batch feeds (padding is never fed), and those it scores.
    pub fn pass_tokens(&self) -> PassTokens {
        PassTokens { fed: self.attention_mask.iter().filter(|&&real| real != 0).count(), scored: self.tokens() }
    }

    fn check(&self, vocab_size: usize) -> Result<(), TrainError> {
        let cells = self.rows * self.steps;
        let lengths = [self.input_ids.len(), self.attention_mask.len(), self.labels.len(), self.loss_mask.len()];
        if lengths.iter().any(|&len| len != cells) {
            return Err(TrainError::Batch(format!(
                "vectors of lengths {lengths:?} for {} x {}",
                self.rows, self.steps
            )));
        }
        let scored = (0..cells).filter(|&at| self.loss_mask[at]);
        if let Some(at) = scored.clone().find(|&at| self.attention_mask[at] == 0) {
            return Err(TrainError::Batch(format!("padding position {at} is scored")));
        }
        if let Some(at) = scored.clone().find(|&at| self.labels[at] as usize >= vocab_size) {
            return Err(TrainError::Batch(format!(
                "label {} at {at} is outside the vocabulary of {vocab_size}",
                self.labels[at]
            )));
        }
        Ok(())
    }
}

/// The summed cross-entropy (f32 scalar, differentiable) of the scored positions of a batch.
/// The rows' real tokens run packed end to end ([`TrainableModel::packed_hidden`]: no padding
/// reaches a product) and only scored positions reach the LM head.
pub fn completion_loss<M: TrainableModel>(model: &M, batch: &SftBatch) -> Result<Tensor, TrainError> {
    Ok(scored_cross_entropy(model, batch)?.sum_all()?)
}

/// The cross-entropy (f32, differentiable) of each scored position of a batch, in row-major
/// order: row by row, and within a row, completion token by completion token.
pub fn scored_cross_entropy<M: TrainableModel>(model: &M, batch: &SftBatch) -> Result<Tensor, TrainError> {
    batch.check(model.vocab_size())?;
    let packing = Packing::of_padded(&batch.input_ids, batch.steps, |at| batch.attention_mask[at] != 0);
    let scored = (0..batch.rows * batch.steps).filter(|&at| batch.loss_mask[at]);
    let (rows, targets): (Vec<u32>, Vec<u32>) =
        scored.filter_map(|at| packing.rows[at].map(|row| (row, batch.labels[at]))).unzip();
    if rows.is_empty() {
        return Err(TrainError::NoTrainableTokens);
    }
    let count = rows.len();
    let hidden = model
        .packed_hidden(&packing.sequence_slices())?
        .index_select(&Tensor::from_vec(rows, count, model.device())?, 0)?;
    let logits = model.logits(&hidden)?;
    Ok(whale_kernels::cross_entropy(&logits, &targets)?)
}

/// What one update did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Mean cross-entropy per completion token, before the update.
    pub loss: f64,
    /// Completion tokens trained on.
    pub tokens: usize,
    pub examples: usize,
    /// Examples cut to `max_seq_len`.
    pub truncated: usize,
    pub learning_rate: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// The number of updates done, this one included.
    pub step: u64,
}

/// Counters saved in `trainer_state.json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TrainerState {
    /// Updates done.
    pub step: u64,
    pub tokens_seen: u64,
    pub examples_seen: u64,
}

impl TrainerState {
    fn load(file: &Path) -> Result<Self, CheckpointError> {
        let text =
            std::fs::read_to_string(file).map_err(|source| CheckpointError::Io { file: file.to_path_buf(), source })?;
        let object = match serde_json::from_str(&text) {
            Ok(Value::Object(object)) => object,
            _ => {
                return Err(CheckpointError::Format {
                    file: file.to_path_buf(),
                    reason: "not a JSON object".to_string(),
                })
            }
        };
        let counter = |key: &str| -> Result<u64, CheckpointError> {
            optional(&object, key)
                .map_err(|issue| CheckpointError::invalid(file, key, issue.reason))?
                .ok_or_else(|| CheckpointError::invalid(file, key, "missing"))
        };
        Ok(Self {
            step: counter("step")?,
            tokens_seen: counter("tokens_seen")?,
            examples_seen: counter("examples_seen")?,
        })
    }
}

/// An f32 moment of `var`'s shape, its zeros written out so that its memory is taken now:
/// freshly mapped zeros would be taken only at the first update, after the memory check
/// ([`StepMemory`]) had counted them as available.
fn written_zeros(var: &Var) -> candle_core::Result<Tensor> {
    Tensor::ones(var.shape(), DType::F32, var.device())?.affine(0.0, 0.0)
}

/// AdamW's state of one parameter, in f32: the first and second moments and, for a parameter
/// stored in bf16 or f16, its f32 master copy. Updates accumulate in the master copy and the
/// parameter gets it rounded, so that updates below the low precision's resolution (a step of
/// 1e-4 on a weight of 0.05 is below bf16's) are not lost.
struct Moments {
    first: Tensor,
    second: Tensor,
    master: Option<Tensor>,
}

/// The SFT trainer: owns a handle on the model (clones share its weights) and the optimizer.
/// It trains every parameter of a plain model, and only the adapter of a model that carries one.
///
/// The optimizer state is f32 whatever the model's dtype; a bf16 or f16 model trains through f32
/// master copies of its parameters, saved with the moments.
pub struct SftTrainer<M: TrainableModel> {
    model: M,
    params: Vec<(String, Var)>,
    moments: Vec<Moments>,
    config: TrainerConfig,
    state: TrainerState,
}

impl<M: TrainableModel> SftTrainer<M> {
    /// A trainer with fresh optimizer state over the model's [`TrainableModel::trained_parameters`]
    /// (the model's adapter when it carries one, all its parameters otherwise).
    pub fn new(model: M, config: TrainerConfig) -> Result<Self, TrainError> {
        config.validate()?;
        let params = model.trained_parameters();
        let moments = params
            .iter()
            .map(|(_, var)| {
                Ok(Moments {
                    first: written_zeros(var)?,
                    second: written_zeros(var)?,
                    master: (var.dtype() != DType::F32)
                        .then(|| var.as_detached_tensor().to_dtype(DType::F32))
                        .transpose()?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { model, params, moments, config, state: TrainerState::default() })
    }

    /// Reads the counters, the moments and the master copies saved in `dir`.
    fn restore(&mut self, dir: &Path) -> Result<(), TrainError> {
        self.state = TrainerState::load(&dir.join(TRAINER_STATE_FILE))?;
        let device = self.model.device().clone();
        let wanted: Vec<(String, Vec<usize>)> = self
            .params
            .iter()
            .flat_map(|(name, var)| {
                let shape = var.dims().to_vec();
                let master = (var.dtype() != DType::F32).then(|| (format!("{name}.{MASTER}"), shape.clone()));
                [(format!("{name}.exp_avg"), shape.clone()), (format!("{name}.exp_avg_sq"), shape)]
                    .into_iter()
                    .chain(master)
            })
            .collect();
        let mut stored = read_tensors(&dir.join(OPTIMIZER_FILE), &wanted)?;
        for ((name, _), moments) in self.params.iter().zip(&mut self.moments) {
            let mut take = |suffix: &str| -> Result<Tensor, TrainError> {
                let key = format!("{name}.{suffix}");
                let tensor = stored
                    .remove(&key)
                    .ok_or_else(|| CheckpointError::invalid(&dir.join(OPTIMIZER_FILE), &key, "missing"))?;
                Ok(tensor.to_dtype(DType::F32)?.to_device(&device)?)
            };
            moments.first = take("exp_avg")?;
            moments.second = take("exp_avg_sq")?;
            if moments.master.is_some() {
                moments.master = Some(take(MASTER)?);
            }
        }
        Ok(())
    }

    /// The model being trained; a clone of it sees every update.
    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    fn save_optimizer(&self, dir: &Path) -> Result<(), TrainError> {
        let moments = self
            .params
            .iter()
            .zip(&self.moments)
            .flat_map(|((name, _), moments)| {
                let master = moments.master.as_ref().map(|master| (format!("{name}.{MASTER}"), master.clone()));
                [
                    (format!("{name}.exp_avg"), moments.first.clone()),
                    (format!("{name}.exp_avg_sq"), moments.second.clone()),
                ]
                .into_iter()
                .chain(master)
            })
            .collect();
        write_tensors(&dir.join(OPTIMIZER_FILE), moments)?;
        let state = serde_json::to_string_pretty(&self.state).unwrap_or_default();
        write_atomic(&dir.join(TRAINER_STATE_FILE), state.as_bytes())?;
        Ok(())
    }

    /// One optimizer update on a mini-batch. Examples are grouped by length into micro-batches
    /// of `micro_batch_size`; the loss is the mean over all completion tokens of the
    /// mini-batch. Fails without touching the weights when there is nothing to train on or
    /// the gradient is not finite.
    pub fn step(&mut self, examples: &[SftExample]) -> Result<StepStats, TrainError> {
        let (batches, truncated) = self.micro_batches(examples);
        let tokens: usize = batches.iter().map(SftBatch::tokens).sum();
        if tokens == 0 {
            return Err(TrainError::NoTrainableTokens);
        }
        self.check_memory(batches.iter().filter(|batch| batch.tokens() > 0))?;
        let mut loss_sum = 0.0;
        let scored = batches.iter().filter(|batch| batch.tokens() > 0);
        let grads = self.gradients(scored, tokens, |model, batch| {
            let summed = completion_loss(model, batch)?;
            loss_sum += f64::from(summed.to_scalar::<f32>()?);
            Ok(summed)
        })?;
        let loss = loss_sum / tokens as f64;
        let (learning_rate, grad_norm) = self.update(&grads, loss, tokens, examples.len())?;
        Ok(StepStats {
            loss,
            tokens,
            examples: examples.len(),
            truncated,
            learning_rate,
            grad_norm,
            step: self.state.step,
        })
    }

    /// Refuses a step whose passes cannot fit in the memory available ([`StepMemory`]), before
    /// any of it is taken. On a CPU only: a GPU's memory is the device's, not the system's.
    pub(crate) fn check_memory<'a>(&self, passes: impl Iterator<Item = &'a SftBatch>) -> Result<(), TrainError> {
        if !self.model.device().is_cpu() {
            return Ok(());
        }
        let trained = self.params.iter().map(|(_, var)| var.elem_count()).sum();
        let counts = self.model.activation_counts();
        let need = StepMemory::estimate(&counts, self.model.dtype(), trained, passes.map(SftBatch::pass_tokens));
        if memory::available_bytes().is_none_or(|available| need.check(available).is_ok()) {
            return Ok(());
        }
        // What this process has freed but kept is as good as available: hand it back and ask
        // again (only here, as the next pass would pay page faults for what was handed back).
        whale_kernels::runtime::release_freed_memory();
        if let Some(available) = memory::available_bytes() {
            need.check(available)?;
        }
        Ok(())
    }

    /// The gradients of `Σ loss(micro-batch) / tokens` over the parameters, one backward pass
    /// per micro-batch, each through the model of its pass (its own dropout masks).
    pub(crate) fn gradients<B>(
        &self,
        micro_batches: impl Iterator<Item = B>,
        tokens: usize,
        mut loss: impl FnMut(&M, B) -> Result<Tensor, TrainError>,
    ) -> Result<Vec<Option<Tensor>>, TrainError> {
        let mut grads: Vec<Option<Tensor>> = vec![None; self.params.len()];
        for (index, batch) in micro_batches.enumerate() {
            let model = self.model.pass_model(dropout_seed(self.state.step, index));
            let summed = loss(&model, batch)?;
            let store = (summed / tokens as f64)?.backward()?;
            for ((_, var), total) in self.params.iter().zip(grads.iter_mut()) {
                if let Some(grad) = store.get(var) {
                    let grad = grad.detach().to_dtype(DType::F32)?;
                    *total = Some(match total.take() {
                        Some(sum) => (sum + grad)?,
                        None => grad,
                    });
                }
            }
        }
        Ok(grads)
    }

    /// One AdamW update with the clipped `grads`, counted in the state; returns the learning
    /// rate and the gradient norm before clipping. Touches nothing when the loss or the norm
    /// is not finite.
    pub(crate) fn update(
        &mut self,
        grads: &[Option<Tensor>],
        loss: f64,
        tokens: usize,
        examples: usize,
    ) -> Result<(f64, f64), TrainError> {
        let grad_norm = global_norm(grads)?;
        if !grad_norm.is_finite() || !loss.is_finite() {
            return Err(TrainError::NonFinite { loss, grad_norm });
        }
        let clip_scale = match self.config.max_grad_norm {
            Some(max) if grad_norm > max => max / (grad_norm + 1e-6),
            _ => 1.0,
        };
        let learning_rate = self.config.learning_rate_at(self.state.step);
        self.apply_adamw(grads, clip_scale, learning_rate)?;
        self.state.step += 1;
        self.state.tokens_seen += tokens as u64;
        self.state.examples_seen += examples as u64;
        Ok((learning_rate, grad_norm))
    }

    /// Mean loss per completion token of `examples` under the current weights, no update.
    pub fn evaluate(&self, examples: &[SftExample]) -> Result<(f64, usize), TrainError> {
        let (batches, _) = self.micro_batches(examples);
        let tokens: usize = batches.iter().map(SftBatch::tokens).sum();
        if tokens == 0 {
            return Err(TrainError::NoTrainableTokens);
        }
        let mut loss_sum = 0.0;
        for batch in batches.iter().filter(|batch| batch.tokens() > 0) {
            let summed = completion_loss(&self.model, batch)?;
            loss_sum += f64::from(summed.to_scalar::<f32>()?);
        }
        Ok((loss_sum / tokens as f64, tokens))
    }

    /// Micro-batches of similar lengths (longest first), and how many examples were cut.
    fn micro_batches(&self, examples: &[SftExample]) -> (Vec<SftBatch>, usize) {
        let mut truncated = 0;
        let batches = longest_first_micro_batches(examples, SftExample::tokens, &self.config)
            .into_iter()
            .map(|chunk| {
                let chunk: Vec<SftExample> = chunk.into_iter().cloned().collect();
                let (batch, cut) = SftBatch::from_examples(&chunk, self.config.pad_token_id, self.config.max_seq_len);
                truncated += cut;
                batch
            })
            .collect();
        (batches, truncated)
    }

    /// AdamW with decoupled weight decay (matrices only) on the clipped gradients.
    fn apply_adamw(&mut self, grads: &[Option<Tensor>], clip_scale: f64, learning_rate: f64) -> Result<(), TrainError> {
        let t = (self.state.step + 1) as i32;
        let (beta1, beta2) = (self.config.beta1, self.config.beta2);
        let first_correction = 1.0 - beta1.powi(t);
        let second_correction = 1.0 - beta2.powi(t);
        for (((_, var), moments), grad) in self.params.iter().zip(&mut self.moments).zip(grads) {
            let Some(grad) = grad else { continue };
            let grad = (grad * clip_scale)?;
            moments.first = ((&moments.first * beta1)? + (&grad * (1.0 - beta1))?)?;
            moments.second = ((&moments.second * beta2)? + (grad.sqr()? * (1.0 - beta2))?)?;
            let denominator = ((&moments.second / second_correction)?.sqrt()? + self.config.eps)?;
            let direction = ((&moments.first / first_correction)? / denominator)?;
            let mut weights = match &moments.master {
                Some(master) => master.clone(),
                None => var.as_detached_tensor().to_dtype(DType::F32)?,
            };
            if var.rank() >= 2 && self.config.weight_decay > 0.0 {
                weights = (weights * (1.0 - learning_rate * self.config.weight_decay))?;
            }
            let updated = (weights - (direction * learning_rate)?)?;
            var.set(&updated.to_dtype(var.dtype())?)?;
            if let Some(master) = &mut moments.master {
                *master = updated;
            }
        }
        Ok(())
    }
}

impl<M: TrainableModel> SftTrainer<M> {
    /// A trainer over `model` that continues from the moments and counters saved in `dir`.
    pub fn resumed(model: M, config: TrainerConfig, dir: &Path) -> Result<Self, TrainError> {
        let mut trainer = Self::new(model, config)?;
        trainer.restore(dir)?;
        Ok(trainer)
    }

    /// Continues training the adapter of `base` saved by [`Self::save_adapter`] in `dir`: its
    /// matrices, moments and counters.
    pub fn resume_adapter(dir: &Path, base: &M, config: TrainerConfig) -> Result<Self, TrainError> {
        Self::resumed(base.with_saved_adapter(dir)?, config, dir)
    }

    /// Writes the architecture's checkpoint ([`TrainableModel::save`]), the optimizer moments
    /// (`optimizer.safetensors`) and, last, `trainer_state.json`, whose presence therefore marks
    /// a complete save. Save into a fresh directory each time to be safe against a kill in the
    /// middle. A trainer of an adapter saves with [`Self::save_adapter`] instead.
    pub fn save_checkpoint(&self, dir: &Path) -> Result<(), TrainError> {
        self.refuse_adapter()?;
        self.model.save(dir)?;
        self.save_optimizer(dir)
    }

    /// Writes the adapter as a PEFT directory (`adapter_config.json` naming
    /// `base_model_name_or_path`, `adapter_model.safetensors`), then the optimizer moments and,
    /// last, `trainer_state.json`, as [`Self::save_checkpoint`] does.
    pub fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), TrainError> {
        if !self.model.has_adapter() {
            return Err(TrainError::Mode("only a trainer of a LoRA adapter saves an adapter"));
        }
        self.model.save_adapter(dir, base_model_name_or_path)?;
        self.save_optimizer(dir)
    }

    fn refuse_adapter(&self) -> Result<(), TrainError> {
        match self.model.has_adapter() {
            true => Err(TrainError::Mode("a LoRA trainer saves its adapter (save_adapter), not a checkpoint")),
            false => Ok(()),
        }
    }
}

impl<M: TrainableModel> SftTrainer<M> {
    /// Continues a run from a directory written by [`Self::save`] or [`Self::save_checkpoint`]:
    /// weights (loaded in `dtype` on `device`), moments and counters.
    pub fn resume(dir: &Path, config: TrainerConfig, dtype: DType, device: &Device) -> Result<Self, TrainError> {
        Self::resumed(M::load(dir, dtype, device)?, config, dir)
    }

    /// [`Self::save_checkpoint`] with the `generation_config.json` given.
    pub fn save(&self, dir: &Path, generation: &GenerationConfig) -> Result<(), TrainError> {
        self.refuse_adapter()?;
        self.model.save(dir)?;
        generation.save(dir)?;
        self.save_optimizer(dir)
    }
}

/// The micro-batches of a step: `examples` sorted longest first by `tokens` (a stable sort,
/// so ties keep their order) and cut by [`micro_batch_ranges`].
pub(crate) fn longest_first_micro_batches<'a, T>(
    examples: &'a [T],
    tokens: fn(&T) -> usize,
    config: &TrainerConfig,
) -> Vec<Vec<&'a T>> {
    let mut order: Vec<&T> = examples.iter().collect();
    order.sort_by_key(|example| std::cmp::Reverse(tokens(example)));
    let lengths: Vec<usize> = order.iter().map(|example| tokens(example)).collect();
    micro_batch_ranges(&lengths, config).into_iter().map(|range| order[range].to_vec()).collect()
}

/// The micro-batches of examples of `lengths` (in training order) as index ranges: runs of
/// `micro_batch_size`, each closed early where the next example would take its tokens (each
/// cut to `max_seq_len`) past `micro_batch_tokens`. An example over the cap alone is a
/// micro-batch of its own. Without a cap, or when no run goes over it, these are the plain
/// runs of `micro_batch_size`.
pub(crate) fn micro_batch_ranges(lengths: &[usize], config: &TrainerConfig) -> Vec<std::ops::Range<usize>> {
    let cap = config.micro_batch_tokens.unwrap_or(usize::MAX);
    let mut ranges = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (index, length) in lengths.iter().enumerate() {
        let length = (*length).min(config.max_seq_len);
        let full = index - start == config.micro_batch_size.max(1);
        if index > start && (full || tokens + length > cap) {
            ranges.push(start..index);
            (start, tokens) = (index, 0);
        }
        tokens += length;
    }
    if start < lengths.len() {
        ranges.push(start..lengths.len());
    }
    ranges
}

/// The seed of the adapter dropout masks of one micro-batch: a function of the update number
/// and the micro-batch's place in it, so that a resumed run draws the same masks.
fn dropout_seed(step: u64, micro_batch: usize) -> u64 {
    const SALT: u64 = 0x10A4_D40F_0000_0001;
    SALT ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (micro_batch as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
}

/// The L2 norm of all gradients together.
fn global_norm(grads: &[Option<Tensor>]) -> candle_core::Result<f64> {
    let mut squares = 0.0;
    for grad in grads.iter().flatten() {
        squares += f64::from(grad.sqr()?.sum_all()?.to_scalar::<f32>()?);
    }
    Ok(squares.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(lengths: &[usize], size: usize, cap: Option<usize>) -> Vec<std::ops::Range<usize>> {
        let config =
            TrainerConfig { micro_batch_size: size, micro_batch_tokens: cap, max_seq_len: 1000, ..Default::default() };
        micro_batch_ranges(lengths, &config)
    }

    #[test]
    fn without_a_cap_or_under_it_the_runs_are_those_of_the_micro_batch_size() {
        let lengths = [9, 8, 7, 6, 5, 4, 3];
        assert_eq!(ranges(&lengths, 3, None), [0..3, 3..6, 6..7]);
        assert_eq!(ranges(&lengths, 3, Some(24)), [0..3, 3..6, 6..7]);
        assert!(ranges(&[], 3, Some(5)).is_empty());
    }

    #[test]
    fn a_run_over_the_cap_closes_early_and_a_long_example_stands_alone() {
        assert_eq!(ranges(&[900, 900, 900, 900, 450, 450, 450, 450], 8, Some(3072)), [0..3, 3..8]);
        assert_eq!(ranges(&[5000, 10, 10], 8, Some(100)), [0..1, 1..3]);
        // Lengths count as cut to max_seq_len (1000 here): two of 4000 fit a cap of 2000.
        assert_eq!(ranges(&[4000, 4000, 10], 8, Some(2000)), [0..2, 2..3]);
    }
}
