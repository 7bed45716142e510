//! The policy-gradient update: its loss and gradient against an index-by-index f64
//! computation, ratio 1 on the first update after sampling, and the direction it moves the
//! model.

#[path = "../../whale-lm/tests/common/mod.rs"]
mod common;

use candle_core::Var;
use common::*;
use std::collections::HashMap;
use whale_lm::{DenseSettings, Qwen3Model};
use whale_train::policy_gradient::{surrogate_loss, token_logprobs, PgBatch};
use whale_train::{completion_logprobs, PgExample, PgObjective, SftExample, SftTrainer, TrainerConfig};

fn log_softmax_at(row: &[f64], token: u32) -> f64 {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log_z = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    row[token as usize] - log_z
}

/// Per completion token, its log-probability under the f64 forward pass.
fn logprobs_f64(config: &DenseSettings, weights: &HashMap<String, Vec<f32>>, example: &PgExample) -> Vec<f64> {
    let sequence = [example.prompt.as_slice(), &example.completion].concat();
    let logits = reference_logits(config, weights, &sequence);
    let start = example.prompt.len() - 1;
    example.completion.iter().enumerate().map(|(j, &token)| log_softmax_at(&logits[start + j], token)).collect()
}

/// The mean per-token loss, written out in f64 from the formula.
fn loss_f64(
    config: &DenseSettings,
    weights: &HashMap<String, Vec<f32>>,
    examples: &[PgExample],
    objective: &PgObjective,
) -> f64 {
    let (mut total, mut tokens) = (0.0, 0usize);
    for example in examples {
        let advantage = f64::from(example.advantage);
        for (j, logp) in logprobs_f64(config, weights, example).into_iter().enumerate() {
            let ratio = (logp - f64::from(example.behaviour[j])).exp();
            let clipped = ratio.clamp(1.0 - objective.clip_epsilon, 1.0 + objective.clip_epsilon);
            let d = f64::from(example.reference[j]) - logp;
            total += -(ratio * advantage).min(clipped * advantage) + objective.kl_coef * (d.exp() - d - 1.0);
            tokens += 1;
        }
    }
    total / tokens as f64
}

/// Three completions with advantages of both signs, behaviour and reference log-probabilities
/// off the model's by seeded noise (so that some ratios leave the clip range).
fn off_policy_examples(config: &DenseSettings, weights: &HashMap<String, Vec<f32>>) -> Vec<PgExample> {
    let mut rng = rng(17);
    [1.0f32, -0.6, 0.4]
        .iter()
        .enumerate()
        .map(|(i, &advantage)| {
            let mut example = PgExample {
                prompt: random_tokens(&mut rng, 3 + i),
                completion: random_tokens(&mut rng, 4 + 2 * i),
                advantage,
                behaviour: Vec::new(),
                reference: Vec::new(),
            };
            let logprobs = logprobs_f64(config, weights, &example);
            let noise = |k: usize, scale: f64| scale * (((k * 7919 + i * 104_729) % 1000) as f64 / 500.0 - 1.0);
            example.behaviour = logprobs.iter().enumerate().map(|(k, lp)| (lp + noise(k, 0.5)) as f32).collect();
            example.reference = logprobs.iter().enumerate().map(|(k, lp)| (lp + noise(k + 3, 0.3)) as f32).collect();
            example
        })
        .collect()
}

fn parameter(model: &Qwen3Model, name: &str) -> Var {
    model.named_parameters().into_iter().find(|(n, _)| n == name).map(|(_, var)| var).expect(name)
}

#[test]
fn the_loss_and_its_gradient_match_a_direct_f64_computation() {
    let model = tiny_model(false, 5);
    let config = model.settings().clone();
    let weights = weights_of(&model);
    let examples = off_policy_examples(&config, &weights);
    let objective = PgObjective { clip_epsilon: 0.2, kl_coef: 0.1 };
    let refs: Vec<&PgExample> = examples.iter().collect();
    let (batch, _) = PgBatch::new(&refs, 0, 64).expect("batch");
    let (summed, stats) =
        surrogate_loss(&token_logprobs(&model, &batch.batch).expect("logprobs"), &batch, &objective).expect("loss");
    assert_eq!(stats.tokens, 4 + 6 + 8);
    assert!(stats.clipped > 0 && stats.clipped < stats.tokens, "both branches of the min: {stats:?}");
    let mean = (&summed / stats.tokens as f64).expect("mean");
    let expected = loss_f64(&config, &weights, &examples, &objective);
    let got = f64::from(mean.to_scalar::<f32>().expect("scalar"));
    assert!((got - expected).abs() < 1e-4 * expected.abs().max(1.0), "loss {got} vs f64 {expected}");
    assert!((stats.loss / stats.tokens as f64 - expected).abs() < 1e-4, "reported loss {}", stats.loss);

    let grads = mean.backward().expect("backward");
    let probes = [
        ("model.embed_tokens.weight", 7 * config.hidden_size + 3),
        ("model.layers.0.self_attn.q_proj.weight", 11),
        ("model.layers.1.mlp.down_proj.weight", 29),
        ("model.norm.weight", 5),
        ("lm_head.weight", 2 * config.hidden_size + 1),
    ];
    for (name, index) in probes {
        let var = parameter(&model, name);
        let grad = grads.get(&var).expect("a gradient").flatten_all().unwrap().to_vec1::<f32>().unwrap()[index];
        let h = 1e-3f32;
        let at = |delta: f32| {
            let mut shifted = weights.clone();
            shifted.get_mut(name).expect(name)[index] += delta;
            loss_f64(&config, &shifted, &examples, &objective)
        };
        let numeric = (at(h) - at(-h)) / (2.0 * f64::from(h));
        let analytic = f64::from(grad);
        assert!(
            (numeric - analytic).abs() < 2e-3 * numeric.abs().max(0.05),
            "{name}[{index}]: autograd {analytic} vs central difference {numeric}"
        );
    }
}

fn trainer_config() -> TrainerConfig {
    TrainerConfig {
        learning_rate: 1e-2,
        warmup_steps: 0,
        micro_batch_size: 2,
        max_seq_len: 64,
        ..TrainerConfig::default()
    }
}

/// Completions decoded greedily through the KV cache (the engine's path), with the
/// log-probability of each token under the logits it was chosen from.
fn sampled(model: &Qwen3Model, advantages: &[f32]) -> Vec<PgExample> {
    let mut rng = rng(23);
    advantages
        .iter()
        .map(|&advantage| {
            let prompt = random_tokens(&mut rng, 4);
            let (completion, rows) = greedy_with_cache(model, &prompt, 6);
            let behaviour = completion
                .iter()
                .zip(&rows)
                .map(|(&token, row)| {
                    let row: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
                    log_softmax_at(&row, token) as f32
                })
                .collect();
            PgExample { prompt, completion, advantage, behaviour, reference: Vec::new() }
        })
        .collect()
}

#[test]
fn the_first_update_after_sampling_has_ratio_one_and_clips_nothing() {
    let model = tiny_model(true, 9);
    let examples = sampled(&model, &[1.0, -1.0, 0.5, -0.5]);
    let mut trainer = SftTrainer::new(model, trainer_config()).expect("trainer");
    let objective = PgObjective { clip_epsilon: 0.2, kl_coef: 0.0 };
    let first = trainer.policy_gradient_step(&examples, &objective).expect("step");
    assert_eq!(first.clip_fraction, 0.0);
    assert!(first.ratio_deviation < 1e-4, "ratio off 1 by {}", first.ratio_deviation);
    assert_eq!(first.kl, None);
    assert_eq!(first.tokens, 24);
    let second = trainer.policy_gradient_step(&examples, &objective).expect("step");
    assert!(second.ratio_deviation > first.ratio_deviation, "the first update moved the policy");
}

#[test]
fn updates_raise_advantaged_completions_and_lower_the_others() {
    let model = tiny_model(true, 13);
    let examples = sampled(&model, &[1.0, -1.0]);
    let mut trainer = SftTrainer::new(model.clone(), trainer_config()).expect("trainer");
    let objective = PgObjective { clip_epsilon: 0.2, kl_coef: 0.0 };
    let mut last = None;
    for _ in 0..30 {
        last = Some(trainer.policy_gradient_step(&examples, &objective).expect("step"));
    }
    let refs: Vec<&PgExample> = examples.iter().collect();
    let (batch, _) = PgBatch::new(&refs, 0, 64).expect("batch");
    let after = token_logprobs(trainer.model(), &batch.batch).unwrap().to_vec1::<f32>().unwrap();
    let ratio = |k: usize| f64::from(after[k] - batch.behaviour[k]).exp();
    let raised: f64 = (0..6).map(ratio).product::<f64>().ln();
    let lowered: f64 = (6..12).map(ratio).product::<f64>().ln();
    assert!(raised > 0.1, "the advantaged completion's log-probability rose by {raised}");
    assert!(lowered < -0.1, "the other's fell by {lowered}");
    let last = last.expect("30 steps");
    assert!(last.clip_fraction > 0.2, "tokens past the clip range stop pulling: {last:?}");
}

#[test]
fn mismatched_log_probabilities_and_empty_prompts_are_refused() {
    let example =
        PgExample { prompt: vec![1], completion: vec![2, 3], advantage: 1.0, behaviour: vec![-1.0], reference: vec![] };
    let error = PgBatch::new(&[&example], 0, 64).expect_err("one log-probability for two tokens");
    assert!(error.to_string().contains("1 behaviour log-probabilities for 2 completion tokens"), "{error}");
    let empty = PgExample { prompt: vec![], behaviour: vec![-1.0, -1.0], ..example };
    assert!(PgBatch::new(&[&empty], 0, 64).expect_err("empty prompt").to_string().contains("prompt is empty"));
}

#[test]
fn reference_log_probabilities_are_the_same_in_capped_passes_and_match_f64() {
    let model = tiny_model(false, 31);
    let config = model.settings().clone();
    let weights = weights_of(&model);
    let examples = off_policy_examples(&config, &weights);
    let plain: Vec<SftExample> =
        examples.iter().map(|e| SftExample { prompt: e.prompt.clone(), completion: e.completion.clone() }).collect();
    let whole = completion_logprobs(&model, &plain, &trainer_config()).expect("logprobs");
    // The three examples are 7, 10 and 13 tokens long: a cap of 12 gives each its own pass.
    let capped = TrainerConfig { micro_batch_tokens: Some(12), ..trainer_config() };
    let split = completion_logprobs(&model, &plain, &capped).expect("logprobs");
    for ((example, whole), split) in examples.iter().zip(&whole).zip(&split) {
        let exact = logprobs_f64(&config, &weights, example);
        assert_eq!(whole.len(), example.completion.len());
        for ((w, s), e) in whole.iter().zip(split).zip(&exact) {
            assert!((w - s).abs() < 1e-5, "capped {s} vs whole {w}");
            assert!((f64::from(*w) - e).abs() < 1e-4, "{w} vs f64 {e}");
        }
    }
}
