//! The registry: the one list of every architecture whale runs, the loader that picks one by a
//! checkpoint's `config.json` `model_type`, and the dispatch that hands the model a
//! [`Decoder`] holds to generic code as its own [`TrainableModel`].
//!
//! Adding an architecture is its folder (the model, its [`Architecture`] and
//! [`TrainableModel`] impls, the latter with its `MODEL_TYPES`) plus one line naming the model's
//! type in the [`registry!`] call below. This file is the only place in whale that lists the
//! architectures; nothing else matches on one.
//!
//! [`Architecture`]: crate::decoder::Architecture

use crate::decoder::Decoder;
use crate::qwen3::checkpoint::{config_object, CheckpointError, CONFIG_FILE};
use crate::qwen3::config::QWEN3_MODEL_TYPE;
use crate::trainable::TrainableModel;
use candle_core::{DType, Device};
use std::path::Path;

/// Work over a trainable model of whichever architecture a [`Decoder`] holds
/// ([`Decoder::with_trainable`]): how the crates above build and keep a trainer, or time one,
/// without naming an architecture.
pub trait WithTrainable {
    type Output;
    fn run<M: TrainableModel>(self, model: M) -> Self::Output;
}

/// One architecture's entry in the registry: what its checkpoints are called and how to load one.
pub struct Registration {
    /// The values of `config.json`'s `model_type` that this architecture reads.
    pub model_types: &'static [&'static str],
    /// Loads a checkpoint directory of this architecture as a model of `dtype` on `device`.
    pub load: fn(&Path, DType, &Device) -> Result<Decoder, CheckpointError>,
}

impl Registration {
    /// The entry of the architecture whose model is `M`.
    pub const fn of<M: TrainableModel>() -> Self {
        Self { model_types: M::MODEL_TYPES, load: load_decoder::<M> }
    }
}

fn load_decoder<M: TrainableModel>(dir: &Path, dtype: DType, device: &Device) -> Result<Decoder, CheckpointError> {
    Ok(M::load(dir, dtype, device)?.into())
}

/// Makes the registry from the model types listed: [`ARCHITECTURES`] and
/// [`Decoder::with_trainable`].
macro_rules! registry {
    ($($model:ty),+ $(,)?) => {
        /// Every architecture whale runs, by the `model_type`s of its checkpoints.
        pub const ARCHITECTURES: &[Registration] = &[$(Registration::of::<$model>()),+];

        impl Decoder {
            /// Runs `work` over a clone of the model (which shares its weights), as the
            /// architecture's own [`TrainableModel`].
            ///
            /// # Panics
            /// When the model is of an architecture missing from the registry (a [`Decoder`]
            /// made in memory from a model type not listed here).
            pub fn with_trainable<W: WithTrainable>(&self, work: W) -> W::Output {
                $(
                    if let Some(model) = self.downcast_ref::<$model>() {
                        return work.run(model.clone());
                    }
                )+
                panic!("the {} architecture is not in whale-lm's registry (architectures.rs)", self.architecture())
            }
        }
    };
}

registry! {
    crate::qwen3::model::Qwen3Model,
    crate::llama::LlamaModel,
    crate::qwen2::Qwen2Model,
    crate::qwen3_5::model::Qwen35Model,
}

impl Decoder {
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
        let decoder = (registration.load)(dir, dtype, device);
        // Reading made a transient copy of every tensor; glibc keeps freed blocks under its
        // mmap threshold (32 MB here, `whale_kernels::runtime`), so without this a loaded model
        // held about twice its size.
        whale_kernels::runtime::release_freed_memory();
        decoder
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
        for part in [CONFIG_FILE, "model_type", "\"gpt2\"", "\"qwen3\"", "\"llama\"", "\"qwen2\"", "\"qwen3_5_text\""] {
            assert!(error.contains(part), "{error:?} does not name {part}");
        }
    }

    /// Counts the parameters of the trainable model it is handed.
    struct CountTrained;

    impl WithTrainable for CountTrained {
        type Output = usize;
        fn run<M: TrainableModel>(self, model: M) -> usize {
            model.trained_parameters().len()
        }
    }

    #[test]
    fn every_registered_architecture_reaches_generic_code_as_its_own_type() {
        let qwen3 = crate::Qwen3Model::new_random(&crate::Qwen3Config::tiny(61), 1, DType::F32, &Device::Cpu).unwrap();
        let llama_config = crate::LlamaConfig::with_size(61, crate::ModelSize::TINY);
        let llama = crate::LlamaModel::new_random(&llama_config, 1, DType::F32, &Device::Cpu).unwrap();
        let config = crate::Qwen35Config::text(61, crate::qwen3_5::Qwen35Size::TINY);
        let qwen35 = crate::Qwen35Model::new_random(&config, 1, DType::F32, &Device::Cpu).unwrap();
        assert_ne!(qwen3.named_parameters().len(), llama.named_parameters().len(), "Llama has no q/k norms");
        for (decoder, parameters) in [
            (Decoder::from(qwen3.clone()), qwen3.named_parameters().len()),
            (Decoder::from(llama.clone()), llama.named_parameters().len()),
            (Decoder::from(qwen35.clone()), qwen35.named_parameters().len()),
        ] {
            assert_eq!(decoder.with_trainable(CountTrained), parameters, "{}", decoder.architecture());
        }
    }
}
