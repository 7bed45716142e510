//! A Llama or Qwen2 GGUF as a Hugging Face `LlamaForCausalLM` or `Qwen2ForCausalLM` directory:
//! `config.json`, `model.safetensors` (every tensor dequantized, under Hugging Face names, a
//! Llama's rotary rows of the query and key projections back in Hugging Face order), `tokenizer.json`,
//! `tokenizer_config.json` (with the chat template and the special tokens) and
//! `generation_config.json`. The tokenizer, the block count, the vocabulary size and every tensor's
//! shape are checked before anything is dequantized or written, so that a file refused for them
//! leaves no directory behind to be cached. The weights are the ones transformers gets when it
//! loads the GGUF itself (`bench/smollm2_convert_check.py` and `bench/qwen2_5_parity.py` check
//! that), so transformers, vLLM and whale load the directory as the same model.

use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use serde_json::{json, Map, Value};

use crate::architecture::GgufArchitecture;
use crate::error::GgufError;
use crate::hyperparameters::{Hyperparameters, RopeScaling};
use crate::names::{self, HfTensor, RowOrder};
use crate::tokenizer::{self, GgufVocabulary, SpecialToken};
use crate::{GgufFile, TensorEntry};
use whale_lm::checkpoint::WEIGHTS_FILE;
use whale_lm::tensor_file::{write_atomic, write_tensors};
use whale_text::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};

pub const CONFIG_FILE: &str = "config.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// What the conversion is doing, for a progress display.
#[derive(Debug, Clone, Copy)]
pub enum ConvertProgress<'a> {
    /// Tensor `done` of `total` (1-based) has been dequantized.
    Tensor {
        done: usize,
        total: usize,
        name: &'a str,
    },
    Wrote(&'a Path),
}

/// What was written.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertReport {
    pub architecture: GgufArchitecture,
    pub tensors: usize,
    pub parameters: usize,
    /// No `output.weight`: the embedding doubles as the output projection.
    pub tied_embeddings: bool,
    pub files: Vec<PathBuf>,
}

/// Writes the Hugging Face directory of `gguf` into `dir` (created if needed), the weights in
/// `dtype` (F32, or BF16 rounded from the dequantized f32).
pub fn convert_to_hf(
    gguf: &GgufFile,
    dir: &Path,
    dtype: DType,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<ConvertReport, GgufError> {
    let shape = gguf.hyperparameters()?;
    let vocabulary = gguf.vocabulary()?;
    check_tokenizer(gguf, &vocabulary)?;
    check_vocab_size(gguf, &shape, &vocabulary)?;
    let plan = plan_tensors(gguf, &shape, vocabulary.size)?;
    let tensors = convert_tensors(gguf, &plan, &shape, dtype, progress)?;
    let tied_embeddings = !gguf.has_tensor(names::OUTPUT);
    let parameters = tensors.iter().map(|(_, tensor)| tensor.elem_count()).sum();
    let count = tensors.len();
    std::fs::create_dir_all(dir).map_err(|e| GgufError::io(dir, e))?;
    let config = config_json(&shape, &vocabulary, tied_embeddings, dtype);
    let files = vec![
        write_json(&dir.join(CONFIG_FILE), &config, progress)?,
        write_weights(&dir.join(WEIGHTS_FILE), tensors, progress)?,
        write_json(&dir.join(TOKENIZER_FILE), &vocabulary.tokenizer_json, progress)?,
        write_json(&dir.join(TOKENIZER_CONFIG_FILE), &tokenizer_config_json(gguf, &vocabulary, &shape)?, progress)?,
        write_json(&dir.join(GENERATION_CONFIG_FILE), &generation_config_json(&vocabulary), progress)?,
    ];
    Ok(ConvertReport { architecture: shape.architecture, tensors: count, parameters, tied_embeddings, files })
}

/// Parses the `tokenizer.json` about to be written, as every loader of the directory will: a
/// merge of tokens outside the vocabulary builds a JSON no `tokenizers` loads.
fn check_tokenizer(gguf: &GgufFile, vocabulary: &GgufVocabulary) -> Result<(), GgufError> {
    let json = vocabulary.tokenizer_json.to_string();
    json.parse::<tokenizers::Tokenizer>().map(drop).map_err(|error| {
        let reason = format!("the tokenizer.json built from the vocabulary does not load: {error}");
        GgufError::invalid_key(gguf.path(), tokenizer::MERGES_KEY, reason)
    })
}

/// Refuses a `<architecture>.vocab_size` other than the token count (the rows of the embedding and the
/// output projection are held to the same count by [`check_shape`]).
fn check_vocab_size(gguf: &GgufFile, shape: &Hyperparameters, vocabulary: &GgufVocabulary) -> Result<(), GgufError> {
    match shape.vocab_size {
        Some(size) if size != vocabulary.size => {
            let reason = format!("{size}, but `{}` lists {} tokens", tokenizer::TOKENS_KEY, vocabulary.size);
            Err(GgufError::invalid_key(gguf.path(), &shape.architecture.key("vocab_size"), reason))
        }
        _ => Ok(()),
    }
}

/// Each GGUF tensor with its Hugging Face name, in file order; refuses a block count past the
/// file's blocks, a missing tensor of the architecture's layout, one outside it, and one of the wrong shape
/// (from the file's listing, before anything is dequantized).
fn plan_tensors(gguf: &GgufFile, shape: &Hyperparameters, vocab: usize) -> Result<Vec<(String, HfTensor)>, GgufError> {
    let file = gguf.path().to_path_buf();
    check_block_count(gguf, shape)?;
    let architecture = shape.architecture;
    if let Some(missing) = names::required_tensors(shape.layers, architecture).find(|name| !gguf.has_tensor(name)) {
        return Err(GgufError::MissingTensor { file, tensor: missing });
    }
    let mut plan = Vec::new();
    for entry in gguf.tensors() {
        let target = names::hf_tensor(&entry.name, architecture).filter(|target| layer_of(&target.name) < shape.layers);
        let outside = || format!("not a tensor of a {} model", architecture.name());
        let target = target.ok_or_else(|| GgufError::tensor(&file, &entry.name, outside()))?;
        check_shape(gguf, &entry, shape, vocab)?;
        plan.push((entry.name, target));
    }
    Ok(plan)
}

/// Refuses a `<architecture>.block_count` past the file's last block, naming the key rather than the first
/// tensor of a block the file does not have.
fn check_block_count(gguf: &GgufFile, shape: &Hyperparameters) -> Result<(), GgufError> {
    let last_block = format!("blk.{}.", shape.layers - 1);
    if gguf.tensors().iter().any(|entry| entry.name.starts_with(&last_block)) {
        return Ok(());
    }
    let reason = format!("{} blocks, but the file has no tensor of block {}", shape.layers, shape.layers - 1);
    Err(GgufError::invalid_key(gguf.path(), &shape.architecture.key("block_count"), reason))
}

/// The block index of a Hugging Face layer tensor (0 for the others).
fn layer_of(hf_name: &str) -> usize {
    let index = hf_name.strip_prefix("model.layers.").and_then(|rest| rest.split('.').next());
    index.and_then(|index| index.parse().ok()).unwrap_or(0)
}

fn convert_tensors(
    gguf: &GgufFile,
    plan: &[(String, HfTensor)],
    shape: &Hyperparameters,
    dtype: DType,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<Vec<(String, Tensor)>, GgufError> {
    let mut reader = gguf.reader()?;
    let mut converted = Vec::with_capacity(plan.len());
    for (index, (gguf_name, target)) in plan.iter().enumerate() {
        let values = reader.dequantize(gguf_name, DType::F32)?;
        let values = restore_row_order(values, target.rows, shape).and_then(|values| values.to_dtype(dtype));
        converted.push((target.name.clone(), values.map_err(|e| GgufError::tensor(gguf.path(), gguf_name, e))?));
        progress(ConvertProgress::Tensor { done: index + 1, total: plan.len(), name: gguf_name });
    }
    Ok(converted)
}

fn restore_row_order(values: Tensor, rows: RowOrder, shape: &Hyperparameters) -> candle_core::Result<Tensor> {
    match rows {
        RowOrder::AsStored => Ok(values),
        RowOrder::RotaryQuery => names::unpermute_rotary_rows(&values, shape.heads),
        RowOrder::RotaryKey => names::unpermute_rotary_rows(&values, shape.kv_heads),
    }
}

/// Refuses a tensor whose shape disagrees with the hyperparameters and the token count (the rows
/// of the embedding and the output projection).
fn check_shape(gguf: &GgufFile, entry: &TensorEntry, shape: &Hyperparameters, vocab: usize) -> Result<(), GgufError> {
    let expected = expected_shape(&entry.name, shape, vocab);
    if expected.as_deref() == Some(entry.shape.as_slice()) {
        return Ok(());
    }
    let architecture = shape.architecture.name();
    let wanted = expected.map_or_else(|| format!("no {architecture} tensor"), |dims| format!("{dims:?}"));
    let reason = format!(
        "shape {:?}; the metadata ({vocab} tokens, the `{architecture}.*` sizes) implies {wanted}",
        entry.shape
    );
    Err(GgufError::tensor(gguf.path(), &entry.name, reason))
}

fn expected_shape(name: &str, shape: &Hyperparameters, vocab: usize) -> Option<Vec<usize>> {
    let (hidden, inner) = (shape.hidden_size, shape.intermediate_size);
    let (query, key_value) = (shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim);
    if let Some(leaf) = name.strip_suffix(".bias") {
        return match leaf.rsplit('.').next()? {
            "attn_q" => Some(vec![query]),
            "attn_k" | "attn_v" => Some(vec![key_value]),
            _ => None,
        };
    }
    let leaf = name.strip_suffix(".weight")?.rsplit('.').next()?;
    let dims = match leaf {
        "token_embd" | "output" => vec![vocab, hidden],
        "attn_norm" | "ffn_norm" | "output_norm" => vec![hidden],
        "attn_q" => vec![query, hidden],
        "attn_k" | "attn_v" => vec![key_value, hidden],
        "attn_output" => vec![hidden, query],
        "ffn_gate" | "ffn_up" => vec![inner, hidden],
        "ffn_down" => vec![hidden, inner],
        _ => return None,
    };
    Some(dims)
}

/// The `config.json` transformers writes for the architecture (keys sorted, as it writes them).
fn config_json(shape: &Hyperparameters, vocabulary: &GgufVocabulary, tied_embeddings: bool, dtype: DType) -> Value {
    let id = |token: &Option<SpecialToken>| token.as_ref().map(|token| token.id);
    let mut config = json!({
        "architectures": [shape.architecture.hf_architecture()],
        "model_type": shape.architecture.model_type(),
        "attention_dropout": 0.0,
        "bos_token_id": id(&vocabulary.bos),
        "eos_token_id": id(&vocabulary.eos),
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.context_length,
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_scaling": shape.rope_scaling.as_ref().map(rope_scaling_json),
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": tied_embeddings,
        "torch_dtype": torch_dtype_name(dtype),
        "use_cache": true,
        "vocab_size": vocabulary.size,
    });
    let own = match shape.architecture {
        GgufArchitecture::Llama => json!({
            "attention_bias": false,
            "mlp_bias": false,
            "pad_token_id": id(&vocabulary.pad),
            "pretraining_tp": 1,
        }),
        // Qwen2's biases are not a key: transformers always builds them.
        GgufArchitecture::Qwen2 => json!({
            "max_window_layers": shape.layers,
            "sliding_window": shape.context_length,
            "use_sliding_window": false,
        }),
    };
    if let (Value::Object(config), Value::Object(own)) = (&mut config, own) {
        config.extend(own);
    }
    config
}

fn rope_scaling_json(scaling: &RopeScaling) -> Value {
    match scaling {
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Yarn { factor, original_context } => json!({
            "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original_context,
        }),
    }
}

fn torch_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// transformers' `tokenizer_config.json`: the special tokens by text, every added token by id,
/// and the chat template.
fn tokenizer_config_json(
    gguf: &GgufFile,
    vocabulary: &GgufVocabulary,
    shape: &Hyperparameters,
) -> Result<Value, GgufError> {
    let content = |token: &Option<SpecialToken>| token.as_ref().map(|token| token.content.clone());
    let added: Map<String, Value> = vocabulary
        .added_tokens
        .iter()
        .map(|token| {
            let entry = json!({
                "content": token.content, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": token.special,
            });
            (token.id.to_string(), entry)
        })
        .collect();
    let mut config = json!({
        "add_bos_token": vocabulary.add_bos_token,
        "add_eos_token": vocabulary.add_eos_token,
        "add_prefix_space": false,
        "added_tokens_decoder": added,
        "bos_token": content(&vocabulary.bos),
        "clean_up_tokenization_spaces": false,
        "eos_token": content(&vocabulary.eos),
        "model_max_length": shape.context_length,
        "pad_token": content(&vocabulary.pad),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": content(&vocabulary.unk),
    });
    if let Some(template) = gguf.chat_template_source()? {
        config["chat_template"] = json!(template);
    }
    Ok(config)
}

fn generation_config_json(vocabulary: &GgufVocabulary) -> Value {
    let ids = [("bos_token_id", &vocabulary.bos), ("eos_token_id", &vocabulary.eos), ("pad_token_id", &vocabulary.pad)];
    let present = ids.into_iter().filter_map(|(key, token)| Some((key.to_string(), json!(token.as_ref()?.id))));
    Value::Object(present.collect())
}

fn write_json(file: &Path, value: &Value, progress: &mut dyn FnMut(ConvertProgress)) -> Result<PathBuf, GgufError> {
    let text = serde_json::to_string_pretty(value).expect("a serde_json::Value always serializes") + "\n";
    write_atomic(file, text.as_bytes())?;
    progress(ConvertProgress::Wrote(file));
    Ok(file.to_path_buf())
}

fn write_weights(
    file: &Path,
    tensors: Vec<(String, Tensor)>,
    progress: &mut dyn FnMut(ConvertProgress),
) -> Result<PathBuf, GgufError> {
    write_tensors(file, tensors)?;
    progress(ConvertProgress::Wrote(file));
    Ok(file.to_path_buf())
}
