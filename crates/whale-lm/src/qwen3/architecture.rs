//! The dense decoder behind the seam, for Qwen3 and Llama alike.
//!
//! [`Architecture`] and [`TrainableModel`] are written once for the [`DenseModel`] of any
//! [`DenseConfig`]: how the engine decodes with one (its parameter and FLOP counts included),
//! and how the trainer trains and saves one and the registry loads one for the config's
//! `model_type`s. [`DenseConfig`] is written once too, for the [`DenseHfConfig`] every dense
//! architecture's `config.json` is read into; what is an architecture's own (its name,
//! `model_type`, keys, query and key norms, rotary scaling) is its [`ArchitectureKeys`]:
//! Qwen3's in [`super::config`], Llama's in [`crate::llama::config`].

use super::checkpoint::{load_dense, save_model, torch_dtype_name, CheckpointError, GenerationConfig};
use super::config::{ArchitectureKeys, ConfigError, ConfigIssue, DenseHfConfig};
use super::dense::{plain_inverse_frequencies, DenseConfig, DenseSettings};
use super::lora::{LoraAdapter, LoraConfig};
use super::model::{DenseModel, KvCache, ModelError, SeqStep};
use crate::decoder::{ActivationCounts, AdapterError, Architecture, Decoder, DecoderCache, DecoderStep, FlopCounts};
use crate::trainable::{TrainableError, TrainableModel};
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;

impl<C: DenseConfig> Architecture for DenseModel<C> {
    fn name(&self) -> &'static str {
        C::NAME
    }

    fn dtype(&self) -> DType {
        DenseModel::dtype(self)
    }

    fn device(&self) -> &Device {
        DenseModel::device(self)
    }

    fn vocab_size(&self) -> usize {
        self.settings().vocab_size
    }

    fn max_position_embeddings(&self) -> usize {
        self.settings().max_position_embeddings
    }

    fn eos_token_id(&self) -> &[u32] {
        &self.settings().eos_token_id
    }

    fn parameter_count(&self) -> usize {
        self.settings().parameter_count()
    }

    fn flop_counts(&self) -> FlopCounts {
        flop_counts(self.settings())
    }

    fn activation_counts(&self) -> ActivationCounts {
        let settings = self.settings();
        let query = settings.num_attention_heads * settings.head_dim;
        let key_value = 2 * settings.num_key_value_heads * settings.head_dim;
        let layer =
            ActivationCounts::layer_per_token(settings.hidden_size, query, key_value, settings.intermediate_size);
        ActivationCounts {
            per_token: settings.num_hidden_layers as f64 * layer,
            per_scored: 3.0 * settings.vocab_size as f64,
        }
    }

    fn new_cache(&self) -> Result<DecoderCache, ModelError> {
        Ok(DecoderCache::new(DenseModel::new_cache(self)))
    }

    fn fork_cache(&self, cache: &DecoderCache) -> Result<DecoderCache, ModelError> {
        Ok(DecoderCache::new(cache.downcast_ref::<KvCache>()?.fork()?))
    }

    fn fork_cache_prefix(&self, cache: &DecoderCache, len: usize) -> Result<Option<DecoderCache>, ModelError> {
        Ok(Some(DecoderCache::new(cache.downcast_ref::<KvCache>()?.fork_prefix(len)?)))
    }

    fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError> {
        let mut own = Vec::with_capacity(steps.len());
        for step in steps.iter_mut() {
            own.push(SeqStep { tokens: step.tokens, cache: step.cache.downcast_mut::<KvCache>()? });
        }
        DenseModel::forward_step(self, &mut own)
    }

    fn with_peft_adapter(&self, dir: &Path) -> Result<Decoder, AdapterError> {
        let adapter = LoraAdapter::load_peft(dir, self.config(), self.dtype(), self.device())?;
        Ok(self.with_adapter(&adapter)?.into())
    }

    /// [`DenseModel::for_decoding`]'s transposed copies of the projections.
    fn for_decoding(&self) -> Decoder {
        DenseModel::for_decoding(self).into()
    }

    /// [`DenseModel::for_quantized_decoding`]'s Q8_0 copies of the projections and head.
    fn for_quantized_decoding(&self) -> Result<Decoder, ModelError> {
        Ok(DenseModel::for_quantized_decoding(self)?.into())
    }
}

/// The dense decoder's model FLOPs: every layer's four attention projections and three MLP
/// matrices, the LM head, and every layer's heads in attention.
fn flop_counts(settings: &DenseSettings) -> FlopCounts {
    let (h, d) = (settings.hidden_size as f64, settings.head_dim as f64);
    let (heads, kv_heads) = (settings.num_attention_heads as f64, settings.num_key_value_heads as f64);
    let layers = settings.num_hidden_layers as f64;
    let attention = h * d * (2.0 * heads + 2.0 * kv_heads);
    let mlp = 3.0 * h * settings.intermediate_size as f64;
    FlopCounts {
        body: layers * (attention + mlp),
        head: settings.vocab_size as f64 * h,
        attention_per_key: 4.0 * layers * heads * d,
        recurrence_per_token: 0.0,
    }
}

/// The `model_type`s of the config `C`.
impl<C: DenseConfig> TrainableModel for DenseModel<C> {
    const MODEL_TYPES: &'static [&'static str] = C::MODEL_TYPES;

    fn packed_hidden(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError> {
        DenseModel::packed_hidden(self, sequences)
    }

    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        DenseModel::logits(self, hidden)
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
        load_dense(dir, dtype, device)
    }

    /// The checkpoint with the generation config the model's own config implies.
    fn save(&self, dir: &Path) -> Result<(), CheckpointError> {
        save_model(self, &GenerationConfig::for_model(self.config()), dir)
    }

    fn adapter_config(&self) -> Option<&LoraConfig> {
        self.adapter().map(LoraAdapter::config)
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
        DenseModel::merged(self)
    }
}

/// The configuration of any architecture on the dense decoder: its names from `K`, and the
/// settings of the shared keys with `K`'s query and key norms and rotary frequencies.
impl<K: ArchitectureKeys> DenseConfig for DenseHfConfig<K> {
    const NAME: &'static str = K::NAME;
    const MODEL_TYPES: &'static [&'static str] = &[K::MODEL_TYPE];

    fn read(file: &Path) -> Result<Self, ConfigError> {
        DenseHfConfig::from_file(file)
    }

    fn validate(&self) -> Result<(), ConfigIssue> {
        DenseHfConfig::validate(self)
    }

    fn settings(&self) -> DenseSettings {
        DenseSettings {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            rms_norm_eps: self.rms_norm_eps,
            tie_word_embeddings: self.tie_word_embeddings,
            qk_norm: K::QK_NORM,
            qkv_bias: K::QKV_BIAS,
            inverse_frequencies: self
                .own
                .inverse_frequencies(plain_inverse_frequencies(self.rope_theta, self.head_dim)),
            initializer_range: self.initializer_range,
            max_position_embeddings: self.max_position_embeddings,
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id.clone(),
        }
    }

    /// The config as read (its `model_type` and `architectures` the architecture's), with
    /// `torch_dtype` naming `dtype` (and no `dtype` key beside it).
    fn checkpoint_json(&self, dtype: DType) -> String {
        let mut config = self.clone();
        config.torch_dtype = Some(torch_dtype_name(dtype).to_string());
        config.extra.remove("dtype");
        config.to_json_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen3::config::Qwen3Config;

    #[test]
    fn the_flop_counts_count_every_matrix_once() {
        let settings = Qwen3Config::base(1000).settings();
        let flops = flop_counts(&settings);
        let (h, d, layers) = (settings.hidden_size, settings.head_dim, settings.num_hidden_layers);
        let norms = layers * (2 * h + 2 * d) + h;
        // Tied embeddings: the LM head is the embedding matrix, counted once by the settings.
        assert_eq!(flops.body as usize + flops.head as usize + norms, settings.parameter_count());
        let per_key = 4.0 * (layers * settings.num_attention_heads * d) as f64;
        let expected = 2.0 * flops.body * 3.0 + 2.0 * flops.head * 2.0 + per_key * (1.0 + 2.0 + 3.0);
        assert_eq!(flops.forward(3, 2), expected);
    }

    #[test]
    fn parameter_counts_match_the_named_sizes() {
        let tiny = Qwen3Config::tiny(8000).settings();
        assert_eq!(tiny.parameter_count(), 8000 * 64 + 2 * 49_312 + 64);
        let base = Qwen3Config::base(8000);
        assert_eq!(base.kv_groups(), 2);
        assert_eq!(base.settings().parameter_count(), 8000 * 256 + 4 * 787_072 + 256);
    }

    #[test]
    fn qwen3_normalises_queries_and_keys_and_rotates_by_the_plain_frequencies() {
        let mut config = Qwen3Config::tiny(100);
        config.rope_theta = 10_000.0;
        let settings = config.settings();
        assert!(settings.qk_norm);
        let expected: Vec<f64> = (0..8).map(|i| 10_000f64.powf(-(i as f64) / 8.0)).collect();
        assert_eq!(settings.inverse_frequencies.len(), expected.len());
        for (ours, theirs) in settings.inverse_frequencies.iter().zip(&expected) {
            assert!((ours - theirs).abs() < 1e-15, "{ours} vs {theirs}");
        }
    }
}
