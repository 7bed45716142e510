//! Qwen3.5 behind the seam: how the engine decodes with a [`Qwen35Model`] ([`Architecture`],
//! its parameter and FLOP counts included), and how the trainer trains and saves one and the
//! registry loads one for `model_type` `qwen3_5_text` or `qwen3_5` ([`TrainableModel`]).

use super::config::{LayerKind, Qwen35Config, MULTIMODAL_MODEL_TYPE, TEXT_MODEL_TYPE};
use super::lora::Qwen35Lora;
use super::model::{Qwen35Cache, Qwen35Model, Qwen35Step};
use super::{load_qwen35, parameter_shapes, save_qwen35};
use crate::decoder::{ActivationCounts, AdapterError, Architecture, Decoder, DecoderCache, DecoderStep, FlopCounts};
use crate::qwen3::checkpoint::CheckpointError;
use crate::qwen3::lora::LoraConfig;
use crate::qwen3::model::ModelError;
use crate::trainable::{TrainableError, TrainableModel};
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;

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

    fn parameter_count(&self) -> usize {
        parameter_count(self.config())
    }

    fn flop_counts(&self) -> FlopCounts {
        flop_counts(self.config())
    }

    fn activation_counts(&self) -> ActivationCounts {
        activation_counts(self.config())
    }

    fn new_cache(&self) -> Result<DecoderCache, ModelError> {
        Ok(DecoderCache::new(Qwen35Model::new_cache(self)?))
    }

    fn fork_cache(&self, cache: &DecoderCache) -> Result<DecoderCache, ModelError> {
        Ok(DecoderCache::new(cache.downcast_ref::<Qwen35Cache>()?.clone()))
    }

    /// Never: the Gated DeltaNet layers' states hold every token fed, and cannot be cut back.
    fn fork_cache_prefix(&self, cache: &DecoderCache, _len: usize) -> Result<Option<DecoderCache>, ModelError> {
        cache.downcast_ref::<Qwen35Cache>()?;
        Ok(None)
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

    /// None: Qwen3.5's products all run in the model's own dtype.
    fn for_quantized_decoding(&self) -> Result<Decoder, ModelError> {
        Err(ModelError::Input("Qwen3.5 models do not decode from quantized weights; leave `quantized` off".into()))
    }
}

/// Every parameter of a checkpoint ([`parameter_shapes`]).
fn parameter_count(config: &Qwen35Config) -> usize {
    parameter_shapes(config).iter().map(|(_, shape)| shape.iter().product::<usize>()).sum()
}

/// Qwen3.5's model FLOPs. The layers' parameters of more than one dimension are their matrices
/// (the full-attention query projection's output gate among them) and convolutions.
fn flop_counts(config: &Qwen35Config) -> FlopCounts {
    let body: usize = parameter_shapes(config)
        .iter()
        .filter(|(name, shape)| name.contains("layers.") && shape.len() > 1)
        .map(|(_, shape)| shape.iter().product::<usize>())
        .sum();
    let layers = |kind| config.layer_types.iter().filter(|&&k| k == kind).count() as f64;
    let state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim;
    let query_width = config.num_attention_heads * config.head_dim;
    FlopCounts {
        body: body as f64,
        head: (config.vocab_size * config.hidden_size) as f64,
        attention_per_key: 4.0 * layers(LayerKind::FullAttention) * query_width as f64,
        recurrence_per_token: 6.0 * layers(LayerKind::LinearAttention) * state as f64,
    }
}

/// [`ActivationCounts`] with each layer's own widths: a full-attention layer's gated queries
/// (twice the query heads' width); a Gated DeltaNet layer's key heads' width as its queries,
/// and its keys and values together as its key-value width.
fn activation_counts(config: &Qwen35Config) -> ActivationCounts {
    let full = ActivationCounts::layer_per_token(
        config.hidden_size,
        2 * config.num_attention_heads * config.head_dim,
        2 * config.num_key_value_heads * config.head_dim,
        config.intermediate_size,
    );
    let linear_keys = config.linear_num_key_heads * config.linear_key_head_dim;
    let linear = ActivationCounts::layer_per_token(
        config.hidden_size,
        linear_keys,
        linear_keys + config.linear_num_value_heads * config.linear_value_head_dim,
        config.intermediate_size,
    );
    let per_token =
        config.layer_types.iter().map(|kind| if *kind == LayerKind::FullAttention { full } else { linear }).sum();
    ActivationCounts { per_token, per_scored: 3.0 * config.vocab_size as f64 }
}

/// The text-only checkpoint (`qwen3_5_text`) and the multimodal wrapper (`qwen3_5`).
impl TrainableModel for Qwen35Model {
    const MODEL_TYPES: &'static [&'static str] = &[TEXT_MODEL_TYPE, MULTIMODAL_MODEL_TYPE];

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

    fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, CheckpointError> {
        load_qwen35(dir, dtype, device)
    }

    fn save(&self, dir: &Path) -> Result<(), CheckpointError> {
        save_qwen35(self, dir)
    }

    fn adapter_config(&self) -> Option<&LoraConfig> {
        self.adapter().map(Qwen35Lora::config)
    }

    fn with_new_adapter(&self, config: &LoraConfig, seed: u64) -> Result<Self, TrainableError> {
        let adapter = Qwen35Lora::new(config.clone(), self.config(), seed, self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn with_saved_adapter(&self, dir: &Path) -> Result<Self, TrainableError> {
        let adapter = Qwen35Lora::load_peft(dir, self.config(), self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?)
    }

    fn save_adapter(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), TrainableError> {
        let adapter = self.adapter().ok_or(TrainableError::NoAdapter)?;
        Ok(adapter.save_peft(dir, base_model_name_or_path)?)
    }

    fn merged(&self) -> Result<Self, ModelError> {
        Qwen35Model::merged(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen3_5::Qwen35Size;

    #[test]
    fn the_flop_counts_count_every_matrix_once_and_each_recurrence() {
        let config = Qwen35Config::text(1000, Qwen35Size::QWEN3_5_0_8B);
        let flops = flop_counts(&config);
        let (h, d, heads, kv) = (1024, 256, 8, 2);
        let (key_heads, value_heads, state_dim) = (16, 16, 128);
        let (qkv, value_dim) = ((2 * key_heads + value_heads) * state_dim, value_heads * state_dim);
        let mlp = 3 * h * 3584;
        // In: q, k, v; the gate z; b and a, one per value head. Then the width-4 convolution of
        // q, k, v, and the output projection.
        let linear = h * (qkv + value_dim + 2 * value_heads) + qkv * 4 + value_dim * h;
        // The query with its output gate, key, value, output.
        let full = h * (2 * heads * d + 2 * kv * d) + heads * d * h;
        assert_eq!(flops.body as usize, 18 * (linear + mlp) + 6 * (full + mlp));
        assert_eq!(flops.head as usize, 1000 * h);
        // Norms (two per layer, q and k norms, the gated norm), dt_bias and A_log, the final norm.
        let vectors = 24 * 2 * h + 6 * 2 * d + 18 * (state_dim + 2 * value_heads) + h;
        let embeddings = 1000 * h;
        let all = flops.body as usize + flops.head as usize + vectors + embeddings;
        assert_eq!(all, parameter_count(&config));
        assert_eq!(flops.attention_per_key, (4 * 6 * heads * d) as f64);
        assert_eq!(flops.recurrence_per_token, (6 * 18 * value_heads * state_dim * state_dim) as f64);
        let expected = (2.0 * flops.body + flops.recurrence_per_token) * 3.0
            + 2.0 * flops.head * 2.0
            + flops.attention_per_key * (1.0 + 2.0 + 3.0);
        assert_eq!(flops.forward(3, 2), expected);
    }
}
