//! Training a LoRA adapter with whale's trainer: it moves every adapter matrix and no base
//! weight, and a resumed adapter run continues exactly.

#[path = "../../whale-lm/tests/common/mod.rs"]
mod common;

use candle_core::Var;
use common::*;
use std::collections::HashMap;
use whale_lm::LoraConfig;
use whale_train::trainer::{completion_loss, SftBatch};
use whale_train::{LrSchedule, SftExample, SftTrainer, TrainError, TrainerConfig};

fn values_of(params: Vec<(String, Var)>) -> HashMap<String, Vec<f32>> {
    params
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}

fn examples(seed: u64, count: usize) -> Vec<SftExample> {
    let mut rng = rng(seed);
    (0..count)
        .map(|i| SftExample {
            prompt: random_tokens(&mut rng, 2 + i % 3),
            completion: random_tokens(&mut rng, 3 + (i * 2) % 5),
        })
        .collect()
}

fn trainer_config() -> TrainerConfig {
    TrainerConfig {
        learning_rate: 1e-2,
        warmup_steps: 2,
        micro_batch_size: 4,
        max_seq_len: 64,
        ..TrainerConfig::default()
    }
}

const ALL: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

#[test]
fn lora_training_moves_every_adapter_matrix_and_no_base_weight() {
    let base = tiny_model(true, 11);
    let base_before = weights_of(&base);
    let config = LoraConfig { dropout: 0.1, ..lora(4, &ALL) };
    let adapter = adapter_for(&base, config, 13);
    let adapter_before = values_of(adapter.named_parameters());
    let model = base.with_adapter(&adapter).unwrap();
    let mut trainer = SftTrainer::new(model, trainer_config()).unwrap();
    let data = examples(17, 4);
    let first = trainer.step(&data).unwrap();
    let mut last = first;
    for _ in 1..40 {
        last = trainer.step(&data).unwrap();
    }
    assert!(last.loss < 0.6 * first.loss, "loss {} -> {}", first.loss, last.loss);
    let (evaluated, _) = trainer.evaluate(&data).unwrap();
    assert!(evaluated < 0.6 * first.loss, "evaluated {evaluated} vs first {}", first.loss);

    assert_eq!(weights_of(&base), base_before, "a base weight moved");
    let adapter_after = values_of(adapter.named_parameters());
    for (name, before) in &adapter_before {
        assert!(max_abs_diff(before, &adapter_after[name]) > 0.0, "{name} did not change");
    }

    // A backward pass through the adapted model reaches every matrix of the adapter and no
    // base weight.
    let (batch, _) = SftBatch::from_examples(&data, 0, 64);
    let grads = completion_loss(trainer.model(), &batch).unwrap().backward().unwrap();
    for (name, var) in adapter.named_parameters() {
        let grad = grads.get(&var).unwrap_or_else(|| panic!("no gradient for {name}"));
        let norm = grad.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(norm > 0.0, "zero gradient for {name}");
    }
    for (name, var) in base.named_parameters() {
        assert!(grads.get(&var).is_none(), "gradient for base weight {name}");
    }
}

#[test]
fn a_resumed_adapter_run_continues_exactly() {
    let base = tiny_model(false, 109);
    let base_before = weights_of(&base);
    let config = TrainerConfig {
        weight_decay: 0.1,
        max_grad_norm: Some(0.05),
        micro_batch_size: 2,
        schedule: LrSchedule::Cosine { total_steps: 6, min_lr_ratio: 0.1 },
        ..trainer_config()
    };
    let lora_config = LoraConfig { dropout: 0.2, ..lora(4, &["q_proj", "k_proj", "up_proj", "down_proj"]) };
    let data = [examples(1, 4), examples(2, 4), examples(3, 4), examples(4, 4)];
    let fresh = || base.with_adapter(&adapter_for(&base, lora_config.clone(), 113)).unwrap();

    let mut straight = SftTrainer::new(fresh(), config.clone()).unwrap();
    let straight_stats: Vec<_> = data.iter().map(|batch| straight.step(batch).unwrap()).collect();

    let dir = tempfile::tempdir().unwrap();
    let mut first_half = SftTrainer::new(fresh(), config.clone()).unwrap();
    for batch in &data[..2] {
        first_half.step(batch).unwrap();
    }
    first_half.save_adapter(dir.path(), "base").unwrap();
    let generation = whale_lm::GenerationConfig::for_model(base.config());
    assert!(matches!(first_half.save(dir.path(), &generation), Err(TrainError::Mode(_))));
    for file in ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
    let mut resumed = SftTrainer::resume_adapter(dir.path(), &base, config).unwrap();
    assert_eq!(resumed.state(), first_half.state());
    let resumed_stats: Vec<_> = data[2..].iter().map(|batch| resumed.step(batch).unwrap()).collect();
    assert_eq!(resumed_stats, straight_stats[2..]);
    let adapter_of =
        |trainer: &SftTrainer<whale_lm::Qwen3Model>| values_of(trainer.model().adapter().unwrap().named_parameters());
    assert_eq!(adapter_of(&resumed), adapter_of(&straight));
    assert!(straight_stats.iter().any(|s| s.grad_norm > 0.05), "clipping engaged");
    assert_eq!(weights_of(&base), base_before);

    let mut plain = SftTrainer::new(base.clone(), trainer_config()).unwrap();
    plain.step(&data[0]).unwrap();
    assert!(matches!(plain.save_adapter(dir.path(), "base"), Err(TrainError::Mode(_))));
}

/// Adapter dropout draws its masks per pass, so a step cut into other passes draws other masks:
/// the loss of a step moves when a token cap splits its micro-batches, and only then (the
/// equality of the update without dropout is `train.rs`'s test).
#[test]
fn a_token_cap_reaches_the_passes_of_a_step() {
    let base = tiny_model(true, 11);
    let config = LoraConfig { dropout: 0.3, ..lora(4, &ALL) };
    let data = examples(17, 8);
    let first_loss = |micro_batch_tokens| {
        let adapter = adapter_for(&base, config.clone(), 13);
        let model = base.with_adapter(&adapter).unwrap();
        let mut trainer = SftTrainer::new(model, TrainerConfig { micro_batch_tokens, ..trainer_config() }).unwrap();
        trainer.step(&data).unwrap().loss
    };
    let plain = first_loss(None);
    assert_eq!(first_loss(None), plain, "the same passes draw the same masks");
    assert_eq!(first_loss(Some(1_000)), plain, "a cap no micro-batch reaches changes nothing");
    assert_ne!(first_loss(Some(12)), plain, "a cap of 12 tokens splits the micro-batches of 4");
}
