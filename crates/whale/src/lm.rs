//! The `whale lm` commands on local checkpoints: turning chat data into training examples with a
//! model's own tokenizer and chat template, supervised fine-tuning from an `sft.jsonl` (of the
//! whole model or of a LoRA adapter), merging an adapter into its base, and sampling completions.
//!
//! A checkpoint directory is the Hugging Face layout written by whale (`config.json`,
//! `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` with the chat template), so the
//! same code serves the pretrained base model and every model trained from it. An adapter
//! directory is PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`) and applies to
//! the base it was trained on.
//!
//! Every command takes a checkpoint of any architecture whale-lm registers: the model is loaded
//! by its `config.json`'s `model_type` ([`Decoder::load`]) and trained or merged as its own
//! [`TrainableModel`] ([`Decoder::with_trainable`]), so nothing here names an architecture.

use candle_core::{DType, Device};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::{Path, PathBuf};
use whale_core::ChatMessage;
use whale_engine::{EngineConfig, EngineError, LocalPolicy};
use whale_lm::{
    stored_dtype, AdapterError, CheckpointError, Decoder, GenerationConfig, LoraConfig, LoraError, ModelError,
    TrainableError, TrainableModel, WithTrainable,
};
use whale_loop::scale_out::external_weights::Sample;
use whale_policy::{ChatRequest, Completion, Policy, PolicyError, SamplingParams};
use whale_tasks::{read_jsonl, RecordError};
use whale_text::{ChatTemplateError, TokenizerError};
use whale_train::{
    completion_logprobs, ChatCodec, ChatCodecError, PgExample, PgObjective, SftExample, SftTrainer, TrainError,
    TrainerConfig,
};

#[derive(Debug, thiserror::Error)]
pub enum LmError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error(transparent)]
    Codec(#[from] ChatCodecError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Lora(Box<LoraError>),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{} problem(s) in the SFT data, first: {}", .0.len(), .0[0])]
    Records(Vec<RecordError>),
    #[error("{0}")]
    Invalid(String),
    #[error("cannot write {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

impl From<LoraError> for LmError {
    fn from(error: LoraError) -> Self {
        Self::Lora(Box::new(error))
    }
}

/// A model's adapter error: the adapter's files or configuration, or a misfit with the model, as
/// the commands report them whatever the architecture.
impl From<TrainableError> for LmError {
    fn from(error: TrainableError) -> Self {
        match error {
            TrainableError::Lora(error) => error.into(),
            TrainableError::Model(error) => error.into(),
            TrainableError::NoAdapter => Self::Train(error.into()),
        }
    }
}

impl From<AdapterError> for LmError {
    fn from(error: AdapterError) -> Self {
        match error {
            AdapterError::Load(error) => error.into(),
            AdapterError::Mismatch(error) => error.into(),
        }
    }
}

/// One line of an `sft.jsonl`: the conversation so far and the assistant's reply to learn.
#[derive(Debug, Clone, PartialEq)]
pub struct SftRecord {
    pub line: usize,
    pub messages: Vec<ChatMessage>,
    pub completion: String,
    /// Whether the reply ended its turn (trained with the end-of-turn token).
    pub ends_turn: bool,
    /// A policy-gradient sample's advantage and sampled tokens (a WHALE step under GRPO or
    /// RLOO writes them).
    pub policy_gradient: Option<SampledReply>,
}

/// The sampled tokens of a reply, the sampler's log-probability of each, and the advantage of
/// the rollout it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledReply {
    pub advantage: f32,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
}

impl SftRecord {
    pub fn example(&self, codec: &ChatCodec) -> Result<SftExample, LmError> {
        Ok(codec.example_ending(&self.messages, &self.completion, self.ends_turn)?)
    }

    /// The policy-gradient example of a sample that carries its sampled tokens.
    fn pg_example(&self, codec: &ChatCodec) -> Result<Option<PgExample>, LmError> {
        let Some(sampled) = &self.policy_gradient else { return Ok(None) };
        Ok(Some(PgExample {
            prompt: codec.prompt_ids(&self.messages)?,
            completion: sampled.token_ids.clone(),
            advantage: sampled.advantage,
            behaviour: sampled.logprobs.clone(),
            reference: Vec::new(),
        }))
    }
}

/// Reads an `sft.jsonl` of `{"messages": [{role, content}...], "completion": "..."}` lines, or
/// the `samples.jsonl` of a WHALE weight step: `{"messages": [...], "trainable": [bool...],
/// "finish_reason": "stop" | "length"}`, whose last trainable turn (an assistant message) is the
/// reply to learn and the messages before it its context. Every bad line is reported as
/// `file:line`, none is skipped silently.
pub fn read_sft_file(path: &Path) -> Result<Vec<SftRecord>, LmError> {
    let (values, mut problems) = read_jsonl(path);
    let mut records = Vec::new();
    for (line, value) in values {
        let parsed = if value.get("trainable").is_some() { parse_sample(&value) } else { parse_sft_record(&value) };
        match parsed {
            Ok((messages, completion, ends_turn, policy_gradient)) => {
                records.push(SftRecord { line, messages, completion, ends_turn, policy_gradient })
            }
            Err((field, reason)) => problems.push(RecordError::new(path, line, Some(field), reason)),
        }
    }
    if let Some(first) = records.first() {
        let kind = |r: &SftRecord| r.policy_gradient.is_some();
        if let Some(other) = records.iter().find(|r| kind(r) != kind(first)) {
            let reason = format!(
                "line {} is a {} sample and this one is not: a file holds one kind",
                first.line,
                if kind(first) { "policy-gradient" } else { "supervised" }
            );
            problems.push(RecordError::new(path, other.line, Some("advantage"), reason));
        }
    }
    if problems.is_empty() {
        Ok(records)
    } else {
        problems.sort_by_key(|p| p.line);
        Err(LmError::Records(problems))
    }
}

type ParsedRecord = (Vec<ChatMessage>, String, bool, Option<SampledReply>);

fn parse_messages(value: &serde_json::Value) -> Result<Vec<ChatMessage>, (&'static str, String)> {
    let messages = value.get("messages").ok_or(("messages", "missing".to_string()))?;
    serde_json::from_value(messages.clone())
        .map_err(|e| ("messages", format!("expected a list of {{role, content}} strings: {e}")))
}

/// A `samples.jsonl` line: the last trainable turn is the completion; with an `advantage`,
/// its sampled tokens and their log-probabilities are what a policy gradient learns from.
fn parse_sample(value: &serde_json::Value) -> Result<ParsedRecord, (&'static str, String)> {
    let sample: Sample = serde_json::from_value(value.clone()).map_err(|e| ("samples.jsonl line", e.to_string()))?;
    let sampled = match sample.advantage {
        None => None,
        Some(advantage) if !advantage.is_finite() => return Err(("advantage", format!("{advantage} is not finite"))),
        Some(_) if sample.completion_token_ids.is_empty() => {
            return Err(("completion_token_ids", "missing or empty beside an advantage".to_string()))
        }
        Some(_) if sample.behaviour_logprobs.len() != sample.completion_token_ids.len() => {
            let reason =
                format!("{} for {} token ids", sample.behaviour_logprobs.len(), sample.completion_token_ids.len());
            return Err(("behaviour_logprobs", reason));
        }
        Some(advantage) => Some(SampledReply {
            advantage: advantage as f32,
            token_ids: sample.completion_token_ids.clone(),
            logprobs: sample.behaviour_logprobs.clone(),
        }),
    };
    let reply = sample.reply()?;
    Ok((reply.context, reply.completion, reply.ends_turn, sampled))
}

fn parse_sft_record(value: &serde_json::Value) -> Result<ParsedRecord, (&'static str, String)> {
    let messages = parse_messages(value)?;
    if messages.is_empty() {
        return Err(("messages", "empty: the completion needs a prompt".to_string()));
    }
    let completion = match value.get("completion") {
        Some(serde_json::Value::String(text)) if !text.is_empty() => text.clone(),
        Some(serde_json::Value::String(_)) => return Err(("completion", "empty".to_string())),
        Some(other) => return Err(("completion", format!("expected a string, got {other}"))),
        None => return Err(("completion", "missing".to_string())),
    };
    Ok((messages, completion, true, None))
}

/// Settings of `whale lm train`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SftSettings {
    pub epochs: usize,
    pub learning_rate: f64,
    /// Examples per optimizer step.
    pub batch_size: usize,
    /// At most this many tokens in one pass ([`TrainerConfig::micro_batch_tokens`]).
    pub micro_batch_tokens: Option<usize>,
    /// Shuffles the examples each epoch (and draws a new adapter's initial matrices).
    pub seed: u64,
    /// Train a new LoRA adapter with these settings instead of the whole model.
    pub lora: Option<LoraConfig>,
    /// Continue the LoRA run saved in this adapter directory (its settings, matrices and
    /// optimizer state); `lora`, if given, must match its settings.
    pub resume_adapter: Option<PathBuf>,
    /// Take the examples in the file's order instead of shuffling them.
    pub keep_order: bool,
    /// Policy-gradient samples: PPO's clip range.
    pub clip_epsilon: f64,
    /// Also write each example's prompt ids and trained ids here, one JSON line per example
    /// in the file's order, so that another trainer can be checked against this one.
    pub trained_tokens: Option<PathBuf>,
}

/// What `whale lm train` did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SftReport {
    pub examples: usize,
    /// Updates done, those of a resumed run included.
    pub steps: u64,
    /// Scalars the optimizer updated: the whole model's, or the adapter's.
    pub trained_parameters: usize,
    /// Whether `output` is a PEFT adapter directory rather than a checkpoint.
    pub adapter: bool,
    /// Whether the data were policy-gradient samples (the loss is then the clipped surrogate).
    pub policy_gradient: bool,
    /// Mean loss per completion token over the data before and after training.
    pub loss_before: f64,
    pub loss_after: f64,
    pub output: PathBuf,
}

/// Fine-tunes the model in `model_dir` on `data` and writes the result to `output`: a Hugging
/// Face checkpoint with the tokenizer files, or, when training a LoRA adapter, a PEFT adapter
/// directory with the optimizer state that `resume_adapter` continues from. Each epoch's order
/// is drawn from the seed and the number of updates done before it, so a LoRA run continued
/// epoch by epoch with `resume_adapter` ends exactly where one uninterrupted run does.
/// Policy-gradient samples (a WHALE step's under GRPO or RLOO) are trained on with the clipped
/// surrogate instead of the supervised loss, against the log-probabilities the starting weights
/// of this invocation give their tokens (so, unlike supervised data, several epochs in one
/// invocation are not the same as one epoch per resumed invocation). `on_step` sees every step.
pub fn train_sft(
    model_dir: &Path,
    data: &Path,
    output: &Path,
    settings: &SftSettings,
    on_step: &mut dyn FnMut(&whale_train::StepStats, u64),
) -> Result<SftReport, LmError> {
    if settings.epochs == 0 || settings.batch_size == 0 {
        return Err(LmError::Invalid("epochs and batch size must be at least 1".to_string()));
    }
    let records = read_sft_file(data)?;
    let codec = ChatCodec::load(model_dir)?;
    let model = Decoder::load(model_dir, DType::F32, &Device::Cpu)?;
    model.with_trainable(SftRun { model_dir, output, settings, records: &records, codec: &codec, on_step })
}

/// `whale lm train` over the model of whichever architecture the checkpoint holds.
struct SftRun<'a> {
    model_dir: &'a Path,
    output: &'a Path,
    settings: &'a SftSettings,
    records: &'a [SftRecord],
    codec: &'a ChatCodec,
    on_step: &'a mut dyn FnMut(&whale_train::StepStats, u64),
}

impl WithTrainable for SftRun<'_> {
    type Output = Result<SftReport, LmError>;

    fn run<M: TrainableModel>(self, model: M) -> Self::Output {
        let Self { model_dir, output, settings, records, codec, on_step } = self;
        let mut trainer = trainer_for(model, settings, codec)?;
        let pg: Vec<PgExample> =
            records.iter().filter_map(|r| r.pg_example(codec).transpose()).collect::<Result<_, _>>()?;
        let (loss_before, loss_after) = if pg.is_empty() {
            let examples: Vec<SftExample> =
                records.iter().map(|record| record.example(codec)).collect::<Result<_, _>>()?;
            let split = examples.iter().map(|e| (e.prompt.as_slice(), e.completion.as_slice()));
            write_trained_tokens(settings, records, split)?;
            supervised_epochs(&mut trainer, &examples, settings, on_step)?
        } else {
            let split = pg.iter().map(|e| (e.prompt.as_slice(), e.completion.as_slice()));
            write_trained_tokens(settings, records, split)?;
            policy_gradient_epochs(&mut trainer, pg, settings, on_step)?
        };
        let adapter = trainer.model().has_adapter();
        if adapter {
            let base = std::path::absolute(model_dir).unwrap_or(model_dir.to_path_buf());
            trainer.save_adapter(output, &base.display().to_string())?;
        } else {
            save_with_generation_config(trainer.model(), model_dir, output)?;
            ChatCodec::copy_files(model_dir, output)?;
        }
        Ok(SftReport {
            examples: records.len(),
            steps: trainer.state().step,
            trained_parameters: trainer.model().trained_parameters().iter().map(|(_, var)| var.elem_count()).sum(),
            adapter,
            policy_gradient: records.iter().any(|r| r.policy_gradient.is_some()),
            loss_before,
            loss_after,
            output: output.to_path_buf(),
        })
    }
}

/// Writes `{"line", "prompt_ids", "trained_ids"}` per example to `settings.trained_tokens`:
/// exactly the token ids this trainer scores, so that an external trainer can show it trains
/// the same ones (`scripts/trainer_agreement.py`).
fn write_trained_tokens<'a>(
    settings: &SftSettings,
    records: &[SftRecord],
    examples: impl Iterator<Item = (&'a [u32], &'a [u32])>,
) -> Result<(), LmError> {
    let Some(path) = &settings.trained_tokens else { return Ok(()) };
    let lines: String = records
        .iter()
        .zip(examples)
        .map(|(record, (prompt, trained))| {
            let line = serde_json::json!({"line": record.line, "prompt_ids": prompt, "trained_ids": trained});
            format!("{line}\n")
        })
        .collect();
    std::fs::write(path, lines).map_err(|source| LmError::Io { path: path.clone(), source })
}

/// The trainer of `whale lm train` over `model`: the whole model, a new adapter, or a resumed
/// one.
fn trainer_for<M: TrainableModel>(
    model: M,
    settings: &SftSettings,
    codec: &ChatCodec,
) -> Result<SftTrainer<M>, LmError> {
    let config = TrainerConfig {
        learning_rate: settings.learning_rate,
        warmup_steps: 1,
        pad_token_id: codec.tokenizer.specials().endoftext,
        max_seq_len: model.max_position_embeddings(),
        micro_batch_tokens: settings.micro_batch_tokens,
        ..TrainerConfig::default()
    };
    Ok(match (&settings.resume_adapter, &settings.lora) {
        (Some(dir), lora) => {
            let trainer = SftTrainer::resume_adapter(dir, &model, config)?;
            if let (Some(given), Some(stored)) = (lora, trainer.model().adapter_config()) {
                check_same_lora(given, stored, dir)?;
            }
            trainer
        }
        (None, Some(lora)) => SftTrainer::new(model.with_new_adapter(lora, settings.seed)?, config)?,
        (None, None) => SftTrainer::new(model, config)?,
    })
}

/// The examples of one epoch in training order: shuffled from the seed and the updates done
/// so far, unless `keep_order`.
fn epoch_order<'a, T>(examples: &'a [T], settings: &SftSettings, updates_done: u64) -> Vec<&'a T> {
    let mut order: Vec<&T> = examples.iter().collect();
    if !settings.keep_order {
        let mut rng = ChaCha8Rng::seed_from_u64(settings.seed);
        rng.set_stream(updates_done);
        order.shuffle(&mut rng);
    }
    order
}

/// Supervised epochs; returns the mean loss per completion token before and after.
fn supervised_epochs<M: TrainableModel>(
    trainer: &mut SftTrainer<M>,
    examples: &[SftExample],
    settings: &SftSettings,
    on_step: &mut dyn FnMut(&whale_train::StepStats, u64),
) -> Result<(f64, f64), LmError> {
    let (loss_before, _) = trainer.evaluate(examples)?;
    let steps_per_epoch = examples.len().div_ceil(settings.batch_size) as u64;
    let total_steps = trainer.state().step + steps_per_epoch * settings.epochs as u64;
    for _ in 0..settings.epochs {
        for chunk in epoch_order(examples, settings, trainer.state().step).chunks(settings.batch_size) {
            let batch: Vec<SftExample> = chunk.iter().map(|&e| e.clone()).collect();
            let stats = trainer.step(&batch)?;
            on_step(&stats, total_steps);
        }
    }
    let (loss_after, _) = trainer.evaluate(examples)?;
    Ok((loss_before, loss_after))
}

/// Policy-gradient epochs over sampled replies, against the log-probabilities the starting
/// weights give their tokens (recomputed, as the in-process weight phase does: the sampler's
/// agree up to its float rounding); returns the surrogate loss before and after.
fn policy_gradient_epochs<M: TrainableModel>(
    trainer: &mut SftTrainer<M>,
    mut examples: Vec<PgExample>,
    settings: &SftSettings,
    on_step: &mut dyn FnMut(&whale_train::StepStats, u64),
) -> Result<(f64, f64), LmError> {
    let plain: Vec<SftExample> =
        examples.iter().map(|e| SftExample { prompt: e.prompt.clone(), completion: e.completion.clone() }).collect();
    let old = completion_logprobs(trainer.model(), &plain, trainer.config())?;
    for (example, old) in examples.iter_mut().zip(old) {
        example.behaviour = old;
    }
    let objective = PgObjective { clip_epsilon: settings.clip_epsilon, kl_coef: 0.0 };
    let loss_before = trainer.evaluate_policy_gradient(&examples, &objective)?;
    let steps_per_epoch = examples.len().div_ceil(settings.batch_size) as u64;
    let total_steps = trainer.state().step + steps_per_epoch * settings.epochs as u64;
    for _ in 0..settings.epochs {
        for chunk in epoch_order(&examples, settings, trainer.state().step).chunks(settings.batch_size) {
            let batch: Vec<PgExample> = chunk.iter().map(|&e| e.clone()).collect();
            let stats = trainer.policy_gradient_step(&batch, &objective)?;
            let step = trainer.state().step;
            let stats = whale_train::StepStats {
                loss: stats.loss,
                tokens: stats.tokens,
                examples: stats.examples,
                truncated: stats.truncated,
                learning_rate: stats.learning_rate,
                grad_norm: stats.grad_norm,
                step,
            };
            on_step(&stats, total_steps);
        }
    }
    let loss_after = trainer.evaluate_policy_gradient(&examples, &objective)?;
    Ok((loss_before, loss_after))
}

/// Fails unless the LoRA settings given on the command line are those of the adapter resumed
/// from `dir` (target modules in any order).
fn check_same_lora(given: &LoraConfig, stored: &LoraConfig, dir: &Path) -> Result<(), LmError> {
    let sorted = |config: &LoraConfig| {
        let mut targets = config.target_modules.clone();
        targets.sort();
        (config.rank, config.alpha, config.dropout, targets)
    };
    if sorted(given) == sorted(stored) {
        return Ok(());
    }
    Err(LmError::Invalid(format!(
        "the LoRA settings given (rank {}, alpha {}, dropout {}, targets {}) differ from those of the adapter in {} \
         (rank {}, alpha {}, dropout {}, targets {})",
        given.rank,
        given.alpha,
        given.dropout,
        given.target_modules.join(","),
        dir.display(),
        stored.rank,
        stored.alpha,
        stored.dropout,
        stored.target_modules.join(",")
    )))
}

/// Writes `model`'s checkpoint into `output` with the generation config of the checkpoint in
/// `model_dir` where it has one (else the architecture's own, [`TrainableModel::save`]).
fn save_with_generation_config<M: TrainableModel>(model: &M, model_dir: &Path, output: &Path) -> Result<(), LmError> {
    let generation = GenerationConfig::load(model_dir)?;
    model.save(output)?;
    if let Some(generation) = generation {
        generation.save(output)?;
    }
    Ok(())
}

/// Folds the PEFT adapter in `adapter_dir` into the model in `base_dir` and writes the result
/// to `output` as a full checkpoint in the base's dtype, with the base's generation config and
/// tokenizer files. Returns the number of projections the adapter changed.
pub fn merge_adapter(base_dir: &Path, adapter_dir: &Path, output: &Path) -> Result<usize, LmError> {
    let base = Decoder::load(base_dir, stored_dtype(base_dir)?, &Device::Cpu)?;
    base.with_trainable(Merge { base_dir, adapter_dir, output })
}

/// `whale lm merge` over the base model of whichever architecture the checkpoint holds.
struct Merge<'a> {
    base_dir: &'a Path,
    adapter_dir: &'a Path,
    output: &'a Path,
}

impl WithTrainable for Merge<'_> {
    type Output = Result<usize, LmError>;

    /// The adapter's matrices come in pairs, A and B, one pair per projection it changes.
    fn run<M: TrainableModel>(self, base: M) -> Self::Output {
        let adapted = base.with_saved_adapter(self.adapter_dir)?;
        let projections = adapted.trained_parameters().len() / 2;
        save_with_generation_config(&adapted.merged()?, self.base_dir, self.output)?;
        ChatCodec::copy_files(self.base_dir, self.output)?;
        Ok(projections)
    }
}

/// Settings of `whale lm generate`.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateSettings {
    /// Completions to sample; sample `i` uses seed `seed + i`.
    pub n: usize,
    pub max_tokens: usize,
    pub temperature: f32,
    pub seed: u64,
    /// Continue the prompt as raw text instead of sending it as a user message.
    pub raw: bool,
    /// A PEFT LoRA adapter directory to apply to the model.
    pub adapter: Option<PathBuf>,
}

/// Samples `settings.n` completions of `prompt` from the model in `dir`, all at once (the
/// engine batches them), with top_k 20 and top_p 1.0 as everywhere in whale.
pub fn generate(dir: &Path, prompt: &str, settings: &GenerateSettings) -> Result<Vec<Completion>, LmError> {
    let policy = LocalPolicy::load(dir, DType::F32, &Device::Cpu, EngineConfig::default())?;
    if let Some(adapter_dir) = &settings.adapter {
        policy.reload(policy.decoder().with_peft_adapter(adapter_dir)?, 0)?;
    }
    let params = |i: usize| SamplingParams {
        max_tokens: settings.max_tokens,
        temperature: settings.temperature,
        seed: settings.seed.wrapping_add(i as u64),
        ..SamplingParams::default()
    };
    let completions = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..settings.n)
            .map(|i| {
                let policy = &policy;
                scope.spawn(move || {
                    if settings.raw {
                        policy.generate_text(prompt, &params(i))
                    } else {
                        let messages = vec![ChatMessage::new("user", prompt)];
                        policy.chat(ChatRequest { messages, params: params(i) })
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(Err(PolicyError::EngineStopped))).collect::<Result<Vec<_>, _>>()
    })?;
    policy.shutdown();
    Ok(completions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("sft.jsonl");
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn sft_records_are_read_and_bad_lines_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = r#"{"messages": [{"role": "user", "content": "2+2?"}], "completion": "4"}"#;
        let path = write(dir.path(), &format!("{good}\n\n{good}\n"));
        let records = read_sft_file(&path).expect("valid");
        assert_eq!(records.len(), 2);
        assert_eq!((records[0].line, records[1].line), (1, 3));
        assert_eq!(records[1].completion, "4");

        let bad = format!(
            "{good}\n{}\n{}\nnot json\n",
            r#"{"messages": [{"role": "user"}], "completion": "4"}"#,
            r#"{"messages": [{"role": "user", "content": "x"}], "completion": 4}"#
        );
        let path = write(dir.path(), &bad);
        let LmError::Records(problems) = read_sft_file(&path).expect_err("invalid") else { panic!("not records") };
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [2, 3, 4]);
        let shown = problems[0].to_string();
        assert!(shown.contains("sft.jsonl:2: field `messages`"), "{shown}");
        assert!(problems[1].to_string().contains("field `completion`"));
    }

    #[test]
    fn lora_settings_given_beside_a_resumed_adapter_must_be_its_own() {
        let stored = LoraConfig { rank: 4, ..LoraConfig::default() };
        let mut reordered = stored.clone();
        reordered.target_modules.reverse();
        assert!(check_same_lora(&reordered, &stored, Path::new("a")).is_ok(), "the order of targets does not matter");
        let other = LoraConfig { rank: 8, ..stored.clone() };
        let error = check_same_lora(&other, &stored, Path::new("runs/x/adapter")).expect_err("another rank");
        let text = error.to_string();
        assert!(text.contains("rank 8") && text.contains("rank 4") && text.contains("runs/x/adapter"), "{text}");
    }

    #[test]
    fn weight_step_samples_train_their_last_trainable_turn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sample = |trainable: &str, finish: &str| {
            format!(
                r#"{{"messages": [{{"role": "user", "content": "2+2?"}}, {{"role": "assistant", "content": "hm"}}, {{"role": "user", "content": "so?"}}, {{"role": "assistant", "content": "4"}}], "trainable": {trainable}, "finish_reason": "{finish}"}}"#
            )
        };
        let text = format!(
            "{}\n{}\n",
            sample("[false, false, false, true]", "stop"),
            sample("[false, true, false, false]", "length")
        );
        let records = read_sft_file(&write(dir.path(), &text)).expect("valid");
        assert_eq!(records[0].completion, "4");
        assert_eq!(records[0].messages.len(), 3, "every earlier turn is context");
        assert!(records[0].ends_turn);
        assert_eq!((records[1].completion.as_str(), records[1].messages.len()), ("hm", 1));
        assert!(!records[1].ends_turn, "a reply cut off at max_tokens did not end its turn");

        let bad = format!(
            "{}\n{}\n{}\n",
            sample("[false, false, false, false]", "stop"),
            sample("[false, false, true, false]", "stop"),
            sample("[true, true]", "stop")
        );
        let LmError::Records(problems) = read_sft_file(&write(dir.path(), &bad)).expect_err("invalid") else {
            panic!("not records")
        };
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(shown[0].contains("no trainable turn"), "{shown:?}");
        assert!(shown[1].contains("not an assistant reply"), "{shown:?}");
        assert!(shown[2].contains("2 flags for 4 messages"), "{shown:?}");
    }

    #[test]
    fn policy_gradient_samples_carry_their_tokens_and_a_file_holds_one_kind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let chat = r#""messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "trainable": [false, true]"#;
        let pg = |ids: &str, logprobs: &str| {
            format!(r#"{{{chat}, "advantage": -0.5, "completion_token_ids": {ids}, "behaviour_logprobs": {logprobs}}}"#)
        };
        let text = format!("{}\n", pg("[7, 2]", "[-0.1, -0.2]"));
        let records = read_sft_file(&write(dir.path(), &text)).expect("valid");
        let sampled = records[0].policy_gradient.clone().expect("policy-gradient fields");
        assert_eq!((sampled.advantage, sampled.token_ids, sampled.logprobs), (-0.5, vec![7, 2], vec![-0.1, -0.2]));

        let text = format!("{}\n{{{chat}}}\n{}\n", pg("[7, 2]", "[-0.1, -0.2]"), pg("[7, 2]", "[-0.1]"));
        let LmError::Records(problems) = read_sft_file(&write(dir.path(), &text)).expect_err("invalid") else {
            panic!("not records")
        };
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.iter().map(|p| p.line).collect::<Vec<_>>(), [2, 3], "{shown:?}");
        assert!(shown[0].contains("field `advantage`") && shown[0].contains("one kind"), "{shown:?}");
        assert!(shown[1].contains("field `behaviour_logprobs`") && shown[1].contains("1 for 2 token ids"), "{shown:?}");
    }
}
