//! Qwen3 (and Llama) behind the seam: how the engine decodes with a [`Qwen3Model`]
//! ([`Architecture`]), how the trainer trains and saves one ([`TrainableModel`]), and the
//! registry entry that loads one for `model_type` `qwen3` or `llama`.

use super::checkpoint::{load_model, save_model, CheckpointError, GenerationConfig};
use super::config::{LLAMA_MODEL_TYPE, QWEN3_MODEL_TYPE};
use super::lora::{LoraAdapter, LoraConfig};
use super::model::{KvCache, ModelError, Qwen3Model, SeqStep};
use crate::decoder::{AdapterError, Architecture, Decoder, DecoderCache, DecoderStep, Registration};
use crate::train::{TrainError, TrainableModel};
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;

/// Qwen3's entry in the registry: `qwen3`, and `llama` (Qwen3 without the q/k norm).
pub const REGISTRATION: Registration = Registration { model_types: &[QWEN3_MODEL_TYPE, LLAMA_MODEL_TYPE], load };

fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Decoder, CheckpointError> {
    Ok(load_model(dir, dtype, device)?.into())
}

impl Architecture for Qwen3Model {
    fn name(&self) -> &'static str {
        "Qwen3"
    }

    fn dtype(&self) -> DType {
        Qwen3Model::dtype(self)
    }

    fn device(&self) -> &Device {
        Qwen3Model::device(self)
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
        Ok(DecoderCache::new(Qwen3Model::new_cache(self)))
    }

    fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError> {
        let mut own = Vec::with_capacity(steps.len());
        for step in steps.iter_mut() {
            own.push(SeqStep { tokens: step.tokens, cache: step.cache.downcast_mut::<KvCache>()? });
        }
        Qwen3Model::forward_step(self, &mut own)
    }

    fn with_peft_adapter(&self, dir: &Path) -> Result<Decoder, AdapterError> {
        let adapter = LoraAdapter::load_peft(dir, self.config(), self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?.into())
    }

    /// [`Qwen3Model::for_decoding`]'s transposed copies of the projections.
    fn for_decoding(&self) -> Decoder {
        Qwen3Model::for_decoding(self).into()
    }
}

impl TrainableModel for Qwen3Model {
    fn packed_hidden(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError> {
        Qwen3Model::packed_hidden(self, sequences)
    }

    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        Qwen3Model::logits(self, hidden)
    }

    fn trained_parameters(&self) -> Vec<(String, Var)> {
        match self.adapter() {
            Some(adapter) => adapter.named_parameters(),
            None => self.named_parameters(),
        }
    }

    fn pass_model(&self, seed: u64) -> Self {
        self.with_dropout(seed)
    }

    fn of_decoder(decoder: &Decoder) -> Option<&Self> {
        decoder.qwen3()
    }

    fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, CheckpointError> {
        load_model(dir, dtype, device)
    }

    /// The checkpoint with the generation config the model's own config implies.
    fn save(&self, dir: &Path) -> Result<(), CheckpointError> {
        save_model(self, &GenerationConfig::for_model(self.config()), dir)
    }

    fn has_adapter(&self) -> bool {
        self.adapter().is_some()
    }

    fn with_new_adapter(&self, config: &LoraConfig, seed: u64) -> Result<Self, TrainError> {
        let adapter = LoraAdapter::new(config.clone(), self.config(), seed, self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn with_saved_adapter(&self, dir: &Path) -> Result<Self, TrainError> {
        let adapter = LoraAdapter::load_peft(dir, self.config(), self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), TrainError> {
        let adapter = self.adapter().ok_or(TrainError::Mode("the model carries no adapter"))?;
        Ok(adapter.save_peft(dir, base_model_name_or_path)?)
    }

    fn merged(&self) -> Result<Self, ModelError> {
        Qwen3Model::merged(self)
    }
}
