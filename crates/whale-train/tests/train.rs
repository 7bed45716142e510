//! The SFT trainer: completion-only loss, masking, overfitting, gradient accumulation, an
//! exact resume, and its loss's gradient reaching every parameter of a Qwen3, a Llama and a Qwen2.

#[path = "../../whale-lm/tests/common/mod.rs"]
mod common;

use candle_core::{DType, Device};
use common::*;
use std::path::Path;
use whale_lm::{
    Decoder, DenseConfig, DenseModel, GenerationConfig, LoraConfig, Qwen3Model, TrainableModel, WithTrainable,
};
use whale_train::trainer::{completion_loss, SftBatch};
use whale_train::{LrSchedule, SftExample, SftTrainer, TrainError, TrainerConfig};

fn examples(seed: u64, count: usize) -> Vec<SftExample> {
    let mut rng = rng(seed);
    (0..count)
        .map(|i| SftExample {
            prompt: random_tokens(&mut rng, 2 + i % 3),
            completion: random_tokens(&mut rng, 3 + (i * 2) % 5),
        })
        .collect()
}

fn config() -> TrainerConfig {
    TrainerConfig {
        learning_rate: 3e-3,
        warmup_steps: 3,
        micro_batch_size: 4,
        max_seq_len: 64,
        ..TrainerConfig::default()
    }
}

fn loss_of(batch: &SftBatch, model: &Qwen3Model) -> f32 {
    completion_loss(model, batch).unwrap().to_scalar::<f32>().unwrap()
}

#[test]
fn the_loss_is_the_cross_entropy_of_completion_tokens_only() {
    let model = tiny_model(true, 41);
    let example = SftExample { prompt: vec![5, 6, 7], completion: vec![8, 9] };
    let (batch, _) = SftBatch::from_examples(std::slice::from_ref(&example), 0, 64);
    assert_eq!(batch.tokens(), 2);
    // Positions 2 and 3 read 7 and 8 and predict 8 and 9.
    let logits = full_logits(&model, &[5, 6, 7, 8]);
    let nll = |row: &[f32], target: usize| {
        let max = row.iter().cloned().fold(f32::MIN, f32::max);
        let log_z = row.iter().map(|x| ((x - max) as f64).exp()).sum::<f64>().ln();
        log_z - (row[target] - max) as f64
    };
    let expected = nll(&logits[2], 8) + nll(&logits[3], 9);
    let got = loss_of(&batch, &model) as f64;
    assert!((got - expected).abs() < 1e-4, "{got} vs {expected}");
}

#[test]
fn padding_tokens_and_unscored_labels_do_not_change_the_loss() {
    let model = tiny_model(false, 43);
    let (batch, _) = SftBatch::from_examples(&examples(1, 5), 0, 64);
    assert!(batch.attention_mask.contains(&0), "the batch must contain padding");
    let baseline = loss_of(&batch, &model);

    let mut repadded = batch.clone();
    for (id, &real) in repadded.input_ids.iter_mut().zip(&batch.attention_mask) {
        if real == 0 {
            *id = (*id + 17) % VOCAB as u32;
        }
    }
    assert_ne!(repadded.input_ids, batch.input_ids);
    assert_eq!(loss_of(&repadded, &model), baseline);

    let mut relabelled = batch.clone();
    for (label, &scored) in relabelled.labels.iter_mut().zip(&batch.loss_mask) {
        if !scored {
            *label = (*label + 5) % VOCAB as u32;
        }
    }
    assert_ne!(relabelled.labels, batch.labels);
    assert_eq!(loss_of(&relabelled, &model), baseline);

    // A scored label does change it: the check above is not vacuous.
    let mut changed = batch.clone();
    let scored = changed.loss_mask.iter().position(|&s| s).unwrap();
    changed.labels[scored] = (changed.labels[scored] + 1) % VOCAB as u32;
    assert_ne!(loss_of(&changed, &model), baseline);

    // A different pad id in the trainer gives exactly the same evaluation too.
    let data = examples(1, 5);
    let a = SftTrainer::new(model.clone(), config()).unwrap();
    let b = SftTrainer::new(model, TrainerConfig { pad_token_id: 33, ..config() }).unwrap();
    assert_eq!(a.evaluate(&data).unwrap(), b.evaluate(&data).unwrap());
}

#[test]
fn the_loss_falls_when_overfitting_four_sequences() {
    let model = tiny_model(true, 47);
    let mut trainer = SftTrainer::new(model, config()).unwrap();
    let data = examples(2, 4);
    let first = trainer.step(&data).unwrap();
    let mut last = first;
    for _ in 1..50 {
        last = trainer.step(&data).unwrap();
    }
    assert_eq!(first.tokens, data.iter().map(|e| e.completion.len()).sum::<usize>());
    assert_eq!(last.step, 50);
    assert!(last.loss < 0.5 * first.loss, "{} -> {}", first.loss, last.loss);
    let (evaluated, _) = trainer.evaluate(&data).unwrap();
    assert!(evaluated < 0.5 * first.loss);
    assert_eq!(trainer.state().tokens_seen, 50 * first.tokens as u64);
}

#[test]
fn gradient_accumulation_matches_one_big_batch() {
    let data = examples(3, 6);
    let mut whole = SftTrainer::new(tiny_model(false, 53), config()).unwrap();
    let mut accumulated =
        SftTrainer::new(tiny_model(false, 53), TrainerConfig { micro_batch_size: 2, ..config() }).unwrap();
    for _ in 0..3 {
        let a = whole.step(&data).unwrap();
        let b = accumulated.step(&data).unwrap();
        assert!((a.loss - b.loss).abs() < 1e-5, "{} vs {}", a.loss, b.loss);
        assert!((a.grad_norm - b.grad_norm).abs() < 1e-4 * a.grad_norm);
    }
    let x = weights_of(whole.model());
    let y = weights_of(accumulated.model());
    for (name, values) in &x {
        let diff = max_abs_diff(values, &y[name]);
        assert!(diff < 1e-5, "{name}: {diff}");
    }
}

/// A token cap splits the passes (the first micro-batch of 4 holds 38 tokens here) and leaves
/// the update what it was, up to rounding.
#[test]
fn a_token_cap_on_micro_batches_changes_the_passes_not_the_update() {
    let data = examples(5, 8);
    let mut plain = SftTrainer::new(tiny_model(false, 59), config()).unwrap();
    let mut capped =
        SftTrainer::new(tiny_model(false, 59), TrainerConfig { micro_batch_tokens: Some(12), ..config() }).unwrap();
    for _ in 0..2 {
        let (a, b) = (plain.step(&data).unwrap(), capped.step(&data).unwrap());
        assert_eq!(a.tokens, b.tokens);
        assert!((a.loss - b.loss).abs() < 1e-5, "{} vs {}", a.loss, b.loss);
    }
    let (x, y) = (weights_of(plain.model()), weights_of(capped.model()));
    for (name, values) in &x {
        let diff = max_abs_diff(values, &y[name]);
        assert!(diff < 1e-5, "{name}: {diff}");
    }
    let zero = SftTrainer::new(tiny_model(false, 59), TrainerConfig { micro_batch_tokens: Some(0), ..config() });
    assert!(matches!(zero, Err(TrainError::Config { key, .. }) if key == "micro_batch_tokens"));
}

#[test]
fn a_resumed_run_continues_exactly() {
    let data = [examples(4, 4), examples(5, 4), examples(6, 4), examples(7, 4)];
    let config = TrainerConfig {
        weight_decay: 0.1,
        max_grad_norm: Some(0.5),
        schedule: LrSchedule::Cosine { total_steps: 6, min_lr_ratio: 0.1 },
        ..config()
    };
    let mut straight = SftTrainer::new(tiny_model(false, 59), config.clone()).unwrap();
    let straight_stats: Vec<_> = data.iter().map(|b| straight.step(b).unwrap()).collect();

    let dir = tempfile::tempdir().unwrap();
    let mut first_half = SftTrainer::new(tiny_model(false, 59), config.clone()).unwrap();
    for batch in &data[..2] {
        first_half.step(batch).unwrap();
    }
    let generation = GenerationConfig::for_model(first_half.model().config());
    first_half.save(dir.path(), &generation).unwrap();
    let mut resumed = SftTrainer::<Qwen3Model>::resume(dir.path(), config, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(resumed.state(), first_half.state());
    let resumed_stats: Vec<_> = data[2..].iter().map(|b| resumed.step(b).unwrap()).collect();
    assert_eq!(resumed_stats, straight_stats[2..]);
    assert_eq!(weights_of(resumed.model()), weights_of(straight.model()));
    // Clipping engaged, so the resumed run also restored what clipping depends on.
    assert!(straight_stats.iter().any(|s| s.grad_norm > 0.5));
}

#[test]
fn a_resume_without_optimizer_state_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = SftTrainer::new(tiny_model(true, 61), config()).unwrap();
    trainer.step(&examples(8, 2)).unwrap();
    trainer.save(dir.path(), &GenerationConfig::for_model(trainer.model().config())).unwrap();
    let state = dir.path().join("trainer_state.json");
    std::fs::write(&state, "{\"step\": 1, \"tokens_seen\": 3}").unwrap();
    let message =
        SftTrainer::<Qwen3Model>::resume(dir.path(), config(), DType::F32, &Device::Cpu).err().unwrap().to_string();
    assert!(message.contains("trainer_state.json") && message.contains("`examples_seen`"), "{message}");
    std::fs::write(&state, "{\"step\": 1, \"tokens_seen\": 3, \"examples_seen\": 2}").unwrap();
    let resumed = SftTrainer::<Qwen3Model>::resume(dir.path(), config(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(resumed.state().step, 1);
    let optimizer = dir.path().join("optimizer.safetensors");
    std::fs::remove_file(&optimizer).unwrap();
    let message =
        SftTrainer::<Qwen3Model>::resume(dir.path(), config(), DType::F32, &Device::Cpu).err().unwrap().to_string();
    assert!(message.contains(&optimizer.display().to_string()), "{message}");
}

#[test]
fn the_learning_rate_warms_up_then_follows_the_schedule() {
    let constant = TrainerConfig { learning_rate: 1.0, warmup_steps: 4, ..config() };
    let rates: Vec<f64> = (0..6).map(|s| constant.learning_rate_at(s)).collect();
    assert_eq!(rates, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
    let cosine = TrainerConfig { schedule: LrSchedule::Cosine { total_steps: 14, min_lr_ratio: 0.1 }, ..constant };
    assert_eq!(cosine.learning_rate_at(4), 1.0);
    assert!((cosine.learning_rate_at(9) - 0.55).abs() < 1e-12);
    assert!((cosine.learning_rate_at(14) - 0.1).abs() < 1e-12);
    assert!((cosine.learning_rate_at(100) - 0.1).abs() < 1e-12);
}

#[test]
fn nothing_to_train_on_and_bad_settings_are_errors() {
    let mut trainer = SftTrainer::new(tiny_model(true, 67), config()).unwrap();
    let before = weights_of(trainer.model());
    let empty = [SftExample { prompt: vec![1, 2, 3], completion: vec![] }];
    assert!(matches!(trainer.step(&empty), Err(TrainError::NoTrainableTokens)));
    assert!(matches!(trainer.step(&[]), Err(TrainError::NoTrainableTokens)));
    let outside = [SftExample { prompt: vec![1], completion: vec![VOCAB as u32] }];
    assert!(matches!(trainer.step(&outside), Err(TrainError::Batch(_))));
    assert_eq!(weights_of(trainer.model()), before);
    assert_eq!(trainer.state().step, 0);

    let bad = TrainerConfig { beta2: 1.0, ..config() };
    let message = SftTrainer::new(tiny_model(true, 67), bad).err().unwrap().to_string();
    assert!(message.contains("`beta2`"), "{message}");
}

#[test]
fn long_examples_are_cut_and_counted() {
    let mut trainer = SftTrainer::new(tiny_model(true, 71), TrainerConfig { max_seq_len: 6, ..config() }).unwrap();
    let data = [
        SftExample { prompt: vec![1, 2, 3, 4], completion: vec![5, 6, 7, 8] },
        SftExample { prompt: vec![1], completion: vec![2, 3] },
    ];
    let stats = trainer.step(&data).unwrap();
    assert_eq!(stats.truncated, 1);
    assert_eq!(stats.tokens, 2 + 2);
}

/// The fused kernels take f32 tensors on the CPU; a bf16 model runs the compositions of candle
/// ops that every other device (a GPU) runs: padded attention, composed RMSNorm, rotary, SwiGLU.
/// (Its attention scores and logits are f32, so on the CPU their softmax and cross-entropy still
/// run fused; the kernel tests compare those compositions on their own.)
#[test]
fn the_composed_pass_of_other_devices_and_dtypes_trains_like_the_fused_one() {
    let mut model_config = tiny_config(false);
    model_config.initializer_range = 0.2;
    let bf16 = whale_lm::Qwen3Model::new_random(&model_config, 31, DType::BF16, &Device::Cpu).unwrap();
    let same_weights = bf16
        .named_parameters()
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().to_dtype(DType::F32).unwrap()))
        .collect();
    let f32 = whale_lm::Qwen3Model::from_tensors(&model_config, same_weights, DType::F32, &Device::Cpu).unwrap();
    let (batch, _) = SftBatch::from_examples(&examples(3, 7), 0, 64);
    assert!(batch.attention_mask.contains(&0), "the batch must contain padding");
    let (fused, composed) = (completion_loss(&f32, &batch).unwrap(), completion_loss(&bf16, &batch).unwrap());
    let (fused_loss, composed_loss) = (fused.to_scalar::<f32>().unwrap(), composed.to_scalar::<f32>().unwrap());
    assert!((fused_loss - composed_loss).abs() < 0.02 * fused_loss, "{fused_loss} vs {composed_loss}");
    let (fused_grads, composed_grads) = (fused.backward().unwrap(), composed.backward().unwrap());
    for ((name, f32_var), (_, bf16_var)) in f32.named_parameters().into_iter().zip(bf16.named_parameters()) {
        let expected = fused_grads.get(&f32_var).unwrap().flatten_all().unwrap();
        let got = composed_grads.get(&bf16_var).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap();
        let dot = (&expected * &got).unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        let norm = |t: &candle_core::Tensor| t.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
        let cosine = dot / (norm(&expected) * norm(&got));
        assert!(cosine > 0.98, "{name}: gradients at cosine {cosine}");
    }
    let mut trainer = SftTrainer::new(bf16, TrainerConfig { learning_rate: 1e-2, ..config() }).unwrap();
    let examples = examples(3, 7);
    let first = trainer.step(&examples).unwrap().loss;
    let last = (0..15).map(|_| trainer.step(&examples).unwrap().loss).last().unwrap();
    assert!(last < 0.7 * first, "bf16 training: loss {first} -> {last}");
}

fn bf16_model(seed: u64) -> whale_lm::Qwen3Model {
    let mut model_config = tiny_config(false);
    model_config.initializer_range = 0.2;
    whale_lm::Qwen3Model::new_random(&model_config, seed, DType::BF16, &Device::Cpu).unwrap()
}

/// Steps of 2e-4 are below half of bf16's spacing for weights above 1/8 in size (the spacing is
/// 2^-10 between 1/8 and 1/4), so rounding each update into the weights would lose most of them;
/// the trainer's f32 master copies accumulate them. The copies are saved, so a resumed run continues exactly.
#[test]
fn a_bf16_model_trains_through_f32_master_copies_and_resumes_exactly() {
    let data = [examples(4, 4), examples(5, 4), examples(6, 4), examples(7, 4)];
    let config = TrainerConfig { learning_rate: 2e-4, warmup_steps: 0, ..config() };
    let initial = weights_of(&bf16_model(59));
    let mut straight = SftTrainer::new(bf16_model(59), config.clone()).unwrap();
    let straight_stats: Vec<_> = data.iter().map(|b| straight.step(b).unwrap()).collect();
    let trained = weights_of(straight.model());
    let (changed, total) = initial.iter().fold((0, 0), |(changed, total), (name, before)| {
        let after = &trained[name];
        (changed + before.iter().zip(after).filter(|(a, b)| a != b).count(), total + before.len())
    });
    let share = changed as f64 / total as f64;
    // Measured: 0.50 of them move; 0.23 when each update is rounded into the weights instead.
    assert!(share > 0.4, "only {share:.2} of the bf16 weights moved");

    let dir = tempfile::tempdir().unwrap();
    let mut first_half = SftTrainer::new(bf16_model(59), config.clone()).unwrap();
    for batch in &data[..2] {
        first_half.step(batch).unwrap();
    }
    first_half.save(dir.path(), &GenerationConfig::for_model(first_half.model().config())).unwrap();
    let mut resumed = SftTrainer::<Qwen3Model>::resume(dir.path(), config, DType::BF16, &Device::Cpu).unwrap();
    let resumed_stats: Vec<_> = data[2..].iter().map(|b| resumed.step(b).unwrap()).collect();
    assert_eq!(resumed_stats, straight_stats[2..]);
    assert_eq!(weights_of(resumed.model()), trained);
}

#[test]
fn a_llama_model_learns_and_comes_back_from_its_checkpoint() {
    let mut trainer = SftTrainer::new(tiny_llama(false, 53), config()).unwrap();
    let data = examples(4, 4);
    let first = trainer.step(&data).unwrap();
    let last = (1..40).map(|_| trainer.step(&data).unwrap()).last().unwrap();
    assert!(last.loss < 0.5 * first.loss, "{} -> {}", first.loss, last.loss);
    let dir = tempfile::tempdir().unwrap();
    trainer.save(dir.path(), &GenerationConfig::for_model(trainer.model().config())).unwrap();
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    assert!(config.contains("\"model_type\": \"llama\"") && config.contains("LlamaForCausalLM"), "{config}");
    let decoder = Decoder::load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(decoder.architecture(), "Llama");
    let loaded = decoder.downcast_ref::<whale_lm::LlamaModel>().expect("a Llama model");
    let tokens = random_tokens(&mut rng(9), 7);
    assert_eq!(full_logits(loaded, &tokens), full_logits(trainer.model(), &tokens));
}

/// Four updates of the model the registry loaded, straight, against two, a save and a resume,
/// then two more: the whole model (a checkpoint) or, with `lora`, a new adapter (a PEFT
/// directory). What `whale lm train` does through [`Decoder::with_trainable`].
struct ResumesExactly<'a> {
    dir: &'a Path,
    lora: Option<LoraConfig>,
}

impl WithTrainable for ResumesExactly<'_> {
    type Output = ();

    fn run<M: TrainableModel>(self, base: M) {
        let data = [examples(14, 4), examples(15, 4), examples(16, 4), examples(17, 4)];
        let config = TrainerConfig {
            max_grad_norm: Some(0.5),
            schedule: LrSchedule::Cosine { total_steps: 6, min_lr_ratio: 0.1 },
            ..config()
        };
        let fresh = || match &self.lora {
            Some(lora) => base.with_new_adapter(lora, 3).unwrap(),
            None => M::load(self.dir, DType::F32, &Device::Cpu).unwrap(),
        };
        let mut straight = SftTrainer::new(fresh(), config.clone()).unwrap();
        let straight_stats: Vec<_> = data.iter().map(|batch| straight.step(batch).unwrap()).collect();
        let mut first_half = SftTrainer::new(fresh(), config.clone()).unwrap();
        for batch in &data[..2] {
            first_half.step(batch).unwrap();
        }
        let saved = tempfile::tempdir().unwrap();
        let mut resumed = match &self.lora {
            Some(_) => {
                first_half.save_adapter(saved.path(), "base").unwrap();
                SftTrainer::resume_adapter(saved.path(), &base, config).unwrap()
            }
            None => {
                first_half.save_checkpoint(saved.path()).unwrap();
                SftTrainer::<M>::resume(saved.path(), config, DType::F32, &Device::Cpu).unwrap()
            }
        };
        assert_eq!(resumed.state(), first_half.state());
        let resumed_stats: Vec<_> = data[2..].iter().map(|batch| resumed.step(batch).unwrap()).collect();
        assert_eq!(resumed_stats, straight_stats[2..]);
        let trained = |model: &M| -> Vec<Vec<f32>> {
            let parameters = model.trained_parameters();
            parameters.iter().map(|(_, var)| var.flatten_all().unwrap().to_vec1().unwrap()).collect()
        };
        assert_eq!(trained(resumed.model()), trained(straight.model()));
        assert_ne!(trained(straight.model()), trained(&fresh()), "the updates moved the trained parameters");
    }
}

#[test]
fn a_llama_checkpoint_from_the_registry_trains_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    tiny_llama(true, 57).save(dir.path()).unwrap();
    let decoder = Decoder::load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(decoder.architecture(), "Llama");
    decoder.with_trainable(ResumesExactly { dir: dir.path(), lora: None });
    let lora = LoraConfig { dropout: 0.1, ..lora(4, &["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]) };
    decoder.with_trainable(ResumesExactly { dir: dir.path(), lora: Some(lora) });
}

fn every_parameter_of(model: &DenseModel<impl DenseConfig>) {
    let mut rng = rng(2);
    let examples: Vec<SftExample> = (0..3)
        .map(|i| SftExample { prompt: random_tokens(&mut rng, 3 + i), completion: random_tokens(&mut rng, 4) })
        .collect();
    let (batch, _) = SftBatch::from_examples(&examples, 0, 64);
    let loss = completion_loss(model, &batch).unwrap();
    let grads = loss.backward().unwrap();
    for (name, var) in model.named_parameters() {
        let grad = grads.get(&var).unwrap_or_else(|| panic!("no gradient for {name}"));
        let size = grad.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(size > 0.0 && size.is_finite(), "{name}: |grad| = {size}");
    }
}

#[test]
fn every_parameter_receives_a_nonzero_gradient() {
    for tied in [true, false] {
        every_parameter_of(&tiny_model(tied, 5));
        every_parameter_of(&tiny_llama(tied, 5));
        every_parameter_of(&tiny_qwen2(tied, 5));
    }
}

/// A Qwen2 (biases on the query, key and value projections) overfits four sequences, its biases
/// moving with the weights.
#[test]
fn a_qwen2_model_learns_its_biases_too() {
    let model = tiny_qwen2(false, 59);
    let bias = |model: &whale_lm::Qwen2Model| {
        let (_, var) =
            model.named_parameters().into_iter().find(|(name, _)| name.ends_with("0.self_attn.k_proj.bias")).unwrap();
        var.as_tensor().to_vec1::<f32>().unwrap()
    };
    let before = bias(&model);
    let mut trainer = SftTrainer::new(model.clone(), config()).unwrap();
    let examples = examples(3, 4);
    let first = trainer.step(&examples).unwrap().loss;
    let mut last = first;
    for _ in 0..30 {
        last = trainer.step(&examples).unwrap().loss;
    }
    assert!(last < first * 0.5, "the loss falls: {first} -> {last}");
    assert!(max_abs_diff(&bias(&model), &before) > 1e-4, "the biases train");
    let dir = tempfile::tempdir().unwrap();
    trainer.save(dir.path(), &GenerationConfig::for_model(trainer.model().config())).unwrap();
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    assert!(config.contains("\"model_type\": \"qwen2\"") && config.contains("Qwen2ForCausalLM"), "{config}");
    let decoder = Decoder::load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    let loaded = decoder.downcast_ref::<whale_lm::Qwen2Model>().expect("a Qwen2 model");
    let tokens = random_tokens(&mut rng(9), 7);
    assert_eq!(full_logits(loaded, &tokens), full_logits(trainer.model(), &tokens));
}
