//! Hugging Face checkpoints: exact round trips, a foreign sharded bf16 checkpoint written with
//! `safetensors` directly, and errors that name the file and the key.

mod common;

use candle_core::{DType, Device};
use common::*;
use rand::Rng;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;
use whale_lm::checkpoint::{CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use whale_lm::{
    load_model, save_model, CheckpointError, Decoder, GenerationConfig, LlamaModel, Qwen3Config, RopeScaling,
    TrainableModel,
};

#[test]
fn save_then_load_gives_bit_identical_logits() {
    for tied in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_model(tied, 29);
        let mut generation = GenerationConfig::for_model(model.config());
        generation.eos_token_id = vec![3, 4];
        save_model(&model, &generation, dir.path()).unwrap();
        // Saving again over an existing checkpoint replaces it.
        save_model(&model, &generation, dir.path()).unwrap();
        let loaded = load_model(dir.path(), DType::F32, &Device::Cpu).unwrap();
        let tokens = random_tokens(&mut rng(7), 10);
        assert_eq!(full_logits(&model, &tokens), full_logits(&loaded, &tokens));
        assert_eq!(weights_of(&model), weights_of(&loaded));
        let mut expected_config = model.config().clone();
        expected_config.torch_dtype = Some("float32".to_string());
        assert_eq!(loaded.config(), &expected_config);
        assert_eq!(GenerationConfig::load(dir.path()).unwrap(), Some(generation));
        let names = tensor_names(&dir.path().join(WEIGHTS_FILE));
        assert_eq!(names.contains(&"lm_head.weight".to_string()), !tied);
        assert!(names.contains(&"model.layers.1.self_attn.k_norm.weight".to_string()));
    }
}

/// A Llama checkpoint is written as Llama (`model_type`, `architectures`, no query and key
/// norms, its rope scaling), and the registry loads it back as Llama with the same logits.
#[test]
fn a_llama_checkpoint_is_written_as_llama_and_loads_back_through_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = tiny_llama(true, 31).config().clone();
    config.own.rope_scaling = Some(RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 16,
    });
    let model = LlamaModel::new_random(&config, 31, DType::F32, &Device::Cpu).unwrap();
    model.save(dir.path()).unwrap();
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap()).unwrap();
    assert_eq!(written["model_type"], "llama");
    assert_eq!(written["architectures"], serde_json::json!(["LlamaForCausalLM"]));
    assert_eq!(written["rope_scaling"]["rope_type"], "llama3");
    let names = tensor_names(&dir.path().join(WEIGHTS_FILE));
    assert!(!names.iter().any(|name| name.contains("q_norm") || name.contains("k_norm")), "{names:?}");

    let decoder = Decoder::load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(decoder.architecture(), "Llama");
    let loaded = LlamaModel::of_decoder(&decoder).expect("a Llama model");
    assert_eq!(loaded.config().own.rope_scaling, config.own.rope_scaling);
    let tokens = random_tokens(&mut rng(8), 20);
    assert_eq!(full_logits(&model, &tokens), full_logits(loaded, &tokens));
}

fn tensor_names(file: &Path) -> Vec<String> {
    let bytes = std::fs::read(file).unwrap();
    let archive = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        metadata.metadata().as_ref().and_then(|m| m.get("format")),
        Some(&"pt".to_string()),
        "transformers requires the format metadata"
    );
    archive.names().into_iter().map(str::to_string).collect()
}

/// A Qwen3 `config.json` as `transformers` writes it, with keys whale does not use.
const HF_CONFIG: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "head_dim": 16,
  "hidden_act": "silu",
  "hidden_size": 48,
  "initializer_range": 0.02,
  "intermediate_size": 96,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 6,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 61
}"#;

/// The tensor names and shapes of `HF_CONFIG`, written out by hand from the HF naming scheme.
fn hf_tensor_shapes() -> Vec<(String, Vec<usize>)> {
    let mut shapes = vec![("model.embed_tokens.weight".to_string(), vec![61, 48])];
    for layer in 0..2 {
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![96, 48]),
            ("self_attn.k_proj.weight", vec![32, 48]),
            ("self_attn.v_proj.weight", vec![32, 48]),
            ("self_attn.o_proj.weight", vec![48, 96]),
            ("self_attn.q_norm.weight", vec![16]),
            ("self_attn.k_norm.weight", vec![16]),
            ("mlp.gate_proj.weight", vec![96, 48]),
            ("mlp.up_proj.weight", vec![96, 48]),
            ("mlp.down_proj.weight", vec![48, 96]),
            ("input_layernorm.weight", vec![48]),
            ("post_attention_layernorm.weight", vec![48]),
        ] {
            shapes.push((format!("model.layers.{layer}.{name}"), shape));
        }
    }
    shapes.push(("model.norm.weight".to_string(), vec![48]));
    shapes.push(("lm_head.weight".to_string(), vec![61, 48]));
    shapes
}

/// A tensor's name, shape and little-endian bytes.
type RawTensor = (String, Vec<usize>, Vec<u8>);

/// Rounds to the nearest bfloat16 (ties to even) and returns its bits.
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// Writes a sharded bf16 checkpoint of `HF_CONFIG`; returns the exact f32 value of every weight.
fn write_sharded_bf16_checkpoint(dir: &Path) -> HashMap<String, Vec<f32>> {
    std::fs::write(dir.join(CONFIG_FILE), HF_CONFIG).unwrap();
    let mut rng = rng(8);
    let mut values = HashMap::new();
    let mut shards: [Vec<RawTensor>; 2] = [Vec::new(), Vec::new()];
    let mut weight_map = serde_json::Map::new();
    for (index, (name, shape)) in hf_tensor_shapes().into_iter().enumerate() {
        let count: usize = shape.iter().product();
        let bits: Vec<u16> = (0..count)
            .map(|_| {
                let x: f32 = if shape.len() == 1 { rng.gen_range(0.5..1.5) } else { rng.gen_range(-0.3..0.3) };
                bf16_bits(x)
            })
            .collect();
        values.insert(name.clone(), bits.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect());
        let shard = usize::from(index >= 12);
        let file = format!("model-0000{}-of-00002.safetensors", shard + 1);
        weight_map.insert(name.clone(), serde_json::Value::from(file));
        let bytes = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        shards[shard].push((name, shape, bytes));
    }
    for (shard, tensors) in shards.iter().enumerate() {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(name, shape, bytes)| {
                let view = TensorView::new(Dtype::BF16, shape.clone(), bytes).unwrap();
                (name.clone(), view)
            })
            .collect();
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let file = dir.join(format!("model-0000{}-of-00002.safetensors", shard + 1));
        safetensors::tensor::serialize_to_file(views, Some(metadata), &file).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join(WEIGHTS_INDEX_FILE), index.to_string()).unwrap();
    values
}

#[test]
fn a_sharded_bf16_hugging_face_checkpoint_loads_and_matches_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let values = write_sharded_bf16_checkpoint(dir.path());
    let model = load_model(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(model.config().hidden_size, 48);
    assert_eq!(model.config().eos_token_id, vec![2]);
    assert_eq!(weights_of(&model), values);
    let tokens = random_tokens(&mut rng(9), 7);
    let ours = full_logits(&model, &tokens);
    let reference = reference_logits(model.settings(), &values, &tokens);
    for (row, expected) in ours.iter().zip(&reference) {
        let expected: Vec<f32> = expected.iter().map(|&x| x as f32).collect();
        assert!(max_abs_diff(row, &expected) < 1e-4);
    }

    let half = load_model(dir.path(), DType::BF16, &Device::Cpu).unwrap();
    assert_eq!(half.dtype(), DType::BF16);
    let half_logits = full_logits(&half, &tokens);
    for (row, expected) in half_logits.iter().zip(&ours) {
        let diff = max_abs_diff(row, expected);
        assert!(diff < 0.1, "bf16 drifts by {diff}");
    }

    // The foreign keys survive a save, and whale reads its own save back.
    let resaved = tempfile::tempdir().unwrap();
    save_model(&model, &GenerationConfig::for_model(model.config()), resaved.path()).unwrap();
    let text = std::fs::read_to_string(resaved.path().join(CONFIG_FILE)).unwrap();
    assert!(text.contains("\"transformers_version\": \"4.51.0\""), "{text}");
    assert!(text.contains("\"torch_dtype\": \"float32\""), "{text}");
    let again = load_model(resaved.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(full_logits(&again, &tokens), ours);
}

fn load_error(dir: &Path) -> String {
    match load_model(dir, DType::F32, &Device::Cpu) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(error) => error.to_string(),
    }
}

#[test]
fn malformed_config_errors_name_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(true, 31);
    save_model(&model, &GenerationConfig::for_model(model.config()), dir.path()).unwrap();
    let config_file = dir.path().join(CONFIG_FILE);
    let valid = std::fs::read_to_string(&config_file).unwrap();
    for (broken, key) in [
        (valid.replace("\"num_attention_heads\": 4", "\"num_attention_heads\": \"four\""), "num_attention_heads"),
        (valid.replace("\"intermediate_size\": 192,", ""), "intermediate_size"),
        (valid.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"), "num_key_value_heads"),
    ] {
        assert_ne!(broken, valid);
        std::fs::write(&config_file, broken).unwrap();
        let message = load_error(dir.path());
        assert!(message.contains(&config_file.display().to_string()), "{message}");
        assert!(message.contains(&format!("`{key}`")), "{message}");
    }
    std::fs::write(&config_file, &valid[..valid.len() / 2]).unwrap();
    let message = load_error(dir.path());
    assert!(message.contains(&config_file.display().to_string()), "{message}");
}

#[test]
fn missing_or_misshapen_tensors_name_the_file_and_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(false, 37);
    save_model(&model, &GenerationConfig::for_model(model.config()), dir.path()).unwrap();
    let weights = dir.path().join(WEIGHTS_FILE);
    let all = weights_of(&model);
    let shapes: HashMap<String, Vec<usize>> =
        model.named_parameters().into_iter().map(|(name, var)| (name, var.dims().to_vec())).collect();
    let write = |skip: &str, reshape: Option<(&str, Vec<usize>)>| {
        let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = all
            .iter()
            .filter(|(name, _)| name.as_str() != skip)
            .map(|(name, values)| {
                let shape = match &reshape {
                    Some((target, shape)) if target == name => shape.clone(),
                    _ => shapes[name].clone(),
                };
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name.clone(), shape, bytes)
            })
            .collect();
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(name, shape, bytes)| (name.clone(), TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap()))
            .collect();
        safetensors::tensor::serialize_to_file(views, None, &weights).unwrap();
    };
    let file = weights.display().to_string();

    write("model.layers.1.mlp.up_proj.weight", None);
    let message = load_error(dir.path());
    assert!(message.contains(&file), "{message}");
    assert!(message.contains("`model.layers.1.mlp.up_proj.weight`: missing"), "{message}");

    write("lm_head.weight", None);
    assert!(load_error(dir.path()).contains("`lm_head.weight`: missing"));

    write("", Some(("model.norm.weight", vec![8, 8])));
    let message = load_error(dir.path());
    assert!(message.contains(&file) && message.contains("`model.norm.weight`: shape [8, 8]"), "{message}");

    std::fs::write(&weights, b"not safetensors").unwrap();
    let message = load_error(dir.path());
    assert!(message.contains(&file), "{message}");

    std::fs::remove_file(&weights).unwrap();
    assert!(matches!(load_model(dir.path(), DType::F32, &Device::Cpu), Err(CheckpointError::NoWeights { .. })));
}

#[test]
fn sharded_checkpoint_errors_name_the_index_or_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded_bf16_checkpoint(dir.path());
    let index_file = dir.path().join(WEIGHTS_INDEX_FILE);
    let index = std::fs::read_to_string(&index_file).unwrap();

    let without_entry = index.replace("\"model.norm.weight\":", "\"model.norm.weight.unused\":");
    std::fs::write(&index_file, without_entry).unwrap();
    let message = load_error(dir.path());
    assert!(message.contains(&index_file.display().to_string()), "{message}");
    assert!(message.contains("`model.norm.weight`: missing from weight_map"), "{message}");

    // The index points a tensor at the shard that does not hold it.
    let moved = index.replace(
        "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"",
        "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"",
    );
    assert_ne!(moved, index);
    std::fs::write(&index_file, moved).unwrap();
    let message = load_error(dir.path());
    assert!(message.contains("model-00001-of-00002.safetensors"), "{message}");
    assert!(message.contains("`model.norm.weight`: missing"), "{message}");

    let escaping = index.replace(
        "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"",
        "\"model.norm.weight\":\"../model-00002-of-00002.safetensors\"",
    );
    std::fs::write(&index_file, escaping).unwrap();
    let message = load_error(dir.path());
    assert!(message.contains("not a plain file name"), "{message}");

    std::fs::write(&index_file, "{\"metadata\": {}}").unwrap();
    assert!(load_error(dir.path()).contains("`weight_map`: missing"));
}

#[test]
fn the_generation_config_reads_hugging_face_files() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(GenerationConfig::load(dir.path()).unwrap(), None);
    let file = dir.path().join("generation_config.json");
    std::fs::write(
        &file,
        r#"{"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
            "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
            "transformers_version": "4.51.0"}"#,
    )
    .unwrap();
    let generation = GenerationConfig::load(dir.path()).unwrap().unwrap();
    assert_eq!(generation.eos_token_id, vec![151645, 151643]);
    assert_eq!((generation.top_k, generation.top_p), (20, 0.95));
    assert!(generation.extra.contains_key("transformers_version"));
    std::fs::write(&file, r#"{"top_k": -1}"#).unwrap();
    let message = GenerationConfig::load(dir.path()).unwrap_err().to_string();
    assert!(message.contains(&file.display().to_string()) && message.contains("`top_k`"), "{message}");
    let defaults = GenerationConfig::for_model(&Qwen3Config::tiny(10));
    assert_eq!((defaults.temperature, defaults.top_k, defaults.top_p), (1.0, 20, 1.0));
}
