//! What the dense decoder of [`crate::qwen3::model`] is built from, so that more than one
//! architecture runs on it: each such architecture's config (Qwen3's, Llama's, both a
//! [`crate::qwen3::config::DenseHfConfig`]) implements [`DenseConfig`] and produces the
//! [`DenseSettings`] the layers are assembled from.
//!
//! Why a seam of its own: Qwen3, Qwen2 and Llama are the same grouped-query-attention decoder
//! (pre-norm blocks, rotary embeddings, a SwiGLU MLP) apart from Qwen3's per-head query and key
//! norms, Qwen2's query, key and value biases and Llama's scaled rotary frequencies. Their `config.json`s differ in a few keys, defaults and
//! refusals (each architecture's `ArchitectureKeys`, in its folder), their layers not at all; so
//! the layers, the cache, the training pass and the LoRA updates are written once, over the
//! settings both configs reduce to.

use crate::qwen3::config::{ConfigError, ConfigIssue};
use candle_core::DType;
use std::path::Path;

/// The config of an architecture that runs on the dense decoder: its names, how its
/// `config.json` is read and written, and the [`DenseSettings`] it gives the layers.
pub trait DenseConfig: Clone + Send + Sync + 'static {
    /// The architecture's name, for messages.
    const NAME: &'static str;
    /// The values of `config.json`'s `model_type` this config reads.
    const MODEL_TYPES: &'static [&'static str];
    /// Reads and validates a `config.json`.
    fn read(file: &Path) -> Result<Self, ConfigError>;
    /// Checks that the configuration describes a model the decoder can run; the issue names the
    /// key at fault.
    fn validate(&self) -> Result<(), ConfigIssue>;
    /// What the layers are assembled from.
    fn settings(&self) -> DenseSettings;
    /// The text of the `config.json` of a checkpoint whose weights are stored in `dtype`.
    fn checkpoint_json(&self, dtype: DType) -> String;
}

/// Everything the dense decoder's layers, cache and adapters need of a configuration, whichever
/// architecture's it is.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseSettings {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Whether each attention head normalises its queries and keys (Qwen3) or not (Llama).
    pub qk_norm: bool,
    /// Whether the query, key and value projections add a bias (Qwen2) or not.
    pub qkv_bias: bool,
    /// The rotary inverse frequencies, `head_dim / 2` of them, scaled as the config says.
    pub inverse_frequencies: Vec<f64>,
    /// The standard deviation of a random model's matrices.
    pub initializer_range: f64,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Vec<u32>,
}

impl DenseSettings {
    /// The number of parameters of a model with these settings.
    pub fn parameter_count(&self) -> usize {
        let (h, d) = (self.hidden_size, self.head_dim);
        let attention = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads);
        let mlp = 3 * h * self.intermediate_size;
        let norms = 2 * h + if self.qk_norm { 2 * d } else { 0 };
        let biases = if self.qkv_bias { d * (self.num_attention_heads + 2 * self.num_key_value_heads) } else { 0 };
        let embeddings = self.vocab_size * h * if self.tie_word_embeddings { 1 } else { 2 };
        self.num_hidden_layers * (attention + mlp + norms + biases) + embeddings + h
    }
}

/// `1 / theta^(2i / head_dim)` for `i < head_dim / 2`, as `transformers` computes the unscaled
/// rotary frequencies.
pub fn plain_inverse_frequencies(rope_theta: f64, head_dim: usize) -> Vec<f64> {
    (0..head_dim / 2).map(|i| 1.0 / rope_theta.powf((2 * i) as f64 / head_dim as f64)).collect()
}
