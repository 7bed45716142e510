//! The `whale lm` commands on local checkpoints: turning chat data into training examples with a
//! model's own tokenizer and chat template, supervised fine-tuning from an `sft.jsonl` (of the
//! whole model or of a LoRA adapter), merging an adapter into its base, and sampling completions.
//!
//! A checkpoint directory is the Hugging Face layout written by whale (`config.json`,
//! `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` with the chat template), so the
//! same code serves the pretrained base model and every model trained from it. An adapter
//! directory is PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`) and applies to
//! the base it was trained on.

use candle_core::{DType, Device};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::{Path, PathBuf};
use whale_core::ChatMessage;
use whale_lm::{
    load_model, save_model, stored_dtype, ChatCodec, ChatCodecError, ChatRequest, ChatTemplateError, CheckpointError,
    Completion, EngineConfig, EngineError, GenerationConfig, LocalPolicy, LoraAdapter, LoraConfig, LoraError,
    ModelError, Policy, PolicyError, Qwen3Config, SamplingParams, SftExample, SftTrainer, TokenizerError, TrainError,
    TrainerConfig,
};
use whale_loop::scale_out::external_weights::Sample;
use whale_tasks::{read_jsonl, RecordError};

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
}

impl From<LoraError> for LmError {
    fn from(error: LoraError) -> Self {
        Self::Lora(Box::new(error))
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
}

impl SftRecord {
    pub fn example(&self, codec: &ChatCodec) -> Result<SftExample, LmError> {
        Ok(codec.example_ending(&self.messages, &self.completion, self.ends_turn)?)
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
            Ok((messages, completion, ends_turn)) => records.push(SftRecord { line, messages, completion, ends_turn }),
            Err((field, reason)) => problems.push(RecordError::new(path, line, Some(field), reason)),
        }
    }
    if problems.is_empty() {
        Ok(records)
    } else {
        problems.sort_by_key(|p| p.line);
        Err(LmError::Records(problems))
    }
}

type ParsedRecord = (Vec<ChatMessage>, String, bool);

fn parse_messages(value: &serde_json::Value) -> Result<Vec<ChatMessage>, (&'static str, String)> {
    let messages = value.get("messages").ok_or(("messages", "missing".to_string()))?;
    serde_json::from_value(messages.clone())
        .map_err(|e| ("messages", format!("expected a list of {{role, content}} strings: {e}")))
}

/// A `samples.jsonl` line: the last trainable turn is the completion.
fn parse_sample(value: &serde_json::Value) -> Result<ParsedRecord, (&'static str, String)> {
    let sample: Sample = serde_json::from_value(value.clone()).map_err(|e| ("samples.jsonl line", e.to_string()))?;
    let reply = sample.reply()?;
    Ok((reply.context, reply.completion, reply.ends_turn))
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
    Ok((messages, completion, true))
}

/// Settings of `whale lm train`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SftSettings {
    pub epochs: usize,
    pub learning_rate: f64,
    /// Examples per optimizer step.
    pub batch_size: usize,
    /// Shuffles the examples each epoch (and draws a new adapter's initial matrices).
    pub seed: u64,
    /// Train a new LoRA adapter with these settings instead of the whole model.
    pub lora: Option<LoraConfig>,
    /// Continue the LoRA run saved in this adapter directory (its settings, matrices and
    /// optimizer state); `lora`, if given, must match its settings.
    pub resume_adapter: Option<PathBuf>,
    /// Take the examples in the file's order instead of shuffling them.
    pub keep_order: bool,
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
/// `on_step` sees every step.
pub fn train_sft(
    model_dir: &Path,
    data: &Path,
    output: &Path,
    settings: &SftSettings,
    on_step: &mut dyn FnMut(&whale_lm::StepStats, u64),
) -> Result<SftReport, LmError> {
    if settings.epochs == 0 || settings.batch_size == 0 {
        return Err(LmError::Invalid("epochs and batch size must be at least 1".to_string()));
    }
    let records = read_sft_file(data)?;
    let codec = ChatCodec::load(model_dir)?;
    let examples: Vec<SftExample> = records.iter().map(|record| record.example(&codec)).collect::<Result<_, _>>()?;
    let model = load_model(model_dir, DType::F32, &Device::Cpu)?;
    let config = TrainerConfig {
        learning_rate: settings.learning_rate,
        warmup_steps: 1,
        pad_token_id: codec.tokenizer.specials().endoftext,
        max_seq_len: model.config().max_position_embeddings,
        ..TrainerConfig::default()
    };
    let mut trainer = match (&settings.resume_adapter, &settings.lora) {
        (Some(dir), lora) => {
            let trainer = SftTrainer::resume_adapter(dir, &model, config)?;
            if let (Some(given), Some(adapter)) = (lora, trainer.model().adapter()) {
                check_same_lora(given, adapter.config(), dir)?;
            }
            trainer
        }
        (None, Some(lora)) => {
            let adapter = LoraAdapter::new(lora.clone(), model.config(), settings.seed, DType::F32, &Device::Cpu)?;
            SftTrainer::new(model.with_adapter(&adapter)?, config)?
        }
        (None, None) => SftTrainer::new(model, config)?,
    };
    let (loss_before, _) = trainer.evaluate(&examples)?;
    let steps_per_epoch = examples.len().div_ceil(settings.batch_size) as u64;
    let total_steps = trainer.state().step + steps_per_epoch * settings.epochs as u64;
    for _ in 0..settings.epochs {
        let mut rng = ChaCha8Rng::seed_from_u64(settings.seed);
        rng.set_stream(trainer.state().step);
        let mut order: Vec<&SftExample> = examples.iter().collect();
        if !settings.keep_order {
            order.shuffle(&mut rng);
        }
        for chunk in order.chunks(settings.batch_size) {
            let batch: Vec<SftExample> = chunk.iter().map(|&e| e.clone()).collect();
            let stats = trainer.step(&batch)?;
            on_step(&stats, total_steps);
        }
    }
    let (loss_after, _) = trainer.evaluate(&examples)?;
    let adapter = trainer.model().adapter().map(LoraAdapter::parameter_count);
    if adapter.is_some() {
        trainer.save_adapter(
            output,
            &std::path::absolute(model_dir).unwrap_or(model_dir.to_path_buf()).display().to_string(),
        )?;
    } else {
        save_model(trainer.model(), &generation_config(model_dir, trainer.model().config())?, output)?;
        ChatCodec::copy_files(model_dir, output)?;
    }
    Ok(SftReport {
        examples: examples.len(),
        steps: trainer.state().step,
        trained_parameters: adapter.unwrap_or_else(|| trainer.model().config().parameter_count()),
        adapter: adapter.is_some(),
        loss_before,
        loss_after,
        output: output.to_path_buf(),
    })
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

/// The sampling defaults of a checkpoint directory, or whale's for its model.
fn generation_config(dir: &Path, config: &Qwen3Config) -> Result<GenerationConfig, LmError> {
    Ok(GenerationConfig::load(dir)?.unwrap_or_else(|| GenerationConfig::for_model(config)))
}

/// Folds the PEFT adapter in `adapter_dir` into the model in `base_dir` and writes the result
/// to `output` as a full checkpoint in the base's dtype, with the base's generation config and
/// tokenizer files. Returns the number of projections the adapter changed.
pub fn merge_adapter(base_dir: &Path, adapter_dir: &Path, output: &Path) -> Result<usize, LmError> {
    let config =
        Qwen3Config::from_file(&base_dir.join(whale_lm::checkpoint::CONFIG_FILE)).map_err(CheckpointError::from)?;
    let base = load_model(base_dir, stored_dtype(&config), &Device::Cpu)?;
    let adapter = LoraAdapter::load_peft(adapter_dir, base.config(), base.dtype(), base.device())?;
    let merged = base.with_adapter(&adapter)?.merged()?;
    save_model(&merged, &generation_config(base_dir, base.config())?, output)?;
    ChatCodec::copy_files(base_dir, output)?;
    Ok(adapter.targets().len() * adapter.num_layers())
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
        let base = policy.model();
        let adapter = LoraAdapter::load_peft(adapter_dir, base.config(), base.dtype(), base.device())?;
        policy.reload(base.with_adapter(&adapter)?, 0)?;
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
}
