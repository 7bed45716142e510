//! Checkpoints in the Hugging Face layout, so that `transformers`, vLLM and friends can load what
//! whale trains and whale can start from any Qwen3 or Llama checkpoint (any config of the dense
//! decoder, [`DenseConfig`], which writes its own `config.json`).
//!
//! A checkpoint directory holds `config.json`, the weights (one `model.safetensors`, or shards
//! listed by `model.safetensors.index.json`) and `generation_config.json`. Weights of any float
//! dtype load and are converted to the model's dtype. Every problem names the file and the key
//! (or tensor) at fault. Files are written atomically (a temporary file, then a rename), so a
//! run killed while saving leaves either the old file or the new one.

use crate::qwen3::config::{one_or_many, optional, token_ids, ConfigIssue, Qwen3Config};
use crate::qwen3::dense::DenseConfig;
use crate::qwen3::model::{parameter_shapes, DenseModel, Qwen3Model};
use crate::tensor_file::{self, read_json_object, read_tensors, write_atomic, write_tensors};
pub use crate::tensor_file::{CheckpointError, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use candle_core::{DType, Device};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Tensor names with their expected shapes.
pub(crate) type NamedShapes = Vec<(String, Vec<usize>)>;

/// Sampling defaults stored beside the weights (`generation_config.json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenerationConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    #[serde(serialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub eos_token_id: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<u32>,
    pub do_sample: bool,
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
    /// Keys this crate does not interpret, written back unchanged.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

const GENERATION_KEYS: [&str; 7] =
    ["bos_token_id", "eos_token_id", "pad_token_id", "do_sample", "temperature", "top_k", "top_p"];

impl GenerationConfig {
    /// whale's sampling settings (temperature 1.0, top_p 1.0, top_k 20) with the model's
    /// special tokens.
    pub fn for_model(config: &impl DenseConfig) -> Self {
        let settings = config.settings();
        Self {
            bos_token_id: settings.bos_token_id,
            eos_token_id: settings.eos_token_id,
            pad_token_id: None,
            do_sample: true,
            temperature: 1.0,
            top_k: 20,
            top_p: 1.0,
            extra: BTreeMap::new(),
        }
    }

    /// Reads `generation_config.json` from a checkpoint directory; `None` when there is none.
    /// Missing keys take the `transformers` defaults.
    pub fn load(dir: &Path) -> Result<Option<Self>, CheckpointError> {
        let file = dir.join(GENERATION_CONFIG_FILE);
        if !file.exists() {
            return Ok(None);
        }
        let object = read_json_object(&file)?;
        Self::from_object(object).map(Some).map_err(|issue| CheckpointError::invalid(&file, &issue.key, issue.reason))
    }

    /// Writes `generation_config.json` into the checkpoint directory `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), CheckpointError> {
        let file = dir.join(GENERATION_CONFIG_FILE);
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| CheckpointError::Format { file: file.clone(), reason: e.to_string() })?;
        write_atomic(&file, text.as_bytes())
    }

    fn from_object(mut object: Map<String, Value>) -> Result<Self, ConfigIssue> {
        let config = Self {
            bos_token_id: optional(&object, "bos_token_id")?,
            eos_token_id: token_ids(&object, "eos_token_id")?,
            pad_token_id: optional(&object, "pad_token_id")?,
            do_sample: optional(&object, "do_sample")?.unwrap_or(false),
            temperature: optional(&object, "temperature")?.unwrap_or(1.0),
            top_k: optional(&object, "top_k")?.unwrap_or(50),
            top_p: optional(&object, "top_p")?.unwrap_or(1.0),
            extra: BTreeMap::new(),
        };
        object.retain(|key, _| !GENERATION_KEYS.contains(&key.as_str()));
        Ok(Self { extra: object.into_iter().collect(), ..config })
    }
}

/// The `torch_dtype` name of a candle dtype.
pub(crate) fn torch_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F64 => "float64",
        _ => "float32",
    }
}

/// The dtype the `config.json` of the checkpoint in `dir`, of any architecture, says its weights
/// are stored in (`torch_dtype`, or `dtype` as newer `transformers` write it); f32 when it names
/// none or another.
pub fn stored_dtype(dir: &Path) -> Result<DType, CheckpointError> {
    let config = config_object(dir)?;
    let named =
        config.get("torch_dtype").and_then(Value::as_str).or_else(|| config.get("dtype").and_then(Value::as_str));
    Ok(match named {
        Some("bfloat16") => DType::BF16,
        Some("float16") => DType::F16,
        _ => DType::F32,
    })
}

/// Writes the model as a Hugging Face checkpoint into `dir` (created if needed): its
/// architecture's `config.json` ([`DenseConfig::checkpoint_json`]), a single `model.safetensors`
/// in the model's dtype, and `generation_config.json`.
pub fn save_model<C: DenseConfig>(
    model: &DenseModel<C>,
    generation: &GenerationConfig,
    dir: &Path,
) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let tensors = model.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
    write_tensors(&dir.join(WEIGHTS_FILE), tensors)?;
    write_atomic(&dir.join(CONFIG_FILE), model.config().checkpoint_json(model.dtype()).as_bytes())?;
    generation.save(dir)
}

/// Loads a Qwen3 checkpoint directory as a model of `dtype` on `device`.
pub fn load_model(dir: &Path, dtype: DType, device: &Device) -> Result<Qwen3Model, CheckpointError> {
    load_dense::<Qwen3Config>(dir, dtype, device)
}

/// Loads a checkpoint directory of the architecture whose config is `C` as a model of `dtype`
/// on `device`.
pub fn load_dense<C: DenseConfig>(dir: &Path, dtype: DType, device: &Device) -> Result<DenseModel<C>, CheckpointError> {
    let config = C::read(&dir.join(CONFIG_FILE))?;
    let by_file = weight_files(dir, parameter_shapes(&config.settings()))?;
    let mut tensors = HashMap::new();
    for (file, wanted) in by_file {
        tensors.extend(read_tensors(&file, &wanted)?);
    }
    DenseModel::from_tensors(&config, tensors, dtype, device)
        .map_err(|source| CheckpointError::Model { dir: dir.to_path_buf(), source })
}

/// The expected tensors grouped by the file that holds them: `model.safetensors` when it
/// exists, else the shards that `model.safetensors.index.json` names.
pub(crate) fn weight_files(
    dir: &Path,
    expected: NamedShapes,
) -> Result<BTreeMap<PathBuf, NamedShapes>, CheckpointError> {
    let single = dir.join(WEIGHTS_FILE);
    if single.exists() {
        return Ok(BTreeMap::from([(single, expected)]));
    }
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if !index.exists() {
        return Err(CheckpointError::NoWeights { dir: dir.to_path_buf() });
    }
    let weight_map = read_weight_map(&index)?;
    let mut by_file: BTreeMap<PathBuf, NamedShapes> = BTreeMap::new();
    for (name, shape) in expected {
        let shard =
            weight_map.get(&name).ok_or_else(|| CheckpointError::invalid(&index, &name, "missing from weight_map"))?;
        by_file.entry(dir.join(shard)).or_default().push((name, shape));
    }
    Ok(by_file)
}

/// The names of a checkpoint's tensors, from the files [`load_model`] would read
/// (`model.safetensors`, else the index's `weight_map`), without reading any tensor.
pub fn tensor_names(dir: &Path) -> Result<Vec<String>, CheckpointError> {
    let single = dir.join(WEIGHTS_FILE);
    if single.exists() {
        return tensor_file::tensor_names(&single);
    }
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if !index.exists() {
        return Err(CheckpointError::NoWeights { dir: dir.to_path_buf() });
    }
    Ok(read_weight_map(&index)?.into_keys().collect())
}

/// A checkpoint's `config.json` as a JSON object, whatever architecture it describes.
pub fn config_object(dir: &Path) -> Result<Map<String, Value>, CheckpointError> {
    read_json_object(&dir.join(CONFIG_FILE))
}

/// The `weight_map` of a sharded checkpoint's index: tensor name to shard file name.
fn read_weight_map(index: &Path) -> Result<BTreeMap<String, String>, CheckpointError> {
    let object = read_json_object(index)?;
    let map: BTreeMap<String, String> = optional(&object, "weight_map")
        .map_err(|issue| CheckpointError::invalid(index, &issue.key, issue.reason))?
        .ok_or_else(|| CheckpointError::invalid(index, "weight_map", "missing"))?;
    if let Some((name, shard)) = map.iter().find(|(_, shard)| Path::new(shard).file_name() != Some(shard.as_ref())) {
        return Err(CheckpointError::invalid(index, name, format!("shard {shard:?} is not a plain file name")));
    }
    Ok(map)
}
