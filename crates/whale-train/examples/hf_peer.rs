//! whale's half of `bench/hf_compare.py`: runs one workload file on a checkpoint and writes
//! what whale computed, so the script can set it beside transformers on the same inputs.
//!
//! `cargo run --release -p whale-train --example hf_peer -- MODEL_DIR WORKLOAD.json OUT.json`
//!
//! The workload (written by the script) holds chat conversations to render and tokenize, and
//! optionally: one token sequence to compute logits for (also through a LoRA adapter, when it
//! names one, and again with the checkpoint loaded in float64, when it asks), prompts to decode
//! greedily, the prompts of a concurrent generation run and the examples of a training step.
//! The output holds the rendered token ids and, for each part the workload has, the logits, the
//! greedy token ids, the generated token count and time, and the training time per step, of the
//! full weights and, when the workload gives a rank, of a fresh LoRA adapter.
//! `bench/smollm2_greedy.py` sends only conversations and greedy prompts.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};
use whale_core::ChatMessage;
use whale_engine::{EngineConfig, LocalPolicy};
use whale_lm::{LoraConfig, TrainableModel, WithTrainable};
use whale_policy::SamplingParams;
use whale_train::{SftExample, SftTrainer, TrainerConfig};

#[derive(Deserialize)]
struct Workload {
    conversations: Vec<Vec<ChatMessage>>,
    logits_input: Option<Vec<u32>>,
    /// A PEFT adapter directory to compute the same logits through.
    adapter: Option<PathBuf>,
    /// Also compute those logits with the checkpoint loaded in float64, where no f32 rounding
    /// hides a difference in what is computed.
    #[serde(default)]
    float64: bool,
    greedy: Option<GreedyWorkload>,
    generate: Option<GenerateWorkload>,
    train: Option<TrainWorkload>,
}

/// Prompts decoded greedily (temperature 0), all at once through the batching engine as rollouts
/// are, each until its end-of-turn token or `max_tokens`.
#[derive(Deserialize)]
struct GreedyWorkload {
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
}

#[derive(Deserialize)]
struct GenerateWorkload {
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    /// Timed repetitions; the median counts.
    repeats: usize,
}

#[derive(Deserialize)]
struct TrainWorkload {
    examples: Vec<TrainExample>,
    /// Examples per forward/backward pass (gradients accumulate over the step).
    micro_batch: usize,
    steps: usize,
    learning_rate: f64,
    /// The rank (and alpha) of a fresh adapter on all seven projections to time a LoRA step of;
    /// none leaves that timing out.
    lora_rank: Option<usize>,
    lora_alpha: Option<f64>,
    /// Whether to time a step of the full weights too (default true); a model whose full-weight
    /// step does not fit in memory is timed with its adapter alone.
    #[serde(default = "full_weights_by_default")]
    full_weights: bool,
}

fn full_weights_by_default() -> bool {
    true
}

impl TrainWorkload {
    /// Positions fed in a step, the throughput unit of both sides: every token of each example
    /// but its last.
    fn positions(&self) -> usize {
        self.examples.iter().map(|e| e.prompt.len() + e.completion.len() - 1).sum()
    }
}

#[derive(Deserialize)]
struct TrainExample {
    prompt: Vec<u32>,
    completion: Vec<u32>,
}

#[derive(Serialize)]
struct Results {
    chat_ids: Vec<Vec<u32>>,
    logits: Option<Logits>,
    adapter_logits: Option<Logits>,
    logits_f64: Option<Logits>,
    adapter_logits_f64: Option<Logits>,
    greedy_ids: Option<Vec<Vec<u32>>>,
    generate_tokens: Option<usize>,
    generate_seconds: Option<f64>,
    train_positions: Option<usize>,
    train_seconds_per_step: Option<f64>,
    train_loss: Option<f64>,
    lora_train_seconds_per_step: Option<f64>,
    lora_train_loss: Option<f64>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    whale_kernels::runtime::configure_cpu();
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [model_dir, workload_path, out_path] = args.as_slice() else {
        return Err("usage: hf_peer MODEL_DIR WORKLOAD.json OUT.json".into());
    };
    let workload: Workload = serde_json::from_slice(&std::fs::read(workload_path)?)?;
    let concurrent = |prompts: &[Vec<u32>]| prompts.len().max(1);
    let max_batch_size = [
        workload.generate.as_ref().map(|g| concurrent(&g.prompts)),
        workload.greedy.as_ref().map(|g| concurrent(&g.prompts)),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(1);
    let engine = EngineConfig { max_batch_size, ..EngineConfig::default() };
    let policy = LocalPolicy::load(model_dir, DType::F32, &Device::Cpu, engine)?;
    let chat_ids =
        workload.conversations.iter().map(|messages| policy.prompt_ids(messages)).collect::<Result<_, _>>()?;
    let (logits, adapter_logits) = workload_logits(&policy, &workload)?;
    let (logits_f64, adapter_logits_f64) = if workload.float64 {
        let wide = LocalPolicy::load(model_dir, DType::F64, &Device::Cpu, EngineConfig::default())?;
        workload_logits(&wide, &workload)?
    } else {
        (None, None)
    };
    let greedy_ids = workload.greedy.as_ref().map(|work| greedy(&policy, work)).transpose()?;
    let generation = workload.generate.as_ref().map(|work| time_generation(&policy, work)).transpose()?;
    let training = workload
        .train
        .as_ref()
        .filter(|work| work.full_weights)
        .map(|work| time_training(&policy, work, None))
        .transpose()?;
    let lora_timing = workload
        .train
        .as_ref()
        .and_then(|work| {
            let rank = work.lora_rank?;
            let lora =
                LoraConfig { rank, alpha: work.lora_alpha.unwrap_or(2.0 * rank as f64), ..LoraConfig::default() };
            Some(time_training(&policy, work, Some(lora)))
        })
        .transpose()?;
    let results = Results {
        chat_ids,
        logits,
        adapter_logits,
        logits_f64,
        adapter_logits_f64,
        greedy_ids,
        generate_tokens: generation.map(|(tokens, _)| tokens),
        generate_seconds: generation.map(|(_, seconds)| seconds),
        train_positions: workload.train.as_ref().map(TrainWorkload::positions),
        train_seconds_per_step: training.map(|(seconds, _)| seconds),
        train_loss: training.map(|(_, loss)| loss),
        lora_train_seconds_per_step: lora_timing.map(|(seconds, _)| seconds),
        lora_train_loss: lora_timing.map(|(_, loss)| loss),
    };
    std::fs::write(out_path, serde_json::to_vec(&results)?)?;
    Ok(())
}

/// The logits of the workload's sequence from `policy`'s model, and through its adapter when
/// it names one; none when it has no sequence.
fn workload_logits(policy: &LocalPolicy, workload: &Workload) -> Result<(Option<Logits>, Option<Logits>), BoxError> {
    let Some(ids) = &workload.logits_input else {
        return Ok((None, None));
    };
    let (plain, adapted) = policy.decoder().with_trainable(SequenceLogits { ids, adapter: &workload.adapter })?;
    Ok((Some(plain), adapted))
}

/// The logits `[T, vocab]` of one unpadded sequence from the training forward pass, and through
/// the PEFT adapter in `adapter` when there is one, for whichever architecture is served.
struct SequenceLogits<'a> {
    ids: &'a [u32],
    adapter: &'a Option<PathBuf>,
}

/// In f64 whatever the model's dtype: an f32 widens exactly.
type Logits = Vec<Vec<f64>>;

impl WithTrainable for SequenceLogits<'_> {
    type Output = Result<(Logits, Option<Logits>), BoxError>;

    fn run<M: TrainableModel>(self, model: M) -> Self::Output {
        let plain = sequence_logits(&model, self.ids)?;
        let adapted = match self.adapter {
            Some(dir) => Some(sequence_logits(&model.with_saved_adapter(dir)?, self.ids)?),
            None => None,
        };
        Ok((plain, adapted))
    }
}

fn sequence_logits(model: &impl TrainableModel, ids: &[u32]) -> Result<Logits, BoxError> {
    Ok(model.logits(&model.packed_hidden(&[ids])?)?.to_dtype(DType::F64)?.to_vec2()?)
}

/// The greedy token ids of every prompt (end-of-turn token included when it came), decoded
/// concurrently.
fn greedy(policy: &LocalPolicy, work: &GreedyWorkload) -> Result<Vec<Vec<u32>>, BoxError> {
    let params = SamplingParams { temperature: 0.0, max_tokens: work.max_tokens, ..SamplingParams::default() };
    let completions = std::thread::scope(|scope| {
        let handles: Vec<_> =
            work.prompts.iter().map(|prompt| scope.spawn(|| policy.generate(prompt.clone(), &params))).collect();
        handles.into_iter().map(|handle| handle.join()).collect::<Vec<_>>()
    });
    completions
        .into_iter()
        .map(|completion| Ok(completion.map_err(|_| "a generation thread panicked")??.token_ids))
        .collect()
}

/// All prompts generated at once by concurrent callers, after a short warm-up request; the
/// median time of `repeats` runs (each samples the same tokens, the seeds being the same).
fn time_generation(policy: &LocalPolicy, work: &GenerateWorkload) -> Result<(usize, f64), BoxError> {
    let params = |seed: u64| SamplingParams {
        temperature: work.temperature,
        top_k: work.top_k,
        top_p: work.top_p,
        max_tokens: work.max_tokens,
        seed,
        ..SamplingParams::default()
    };
    if let Some(first) = work.prompts.first() {
        policy.generate(first.clone(), &SamplingParams { max_tokens: 4, ..params(0) })?;
    }
    let mut times = Vec::with_capacity(work.repeats);
    let mut tokens = 0;
    for _ in 0..work.repeats.max(1) {
        let start = Instant::now();
        let completions = std::thread::scope(|scope| {
            let handles: Vec<_> = work
                .prompts
                .iter()
                .enumerate()
                .map(|(seed, prompt)| scope.spawn(move || policy.generate(prompt.clone(), &params(seed as u64))))
                .collect();
            handles.into_iter().map(|handle| handle.join()).collect::<Vec<_>>()
        });
        times.push(start.elapsed().as_secs_f64());
        tokens = 0;
        for completion in completions {
            tokens += completion.map_err(|_| "a generation thread panicked")??.completion_tokens;
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((tokens, times[times.len() / 2]))
}

/// Seconds per SFT step over the whole batch, after one warm-up step, and the last loss: of the
/// full weights, or of a fresh adapter of `lora`.
fn time_training(policy: &LocalPolicy, work: &TrainWorkload, lora: Option<LoraConfig>) -> Result<(f64, f64), BoxError> {
    let examples: Vec<SftExample> = work
        .examples
        .iter()
        .map(|example| SftExample { prompt: example.prompt.clone(), completion: example.completion.clone() })
        .collect();
    let longest = examples.iter().map(SftExample::tokens).max().unwrap_or(2);
    let config = TrainerConfig {
        learning_rate: work.learning_rate,
        warmup_steps: 0,
        micro_batch_size: work.micro_batch,
        max_seq_len: longest,
        ..TrainerConfig::default()
    };
    policy.decoder().with_trainable(TimedSteps { examples: &examples, config, steps: work.steps, lora })
}

/// `steps` SFT steps after one warm-up step, of the model or of a fresh adapter of `lora` on
/// it: seconds per step and the last loss.
struct TimedSteps<'a> {
    examples: &'a [SftExample],
    config: TrainerConfig,
    steps: usize,
    lora: Option<LoraConfig>,
}

impl WithTrainable for TimedSteps<'_> {
    type Output = Result<(f64, f64), BoxError>;

    fn run<M: TrainableModel>(self, model: M) -> Self::Output {
        let model = match &self.lora {
            Some(lora) => model.with_new_adapter(lora, 0)?,
            None => model,
        };
        let mut trainer = SftTrainer::new(model, self.config)?;
        trainer.step(self.examples)?;
        let start = Instant::now();
        let mut loss = f64::NAN;
        for _ in 0..self.steps {
            loss = trainer.step(self.examples)?.loss;
        }
        Ok((start.elapsed().as_secs_f64() / self.steps.max(1) as f64, loss))
    }
}
