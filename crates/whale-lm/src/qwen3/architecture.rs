//! Qwen3 (and Llama) behind the seam: how the engine decodes with a [`Qwen3Model`]
//! ([`Architecture`], its parameter and FLOP counts included), and how the trainer trains and
//! saves one and the registry loads one for `model_type` `qwen3` or `llama` ([`TrainableModel`]).

use super::checkpoint::{load_model, save_model, CheckpointError, GenerationConfig};
use super::config::{Qwen3Config, LLAMA_MODEL_TYPE, QWEN3_MODEL_TYPE};
use super::lora::{LoraAdapter, LoraConfig};
use super::model::{KvCache, ModelError, Qwen3Model, SeqStep};
use crate::decoder::{AdapterError, Architecture, Decoder, DecoderCache, DecoderStep, FlopCounts};
use crate::trainable::{TrainableError, TrainableModel};
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;

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

    fn parameter_count(&self) -> usize {
        self.config().parameter_count()
    }

    fn flop_counts(&self) -> FlopCounts {
        flop_counts(self.config())
    }

    fn new_cache(&self) -> Result<DecoderCache, ModelError> {
        Ok(DecoderCache::new(Qwen3Model::new_cache(self)))
    }

    fn fork_cache(&self, cache: &DecoderCache) -> Result<DecoderCache, ModelError> {
        Ok(DecoderCache::new(cache.downcast_ref::<KvCache>()?.fork()?))
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

/// Qwen3's model FLOPs: every layer's four attention projections and three MLP matrices, the
/// LM head, and every layer's heads in attention.
fn flop_counts(config: &Qwen3Config) -> FlopCounts {
    let (h, d) = (config.hidden_size as f64, config.head_dim as f64);
    let (heads, kv_heads) = (config.num_attention_heads as f64, config.num_key_value_heads as f64);
    let layers = config.num_hidden_layers as f64;
    let attention = h * d * (2.0 * heads + 2.0 * kv_heads);
    let mlp = 3.0 * h * config.intermediate_size as f64;
    FlopCounts {
        body: layers * (attention + mlp),
        head: config.vocab_size as f64 * h,
        attention_per_key: 4.0 * layers * heads * d,
        recurrence_per_token: 0.0,
    }
}

/// `qwen3`, and `llama` (Qwen3 without the q/k norm).
impl TrainableModel for Qwen3Model {
    const MODEL_TYPES: &'static [&'static str] = &[QWEN3_MODEL_TYPE, LLAMA_MODEL_TYPE];

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

    fn with_new_adapter(&self, config: &LoraConfig, seed: u64) -> Result<Self, TrainableError> {
        let adapter = LoraAdapter::new(config.clone(), self.config(), seed, self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn with_saved_adapter(&self, dir: &Path) -> Result<Self, TrainableError> {
        let adapter = LoraAdapter::load_peft(dir, self.config(), self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), TrainableError> {
        let adapter = self.adapter().ok_or(TrainableError::NoAdapter)?;
        Ok(adapter.save_peft(dir, base_model_name_or_path)?)
    }

    fn merged(&self) -> Result<Self, ModelError> {
        Qwen3Model::merged(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flop_counts_count_every_matrix_once() {
        let config = Qwen3Config::base(1000);
        let flops = flop_counts(&config);
        let (h, d, layers) = (config.hidden_size, config.head_dim, config.num_hidden_layers);
        let norms = layers * (2 * h + 2 * d) + h;
        // Tied embeddings: the LM head is the embedding matrix, counted once by the config.
        assert_eq!(flops.body as usize + flops.head as usize + norms, config.parameter_count());
        let per_key = 4.0 * (layers * config.num_attention_heads * d) as f64;
        let expected = 2.0 * flops.body * 3.0 + 2.0 * flops.head * 2.0 + per_key * (1.0 + 2.0 + 3.0);
        assert_eq!(flops.forward(3, 2), expected);
    }
}
