//! How fast the local policy runs on this machine, measured in one run so the numbers compare:
//! prefill of a batch of long prompts, generation through the engine at several numbers of
//! concurrent requests, SFT training steps of the full weights and of a LoRA adapter, the
//! machine's own f32 matmul ceiling, which turns each throughput into a model-FLOPs
//! utilisation (MFU), and the process's peak resident memory.
//!
//! Model FLOPs count the useful arithmetic of the model, not what the implementation happens
//! to spend: each architecture gives its own counts ([`FlopCounts`], from whale-lm's
//! `Architecture::flop_counts`: `B` parameters in the layers' matrices, `H` in the LM head, and
//! the cost of a forward pass over `n` tokens that computes `m` logit rows), so nothing here
//! names an architecture.
//! - Generation of `c` tokens after a prompt of `P`: the prompt and `c - 1` sampled tokens are
//!   fed and `c` logit rows computed, so `n = P + c - 1`, `m = c` — about `2·(B + H)` per
//!   token plus attention. Tokens/s counts generated tokens; the time includes the prefill.
//! - Prefill: requests that ask for one token each, so the time is almost all the forward pass
//!   over their prompts (`n = P`, `m = 1`). Tokens/s counts prompt tokens fed.
//! - Training: backward costs twice the forward, so a step costs `3×` the forward FLOPs of
//!   its examples, about `6·B` per position; an example of `T` tokens feeds `T - 1` positions
//!   and scores its completion tokens (`m`). Tokens/s counts positions fed. A LoRA step needs
//!   no gradient of the frozen weights, only of the activations, so it costs `2×` the forward
//!   (the adapter's own small products, a few per cent at rank 16, are not counted).
//!
//! The peak resident set size (Linux's `VmHWM`) is the whole process's high-water mark over
//! every workload above (the training steps' activations and optimizer state usually set it):
//! what decides whether a model of this size fits a machine.
//!
//! Without a model directory the bench serves a fresh random model, built in memory
//! (whale-lm's [`whale_lm::random`]): [`ModelSize::BASE`](whale_lm::ModelSize::BASE), or a
//! Qwen3.5 of a [`Qwen35Size`] such as Qwen3.5-0.8B's layers, with a byte-level BPE trained on
//! generated text, so it runs anywhere without downloads.
//!
//! It lives in the `whale` crate because it measures the engine (whale-engine) and the trainer
//! (whale-train) side by side, and neither of those crates depends on the other.

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use whale_engine::{EngineConfig, EngineError, EngineStats, LocalPolicy};
use whale_lm::qwen3_5::Qwen35Size;
use whale_lm::random::{random_model, random_qwen35, RandomModelError, SyntheticText};
use whale_lm::{Decoder, FlopCounts, LoraConfig, ModelError, TrainableError, TrainableModel, WithTrainable};
use whale_policy::{Completion, Policy, PolicyError, SamplingParams};
use whale_text::{ChatTemplate, Tokenizer, TokenizerError};
use whale_train::{SftExample, SftTrainer, TrainError, TrainerConfig};

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// A Hugging Face model directory of any registered architecture; `None` uses a random
    /// model.
    pub model_dir: Option<PathBuf>,
    /// The random model's shape: a Qwen3.5 of this size ([`random_qwen35`]), or `None` for the
    /// [`ModelSize::BASE`](whale_lm::ModelSize::BASE) Qwen3 ([`random_model`]).
    pub random_qwen35: Option<Qwen35Size>,
    /// The numbers of concurrent requests to time generation at.
    pub batch_sizes: Vec<usize>,
    /// Prompt length of each generation request.
    pub prompt_tokens: usize,
    /// Tokens each generation request asks for (fewer when it samples an end token).
    pub new_tokens: usize,
    /// The prefill row: this many concurrent requests, each a prompt of
    /// `prefill_prompt_tokens` asking for one token.
    pub prefill_requests: usize,
    pub prefill_prompt_tokens: usize,
    /// Most prompt tokens the engine prefills in one pass (a run config's `[model]
    /// max_prefill_tokens`).
    pub max_prefill_tokens: usize,
    /// Examples of each timed SFT step, all of the same prompt and completion lengths.
    pub train_examples: usize,
    /// Examples per forward and backward pass of a step (gradients accumulate over the step's
    /// micro-batches); 0 runs the whole step as one.
    pub train_micro_batch: usize,
    pub train_prompt_tokens: usize,
    pub train_completion_tokens: usize,
    /// Timed SFT steps of each training row, after one untimed warm-up step; 0 leaves the
    /// training rows out.
    pub train_steps: usize,
    /// Whether to time the full-weight training row (a model too big to train whole here is
    /// benched with its LoRA row only).
    pub full_weights: bool,
    /// Rank of the adapter of the LoRA training row (the other LoRA settings are
    /// [`LoraConfig::default`]'s); 0 leaves that row out.
    pub lora_rank: usize,
    /// Side of the square f32 matrices multiplied to find the ceiling, and how many products
    /// to time (the fastest counts).
    pub matmul_size: usize,
    pub matmul_repeats: usize,
    /// Vocabulary size of the tokenizer trained for the random model.
    pub random_vocab_size: usize,
    /// Decode from 8-bit copies of the weights ([`EngineConfig::quantized`]).
    pub quantized: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            model_dir: None,
            random_qwen35: None,
            batch_sizes: vec![1, 8, 64],
            prompt_tokens: 32,
            new_tokens: 64,
            prefill_requests: 8,
            prefill_prompt_tokens: 256,
            max_prefill_tokens: EngineConfig::default().max_prefill_tokens,
            train_examples: 16,
            train_micro_batch: 0,
            train_prompt_tokens: 32,
            train_completion_tokens: 96,
            train_steps: 2,
            full_weights: true,
            lora_rank: 16,
            matmul_size: 1024,
            matmul_repeats: 20,
            random_vocab_size: 8192,
            quantized: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bench config `{key}`: {reason}")]
    Config { key: &'static str, reason: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Trainable(#[from] TrainableError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Random(#[from] RandomModelError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// One measured workload.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub workload: String,
    /// Prompt tokens fed (prefill), generated tokens (generation) or positions fed (training).
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// Model FLOPs (see the module documentation) per second.
    pub flops_per_second: f64,
    /// `flops_per_second` over the measured matmul ceiling.
    pub mfu: f64,
    /// What else explains the number (requests, prefill and decode batch sizes, loss).
    pub detail: String,
}

/// The results of one [`run_bench`].
#[derive(Debug, Clone, PartialEq)]
pub struct BenchTable {
    /// Which model ran, in words.
    pub model: String,
    pub device: String,
    /// All parameters, embeddings included.
    pub parameters: usize,
    /// The fastest f32 matmul, timed before and after the workloads, in FLOP/s.
    pub matmul_flops_per_second: f64,
    pub matmul_size: usize,
    pub rows: Vec<BenchRow>,
    /// The process's peak resident set size in bytes, read after the workloads; `None` where
    /// the system does not say (it is read from Linux's `/proc/self/status`).
    pub peak_rss_bytes: Option<u64>,
    /// Seconds from a weight update to the first token through new Q8_0 copies of the weights
    /// (`quantized` runs only): what every weight update adds to a run that samples from them.
    pub quantize_seconds: Option<f64>,
}

impl fmt::Display for BenchTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "model: {} ({:.2}M parameters) on {}", self.model, self.parameters as f64 / 1e6, self.device)?;
        let n = self.matmul_size;
        writeln!(f, "f32 matmul ceiling ({n}x{n}, best): {:.1} GFLOP/s", self.matmul_flops_per_second / 1e9)?;
        writeln!(f, "| workload | tokens | seconds | tokens/s | GFLOP/s | MFU | detail |")?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---|")?;
        for row in &self.rows {
            writeln!(
                f,
                "| {} | {} | {:.2} | {:.1} | {:.2} | {:.1}% | {} |",
                row.workload,
                row.tokens,
                row.seconds,
                row.tokens_per_second,
                row.flops_per_second / 1e9,
                100.0 * row.mfu,
                row.detail
            )?;
        }
        if let Some(seconds) = self.quantize_seconds {
            writeln!(f, "a weight update to its first token (new Q8_0 copies of the weights): {seconds:.2} s")?;
        }
        match self.peak_rss_bytes {
            Some(bytes) => writeln!(f, "peak RSS (VmHWM): {:.1} MiB", bytes as f64 / (1024.0 * 1024.0)),
            None => writeln!(f, "peak RSS: unknown (no VmHWM in /proc/self/status on this system)"),
        }
    }
}

/// Runs every measurement on `device` in f32 and returns the table (print it with `{}`). The
/// matmul ceiling is timed before and after the workloads and the best counts, so a moment of
/// contention on a shared machine does not lower it.
///
/// The full-weight SFT steps (of any architecture, through [`SftTrainer`]) update the served
/// model's weights in memory (nothing is written to disk), so they run after the prefill and
/// generation measurements; the LoRA steps train a fresh adapter on the weights they left.
pub fn run_bench(config: &BenchConfig, device: &Device) -> Result<BenchTable, BenchError> {
    validate(config)?;
    let ceiling_before = matmul_ceiling(config.matmul_size, config.matmul_repeats, device)?;
    let (policy, model_name) = bench_policy(config, device)?;
    let decoder = policy.decoder();
    let flops = FlopModel(decoder.flop_counts());
    let longest_prompt = config.prompt_tokens.max(config.prefill_prompt_tokens).max(config.train_prompt_tokens);
    let text_ids = corpus_ids(policy.tokenizer(), longest_prompt * 64)?;
    let mut rows = vec![prefill_row(&policy, &flops, &text_ids, config)?];
    for &batch in &config.batch_sizes {
        rows.push(generation_row(&policy, &flops, &text_ids, batch, config)?);
    }
    if config.train_steps > 0 {
        let row = |lora| TrainingRow { flops: &flops, text_ids: &text_ids, config, lora };
        if config.full_weights {
            rows.push(decoder.with_trainable(row(None))?);
        }
        if config.lora_rank > 0 {
            let lora = LoraConfig { rank: config.lora_rank, ..LoraConfig::default() };
            rows.push(decoder.with_trainable(row(Some(lora)))?);
        }
    }
    let quantize_seconds = config.quantized.then(|| remake_time(&policy, &text_ids)).transpose()?;
    let ceiling_after = matmul_ceiling(config.matmul_size, config.matmul_repeats, device)?;
    let matmul_flops_per_second = ceiling_before.max(ceiling_after);
    for row in &mut rows {
        row.mfu = row.flops_per_second / matmul_flops_per_second;
    }
    Ok(BenchTable {
        model: model_name,
        device: format!("{device:?}"),
        parameters: decoder.parameter_count(),
        matmul_flops_per_second,
        matmul_size: config.matmul_size,
        rows,
        peak_rss_bytes: peak_rss_bytes(),
        quantize_seconds,
    })
}

/// Seconds from a weight update to its first token: the engine drops its Q8_0 copies, makes
/// new ones and feeds a one-token prompt through them (candle lays a copy out for its kernels
/// on its first product), as after every weight step of a quantized run.
fn remake_time(policy: &LocalPolicy, text_ids: &[u32]) -> Result<f64, BenchError> {
    let start = Instant::now();
    policy.set_weights_version(policy.weights_version() + 1)?;
    policy.generate(text_ids[..1].to_vec(), &SamplingParams { max_tokens: 1, ..SamplingParams::default() })?;
    Ok(start.elapsed().as_secs_f64())
}

fn validate(config: &BenchConfig) -> Result<(), BenchError> {
    let positive = [
        ("prompt_tokens", config.prompt_tokens),
        ("new_tokens", config.new_tokens),
        ("prefill_requests", config.prefill_requests),
        ("prefill_prompt_tokens", config.prefill_prompt_tokens),
        ("max_prefill_tokens", config.max_prefill_tokens),
        ("train_examples", config.train_examples),
        ("train_prompt_tokens", config.train_prompt_tokens),
        ("train_completion_tokens", config.train_completion_tokens),
        ("matmul_size", config.matmul_size),
        ("matmul_repeats", config.matmul_repeats),
    ];
    if let Some((key, _)) = positive.iter().find(|(_, value)| *value == 0) {
        return Err(BenchError::Config { key, reason: "must be positive".to_string() });
    }
    if config.batch_sizes.is_empty() || config.batch_sizes.contains(&0) {
        return Err(BenchError::Config { key: "batch_sizes", reason: "must be positive numbers".to_string() });
    }
    Ok(())
}

/// The fastest of `repeats` products of two random `size x size` f32 matrices, in FLOP/s.
fn matmul_ceiling(size: usize, repeats: usize, device: &Device) -> Result<f64, BenchError> {
    let a = Tensor::randn(0f32, 1.0, (size, size), device)?;
    let b = Tensor::randn(0f32, 1.0, (size, size), device)?;
    a.matmul(&b)?;
    device.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        let start = Instant::now();
        let product = a.matmul(&b)?;
        device.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
        drop(product);
    }
    Ok(2.0 * (size as f64).powi(3) / best)
}

/// The engine to measure and its description.
fn bench_policy(config: &BenchConfig, device: &Device) -> Result<(LocalPolicy, String), BenchError> {
    let max_batch_size = config.batch_sizes.iter().copied().chain([config.prefill_requests]).max().unwrap_or(1);
    let engine = EngineConfig {
        max_batch_size,
        max_prefill_tokens: config.max_prefill_tokens,
        quantized: config.quantized,
        ..EngineConfig::default()
    };
    if let Some(dir) = &config.model_dir {
        let policy = LocalPolicy::load(dir, DType::F32, device, engine)?;
        return Ok((policy, with_decoding(dir.display().to_string(), config.quantized)));
    }
    let (model, tokenizer, name): (Decoder, _, _) = match config.random_qwen35 {
        Some(size) => {
            let (tokenizer, model, name) = random_qwen35(config.random_vocab_size, size, DType::F32, device)?;
            (model.into(), tokenizer, name)
        }
        None => {
            let (tokenizer, model, name) = random_model(config.random_vocab_size, device)?;
            (model.into(), tokenizer, name)
        }
    };
    Ok((LocalPolicy::new(model, tokenizer, ChatTemplate::chatml(), engine)?, with_decoding(name, config.quantized)))
}

/// The model's description, saying when it decodes from 8-bit copies.
fn with_decoding(name: String, quantized: bool) -> String {
    if quantized {
        format!("{name}, decoding from Q8_0 copies")
    } else {
        name
    }
}

/// At least `len` token ids of generated text, for prompts and training examples.
fn corpus_ids(tokenizer: &Tokenizer, len: usize) -> Result<Vec<u32>, BenchError> {
    let mut ids = Vec::with_capacity(len);
    for line in SyntheticText::new(11) {
        if ids.len() >= len {
            break;
        }
        ids.extend(tokenizer.encode(&line)?);
    }
    Ok(ids)
}

/// What `requests` concurrent requests gave: their completions, the wall time they took
/// together, and the engine's counters before and after.
struct Concurrent {
    completions: Vec<Completion>,
    seconds: f64,
    before: EngineStats,
    after: EngineStats,
}

/// The tokens a row counts (`counted` of each completion) and the model FLOPs of generating
/// every completion, prompt included.
fn totals(completions: &[Completion], flops: &FlopModel, counted: impl Fn(&Completion) -> usize) -> (usize, f64) {
    let tokens = completions.iter().map(&counted).sum();
    let model_flops = completions.iter().map(|c| flops.generation(c.prompt_tokens, c.completion_tokens)).sum();
    (tokens, model_flops)
}

/// `requests` concurrent requests, each a prompt of `prompt_tokens` from its own window of
/// `text_ids` and asking for `max_tokens`, after one untimed request that warms the engine up.
/// They reach the engine together ([`LocalPolicy::generate_batch`]), so the batches measured
/// are those asked for, not those that threads' timing happened to form.
fn concurrent_requests(
    policy: &LocalPolicy,
    text_ids: &[u32],
    requests: usize,
    prompt_tokens: usize,
    max_tokens: usize,
) -> Result<Concurrent, BenchError> {
    let prompt = |index: usize| {
        let start = (index * 7) % (text_ids.len() - prompt_tokens);
        text_ids[start..start + prompt_tokens].to_vec()
    };
    let params = |seed: u64| SamplingParams { max_tokens, seed, ..SamplingParams::default() };
    policy.generate(prompt(0), &SamplingParams { max_tokens: max_tokens.min(4), ..params(0) })?;
    let before = policy.stats();
    let start = Instant::now();
    let batch: Vec<_> = (0..requests).map(|index| (prompt(index), params(index as u64))).collect();
    let completions = policy.generate_batch(&batch);
    let seconds = start.elapsed().as_secs_f64();
    let after = policy.stats();
    let completions = completions.into_iter().collect::<Result<_, _>>()?;
    Ok(Concurrent { completions, seconds, before, after })
}

/// `prefill_requests` concurrent requests of `prefill_prompt_tokens` each, asking for one
/// token: the forward pass over the prompts, counted in prompt tokens.
fn prefill_row(
    policy: &LocalPolicy,
    flops: &FlopModel,
    text_ids: &[u32],
    config: &BenchConfig,
) -> Result<BenchRow, BenchError> {
    let (requests, prompt_tokens) = (config.prefill_requests, config.prefill_prompt_tokens);
    let Concurrent { completions, seconds, before, after } =
        concurrent_requests(policy, text_ids, requests, prompt_tokens, 1)?;
    let (tokens, model_flops) = totals(&completions, flops, |completion| completion.prompt_tokens);
    let prefill_calls = after.prefill_calls - before.prefill_calls;
    let mean_rows = (after.prefill_rows - before.prefill_rows) as f64 / prefill_calls.max(1) as f64;
    Ok(BenchRow {
        workload: format!("prefill, {requests} requests"),
        tokens,
        seconds,
        tokens_per_second: tokens as f64 / seconds,
        flops_per_second: model_flops / seconds,
        mfu: 0.0,
        detail: format!(
            "{requests} x {prompt_tokens} prompt tokens, 1 sampled; {prefill_calls} prefill calls of {mean_rows:.1} rows on average"
        ),
    })
}

/// `batch` concurrent requests, each continuing its own window of `text_ids`.
fn generation_row(
    policy: &LocalPolicy,
    flops: &FlopModel,
    text_ids: &[u32],
    batch: usize,
    config: &BenchConfig,
) -> Result<BenchRow, BenchError> {
    let Concurrent { completions, seconds, before, after } =
        concurrent_requests(policy, text_ids, batch, config.prompt_tokens, config.new_tokens)?;
    let (tokens, model_flops) = totals(&completions, flops, |completion| completion.completion_tokens);
    let decode_calls = (after.decode_calls - before.decode_calls).max(1);
    let mean_batch = (after.decode_rows - before.decode_rows) as f64 / decode_calls as f64;
    Ok(BenchRow {
        workload: format!("generate, {batch} concurrent"),
        tokens,
        seconds,
        tokens_per_second: tokens as f64 / seconds,
        flops_per_second: model_flops / seconds,
        mfu: 0.0,
        detail: format!(
            "{batch} x ({} prompt + {} asked) tokens; {decode_calls} decode steps of {mean_batch:.1} rows on average",
            config.prompt_tokens, config.new_tokens
        ),
    })
}

/// `train_steps` timed [`SftTrainer::step`]s on one mini-batch, after a warm-up step, of
/// whichever architecture the engine serves ([`Decoder::with_trainable`]): of all its weights,
/// or of a new adapter of `lora` ([`TrainableModel::with_new_adapter`]).
struct TrainingRow<'a> {
    flops: &'a FlopModel,
    text_ids: &'a [u32],
    config: &'a BenchConfig,
    lora: Option<LoraConfig>,
}

impl WithTrainable for TrainingRow<'_> {
    type Output = Result<BenchRow, BenchError>;

    fn run<M: TrainableModel>(self, model: M) -> Self::Output {
        match &self.lora {
            Some(lora) => training_row(model.with_new_adapter(lora, 0)?, &self),
            None => training_row(model, &self),
        }
    }
}

fn training_row<M: TrainableModel>(model: M, row: &TrainingRow<'_>) -> Result<BenchRow, BenchError> {
    let TrainingRow { flops, text_ids, config, .. } = *row;
    let (prompt, completion) = (config.train_prompt_tokens, config.train_completion_tokens);
    let total = prompt + completion;
    let examples: Vec<SftExample> = (0..config.train_examples)
        .map(|index| {
            let start = (index * 13) % text_ids.len().saturating_sub(total).max(1);
            let window: Vec<u32> = text_ids.iter().cycle().skip(start).take(total).copied().collect();
            SftExample { prompt: window[..prompt].to_vec(), completion: window[prompt..].to_vec() }
        })
        .collect();
    let micro_batch = if config.train_micro_batch == 0 { config.train_examples } else { config.train_micro_batch };
    let trainer_config = TrainerConfig {
        micro_batch_size: micro_batch,
        max_seq_len: total,
        learning_rate: 1e-5,
        ..TrainerConfig::default()
    };
    let mut trainer = SftTrainer::new(model, trainer_config)?;
    trainer.step(&examples)?;
    let start = Instant::now();
    let mut last = None;
    for _ in 0..config.train_steps {
        last = Some(trainer.step(&examples)?);
    }
    let seconds = start.elapsed().as_secs_f64();
    let positions = config.train_steps * config.train_examples * (total - 1);
    let (weights, example_flops) = match &row.lora {
        Some(lora) => (format!("LoRA rank {}", lora.rank), flops.lora_training(total, completion)),
        None => ("full weights".to_string(), flops.training(total, completion)),
    };
    let model_flops = (config.train_steps * config.train_examples) as f64 * example_flops;
    let loss = last.map(|stats| stats.loss).unwrap_or(f64::NAN);
    Ok(BenchRow {
        workload: format!("SFT step ({weights}), {} examples", config.train_examples),
        tokens: positions,
        seconds,
        tokens_per_second: positions as f64 / seconds,
        flops_per_second: model_flops / seconds,
        mfu: 0.0,
        detail: format!(
            "{} steps of {} x ({prompt} prompt + {completion} completion) tokens, micro-batches of {micro_batch}; loss {loss:.3}",
            config.train_steps, config.train_examples
        ),
    })
}

/// The architecture's per-token counts, applied to the bench's workloads.
struct FlopModel(FlopCounts);

impl FlopModel {
    /// A forward pass over positions `0..fed` computing `scored` logit rows.
    fn forward(&self, fed: usize, scored: usize) -> f64 {
        self.0.forward(fed, scored)
    }

    fn generation(&self, prompt: usize, generated: usize) -> f64 {
        self.forward(prompt + generated.saturating_sub(1), generated)
    }

    fn training(&self, example_len: usize, completion: usize) -> f64 {
        3.0 * self.forward(example_len - 1, completion)
    }

    fn lora_training(&self, example_len: usize, completion: usize) -> f64 {
        2.0 * self.forward(example_len - 1, completion)
    }
}

/// The process's peak resident set size in bytes, where `/proc/self/status` says it.
fn peak_rss_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status").ok().as_deref().and_then(vm_hwm_bytes)
}

/// The `VmHWM:   123456 kB` line of a `/proc/<pid>/status`, in bytes.
fn vm_hwm_bytes(status: &str) -> Option<u64> {
    let value = status.lines().find_map(|line| line.strip_prefix("VmHWM:"))?;
    let kib: u64 = value.trim().strip_suffix("kB")?.trim_end().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_and_training_cost_the_forward_passes_of_the_module_documentation() {
        let counts = FlopCounts { body: 5.0, head: 3.0, attention_per_key: 2.0, recurrence_per_token: 7.0 };
        let flops = FlopModel(counts);
        // Three positions fed, two logit rows: (2·5 + 7)·3 + 2·3·2 + 2·(1 + 2 + 3).
        let expected = 17.0 * 3.0 + 12.0 + 12.0;
        assert_eq!(flops.forward(3, 2), expected);
        assert_eq!(flops.generation(2, 2), expected);
        assert_eq!(flops.training(4, 2), 3.0 * expected);
        assert_eq!(flops.lora_training(4, 2), 2.0 * expected);
    }

    #[test]
    fn the_peak_resident_set_size_is_read_from_vm_hwm_in_bytes() {
        assert_eq!(
            vm_hwm_bytes("Name:\twhale\nVmPeak:\t  900 kB\nVmHWM:\t    1536 kB\nVmRSS:\t 1024 kB\n"),
            Some(1536 * 1024)
        );
        assert_eq!(vm_hwm_bytes("Name:\twhale\nVmRSS:\t 1024 kB\n"), None, "no VmHWM line");
        assert_eq!(vm_hwm_bytes("VmHWM:\t 12 MB\n"), None, "a unit other than kB");
        if cfg!(target_os = "linux") {
            let status = std::fs::read_to_string("/proc/self/status").expect("Linux has /proc/self/status");
            let peak = vm_hwm_bytes(&status).expect("a VmHWM line");
            assert!(peak > 1024 * 1024, "this test binary alone keeps more than 1 MiB resident: {peak}");
            let later = peak_rss_bytes().expect("the same file read again");
            assert!(later >= peak, "a high-water mark only rises: {later} after {peak}");
        }
    }

    #[test]
    fn bad_configurations_are_refused_before_any_work() {
        let no_batches = BenchConfig { batch_sizes: vec![], ..BenchConfig::default() };
        assert!(matches!(run_bench(&no_batches, &Device::Cpu), Err(BenchError::Config { key: "batch_sizes", .. })));
        let no_tokens = BenchConfig { new_tokens: 0, ..BenchConfig::default() };
        assert!(matches!(run_bench(&no_tokens, &Device::Cpu), Err(BenchError::Config { key: "new_tokens", .. })));
        let no_prefill = BenchConfig { prefill_prompt_tokens: 0, ..BenchConfig::default() };
        let refused = run_bench(&no_prefill, &Device::Cpu).expect_err("an empty prefill prompt");
        assert!(refused.to_string().contains("`prefill_prompt_tokens`"), "{refused}");
        let no_pass = BenchConfig { max_prefill_tokens: 0, ..BenchConfig::default() };
        assert!(matches!(run_bench(&no_pass, &Device::Cpu), Err(BenchError::Config { key: "max_prefill_tokens", .. })));
    }
}
