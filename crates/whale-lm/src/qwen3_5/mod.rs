//! Qwen3.5, the family of the WHALE paper's models: a hybrid decoder in which three of every
//! four layers are Gated DeltaNet linear attention and every fourth is gated full attention.
//!
//! Data flow: [`load_qwen35`] reads `config.json` ([`Qwen35Config`], text-only or the multimodal
//! wrapper's `text_config`) and the text weights (under `model.` or `model.language_model.`)
//! into a [`Qwen35Model`]; [`Qwen35Model::packed_hidden`] is the training pass,
//! [`Qwen35Model::forward_step`] the batched decoding step over per-sequence [`Qwen35Cache`]s;
//! [`save_qwen35`] writes the checkpoint back in the layout it came in.
//!
//! [`Qwen35Lora`] is a PEFT LoRA adapter of its projections ([`Qwen35Model::with_adapter`]).

pub mod architecture;
pub mod config;
mod delta_rule;
pub mod lora;
pub mod model;
mod shapes;

pub use config::{LayerKind, Qwen35Config, Qwen35Size};
pub use lora::Qwen35Lora;
pub use model::{Qwen35Cache, Qwen35Model, Qwen35Step};
pub use shapes::parameter_shapes;

use crate::qwen3::checkpoint::{torch_dtype_name, weight_files, CheckpointError, CONFIG_FILE};
use crate::tensor_file::{read_tensors, write_atomic, write_tensors, WEIGHTS_FILE};
use candle_core::{DType, Device};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Loads a Qwen3.5 checkpoint directory (one `model.safetensors` or an index of shards) as a
/// model of `dtype` on `device`.
pub fn load_qwen35(dir: &Path, dtype: DType, device: &Device) -> Result<Qwen35Model, CheckpointError> {
    let config = Qwen35Config::from_file(&dir.join(CONFIG_FILE))?;
    let mut tensors = HashMap::new();
    for (file, wanted) in weight_files(dir, parameter_shapes(&config))? {
        tensors.extend(read_tensors(&file, &wanted)?);
    }
    Qwen35Model::from_tensors(&config, tensors, dtype, device)
        .map_err(|source| CheckpointError::Model { dir: dir.to_path_buf(), source })
}

/// Writes the model into `dir` (created if needed): its `config.json` as it was read, with the
/// text configuration and the dtype updated ([`Qwen35Config::to_config_json`]), and one
/// `model.safetensors` of the text weights under their names as read.
/// The vision tower of a multimodal checkpoint is not carried: whale does not load it.
pub fn save_qwen35(model: &Qwen35Model, dir: &Path) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let tensors = model.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
    write_tensors(&dir.join(WEIGHTS_FILE), tensors)?;
    let mut config = model.config().to_config_json();
    config.remove("torch_dtype");
    config.insert("dtype".to_string(), Value::from(torch_dtype_name(model.dtype())));
    let text = serde_json::to_string_pretty(&Value::Object(config))
        .map_err(|e| CheckpointError::Format { file: dir.join(CONFIG_FILE), reason: e.to_string() })?;
    write_atomic(&dir.join(CONFIG_FILE), text.as_bytes())
}
