//! Qwen3.5 behind the seam: how the engine decodes with a [`Qwen35Model`] ([`Architecture`]),
//! how the trainer trains and saves one ([`TrainableModel`]), and the registry entry that loads
//! one for `model_type` `qwen3_5_text` or `qwen3_5`.

use super::config::{MULTIMODAL_MODEL_TYPE, TEXT_MODEL_TYPE};
use super::lora::Qwen35Lora;
use super::model::{Qwen35Cache, Qwen35Model, Qwen35Step};
use super::{load_qwen35, save_qwen35};
use crate::decoder::{AdapterError, Architecture, Decoder, DecoderCache, DecoderStep, Registration};
use crate::qwen3::checkpoint::CheckpointError;
use crate::qwen3::lora::LoraConfig;
use crate::qwen3::model::ModelError;
use crate::train::{TrainError, TrainableModel};
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;

/// Qwen3.5's entry in the registry: the text-only checkpoint and the multimodal wrapper.
pub const REGISTRATION: Registration = Registration { model_types: &[TEXT_MODEL_TYPE, MULTIMODAL_MODEL_TYPE], load };

fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Decoder, CheckpointError> {
    Ok(load_qwen35(dir, dtype, device)?.into())
}

impl Architecture for Qwen35Model {
    fn name(&self) -> &'static str {
        "Qwen3.5"
    }

    fn dtype(&self) -> DType {
        Qwen35Model::dtype(self)
    }

    fn device(&self) -> &Device {
        Qwen35Model::device(self)
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn max_position_embeddings(&self) -> usize {
        self.config().max_position_embeddings
    }

    fn eos_token_id(&self) -> &[u32] {
        &self.config().eos_token_id
    }

    fn new_cache(&self) -> Result<DecoderCache, ModelError> {
        Ok(DecoderCache::new(Qwen35Model::new_cache(self)?))
    }

    fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError> {
        let mut own = Vec::with_capacity(steps.len());
        for step in steps.iter_mut() {
            own.push(Qwen35Step { tokens: step.tokens, cache: step.cache.downcast_mut::<Qwen35Cache>()? });
        }
        Qwen35Model::forward_step(self, &mut own)
    }

    fn with_peft_adapter(&self, dir: &Path) -> Result<Decoder, AdapterError> {
        let adapter = Qwen35Lora::load_peft(dir, self.config(), self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?.into())
    }

    /// A plain clone: Qwen3.5 keeps no decoding copies.
    fn for_decoding(&self) -> Decoder {
        self.clone().into()
    }
}

impl TrainableModel for Qwen35Model {
    fn packed_hidden(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError> {
        Qwen35Model::packed_hidden(self, sequences)
    }

    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        Qwen35Model::logits(self, hidden)
    }

    fn trained_parameters(&self) -> Vec<(String, Var)> {
        match self.adapter() {
            Some(adapter) => adapter.named_parameters(),
            None => self.named_parameters(),
        }
    }

    /// The model itself: adapter dropout is not built for Qwen3.5 ([`Qwen35Lora::new`] refuses it).
    fn pass_model(&self, _seed: u64) -> Self {
        self.clone()
    }

    fn of_decoder(decoder: &Decoder) -> Option<&Self> {
        match decoder {
            Decoder::Qwen35(model) => Some(model),
            Decoder::Qwen3(_) => None,
        }
    }

    fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, CheckpointError> {
        load_qwen35(dir, dtype, device)
    }

    fn save(&self, dir: &Path) -> Result<(), CheckpointError> {
        save_qwen35(self, dir)
    }

    fn has_adapter(&self) -> bool {
        self.adapter().is_some()
    }

    fn with_new_adapter(&self, config: &LoraConfig, seed: u64) -> Result<Self, TrainError> {
        let adapter = Qwen35Lora::new(config.clone(), self.config(), seed, self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn with_saved_adapter(&self, dir: &Path) -> Result<Self, TrainError> {
        let adapter = Qwen35Lora::load_peft(dir, self.config(), self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), TrainError> {
        let adapter = self.adapter().ok_or(TrainError::Mode("the model carries no adapter"))?;
        Ok(adapter.save_peft(dir, base_model_name_or_path)?)
    }

    fn merged(&self) -> Result<Self, ModelError> {
        Qwen35Model::merged(self)
    }
}
