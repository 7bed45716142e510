//! The registry: the one list of every architecture whale runs, and the loader that picks one by
//! a checkpoint's `config.json` `model_type`.
//!
//! Adding an architecture is its folder (the model, its [`Architecture`] and
//! [`TrainableModel`] impls and its [`Registration`]) plus one line in [`ARCHITECTURES`]; and, for
//! now, a variant of [`Decoder`] with its arms in [`Decoder::model`] and
//! [`Decoder::with_trainable`], and the bench's per-architecture counts, which match on it.
//!
//! [`Architecture`]: crate::decoder::Architecture

use crate::decoder::{Decoder, Registration};
use crate::qwen3::checkpoint::{config_object, CheckpointError, CONFIG_FILE};
use crate::qwen3::config::QWEN3_MODEL_TYPE;
use crate::train::TrainableModel;
use candle_core::{DType, Device};
use std::path::Path;

/// Work over a trainable model of whichever architecture a [`Decoder`] holds
/// ([`Decoder::with_trainable`]): how the crates above build and keep a trainer without naming
/// an architecture.
pub trait WithTrainable {
    type Output;
    fn run<M: TrainableModel>(self, model: M) -> Self::Output;
}

/// Every architecture whale runs, by the `model_type`s of its checkpoints.
pub const ARCHITECTURES: [Registration; 2] =
    [crate::qwen3::architecture::REGISTRATION, crate::qwen3_5::architecture::REGISTRATION];

impl Decoder {
    /// Runs `work` over a clone of the model (which shares its weights), as the architecture's
    /// own [`TrainableModel`].
    pub fn with_trainable<W: WithTrainable>(&self, work: W) -> W::Output {
        match self {
            Self::Qwen3(model) => work.run(model.clone()),
            Self::Qwen35(model) => work.run(model.clone()),
        }
    }

    /// Loads a checkpoint directory with the architecture registered for its `config.json`'s
    /// `model_type` (Qwen3's when the key is absent, as [`crate::Qwen3Config`] reads it). An
    /// unknown one is an error naming the file, the value and the known ones.
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, CheckpointError> {
        let config = config_object(dir)?;
        let model_type = match config.get("model_type") {
            None => QWEN3_MODEL_TYPE,
            Some(value) => value.as_str().ok_or_else(|| unknown_model_type(dir, &value.to_string()))?,
        };
        let registration = ARCHITECTURES
            .iter()
            .find(|registration| registration.model_types.contains(&model_type))
            .ok_or_else(|| unknown_model_type(dir, &format!("{model_type:?}")))?;
        (registration.load)(dir, dtype, device)
    }
}

/// The error for a `model_type` no registered architecture reads, listing those that are.
fn unknown_model_type(dir: &Path, value: &str) -> CheckpointError {
    let known: Vec<String> = ARCHITECTURES
        .iter()
        .flat_map(|registration| registration.model_types)
        .map(|name| format!("{name:?}"))
        .collect();
    CheckpointError::invalid(
        &dir.join(CONFIG_FILE),
        "model_type",
        format!("{value} is no architecture whale runs (known: {})", known.join(", ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_model_type_names_the_file_the_value_and_the_known_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), r#"{"model_type": "gpt2"}"#).unwrap();
        let error = Decoder::load(dir.path(), DType::F32, &Device::Cpu).err().expect("no gpt2").to_string();
        for part in [CONFIG_FILE, "model_type", "\"gpt2\"", "\"qwen3\"", "\"llama\"", "\"qwen3_5_text\""] {
            assert!(error.contains(part), "{error:?} does not name {part}");
        }
    }
}
