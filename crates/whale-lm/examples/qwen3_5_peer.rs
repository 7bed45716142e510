//! whale's half of `bench/qwen3_5_compare.py`: runs one workload on a Qwen3.5 checkpoint and
//! writes what whale computed, for the script to set beside transformers.
//!
//! `cargo run --release -p whale-lm --example qwen3_5_peer -- MODEL_DIR WORKLOAD.json OUT.json`
//!
//! The workload holds one token sequence to compute logits for (the full pass), prompts to
//! decode greedily through the cached decoding step, sequences for a timed training step and,
//! optionally, a directory for a LoRA adapter trained on them. The output holds the logits, the
//! greedy tokens with the decoding time, the step time and the logits through the adapter.
//! With `save_dir`, the full weights are saved there after the training steps: that is how
//! `bench/qwen3_5_vllm.py` makes a trained checkpoint, whose greedy choices are not near-ties.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use serde::{Deserialize, Serialize};
use whale_lm::{load_qwen35, qwen3_5, save_qwen35, LoraConfig, Qwen35Lora, Qwen35Model, Qwen35Step};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Deserialize)]
struct Workload {
    /// Empty for none.
    logits_input: Vec<u32>,
    greedy_prompts: Vec<Vec<u32>>,
    greedy_tokens: usize,
    /// The dtype to load the model in: "f32" (the default) or "bf16".
    dtype: Option<String>,
    train_sequences: Vec<Vec<u32>>,
    train_steps: usize,
    /// The training steps' learning rate (default 1e-4, small enough to time a step without
    /// changing the model much).
    train_lr: Option<f64>,
    /// Sequences per training step, taken in turn from `train_sequences` (default: all of them
    /// in every step).
    train_batch: Option<usize>,
    /// Where to save the full weights after the training steps.
    save_dir: Option<PathBuf>,
    /// Where to save a LoRA adapter trained here on `train_sequences` (every Qwen3.5 module,
    /// rank 4), whose logits of `logits_input` the output then holds too.
    adapter_dir: Option<PathBuf>,
}

#[derive(Serialize)]
struct Output {
    logits: Vec<Vec<f32>>,
    greedy: Vec<Vec<u32>>,
    greedy_seconds: f64,
    train_step_seconds: f64,
    /// The last training step's loss (null without training steps).
    train_loss: Option<f32>,
    adapter_logits: Option<Vec<Vec<f32>>>,
}

fn greedy(model: &Qwen35Model, prompt: &[u32], count: usize) -> Result<Vec<u32>, BoxError> {
    let mut cache = model.new_cache()?;
    let mut logits = model.forward_step(&mut [Qwen35Step { tokens: prompt, cache: &mut cache }])?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let next = logits.argmax(D::Minus1)?.to_vec1::<u32>()?[0];
        out.push(next);
        logits = model.forward_step(&mut [Qwen35Step { tokens: &[next], cache: &mut cache }])?;
    }
    Ok(out)
}

/// Trains an adapter of every module for a few steps, saves it in `dir` and returns the
/// logits of `ids` through it.
fn adapter_logits(model: &Qwen35Model, work: &Workload, dir: &Path) -> Result<Vec<Vec<f32>>, BoxError> {
    let targets = qwen3_5::lora::TARGET_MODULES.map(String::from).to_vec();
    let lora = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, target_modules: targets };
    let adapter = Qwen35Lora::new(lora, model.config(), 5, model.dtype(), model.device())?;
    let adapted = model.with_adapter(&adapter)?;
    let vars = adapter.named_parameters().into_iter().map(|(_, var)| var).collect();
    train(&adapted, vars, &work.train_sequences, work.train_sequences.len(), 5, 1e-2)?;
    adapter.save_peft(dir, "tiny-qwen3.5")?;
    Ok(adapted.logits(&adapted.packed_hidden(&[&work.logits_input])?)?.to_vec2::<f32>()?)
}

/// Seconds per AdamW step of the next-token loss on `vars`, each step over the next `batch`
/// sequences, packed; and the last step's loss (none without steps).
fn train(
    model: &Qwen35Model,
    vars: Vec<Var>,
    sequences: &[Vec<u32>],
    batch: usize,
    steps: usize,
    lr: f64,
) -> Result<(f64, Option<f32>), BoxError> {
    let mut optimizer = AdamW::new(vars, ParamsAdamW { lr, ..Default::default() })?;
    let batches: Vec<&[Vec<u32>]> = sequences.chunks(batch.max(1)).collect();
    if batches.is_empty() && steps > 0 {
        return Err("training steps were asked for without train_sequences".into());
    }
    let (started, mut last_loss) = (Instant::now(), None);
    for step in 0..steps {
        let batch = batches[step % batches.len()];
        let inputs: Vec<&[u32]> = batch.iter().map(|s| &s[..s.len() - 1]).collect();
        let targets: Vec<u32> = batch.iter().flat_map(|s| s[1..].to_vec()).collect();
        let targets = Tensor::from_vec(targets, (inputs.iter().map(|s| s.len()).sum::<usize>(), 1), model.device())?;
        let logits = model.logits(&model.packed_hidden(&inputs)?)?;
        let loss = candle_nn::ops::log_softmax(&logits, D::Minus1)?.gather(&targets, 1)?.mean_all()?.neg()?;
        optimizer.backward_step(&loss)?;
        last_loss = Some(loss.to_dtype(DType::F32)?.to_scalar::<f32>()?);
    }
    Ok((started.elapsed().as_secs_f64() / steps.max(1) as f64, last_loss))
}

fn main() -> Result<(), BoxError> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [model_dir, workload, out] = args.as_slice() else {
        return Err("usage: qwen3_5_peer MODEL_DIR WORKLOAD.json OUT.json".into());
    };
    let workload: Workload = serde_json::from_str(&std::fs::read_to_string(workload)?)?;
    let dtype = match workload.dtype.as_deref() {
        None | Some("f32") => DType::F32,
        Some("bf16") => DType::BF16,
        Some(other) => return Err(format!("dtype {other:?} is neither f32 nor bf16").into()),
    };
    let model = load_qwen35(model_dir, dtype, &Device::Cpu)?;
    let logits = if workload.logits_input.is_empty() {
        Vec::new()
    } else {
        model.logits(&model.packed_hidden(&[&workload.logits_input])?)?.to_vec2::<f32>()?
    };
    let started = Instant::now();
    let greedy = (workload.greedy_prompts.iter())
        .map(|prompt| greedy(&model, prompt, workload.greedy_tokens))
        .collect::<Result<_, _>>()?;
    let greedy_seconds = started.elapsed().as_secs_f64();
    let adapter_logits =
        workload.adapter_dir.as_deref().map(|dir| adapter_logits(&model, &workload, dir)).transpose()?;
    let vars = model.named_parameters().into_iter().map(|(_, var)| var).collect();
    let batch = workload.train_batch.unwrap_or(workload.train_sequences.len());
    let lr = workload.train_lr.unwrap_or(1e-4);
    let (train_step_seconds, train_loss) =
        train(&model, vars, &workload.train_sequences, batch, workload.train_steps, lr)?;
    if let Some(dir) = &workload.save_dir {
        save_qwen35(&model, dir)?;
    }
    let output = Output { logits, greedy, greedy_seconds, train_step_seconds, train_loss, adapter_logits };
    std::fs::write(out, serde_json::to_string(&output)?)?;
    Ok(())
}
