//! The seam between an architecture and the rest of whale: what the engine, `whale serve`,
//! `whale lm` and the loop need of a loaded model, whatever its layers are.
//!
//! Each architecture's folder ([`crate::qwen3`], [`crate::qwen3_5`]) implements
//! [`Architecture`] for its model and offers a [`Registration`] (the `model_type`s of its
//! `config.json` and its loader) to the registry, [`crate::architectures`]. A sequence's cache
//! is the architecture's own type, carried boxed in a [`DecoderCache`] so the engine need not
//! know it. [`Decoder`] holds the loaded model; everything is asked of it through
//! [`Architecture`] (its variants are what the bench's per-architecture FLOP and parameter
//! counts still read).

use crate::qwen3::checkpoint::CheckpointError;
use crate::qwen3::lora::LoraError;
use crate::qwen3::model::{ModelError, Qwen3Model};
use crate::qwen3_5::Qwen35Model;
use candle_core::{DType, Device, Tensor};
use std::any::Any;
use std::path::Path;

/// A loaded model the engine can decode with.
pub trait Architecture {
    /// The architecture's name, for messages.
    fn name(&self) -> &'static str;
    fn dtype(&self) -> DType;
    fn device(&self) -> &Device;
    fn vocab_size(&self) -> usize;
    fn max_position_embeddings(&self) -> usize;
    /// The config's end-of-sequence ids.
    fn eos_token_id(&self) -> &[u32];
    /// An empty cache for one sequence.
    fn new_cache(&self) -> Result<DecoderCache, ModelError>;
    /// One batched incremental step: the logits of each chunk's last token, `[steps.len(),
    /// vocab]` f32. Each step's cache was made by this architecture's [`Self::new_cache`].
    fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError>;
    /// This model with the PEFT LoRA adapter in `dir` applied, sharing this model's weights.
    fn with_peft_adapter(&self, dir: &Path) -> Result<Decoder, AdapterError>;
    /// A clone to decode with (an architecture may keep decoding-friendly copies of weights).
    fn for_decoding(&self) -> Decoder;
}

/// One architecture's entry in the registry, [`crate::architectures`].
pub struct Registration {
    /// The values of `config.json`'s `model_type` that this architecture reads.
    pub model_types: &'static [&'static str],
    /// Loads a checkpoint directory of this architecture as a model of `dtype` on `device`.
    pub load: fn(&Path, DType, &Device) -> Result<Decoder, CheckpointError>,
}

/// What one sequence carries between decoding steps, of the architecture that made it.
pub struct DecoderCache(Box<dyn Any + Send>);

impl DecoderCache {
    pub fn new<C: Any + Send>(cache: C) -> Self {
        Self(Box::new(cache))
    }

    /// The architecture's own cache; an error when another architecture made this one.
    pub fn downcast_mut<C: Any>(&mut self) -> Result<&mut C, ModelError> {
        self.0.downcast_mut().ok_or_else(|| ModelError::Input("a cache was made for another architecture".to_string()))
    }
}

/// One sequence's share of an [`Architecture::forward_step`].
pub struct DecoderStep<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut DecoderCache,
}

/// Why a PEFT adapter directory could not be applied to a model.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// The directory does not hold an adapter this architecture reads.
    #[error(transparent)]
    Load(#[from] LoraError),
    /// The adapter does not fit the model (configuration, dtype or device).
    #[error(transparent)]
    Mismatch(#[from] ModelError),
}

/// A model the engine can decode with.
#[derive(Clone)]
pub enum Decoder {
    Qwen3(Qwen3Model),
    Qwen35(Qwen35Model),
}

impl From<Qwen3Model> for Decoder {
    fn from(model: Qwen3Model) -> Self {
        Self::Qwen3(model)
    }
}

impl From<Qwen35Model> for Decoder {
    fn from(model: Qwen35Model) -> Self {
        Self::Qwen35(model)
    }
}

impl Decoder {
    /// The model, whatever its architecture.
    pub fn model(&self) -> &dyn Architecture {
        match self {
            Self::Qwen3(model) => model,
            Self::Qwen35(model) => model,
        }
    }

    /// The Qwen3 model, or `None` for another architecture.
    pub fn qwen3(&self) -> Option<&Qwen3Model> {
        match self {
            Self::Qwen3(model) => Some(model),
            Self::Qwen35(_) => None,
        }
    }

    /// This model with the PEFT LoRA adapter in `dir` applied, sharing this model's weights
    /// (`whale serve`'s adapters, `whale lm generate --adapter`, an external trainer's adapter).
    pub fn with_peft_adapter(&self, dir: &Path) -> Result<Self, AdapterError> {
        self.model().with_peft_adapter(dir)
    }

    /// A clone to decode with ([`Architecture::for_decoding`]).
    pub fn for_decoding(&self) -> Self {
        self.model().for_decoding()
    }

    /// The architecture's name, for messages.
    pub fn architecture(&self) -> &'static str {
        self.model().name()
    }

    pub fn dtype(&self) -> DType {
        self.model().dtype()
    }

    pub fn device(&self) -> &Device {
        self.model().device()
    }

    pub fn vocab_size(&self) -> usize {
        self.model().vocab_size()
    }

    pub fn max_position_embeddings(&self) -> usize {
        self.model().max_position_embeddings()
    }

    /// The config's end-of-sequence ids.
    pub fn eos_token_id(&self) -> &[u32] {
        self.model().eos_token_id()
    }

    /// An empty cache for one sequence.
    pub fn new_cache(&self) -> Result<DecoderCache, ModelError> {
        self.model().new_cache()
    }

    /// One batched incremental step ([`Architecture::forward_step`]).
    pub fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError> {
        self.model().forward_step(steps)
    }
}
