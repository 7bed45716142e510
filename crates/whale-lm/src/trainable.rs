//! What a trainer needs of an architecture: [`TrainableModel`], the model as a type (its
//! checkpoints, its training pass, its adapters), beside [`Architecture`], the model as an
//! object the engine decodes with.
//!
//! Each architecture's folder implements both for its model; the registry
//! ([`crate::architectures`]) lists the type, from which it builds the loader of its
//! checkpoints and [`Decoder::with_trainable`]'s dispatch. whale-train's trainer is generic over
//! [`TrainableModel`] and never names an architecture.

use crate::decoder::{Architecture, Decoder};
use crate::qwen3::checkpoint::CheckpointError;
use crate::qwen3::lora::{LoraConfig, LoraError};
use crate::qwen3::model::ModelError;
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;

/// What the trainer needs of a model: its training pass, the parameters an update changes, and
/// the architecture's own checkpoints and adapters. Each architecture's folder implements it
/// beside its [`Architecture`].
pub trait TrainableModel: Architecture + Clone + Into<Decoder> + 'static {
    /// The values of `config.json`'s `model_type` whose checkpoints [`Self::load`] reads (the
    /// registry picks the architecture of a checkpoint by them).
    const MODEL_TYPES: &'static [&'static str];
    /// The final hidden states `[Σ len, hidden]` of sequences packed end to end, differentiable.
    fn packed_hidden(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError>;
    /// Logits (f32) of hidden states.
    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor>;
    /// The parameters an update changes, with their names (the names of the optimizer state):
    /// the adapter's matrices when the model carries one, every parameter otherwise.
    fn trained_parameters(&self) -> Vec<(String, Var)>;
    /// The model of one training pass, whose dropout masks (if any) are drawn from `seed`.
    fn pass_model(&self, seed: u64) -> Self;
    /// This architecture's model in `decoder`, or `None` when it holds another.
    fn of_decoder(decoder: &Decoder) -> Option<&Self> {
        decoder.downcast_ref()
    }
    /// Loads a checkpoint directory of this architecture.
    fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, CheckpointError>;
    /// Writes the checkpoint: `config.json`, the weights and the architecture's other files.
    fn save(&self, dir: &Path) -> Result<(), CheckpointError>;
    /// The settings of the adapter the model carries, `None` without one.
    fn adapter_config(&self) -> Option<&LoraConfig>;
    fn has_adapter(&self) -> bool {
        self.adapter_config().is_some()
    }
    /// This model with a fresh adapter (its matrices drawn from `seed`), sharing the base weights.
    fn with_new_adapter(&self, config: &LoraConfig, seed: u64) -> Result<Self, TrainableError>;
    /// This model with the PEFT adapter saved in `dir`, sharing the base weights.
    fn with_saved_adapter(&self, dir: &Path) -> Result<Self, TrainableError>;
    /// Writes the adapter as a PEFT directory naming `base_model_name_or_path`.
    fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), TrainableError>;
    /// The adapter folded into the weights, as a model without one.
    fn merged(&self) -> Result<Self, ModelError>;
}

/// Why a [`TrainableModel`] could not make, apply or save its adapter.
#[derive(Debug, thiserror::Error)]
pub enum TrainableError {
    /// The adapter's configuration or files.
    #[error(transparent)]
    Lora(#[from] LoraError),
    /// The adapter does not fit the model (configuration, dtype or device).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// [`TrainableModel::save_adapter`] of a model without one.
    #[error("the model carries no adapter")]
    NoAdapter,
}
