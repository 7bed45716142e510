//! Qwen3.5 on tiny random models: decoding equals the full pass (across delta-rule chunks and
//! with sequences joining mid-way), every parameter trains (and resumes exactly), LoRA adapters
//! train alone and round-trip through PEFT files, the engine batches it, and checkpoints
//! round-trip in the text-only and the multimodal layout.

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use whale_lm::qwen3_5::{parameter_shapes, Qwen35Size};
use whale_lm::{
    load_qwen35, save_qwen35, ChatTemplate, EngineConfig, LocalPolicy, LoraConfig, LrSchedule, Qwen35Config,
    Qwen35Lora, Qwen35Model, Qwen35Step, SamplingParams, SftExample, SftTrainer, Tokenizer, TrainerConfig,
};

const VOCAB: usize = 97;

/// A tiny model whose every parameter is moved off its initial value, so that norms, gates and
/// decays all matter to the output.
fn model(config: &Qwen35Config, seed: u64) -> Qwen35Model {
    let model = Qwen35Model::new_random(config, seed, DType::F32, &Device::Cpu).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    for (name, var) in model.named_parameters() {
        let count = var.elem_count();
        let spread = if name.ends_with("A_log") || name.contains("norm") { 0.5 } else { 0.15 };
        let noise: Vec<f32> = (0..count).map(|_| rng.gen_range(-spread..spread)).collect();
        let noise = Tensor::from_vec(noise, var.shape(), &Device::Cpu).unwrap();
        var.set(&(var.as_tensor() + noise).unwrap()).unwrap();
    }
    model
}

fn tokens(len: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(0..VOCAB as u32)).collect()
}

fn max_difference(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

#[test]
fn decoding_step_by_step_equals_the_full_pass_across_chunks_and_joins() {
    let config = Qwen35Config::text(VOCAB, Qwen35Size::TINY);
    let model = model(&config, 3);
    let (long, short) = (tokens(150, 1), tokens(40, 2));
    let full_long = model.logits(&model.packed_hidden(&[&long]).unwrap()).unwrap();
    let full_short = model.logits(&model.packed_hidden(&[&short]).unwrap()).unwrap();
    let packed = model.logits(&model.packed_hidden(&[&short, &long]).unwrap()).unwrap();
    assert!(max_difference(&packed.narrow(0, 40, 150).unwrap(), &full_long) < 1e-4, "packing mixes sequences");

    let (mut long_cache, mut short_cache) = (model.new_cache().unwrap(), model.new_cache().unwrap());
    let prefill = model.forward_step(&mut [Qwen35Step { tokens: &long[..70], cache: &mut long_cache }]).unwrap();
    assert!(max_difference(&prefill.squeeze(0).unwrap(), &full_long.get(69).unwrap()) < 1e-4);
    let mut worst: f32 = 0.0;
    for t in 70..150 {
        let mut steps = vec![Qwen35Step { tokens: &long[t..t + 1], cache: &mut long_cache }];
        match t.checked_sub(100) {
            Some(0) => steps.push(Qwen35Step { tokens: &short[..20], cache: &mut short_cache }),
            Some(joined) if joined + 19 < short.len() => {
                steps.push(Qwen35Step { tokens: &short[joined + 19..joined + 20], cache: &mut short_cache })
            }
            _ => {}
        }
        let logits = model.forward_step(&mut steps).unwrap();
        worst = worst.max(max_difference(&logits.get(0).unwrap(), &full_long.get(t).unwrap()));
        if logits.dim(0).unwrap() == 2 {
            let at = short_cache.len() - 1;
            worst = worst.max(max_difference(&logits.get(1).unwrap(), &full_short.get(at).unwrap()));
        }
    }
    assert_eq!((long_cache.len(), short_cache.len()), (150, 40));
    assert!(worst < 1e-4, "decoding drifts from the full pass by {worst}");
}

#[test]
fn every_parameter_gets_a_gradient_and_the_loss_falls() {
    let config = Qwen35Config::text(VOCAB, Qwen35Size::TINY);
    let model = model(&config, 5);
    let sequences = [tokens(80, 7), tokens(33, 8)];
    let loss = |model: &Qwen35Model| {
        let inputs: Vec<&[u32]> = sequences.iter().map(|s| &s[..s.len() - 1]).collect();
        let targets: Vec<u32> = sequences.iter().flat_map(|s| s[1..].to_vec()).collect();
        let logits = model.logits(&model.packed_hidden(&inputs).unwrap()).unwrap();
        let targets = Tensor::from_vec(targets.clone(), (targets.len(), 1), &Device::Cpu).unwrap();
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        log_probs.gather(&targets, 1).unwrap().mean_all().unwrap().neg().unwrap()
    };
    let first = loss(&model);
    let grads = first.backward().unwrap();
    let params = model.named_parameters();
    assert_eq!(params.len(), parameter_shapes(&config).len());
    for (name, var) in &params {
        let gradient = grads.get(var).unwrap_or_else(|| panic!("{name} gets no gradient"));
        let size: f32 = gradient.abs().unwrap().sum_all().unwrap().to_scalar().unwrap();
        assert!(size > 0.0 && size.is_finite(), "{name}: gradient {size}");
    }
    let vars = params.into_iter().map(|(_, var)| var).collect();
    let mut optimizer = AdamW::new(vars, ParamsAdamW { lr: 3e-3, ..Default::default() }).unwrap();
    for _ in 0..15 {
        optimizer.backward_step(&loss(&model)).unwrap();
    }
    let (before, after): (f32, f32) = (first.to_scalar().unwrap(), loss(&model).to_scalar().unwrap());
    assert!(after < before - 0.3, "the loss went from {before} to {after}");
}

#[test]
fn checkpoints_round_trip_in_the_text_and_the_multimodal_layout() {
    let text = Qwen35Config::text(VOCAB, Qwen35Size::TINY);
    let mut raw = serde_json::Map::new();
    raw.insert("model_type".into(), "qwen3_5".into());
    raw.insert("architectures".into(), serde_json::json!(["Qwen3_5ForConditionalGeneration"]));
    raw.insert("text_config".into(), serde_json::Value::Object(text.to_config_json()));
    raw.insert("vision_config".into(), serde_json::json!({"depth": 1}));
    let wrapper = Qwen35Config::from_object(raw).unwrap();
    let ids = tokens(30, 4);
    for config in [text, wrapper] {
        let original = model(&config, 9);
        let dir = tempfile::tempdir().unwrap();
        save_qwen35(&original, dir.path()).unwrap();
        let loaded = load_qwen35(dir.path(), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(loaded.config().multimodal, config.multimodal);
        let logits = |m: &Qwen35Model| m.logits(&m.packed_hidden(&[&ids]).unwrap()).unwrap();
        assert_eq!(max_difference(&logits(&original), &logits(&loaded)), 0.0);
        let names: Vec<String> = loaded.named_parameters().into_iter().map(|(name, _)| name).collect();
        let expected = if config.multimodal {
            "model.language_model.layers.0.linear_attn.A_log"
        } else {
            "model.layers.0.linear_attn.A_log"
        };
        assert!(names.iter().any(|name| name == expected), "{names:?}");
        let written = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        assert_eq!(written.contains("vision_config"), config.multimodal, "{written}");
    }
}

#[test]
fn a_checkpoint_missing_a_tensor_names_the_file_and_the_tensor() {
    let config = Qwen35Config::text(VOCAB, Qwen35Size::TINY);
    let original = model(&config, 2);
    let dir = tempfile::tempdir().unwrap();
    save_qwen35(&original, dir.path()).unwrap();
    let kept: Vec<(String, Tensor)> = original
        .named_parameters()
        .into_iter()
        .filter(|(name, _)| name != "model.layers.3.self_attn.q_norm.weight")
        .map(|(name, var)| (name, var.as_detached_tensor()))
        .collect();
    candle_core::safetensors::save(&kept.into_iter().collect(), dir.path().join("model.safetensors")).unwrap();
    let message = load_qwen35(dir.path(), DType::F32, &Device::Cpu).err().expect("a missing tensor").to_string();
    assert!(
        message.contains("model.safetensors") && message.contains("model.layers.3.self_attn.q_norm.weight"),
        "{message}"
    );
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 10}").unwrap();
    let message = load_qwen35(dir.path(), DType::F32, &Device::Cpu).err().expect("a bad config").to_string();
    assert!(message.contains("config.json") && message.contains("`num_hidden_layers`"), "{message}");
}

/// Greedy tokens from the model's own decoding step, one sequence alone.
fn greedy_alone(model: &Qwen35Model, prompt: &[u32], count: usize) -> Vec<u32> {
    let mut cache = model.new_cache().unwrap();
    let mut logits = model.forward_step(&mut [Qwen35Step { tokens: prompt, cache: &mut cache }]).unwrap();
    let mut out = Vec::new();
    for _ in 0..count {
        let next = logits.argmax(D::Minus1).unwrap().to_vec1::<u32>().unwrap()[0];
        out.push(next);
        logits = model.forward_step(&mut [Qwen35Step { tokens: &[next], cache: &mut cache }]).unwrap();
    }
    out
}

#[test]
fn the_batching_engine_serves_qwen3_5_as_each_sequence_alone() {
    let corpus = whale_lm::bench::synthetic_corpus(200, 1);
    let tokenizer = Tokenizer::train_bpe(corpus.iter().map(String::as_str), 300).unwrap();
    let config = Qwen35Config::text(tokenizer.vocab_size(), Qwen35Size::TINY);
    let model = model(&config, 21);
    let engine = EngineConfig { max_batch_size: 4, ..EngineConfig::default() };
    let policy =
        std::sync::Arc::new(LocalPolicy::new(model.clone(), tokenizer, ChatTemplate::chatml(), engine).unwrap());
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| tokens(5 + 7 * i, 30 + i as u64)).collect();
    let params = SamplingParams { temperature: 0.0, max_tokens: 12, ignore_eos: true, ..SamplingParams::default() };
    let handles: Vec<_> = prompts
        .iter()
        .map(|prompt| {
            let (policy, prompt, params) = (policy.clone(), prompt.clone(), params.clone());
            std::thread::spawn(move || policy.generate(prompt, &params).unwrap().token_ids)
        })
        .collect();
    for (prompt, handle) in prompts.iter().zip(handles) {
        assert_eq!(handle.join().unwrap(), greedy_alone(&model, prompt, 12), "prompt of {}", prompt.len());
    }
    assert!(policy.stats().peak_decode_batch > 1, "the engine never batched: {:?}", policy.stats());
    let error = policy.qwen3("the trainer").err().expect("not a Qwen3 model").to_string();
    assert!(error.contains("Qwen3.5") && error.contains("the trainer"), "{error}");
}

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
