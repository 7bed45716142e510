//! whale's trainer on Qwen3.5 (tiny random models): every parameter trains and a resumed run
//! continues exactly; a LoRA adapter trains alone, round-trips through PEFT files and merges.

#[path = "../../whale-lm/tests/common/mod.rs"]
mod common;

use candle_core::{DType, Device};
use common::qwen3_5::{max_difference, model, tokens, VOCAB};
use whale_lm::qwen3_5::Qwen35Size;
use whale_lm::{load_qwen35, LoraConfig, Qwen35Config, Qwen35Lora, Qwen35Model};
use whale_train::{LrSchedule, SftExample, SftTrainer, TrainerConfig};

fn sft_examples(count: usize, seed: u64) -> Vec<SftExample> {
    (0..count)
        .map(|i| SftExample {
            prompt: tokens(10 + 3 * i, seed * 100 + i as u64),
            completion: tokens(6 + i, seed * 200 + i as u64),
        })
        .collect()
}

fn flat_weights(model: &Qwen35Model) -> Vec<Vec<f32>> {
    model.named_parameters().iter().map(|(_, var)| var.flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect()
}

#[test]
fn the_sft_trainer_trains_qwen3_5_and_a_resumed_run_continues_exactly() {
    let config = Qwen35Config::text(VOCAB, Qwen35Size::TINY);
    let data: Vec<Vec<SftExample>> = (0..4).map(|seed| sft_examples(4, seed)).collect();
    let settings = TrainerConfig {
        learning_rate: 3e-3,
        micro_batch_size: 2,
        max_grad_norm: Some(0.5),
        weight_decay: 0.1,
        schedule: LrSchedule::Cosine { total_steps: 6, min_lr_ratio: 0.1 },
        ..TrainerConfig::default()
    };
    let mut straight = SftTrainer::new(model(&config, 13), settings.clone()).unwrap();
    let stats: Vec<_> = data.iter().map(|batch| straight.step(batch).unwrap()).collect();
    let (before, _) = SftTrainer::new(model(&config, 13), settings.clone()).unwrap().evaluate(&data[0]).unwrap();
    let (after, _) = straight.evaluate(&data[0]).unwrap();
    assert!(after < before, "the loss on the first batch went from {before} to {after}");
    assert!(stats.iter().any(|s| s.grad_norm > 0.5), "clipping never engaged: {stats:?}");

    let dir = tempfile::tempdir().unwrap();
    let mut first_half = SftTrainer::new(model(&config, 13), settings.clone()).unwrap();
    for batch in &data[..2] {
        first_half.step(batch).unwrap();
    }
    first_half.save_checkpoint(dir.path()).unwrap();
    let loaded = load_qwen35(dir.path(), DType::F32, &Device::Cpu).unwrap();
    let mut resumed = SftTrainer::resumed(loaded, settings, dir.path()).unwrap();
    assert_eq!(resumed.state(), first_half.state());
    let resumed_stats: Vec<_> = data[2..].iter().map(|batch| resumed.step(batch).unwrap()).collect();
    assert_eq!(resumed_stats, stats[2..]);
    assert_eq!(flat_weights(resumed.model()), flat_weights(straight.model()));
}

#[test]
fn a_lora_adapter_trains_alone_round_trips_through_peft_files_and_merges() {
    let config = Qwen35Config::text(VOCAB, Qwen35Size::TINY);
    let base = model(&config, 17);
    let base_before = flat_weights(&base);
    let targets = ["q_proj", "in_proj_qkv", "out_proj", "down_proj"].map(String::from).to_vec();
    let lora = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, target_modules: targets };
    let adapter = Qwen35Lora::new(lora.clone(), &config, 3, DType::F32, &Device::Cpu).unwrap();
    let names: Vec<String> = adapter.named_parameters().into_iter().map(|(name, _)| name).collect();
    // q_proj in the one full-attention layer, in_proj_qkv and out_proj in the three linear
    // layers, down_proj in all four; A and B each.
    assert_eq!(names.len(), 2 * (1 + 3 + 3 + 4), "{names:?}");
    assert!(names.contains(&"base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight".to_string()));
    assert!(names.contains(&"base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_B.weight".to_string()));

    let settings = TrainerConfig { learning_rate: 1e-2, micro_batch_size: 2, ..TrainerConfig::default() };
    let mut trainer = SftTrainer::new(base.with_adapter(&adapter).unwrap(), settings).unwrap();
    let data = sft_examples(4, 5);
    let (before, _) = trainer.evaluate(&data).unwrap();
    for _ in 0..4 {
        trainer.step(&data).unwrap();
    }
    let (after, _) = trainer.evaluate(&data).unwrap();
    assert!(after < before, "the adapter's loss went from {before} to {after}");
    assert_eq!(flat_weights(&base), base_before, "the base is bit for bit what it was");

    let ids = tokens(90, 6);
    let logits = |m: &Qwen35Model| m.logits(&m.packed_hidden(&[&ids]).unwrap()).unwrap();
    let adapted = logits(trainer.model());
    assert!(max_difference(&adapted, &logits(&base)) > 1e-3, "the trained adapter changes nothing");
    let dir = tempfile::tempdir().unwrap();
    trainer.save_adapter(dir.path(), "tiny-qwen3.5").unwrap();
    let loaded = Qwen35Lora::load_peft(dir.path(), &config, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(max_difference(&logits(&base.with_adapter(&loaded).unwrap()), &adapted), 0.0);
    assert!(max_difference(&logits(&trainer.model().merged().unwrap()), &adapted) < 1e-4);
    let resumed = SftTrainer::resume_adapter(dir.path(), &base, trainer.config().clone()).unwrap();
    assert_eq!(resumed.state(), trainer.state());

    let unknown = LoraConfig { target_modules: vec!["qkv".into()], ..lora.clone() };
    let error = Qwen35Lora::new(unknown, &config, 3, DType::F32, &Device::Cpu).err().expect("an unknown module");
    assert!(error.to_string().contains("target_modules") && error.to_string().contains("in_proj_z"), "{error}");
    let dropout = LoraConfig { dropout: 0.1, ..lora };
    let error = Qwen35Lora::new(dropout, &config, 3, DType::F32, &Device::Cpu).err().expect("dropout");
    assert!(error.to_string().contains("dropout"), "{error}");
}
