//! Shared helpers of the whale-lm integration tests (whale-engine's and whale-train's include this
//! file too): small models, decoding loops, and an
//! independent, index-by-index f64 implementation of the dense decoder's forward pass (Qwen3's,
//! and Llama's without the query and key norms).
#![allow(dead_code)]

pub mod qwen3_5;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use whale_lm::{
    DenseConfig, DenseModel, DenseSettings, KvCache, LlamaConfig, LlamaModel, LoraAdapter, LoraConfig, ModelSize,
    Qwen2Config, Qwen2Model, Qwen3Config, Qwen3Model, SeqStep,
};

pub const VOCAB: usize = 61;

/// The tiny configuration with a small vocabulary; `rope_theta` kept small so that positions
/// change the rotary angles noticeably within a few tokens.
pub fn tiny_config(tied: bool) -> Qwen3Config {
    let mut config = Qwen3Config::tiny(VOCAB);
    config.tie_word_embeddings = tied;
    config.rope_theta = 10_000.0;
    config
}

/// Llama's tiny configuration: the shape and vocabulary of [`tiny_config`], no per-head norms
/// of queries and keys.
pub fn tiny_llama_config(tied: bool) -> LlamaConfig {
    let mut config = LlamaConfig::with_size(VOCAB, ModelSize::TINY);
    config.tie_word_embeddings = tied;
    config
}

/// [`tiny_model`] of Llama's architecture.
pub fn tiny_llama(tied: bool, seed: u64) -> LlamaModel {
    let mut config = tiny_llama_config(tied);
    config.initializer_range = 0.2;
    LlamaModel::new_random(&config, seed, DType::F32, &Device::Cpu).unwrap()
}

/// [`tiny_model`] of Qwen2's architecture (no per-head norms; query, key and value biases). The
/// biases start at zero in a random model as in Hugging Face's; here they are drawn like the
/// weights, so that a reference that left them out would differ.
pub fn tiny_qwen2(tied: bool, seed: u64) -> Qwen2Model {
    let mut config = Qwen2Config::with_size(VOCAB, ModelSize::TINY);
    config.tie_word_embeddings = tied;
    config.rope_theta = 10_000.0;
    config.initializer_range = 0.2;
    let model = Qwen2Model::new_random(&config, seed, DType::F32, &Device::Cpu).unwrap();
    let mut rng = rng(seed);
    for (name, var) in model.named_parameters() {
        if name.ends_with(".bias") {
            let values: Vec<f32> = (0..var.elem_count()).map(|_| rng.gen_range(-0.5..0.5)).collect();
            var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap()).unwrap();
        }
    }
    model
}

/// A tiny model whose weights are larger than the HF initialisation so that logits vary
/// clearly with the input (std 0.02 makes every distribution almost uniform).
pub fn tiny_model(tied: bool, seed: u64) -> Qwen3Model {
    let mut config = tiny_config(tied);
    config.initializer_range = 0.2;
    Qwen3Model::new_random(&config, seed, DType::F32, &Device::Cpu).unwrap()
}

/// A LoRA config of `rank` on `targets`, alpha twice the rank.
pub fn lora(rank: usize, targets: &[&str]) -> LoraConfig {
    LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
        ..LoraConfig::default()
    }
}

/// A fresh adapter of `config` for `model`, drawn from `seed`.
pub fn adapter_for<C: DenseConfig>(model: &DenseModel<C>, config: LoraConfig, seed: u64) -> LoraAdapter {
    LoraAdapter::new(config, model.config(), seed, DType::F32, &Device::Cpu).unwrap()
}

pub fn random_tokens(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..VOCAB as u32)).collect()
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Logits `[T, V]` of one unpadded sequence through the training path.
pub fn full_logits<C: DenseConfig>(model: &DenseModel<C>, tokens: &[u32]) -> Vec<Vec<f32>> {
    let ids = Tensor::from_vec(tokens.to_vec(), (1, tokens.len()), &Device::Cpu).unwrap();
    let mask = Tensor::ones((1, tokens.len()), DType::U8, &Device::Cpu).unwrap();
    let logits = model.forward_train(&ids, &mask).unwrap();
    logits.squeeze(0).unwrap().to_vec2::<f32>().unwrap()
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (index, &value) in row.iter().enumerate() {
        if value > row[best] {
            best = index;
        }
    }
    best as u32
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Greedy decoding that recomputes the whole sequence every step; returns the new tokens and
/// the logits each was chosen from.
pub fn greedy_without_cache<C: DenseConfig>(
    model: &DenseModel<C>,
    prompt: &[u32],
    new_tokens: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut tokens = prompt.to_vec();
    let mut chosen_from = Vec::new();
    for _ in 0..new_tokens {
        let last = full_logits(model, &tokens).pop().unwrap();
        tokens.push(argmax(&last));
        chosen_from.push(last);
    }
    (tokens[prompt.len()..].to_vec(), chosen_from)
}

/// Greedy decoding through the KV cache: one prefill, then one token per step.
pub fn greedy_with_cache<C: DenseConfig>(
    model: &DenseModel<C>,
    prompt: &[u32],
    new_tokens: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = model.new_cache();
    let mut feed = prompt.to_vec();
    let mut generated = Vec::new();
    let mut chosen_from = Vec::new();
    for _ in 0..new_tokens {
        let row = step_one(model, &feed, &mut cache);
        let next = argmax(&row);
        generated.push(next);
        chosen_from.push(row);
        feed = vec![next];
    }
    (generated, chosen_from)
}

/// One sequence alone through `forward_step`: the logits of the chunk's last token.
pub fn step_one<C: DenseConfig>(model: &DenseModel<C>, tokens: &[u32], cache: &mut KvCache) -> Vec<f32> {
    let mut steps = [SeqStep { tokens, cache }];
    let logits = model.forward_step(&mut steps).unwrap();
    logits.squeeze(0).unwrap().to_vec1::<f32>().unwrap()
}

/// A model's weights as flat f32 vectors by name.
pub fn weights_of<C: DenseConfig>(model: &DenseModel<C>) -> HashMap<String, Vec<f32>> {
    model
        .named_parameters()
        .into_iter()
        .map(|(name, var)| {
            let values = var.as_tensor().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (name, values)
        })
        .collect()
}

/// The dense decoder's forward pass written out index by index in f64, following the
/// `transformers` modelling code of Qwen3 (and of Llama where `config.qk_norm` is off, and of
/// Qwen2 where `config.qkv_bias` is on), rotating by the settings' inverse frequencies: returns
/// `[T, V]` logits of one sequence.
#[allow(clippy::needless_range_loop)] // the indices mirror the formulas
pub fn reference_logits(config: &DenseSettings, weights: &HashMap<String, Vec<f32>>, tokens: &[u32]) -> Vec<Vec<f64>> {
    let w = |name: &str| -> &Vec<f32> { &weights[name] };
    let (h, d) = (config.hidden_size, config.head_dim);
    let (heads, kv_heads) = (config.num_attention_heads, config.num_key_value_heads);
    let eps = config.rms_norm_eps;
    let mut states: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            let row = &w("model.embed_tokens.weight")[t as usize * h..(t as usize + 1) * h];
            row.iter().map(|&x| x as f64).collect()
        })
        .collect();
    for layer in 0..config.num_hidden_layers {
        let p = |name: &str| format!("model.layers.{layer}.{name}.weight");
        let normed: Vec<Vec<f64>> = states.iter().map(|x| rms_norm(x, w(&p("input_layernorm")), eps)).collect();
        // Qwen2 adds a bias to the query, key and value projections.
        let project = |name: &str, x: &[f64], out: usize| {
            let mut projected = matvec(w(&p(name)), x, out);
            if config.qkv_bias && name != "self_attn.o_proj" {
                let bias = w(&format!("model.layers.{layer}.{name}.bias"));
                projected.iter_mut().zip(bias).for_each(|(value, &b)| *value += b as f64);
            }
            projected
        };
        let split =
            |v: Vec<f64>, n: usize| -> Vec<Vec<f64>> { (0..n).map(|i| v[i * d..(i + 1) * d].to_vec()).collect() };
        let mut q = Vec::new();
        let mut k = Vec::new();
        let mut v = Vec::new();
        for (position, x) in normed.iter().enumerate() {
            // Qwen3 normalises each head of the queries and keys; Llama does not.
            let head_norm = |head: &Vec<f64>, name: &str| match config.qk_norm {
                true => rms_norm(head, w(&p(name)), eps),
                false => head.clone(),
            };
            let qh: Vec<Vec<f64>> = split(project("self_attn.q_proj", x, heads * d), heads)
                .iter()
                .map(|head| rope(&head_norm(head, "self_attn.q_norm"), position, config))
                .collect();
            let kh: Vec<Vec<f64>> = split(project("self_attn.k_proj", x, kv_heads * d), kv_heads)
                .iter()
                .map(|head| rope(&head_norm(head, "self_attn.k_norm"), position, config))
                .collect();
            q.push(qh);
            k.push(kh);
            v.push(split(project("self_attn.v_proj", x, kv_heads * d), kv_heads));
        }
        let groups = heads / kv_heads;
        for i in 0..states.len() {
            let mut merged = Vec::with_capacity(heads * d);
            for head in 0..heads {
                let kv = head / groups;
                let scores: Vec<f64> = (0..=i).map(|j| dot(&q[i][head], &k[j][kv]) / (d as f64).sqrt()).collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                merged.extend((0..d).map(|c| (0..=i).map(|j| exps[j] / total * v[j][kv][c]).sum::<f64>()));
            }
            let attended = matvec(w(&p("self_attn.o_proj")), &merged, h);
            for c in 0..h {
                states[i][c] += attended[c];
            }
            let x = rms_norm(&states[i], w(&p("post_attention_layernorm")), eps);
            let inter = config.intermediate_size;
            let gate = matvec(w(&p("mlp.gate_proj")), &x, inter);
            let up = matvec(w(&p("mlp.up_proj")), &x, inter);
            let hidden: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let down = matvec(w(&p("mlp.down_proj")), &hidden, h);
            for c in 0..h {
                states[i][c] += down[c];
            }
        }
    }
    let head_name = if config.tie_word_embeddings { "model.embed_tokens.weight" } else { "lm_head.weight" };
    states.iter().map(|x| matvec(w(head_name), &rms_norm(x, w("model.norm.weight"), eps), config.vocab_size)).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `W x` for a row-major `[out, x.len()]` matrix.
fn matvec(matrix: &[f32], x: &[f64], out: usize) -> Vec<f64> {
    let n = x.len();
    (0..out).map(|r| (0..n).map(|c| matrix[r * n + c] as f64 * x[c]).sum()).collect()
}

fn rms_norm(x: &[f64], weight: &[f32], eps: f64) -> Vec<f64> {
    let mean_square = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (mean_square + eps).sqrt();
    x.iter().zip(weight).map(|(v, &g)| v * scale * g as f64).collect()
}

/// Rotates pairs `(x[i], x[i + d/2])` by `position * inverse_frequencies[i]`.
fn rope(x: &[f64], position: usize, config: &DenseSettings) -> Vec<f64> {
    let d = x.len();
    let half = d / 2;
    let mut out = vec![0.0; d];
    for i in 0..half {
        let angle = position as f64 * config.inverse_frequencies[i];
        let (sin, cos) = angle.sin_cos();
        out[i] = x[i] * cos - x[i + half] * sin;
        out[i + half] = x[i + half] * cos + x[i] * sin;
    }
    out
}
