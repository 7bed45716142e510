//! How fast the local policy runs on this machine, measured in one run so the numbers compare:
//! generation through the engine at several numbers of concurrent requests, SFT training
//! steps, and the machine's own f32 matmul ceiling, which turns each throughput into a
//! model-FLOPs utilisation (MFU).
//!
//! Model FLOPs count the useful arithmetic of the model, not what the implementation happens
//! to spend (padding, masked attention cells, the chunked form of the delta rule). With `B` the
//! parameters of the decoder layers' matrices (and Qwen3.5's depthwise convolutions), `H` those
//! of the LM head, `L` full-attention layers of `A` query heads of size `d`, and `R` the FLOPs of
//! one token through the delta-rule recurrences of Qwen3.5's Gated DeltaNet layers (0 for
//! Qwen3), a forward pass over `n` tokens at positions `p` (0-based, each attending to `p + 1`
//! keys) that computes logits for `m` of them costs
//! `2·B·n + 2·H·m + 4·L·A·d·Σ(p + 1) + R·n` (projections and MLP, LM head, `QKᵀ` and `PV`,
//! recurrences). Per layer of `V` value heads with `k`-by-`v` states, `R` counts three products
//! of a state with a vector (the read-out before the update, the rank-one update, the output):
//! `6·V·k·v`.
//! - Generation of `c` tokens after a prompt of `P`: the prompt and `c - 1` sampled tokens are
//!   fed and `c` logit rows computed, so `n = P + c - 1`, `m = c` — about `2·(B + H)` per
//!   token plus attention. Tokens/s counts generated tokens; the time includes the prefill.
//! - Training: backward costs twice the forward, so a step costs `3×` the forward FLOPs of
//!   its examples, about `6·B` per position; an example of `T` tokens feeds `T - 1` positions
//!   and scores its completion tokens (`m`). Tokens/s counts positions fed.
//!
//! Embedding lookups and norms are left out (no matmul). Without a model directory the bench
//! serves a fresh random model, built in memory: [`ModelSize::BASE`], or a Qwen3.5 of a
//! [`Qwen35Size`] such as Qwen3.5-0.8B's layers, with a byte-level BPE trained on text
//! generated here (arithmetic word problems over made-up names and items, see
//! [`synthetic_corpus`]), so it runs anywhere without downloads.

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use whale_policy::{PolicyError, SamplingParams};

use crate::chat_template::ChatTemplate;
use crate::decoder::Decoder;
use crate::engine::{EngineConfig, EngineError, LocalPolicy};
use crate::qwen3::config::{ModelSize, Qwen3Config};
use crate::qwen3::model::{ModelError, Qwen3Model};
use crate::qwen3_5::{parameter_shapes, LayerKind, Qwen35Config, Qwen35Model, Qwen35Size};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::train::{SftExample, SftTrainer, TrainError, TrainableModel, TrainerConfig};

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// A Hugging Face model directory (Qwen3 or Qwen3.5); `None` uses a random model.
    pub model_dir: Option<PathBuf>,
    /// The random model's shape: a Qwen3.5 of this size ([`random_qwen35`]), or `None` for the
    /// [`ModelSize::BASE`] Qwen3 ([`random_model`]).
    pub random_qwen35: Option<Qwen35Size>,
    /// The numbers of concurrent requests to time generation at.
    pub batch_sizes: Vec<usize>,
    /// Prompt length of each generation request.
    pub prompt_tokens: usize,
    /// Tokens each generation request asks for (fewer when it samples an end token).
    pub new_tokens: usize,
    /// Examples of each timed SFT step, all of the same prompt and completion lengths.
    pub train_examples: usize,
    pub train_prompt_tokens: usize,
    pub train_completion_tokens: usize,
    /// Timed SFT steps, after one untimed warm-up step; 0 leaves the training row out.
    pub train_steps: usize,
    /// Side of the square f32 matrices multiplied to find the ceiling, and how many products
    /// to time (the fastest counts).
    pub matmul_size: usize,
    pub matmul_repeats: usize,
    /// Vocabulary size of the tokenizer trained for the random model.
    pub random_vocab_size: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            model_dir: None,
            random_qwen35: None,
            batch_sizes: vec![1, 8, 64],
            prompt_tokens: 32,
            new_tokens: 64,
            train_examples: 16,
            train_prompt_tokens: 32,
            train_completion_tokens: 96,
            train_steps: 2,
            matmul_size: 1024,
            matmul_repeats: 20,
            random_vocab_size: 8192,
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
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("a generation thread panicked")]
    ThreadPanicked,
}

/// One measured workload.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub workload: String,
    /// Generated tokens (generation) or positions fed (training).
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// Model FLOPs (see the module documentation) per second.
    pub flops_per_second: f64,
    /// `flops_per_second` over the measured matmul ceiling.
    pub mfu: f64,
    /// What else explains the number (requests, decode batch sizes, loss).
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
        Ok(())
    }
}

/// Runs every measurement on `device` in f32 and returns the table (print it with `{}`). The
/// matmul ceiling is timed before and after the workloads and the best counts, so a moment of
/// contention on a shared machine does not lower it.
///
/// The SFT steps (of either architecture, through [`SftTrainer`]) update the served model's
/// weights in memory (nothing is written to disk), so they run after the generation
/// measurements.
pub fn run_bench(config: &BenchConfig, device: &Device) -> Result<BenchTable, BenchError> {
    validate(config)?;
    let ceiling_before = matmul_ceiling(config.matmul_size, config.matmul_repeats, device)?;
    let (policy, model_name) = bench_policy(config, device)?;
    let decoder = policy.decoder();
    let flops = FlopModel::new(&decoder);
    let text_ids = corpus_ids(policy.tokenizer(), config.prompt_tokens.max(config.train_prompt_tokens) * 64)?;
    let mut rows = Vec::new();
    for &batch in &config.batch_sizes {
        rows.push(generation_row(&policy, &flops, &text_ids, batch, config)?);
    }
    if config.train_steps > 0 {
        rows.push(match &decoder {
            Decoder::Qwen3(model) => training_row(model, &flops, &text_ids, config)?,
            Decoder::Qwen35(model) => training_row(model, &flops, &text_ids, config)?,
        });
    }
    let ceiling_after = matmul_ceiling(config.matmul_size, config.matmul_repeats, device)?;
    let matmul_flops_per_second = ceiling_before.max(ceiling_after);
    for row in &mut rows {
        row.mfu = row.flops_per_second / matmul_flops_per_second;
    }
    Ok(BenchTable {
        model: model_name,
        device: format!("{device:?}"),
        parameters: parameter_count(&decoder),
        matmul_flops_per_second,
        matmul_size: config.matmul_size,
        rows,
    })
}

fn validate(config: &BenchConfig) -> Result<(), BenchError> {
    let positive = [
        ("prompt_tokens", config.prompt_tokens),
        ("new_tokens", config.new_tokens),
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
    let max_batch_size = config.batch_sizes.iter().copied().max().unwrap_or(1);
    let engine = EngineConfig { max_batch_size, ..EngineConfig::default() };
    if let Some(dir) = &config.model_dir {
        let policy = LocalPolicy::load(dir, DType::F32, device, engine)?;
        return Ok((policy, dir.display().to_string()));
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
    Ok((LocalPolicy::new(model, tokenizer, ChatTemplate::chatml(), engine)?, name))
}

/// The byte-level BPE of `vocab_size` ids that every random model uses, trained on the
/// synthetic text (seeded, so every bench and `whale lm random` get the same one).
fn random_tokenizer(vocab_size: usize) -> Result<Tokenizer, BenchError> {
    let corpus = synthetic_corpus(20_000, 7);
    Ok(Tokenizer::train_bpe(corpus.iter().map(String::as_str), vocab_size)?)
}

/// The model a bench measures when given none: [`ModelSize::BASE`] with random weights (seed
/// 7) and [`random_tokenizer`]'s BPE, and its description.
pub fn random_model(vocab_size: usize, device: &Device) -> Result<(Tokenizer, Qwen3Model, String), BenchError> {
    let tokenizer = random_tokenizer(vocab_size)?;
    let config = Qwen3Config::with_size(tokenizer.vocab_size(), ModelSize::BASE);
    let model = Qwen3Model::new_random(&config, 7, DType::F32, device)?;
    let name = format!("random ModelSize::BASE, vocabulary {}", tokenizer.vocab_size());
    Ok((tokenizer, model, name))
}

/// [`random_tokenizer`]'s BPE under a random Qwen3.5 of `size` (seed 7) in `dtype`, as long a
/// context as [`random_model`]'s, and its description: what `whale lm random --shape qwen3.5-tiny`
/// (or `qwen3.5-0.8b`) writes. Only the vocabulary is whale's: Qwen3.5-0.8B's layers sit on
/// this BPE instead of their own 248,320 tokens.
pub fn random_qwen35(
    vocab_size: usize,
    size: Qwen35Size,
    dtype: DType,
    device: &Device,
) -> Result<(Tokenizer, Qwen35Model, String), BenchError> {
    let tokenizer = random_tokenizer(vocab_size)?;
    let mut config = Qwen35Config::text(tokenizer.vocab_size(), size);
    config.max_position_embeddings =
        Qwen3Config::with_size(tokenizer.vocab_size(), ModelSize::BASE).max_position_embeddings;
    let model = Qwen35Model::new_random(&config, 7, dtype, device)?;
    let shape = if size == Qwen35Size::QWEN3_5_0_8B { "Qwen3.5-0.8B's layer shape: " } else { "" };
    let name = format!(
        "random Qwen3.5 ({shape}{} wide, {} layers), vocabulary {}",
        size.hidden_size,
        size.num_hidden_layers,
        tokenizer.vocab_size()
    );
    Ok((tokenizer, model, name))
}

/// All parameters of the model, embeddings included (and the LM head when not tied).
fn parameter_count(decoder: &Decoder) -> usize {
    match decoder {
        Decoder::Qwen3(model) => model.config().parameter_count(),
        Decoder::Qwen35(model) => qwen35_parameter_count(model.config()),
    }
}

fn qwen35_parameter_count(config: &Qwen35Config) -> usize {
    parameter_shapes(config).iter().map(|(_, shape)| shape.iter().product::<usize>()).sum()
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

/// `batch` concurrent requests, each continuing its own window of `text_ids`.
fn generation_row(
    policy: &LocalPolicy,
    flops: &FlopModel,
    text_ids: &[u32],
    batch: usize,
    config: &BenchConfig,
) -> Result<BenchRow, BenchError> {
    let prompt = |index: usize| {
        let start = (index * 7) % (text_ids.len() - config.prompt_tokens);
        text_ids[start..start + config.prompt_tokens].to_vec()
    };
    let params = |seed: u64| SamplingParams { max_tokens: config.new_tokens, seed, ..SamplingParams::default() };
    policy.generate(prompt(0), &SamplingParams { max_tokens: 4, ..params(0) })?;
    let before = policy.stats();
    let start = Instant::now();
    let completions = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..batch)
            .map(|index| scope.spawn(move || policy.generate(prompt(index), &params(index as u64))))
            .collect();
        handles.into_iter().map(|handle| handle.join().map_err(|_| BenchError::ThreadPanicked)).collect::<Vec<_>>()
    });
    let seconds = start.elapsed().as_secs_f64();
    let after = policy.stats();
    let (mut tokens, mut model_flops) = (0, 0.0);
    for completion in completions {
        let completion = completion??;
        tokens += completion.completion_tokens;
        model_flops += flops.generation(completion.prompt_tokens, completion.completion_tokens);
    }
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

/// `train_steps` timed [`SftTrainer::step`]s on one mini-batch, after a warm-up step.
fn training_row<M: TrainableModel>(
    model: &M,
    flops: &FlopModel,
    text_ids: &[u32],
    config: &BenchConfig,
) -> Result<BenchRow, BenchError> {
    let (prompt, completion) = (config.train_prompt_tokens, config.train_completion_tokens);
    let total = prompt + completion;
    let examples: Vec<SftExample> = (0..config.train_examples)
        .map(|index| {
            let start = (index * 13) % text_ids.len().saturating_sub(total).max(1);
            let window: Vec<u32> = text_ids.iter().cycle().skip(start).take(total).copied().collect();
            SftExample { prompt: window[..prompt].to_vec(), completion: window[prompt..].to_vec() }
        })
        .collect();
    let trainer_config = TrainerConfig {
        micro_batch_size: config.train_examples,
        max_seq_len: total,
        learning_rate: 1e-5,
        ..TrainerConfig::default()
    };
    let mut trainer = SftTrainer::new(model.clone(), trainer_config)?;
    trainer.step(&examples)?;
    let start = Instant::now();
    let mut last = None;
    for _ in 0..config.train_steps {
        last = Some(trainer.step(&examples)?);
    }
    let seconds = start.elapsed().as_secs_f64();
    let positions = config.train_steps * config.train_examples * (total - 1);
    let model_flops = (config.train_steps * config.train_examples) as f64 * flops.training(total, completion);
    let loss = last.map(|stats| stats.loss).unwrap_or(f64::NAN);
    Ok(BenchRow {
        workload: format!("SFT step, {} examples", config.train_examples),
        tokens: positions,
        seconds,
        tokens_per_second: positions as f64 / seconds,
        flops_per_second: model_flops / seconds,
        mfu: 0.0,
        detail: format!(
            "{} steps of {} x ({prompt} prompt + {completion} completion) tokens, one micro-batch; loss {loss:.3}",
            config.train_steps, config.train_examples
        ),
    })
}

/// The per-token FLOP counts of the module documentation.
struct FlopModel {
    /// Parameters of the decoder layers' matrices (and depthwise convolutions).
    body: f64,
    /// Parameters of the LM head.
    head: f64,
    /// FLOPs of one query attending to one key, all full-attention layers and heads: `4·L·A·d`.
    attention_per_key: f64,
    /// FLOPs of one token through every delta-rule recurrence: `R`.
    recurrence_per_token: f64,
}

impl FlopModel {
    fn new(decoder: &Decoder) -> Self {
        match decoder {
            Decoder::Qwen3(model) => Self::qwen3(model.config()),
            Decoder::Qwen35(model) => Self::qwen35(model.config()),
        }
    }

    fn qwen3(config: &Qwen3Config) -> Self {
        let (h, d) = (config.hidden_size as f64, config.head_dim as f64);
        let (heads, kv_heads) = (config.num_attention_heads as f64, config.num_key_value_heads as f64);
        let layers = config.num_hidden_layers as f64;
        let attention = h * d * (2.0 * heads + 2.0 * kv_heads);
        let mlp = 3.0 * h * config.intermediate_size as f64;
        Self {
            body: layers * (attention + mlp),
            head: config.vocab_size as f64 * h,
            attention_per_key: 4.0 * layers * heads * d,
            recurrence_per_token: 0.0,
        }
    }

    /// The layers' parameters of more than one dimension are their matrices (the full-attention
    /// query projection's output gate among them) and convolutions.
    fn qwen35(config: &Qwen35Config) -> Self {
        let body: usize = parameter_shapes(config)
            .iter()
            .filter(|(name, shape)| name.contains("layers.") && shape.len() > 1)
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum();
        let layers = |kind| config.layer_types.iter().filter(|&&k| k == kind).count() as f64;
        let state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim;
        let query_width = config.num_attention_heads * config.head_dim;
        Self {
            body: body as f64,
            head: (config.vocab_size * config.hidden_size) as f64,
            attention_per_key: 4.0 * layers(LayerKind::FullAttention) * query_width as f64,
            recurrence_per_token: 6.0 * layers(LayerKind::LinearAttention) * state as f64,
        }
    }

    /// A forward pass over positions `0..fed` computing `scored` logit rows.
    fn forward(&self, fed: usize, scored: usize) -> f64 {
        let fed_f = fed as f64;
        let keys = fed_f * (fed_f + 1.0) / 2.0;
        (2.0 * self.body + self.recurrence_per_token) * fed_f
            + 2.0 * self.head * scored as f64
            + self.attention_per_key * keys
    }

    fn generation(&self, prompt: usize, generated: usize) -> f64 {
        self.forward(prompt + generated.saturating_sub(1), generated)
    }

    fn training(&self, example_len: usize, completion: usize) -> f64 {
        3.0 * self.forward(example_len - 1, completion)
    }
}

/// `lines` lines of generated text: arithmetic word problems with their
/// worked answers, over made-up names and items, reproducible from `seed`. The made-up words
/// give a byte-level BPE thousands of merges to learn.
pub fn synthetic_corpus(lines: usize, seed: u64) -> Vec<String> {
    SyntheticText::new(seed).take(lines).collect()
}

struct SyntheticText {
    rng: ChaCha8Rng,
}

const SYLLABLES: [&str; 32] = [
    "ka", "lo", "mi", "ra", "ten", "vo", "shi", "ne", "pa", "dor", "el", "qu", "an", "bri", "sol", "ta", "ve", "ny",
    "ost", "ru", "li", "gar", "po", "emb", "ci", "fa", "hu", "jo", "wen", "zi", "ard", "um",
];
const VERBS: [(&str, &str); 4] = [("buys", "+"), ("finds", "+"), ("gives away", "-"), ("sells", "-")];

impl SyntheticText {
    fn new(seed: u64) -> Self {
        Self { rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    fn word(&mut self) -> String {
        let syllables = self.rng.gen_range(2..=4);
        (0..syllables).map(|_| *SYLLABLES.choose(&mut self.rng).unwrap_or(&"a")).collect()
    }

    fn capitalized(&mut self) -> String {
        let word = self.word();
        let mut chars = word.chars();
        chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or(word)
    }
}

impl Iterator for SyntheticText {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        let (name, item) = (self.capitalized(), self.word());
        let (verb, sign) = *VERBS.choose(&mut self.rng).unwrap_or(&VERBS[0]);
        let first: u32 = self.rng.gen_range(10..1000);
        let second: u32 = self.rng.gen_range(1..first);
        let answer = if sign == "+" { first + second } else { first - second };
        Some(format!(
            "{name} has {first} {item}s. {name} {verb} {second} {item}s. How many {item}s does {name} have now? \
             {first} {sign} {second} = {answer}. The answer is {answer}."
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flop_model_counts_every_matrix_once() {
        let config = Qwen3Config::base(1000);
        let flops = FlopModel::qwen3(&config);
        let (h, d, layers) = (config.hidden_size, config.head_dim, config.num_hidden_layers);
        let norms = layers * (2 * h + 2 * d) + h;
        // Tied embeddings: the LM head is the embedding matrix, counted once by the config.
        assert_eq!(flops.body as usize + flops.head as usize + norms, config.parameter_count());
        let per_key = 4.0 * (layers * config.num_attention_heads * d) as f64;
        let expected = 2.0 * flops.body * 3.0 + 2.0 * flops.head * 2.0 + per_key * (1.0 + 2.0 + 3.0);
        assert_eq!(flops.forward(3, 2), expected);
        assert_eq!(flops.generation(2, 2), expected);
        assert_eq!(flops.training(4, 2), 3.0 * expected);
    }

    #[test]
    fn the_qwen3_5_flop_model_counts_every_matrix_once_and_each_recurrence() {
        let config = Qwen35Config::text(1000, Qwen35Size::QWEN3_5_0_8B);
        let flops = FlopModel::qwen35(&config);
        let (h, d, heads, kv) = (1024, 256, 8, 2);
        let (key_heads, value_heads, state_dim) = (16, 16, 128);
        let (qkv, value_dim) = ((2 * key_heads + value_heads) * state_dim, value_heads * state_dim);
        let mlp = 3 * h * 3584;
        // In: q, k, v; the gate z; b and a, one per value head. Then the width-4 convolution of
        // q, k, v, and the output projection.
        let linear = h * (qkv + value_dim + 2 * value_heads) + qkv * 4 + value_dim * h;
        // The query with its output gate, key, value, output.
        let full = h * (2 * heads * d + 2 * kv * d) + heads * d * h;
        assert_eq!(flops.body as usize, 18 * (linear + mlp) + 6 * (full + mlp));
        assert_eq!(flops.head as usize, 1000 * h);
        // Norms (two per layer, q and k norms, the gated norm), dt_bias and A_log, the final norm.
        let vectors = 24 * 2 * h + 6 * 2 * d + 18 * (state_dim + 2 * value_heads) + h;
        let embeddings = 1000 * h;
        let all = flops.body as usize + flops.head as usize + vectors + embeddings;
        assert_eq!(all, qwen35_parameter_count(&config));
        assert_eq!(flops.attention_per_key, (4 * 6 * heads * d) as f64);
        assert_eq!(flops.recurrence_per_token, (6 * 18 * value_heads * state_dim * state_dim) as f64);
        let expected = (2.0 * flops.body + flops.recurrence_per_token) * 3.0
            + 2.0 * flops.head * 2.0
            + flops.attention_per_key * (1.0 + 2.0 + 3.0);
        assert_eq!(flops.forward(3, 2), expected);
    }

    #[test]
    fn the_synthetic_corpus_is_reproducible_and_its_sums_are_right() {
        let corpus = synthetic_corpus(200, 3);
        assert_eq!(corpus, synthetic_corpus(200, 3));
        assert_ne!(corpus, synthetic_corpus(200, 4));
        for line in &corpus {
            let worked = line.split("? ").nth(1).and_then(|rest| rest.split('.').next()).expect("worked answer");
            let parts: Vec<&str> = worked.split(' ').collect();
            let [first, sign, second, "=", answer] = parts[..] else { panic!("unexpected line {line:?}") };
            let (first, second, answer): (i64, i64, i64) =
                (first.parse().expect("number"), second.parse().expect("number"), answer.parse().expect("number"));
            let expected = if sign == "+" { first + second } else { first - second };
            assert_eq!(answer, expected, "{line}");
            assert!(answer >= 0 && line.ends_with(&format!("The answer is {answer}.")));
        }
    }

    #[test]
    fn bad_configurations_are_refused_before_any_work() {
        let no_batches = BenchConfig { batch_sizes: vec![], ..BenchConfig::default() };
        assert!(matches!(run_bench(&no_batches, &Device::Cpu), Err(BenchError::Config { key: "batch_sizes", .. })));
        let no_tokens = BenchConfig { new_tokens: 0, ..BenchConfig::default() };
        assert!(matches!(run_bench(&no_tokens, &Device::Cpu), Err(BenchError::Config { key: "new_tokens", .. })));
    }
}
