//! The architectures the generation engine serves, as one enum: a checkpoint's `model_type`
//! picks Qwen3 or Qwen3.5, and the engine, `whale serve` and run configs take either.
//!
//! Only generation goes through here. The trainer and LoRA take a [`Qwen3Model`] directly, and
//! [`Decoder::qwen3`] is how a caller that needs one asks for it.

use crate::checkpoint::{load_model, CheckpointError};
use crate::lora::{LoraAdapter, LoraError};
use crate::model::{KvCache, ModelError, Qwen3Model, SeqStep};
use crate::qwen3_5::{is_qwen35, load_qwen35, Qwen35Cache, Qwen35Lora, Qwen35Model, Qwen35Step};
use candle_core::{DType, Device, Tensor};
use std::path::Path;

/// A model the engine can decode with.
#[derive(Clone)]
pub enum Decoder {
    Qwen3(Qwen3Model),
    Qwen35(Qwen35Model),
}

/// What one sequence carries between decoding steps, for the matching [`Decoder`].
pub enum DecoderCache {
    Qwen3(KvCache),
    Qwen35(Qwen35Cache),
}

/// Why a PEFT adapter directory could not be applied to a [`Decoder`].
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// The directory does not hold an adapter this architecture reads.
    #[error(transparent)]
    Load(#[from] LoraError),
    /// The adapter does not fit the model (configuration, dtype or device).
    #[error(transparent)]
    Mismatch(#[from] ModelError),
}

/// One sequence's share of a [`Decoder::forward_step`].
pub struct DecoderStep<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut DecoderCache,
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
    /// This model with the PEFT LoRA adapter in `dir` applied, sharing this model's weights
    /// (`whale serve`'s adapters, `whale lm generate --adapter`, an external trainer's adapter).
    pub fn with_peft_adapter(&self, dir: &Path) -> Result<Self, AdapterError> {
        Ok(match self {
            Self::Qwen3(model) => {
                let adapter = LoraAdapter::load_peft(dir, model.config(), model.dtype(), model.device())?;
                Self::from(model.with_adapter(&adapter)?)
            }
            Self::Qwen35(model) => {
                let adapter = Qwen35Lora::load_peft(dir, model.config(), model.dtype(), model.device())?;
                Self::from(model.with_adapter(&adapter)?)
            }
        })
    }

    /// A clone to decode with: for Qwen3, [`Qwen3Model::for_decoding`]'s transposed copies of
    /// the projections; for Qwen3.5, a plain clone.
    pub fn for_decoding(&self) -> Self {
        match self {
            Self::Qwen3(model) => Self::Qwen3(model.for_decoding()),
            Self::Qwen35(model) => Self::Qwen35(model.clone()),
        }
    }

    /// Loads a checkpoint directory of either architecture (by its `config.json`'s `model_type`).
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, CheckpointError> {
        if is_qwen35(dir) {
            return Ok(Self::Qwen35(load_qwen35(dir, dtype, device)?));
        }
        Ok(Self::Qwen3(load_model(dir, dtype, device)?))
    }

    /// The architecture's name, for messages.
    pub fn architecture(&self) -> &'static str {
        match self {
            Self::Qwen3(_) => "Qwen3",
            Self::Qwen35(_) => "Qwen3.5",
        }
    }

    /// The Qwen3 model, or `None` for another architecture.
    pub fn qwen3(&self) -> Option<&Qwen3Model> {
        match self {
            Self::Qwen3(model) => Some(model),
            Self::Qwen35(_) => None,
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            Self::Qwen3(model) => model.dtype(),
            Self::Qwen35(model) => model.dtype(),
        }
    }

    pub fn device(&self) -> &Device {
        match self {
            Self::Qwen3(model) => model.device(),
            Self::Qwen35(model) => model.device(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Qwen3(model) => model.config().vocab_size,
            Self::Qwen35(model) => model.config().vocab_size,
        }
    }

    pub fn max_position_embeddings(&self) -> usize {
        match self {
            Self::Qwen3(model) => model.config().max_position_embeddings,
            Self::Qwen35(model) => model.config().max_position_embeddings,
        }
    }

    /// The config's end-of-sequence ids.
    pub fn eos_token_id(&self) -> &[u32] {
        match self {
            Self::Qwen3(model) => &model.config().eos_token_id,
            Self::Qwen35(model) => &model.config().eos_token_id,
        }
    }

    /// An empty cache for one sequence.
    pub fn new_cache(&self) -> Result<DecoderCache, ModelError> {
        Ok(match self {
            Self::Qwen3(model) => DecoderCache::Qwen3(model.new_cache()),
            Self::Qwen35(model) => DecoderCache::Qwen35(model.new_cache()?),
        })
    }

    /// One batched incremental step (see [`Qwen3Model::forward_step`]): the logits of each
    /// chunk's last token, `[steps.len(), vocab]` f32.
    pub fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError> {
        let foreign = || ModelError::Input("a cache was made for another architecture".to_string());
        match self {
            Self::Qwen3(model) => {
                let mut own = Vec::with_capacity(steps.len());
                for step in steps.iter_mut() {
                    let DecoderCache::Qwen3(cache) = &mut *step.cache else { return Err(foreign()) };
                    own.push(SeqStep { tokens: step.tokens, cache });
                }
                model.forward_step(&mut own)
            }
            Self::Qwen35(model) => {
                let mut own = Vec::with_capacity(steps.len());
                for step in steps.iter_mut() {
                    let DecoderCache::Qwen35(cache) = &mut *step.cache else { return Err(foreign()) };
                    own.push(Qwen35Step { tokens: step.tokens, cache });
                }
                model.forward_step(&mut own)
            }
        }
    }
}
