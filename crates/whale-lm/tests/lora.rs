//! LoRA adapters: a fresh one changes nothing, cached and uncached passes agree, merging computes
//! the same function, the PEFT files round trip with PEFT's names, and dropout applies to
//! training passes only. (Training an adapter with whale's trainer is tested in whale-train.)

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::*;
use std::collections::HashMap;
use std::path::Path;
use whale_lm::{Decoder, KvCache, LoraAdapter, LoraConfig, Qwen3Model, SeqStep, TrainableModel};

/// Gives every B random values, as training would, so that the adapter changes the outputs.
fn randomize_b(adapter: &LoraAdapter, seed: u64) {
    let mut rng = rng(seed);
    for (name, var) in adapter.named_parameters() {
        if name.contains("lora_B") {
            let values: Vec<f32> = (0..var.elem_count()).map(|_| rand::Rng::gen_range(&mut rng, -0.3..0.3)).collect();
            var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap()).unwrap();
        }
    }
}

fn values_of(params: Vec<(String, Var)>) -> HashMap<String, Vec<f32>> {
    params
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}

const ALL: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

#[test]
fn a_fresh_adapter_leaves_the_logits_unchanged() {
    let base = tiny_model(false, 3);
    let adapter = adapter_for(&base, LoraConfig::default(), 5);
    let adapted = base.with_adapter(&adapter).unwrap();
    let tokens = random_tokens(&mut rng(7), 9);
    assert_eq!(full_logits(&adapted, &tokens), full_logits(&base, &tokens));
    let (base_tokens, base_rows) = greedy_with_cache(&base, &tokens, 4);
    let (adapted_tokens, adapted_rows) = greedy_with_cache(&adapted, &tokens, 4);
    assert_eq!((adapted_tokens, adapted_rows), (base_tokens, base_rows));
    // A is random, B is zero, and every layer has all seven projections.
    let params = values_of(adapter.named_parameters());
    assert_eq!(params.len(), 2 * 7 * base.config().num_hidden_layers);
    for (name, values) in &params {
        let zero = values.iter().all(|&v| v == 0.0);
        assert_eq!(zero, name.contains("lora_B"), "{name}");
    }
    // The same seed makes the same adapter.
    assert_eq!(values_of(adapter_for(&base, LoraConfig::default(), 5).named_parameters()), params);
}

#[test]
fn cached_batched_decoding_with_an_adapter_matches_the_training_pass() {
    let base = tiny_model(false, 19);
    let adapter = adapter_for(&base, lora(3, &["q_proj", "v_proj", "o_proj", "down_proj"]), 23);
    randomize_b(&adapter, 29);
    let model = base.with_adapter(&adapter).unwrap();
    let prompt = random_tokens(&mut rng(31), 6);
    assert!(max_abs_diff(&full_logits(&model, &prompt)[5], &full_logits(&base, &prompt)[5]) > 1e-2);

    let (cached, cached_rows) = greedy_with_cache(&model, &prompt, 8);
    let (uncached, uncached_rows) = greedy_without_cache(&model, &prompt, 8);
    assert_eq!(cached, uncached);
    for (a, b) in cached_rows.iter().zip(&uncached_rows) {
        assert!(max_abs_diff(a, b) < 1e-4);
    }

    // Two sequences of different lengths in one batched step, against each one's full pass.
    let sequences = [random_tokens(&mut rng(37), 7), random_tokens(&mut rng(41), 3)];
    let mut caches: Vec<KvCache> = sequences.iter().map(|_| model.new_cache()).collect();
    let mut steps: Vec<SeqStep> =
        sequences.iter().zip(caches.iter_mut()).map(|(tokens, cache)| SeqStep { tokens, cache }).collect();
    let logits = model.forward_step(&mut steps).unwrap().to_vec2::<f32>().unwrap();
    for (row, tokens) in sequences.iter().enumerate() {
        let expected = full_logits(&model, tokens).pop().unwrap();
        assert!(max_abs_diff(&logits[row], &expected) < 1e-4, "sequence {row}");
    }
}

#[test]
fn the_merged_model_computes_what_the_adapted_one_does() {
    let base = tiny_model(false, 43);
    let adapter = adapter_for(&base, lora(4, &["k_proj", "o_proj", "gate_proj", "up_proj"]), 47);
    randomize_b(&adapter, 53);
    let adapted = base.with_adapter(&adapter).unwrap();
    let merged = adapted.merged().unwrap();
    assert!(merged.adapter().is_none());
    let tokens = random_tokens(&mut rng(59), 10);
    let expected = full_logits(&adapted, &tokens);
    let before_update = full_logits(&merged, &tokens);
    for (a, b) in before_update.iter().zip(&expected) {
        assert!(max_abs_diff(a, b) < 1e-4);
    }
    // Untargeted weights are the base's, targeted ones differ.
    let (base_weights, merged_weights) = (weights_of(&base), weights_of(&merged));
    for (name, values) in &base_weights {
        let targeted = ["k_proj", "o_proj", "gate_proj", "up_proj"].iter().any(|t| name.contains(t));
        assert_eq!(values != &merged_weights[name], targeted, "{name}");
    }
    // The merged model owns its parameters: later adapter updates do not reach it.
    randomize_b(&adapter, 61);
    assert_eq!(full_logits(&merged, &tokens), before_update);
    assert_ne!(full_logits(&adapted, &tokens), expected);
}

fn read_names(file: &Path) -> Vec<String> {
    let mut names: Vec<String> = candle_core::safetensors::load(file, &Device::Cpu).unwrap().into_keys().collect();
    names.sort();
    names
}

#[test]
fn save_peft_writes_peft_names_and_config_and_load_peft_reads_them_back() {
    let base = tiny_model(true, 67);
    let config = LoraConfig { dropout: 0.05, ..lora(2, &["v_proj", "q_proj", "down_proj"]) };
    let adapter = adapter_for(&base, config.clone(), 71);
    randomize_b(&adapter, 73);
    let dir = tempfile::tempdir().unwrap();
    adapter.save_peft(dir.path(), "Qwen/Qwen3-0.6B").unwrap();

    let text = std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["peft_type"], "LORA");
    assert_eq!(json["task_type"], "CAUSAL_LM");
    assert_eq!(json["base_model_name_or_path"], "Qwen/Qwen3-0.6B");
    assert_eq!(json["r"], 2);
    assert_eq!(json["lora_alpha"], 4.0);
    assert_eq!(json["lora_dropout"], 0.05);
    assert_eq!(json["target_modules"], serde_json::json!(["q_proj", "v_proj", "down_proj"]));
    assert_eq!(json["bias"], "none");
    assert_eq!(json["fan_in_fan_out"], false);
    assert_eq!(json["inference_mode"], true);
    assert_eq!(json["use_rslora"], false);
    assert!(json["modules_to_save"].is_null());

    let mut expected: Vec<String> = Vec::new();
    for layer in 0..base.config().num_hidden_layers {
        for module in ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"] {
            for matrix in ["lora_A", "lora_B"] {
                expected.push(format!("base_model.model.model.layers.{layer}.{module}.{matrix}.weight"));
            }
        }
    }
    expected.sort();
    let weights = dir.path().join("adapter_model.safetensors");
    assert_eq!(read_names(&weights), expected);
    let shapes: HashMap<String, Vec<usize>> = candle_core::safetensors::load(&weights, &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(name, tensor)| (name, tensor.dims().to_vec()))
        .collect();
    let (hidden, intermediate) = (base.config().hidden_size, base.config().intermediate_size);
    assert_eq!(shapes["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"], [2, intermediate]);
    assert_eq!(shapes["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"], [hidden, 2]);

    let loaded = LoraAdapter::load_peft(dir.path(), base.config(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(loaded.config().rank, 2);
    assert_eq!(loaded.config().alpha, 4.0);
    assert_eq!(loaded.config().dropout, 0.05);
    assert_eq!(values_of(loaded.named_parameters()), values_of(adapter.named_parameters()));
    let tokens = random_tokens(&mut rng(79), 6);
    let from_saved = full_logits(&base.with_adapter(&loaded).unwrap(), &tokens);
    assert_eq!(from_saved, full_logits(&base.with_adapter(&adapter).unwrap(), &tokens));
}

/// A Llama's adapter is PEFT's, with the module names of `LlamaForCausalLM` (the same seven as
/// Qwen3's), and applies again through the registry's seam with the same logits.
#[test]
fn a_llama_adapter_is_saved_with_peft_names_and_applies_through_the_seam() {
    let base = tiny_llama(true, 89);
    let adapted = base.with_new_adapter(&lora(2, &ALL), 97).unwrap();
    randomize_b(adapted.adapter().unwrap(), 101);
    let dir = tempfile::tempdir().unwrap();
    adapted.save_adapter(dir.path(), "HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(json["target_modules"], serde_json::json!(ALL));
    assert_eq!(json["base_model_name_or_path"], "HuggingFaceTB/SmolLM2-135M-Instruct");
    let names = read_names(&dir.path().join("adapter_model.safetensors"));
    assert_eq!(names.len(), 2 * ALL.len() * base.settings().num_hidden_layers);
    assert!(names.contains(&"base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight".to_string()));

    let decoder = Decoder::from(base.clone()).with_peft_adapter(dir.path()).unwrap();
    assert_eq!(decoder.architecture(), "Llama");
    let tokens = random_tokens(&mut rng(103), 7);
    let through_seam = full_logits(decoder.downcast_ref::<whale_lm::LlamaModel>().unwrap(), &tokens);
    assert_eq!(through_seam, full_logits(&adapted, &tokens));
    assert_ne!(through_seam, full_logits(&base, &tokens), "the adapter changes the logits");
}

#[test]
fn a_bad_adapter_directory_names_the_file_and_the_key() {
    let base = tiny_model(true, 83);
    let adapter = adapter_for(&base, lora(2, &["q_proj"]), 89);
    let dir = tempfile::tempdir().unwrap();
    adapter.save_peft(dir.path(), "base").unwrap();
    let weights = dir.path().join("adapter_model.safetensors");
    let config_file = dir.path().join("adapter_config.json");
    let load = || LoraAdapter::load_peft(dir.path(), base.config(), DType::F32, &Device::Cpu);
    let original: HashMap<String, Tensor> = candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
    let key = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight";

    let mut missing = original.clone();
    missing.remove(key);
    candle_core::safetensors::save(&missing, &weights).unwrap();
    let message = load().err().unwrap().to_string();
    assert!(message.contains(&weights.display().to_string()) && message.contains(key), "{message}");
    assert!(message.contains("missing"), "{message}");

    let mut wrong = original.clone();
    wrong.insert(key.to_string(), Tensor::zeros((5, 2), DType::F32, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&wrong, &weights).unwrap();
    let message = load().err().unwrap().to_string();
    assert!(message.contains(&weights.display().to_string()) && message.contains(key), "{message}");
    assert!(message.contains("shape"), "{message}");

    let extra_key = "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight";
    let mut extra = original.clone();
    extra.insert(extra_key.to_string(), Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&extra, &weights).unwrap();
    let message = load().err().unwrap().to_string();
    assert!(message.contains(extra_key) && message.contains("unexpected"), "{message}");
    candle_core::safetensors::save(&original, &weights).unwrap();
    assert!(load().is_ok());

    let good: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config_file).unwrap()).unwrap();
    let cases: [(&str, serde_json::Value, &str); 4] = [
        ("r", serde_json::Value::Null, "missing"),
        ("use_dora", serde_json::json!(true), "not supported"),
        ("target_modules", serde_json::json!(["q_proj", "lm_head"]), "lm_head"),
        ("lora_dropout", serde_json::json!(1.5), "[0, 1)"),
    ];
    for (key, value, reason) in cases {
        let mut edited = good.clone();
        edited[key] = value;
        std::fs::write(&config_file, edited.to_string()).unwrap();
        let message = load().err().unwrap().to_string();
        assert!(message.contains(&config_file.display().to_string()), "{message}");
        assert!(message.contains(&format!("`{key}`")) && message.contains(reason), "{message}");
    }

    // An adapter made for another shape does not fit.
    let mut other = base.config().clone();
    other.num_hidden_layers += 1;
    let bigger = Qwen3Model::new_random(&other, 1, DType::F32, &Device::Cpu).unwrap();
    let message = bigger.with_adapter(&adapter).err().unwrap().to_string();
    assert!(message.contains("layers"), "{message}");
    for (config, key) in [(lora(0, &["q_proj"]), "rank"), (lora(2, &[]), "target_modules")] {
        let message = config.validate().err().unwrap().to_string();
        assert!(message.contains(&format!("`{key}`")), "{message}");
    }
}

#[test]
fn dropout_applies_to_training_passes_only_and_is_reproducible() {
    let base = tiny_model(false, 97);
    let adapter = adapter_for(&base, LoraConfig { dropout: 0.5, ..lora(4, &ALL) }, 101);
    randomize_b(&adapter, 103);
    let model = base.with_adapter(&adapter).unwrap();
    let tokens = random_tokens(&mut rng(107), 8);
    let plain = full_logits(&model, &tokens);
    let dropped = full_logits(&model.with_dropout(5), &tokens);
    assert!(max_abs_diff(&plain[7], &dropped[7]) > 1e-3);
    assert_eq!(full_logits(&model.with_dropout(5), &tokens), dropped);
    assert_ne!(full_logits(&model.with_dropout(6), &tokens), dropped);
    let mut cache = model.new_cache();
    assert!(max_abs_diff(&step_one(&model, &tokens, &mut cache), &plain[7]) < 1e-4);
    // No dropout without an adapter.
    assert_eq!(full_logits(&base.with_dropout(5), &tokens), full_logits(&base, &tokens));
}
