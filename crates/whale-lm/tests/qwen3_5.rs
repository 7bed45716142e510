//! Qwen3.5 on tiny random models: decoding equals the full pass (across delta-rule chunks and
//! with sequences joining mid-way), every parameter gets a gradient, and checkpoints
//! round-trip in the text-only and the multimodal layout. (The engine's batching of it is
//! tested in whale-engine, its training by whale's trainer in whale-train.)

mod common;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use common::qwen3_5::{max_difference, model, tokens, VOCAB};
use whale_lm::qwen3_5::{parameter_shapes, Qwen35Size};
use whale_lm::{load_qwen35, save_qwen35, Qwen35Config, Qwen35Model, Qwen35Step};

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
