//! The seam between an architecture and the rest of whale: what the engine, `whale serve`,
//! `whale lm`, the bench and the loop need of a loaded model, whatever its layers are.
//!
//! Each architecture's folder ([`crate::qwen3`], [`crate::qwen3_5`]) implements
//! [`Architecture`] for its model, and the registry ([`crate::architectures`]) lists the model's
//! type. A sequence's cache is the architecture's own type, carried boxed in a [`DecoderCache`]
//! so the engine need not know it. [`Decoder`] holds the loaded model as a boxed
//! `dyn Architecture`; everything is asked of it through the trait, and only the registry and
//! [`crate::trainable::TrainableModel::of_decoder`] look at the concrete type behind it
//! ([`Decoder::downcast_ref`]).

use crate::qwen3::lora::LoraError;
use crate::qwen3::model::ModelError;
use candle_core::{DType, Device, Tensor};
use std::any::Any;
use std::path::Path;

/// A loaded model the engine can decode with.
pub trait Architecture: ArchitectureObject {
    /// The architecture's name, for messages.
    fn name(&self) -> &'static str;
    fn dtype(&self) -> DType;
    fn device(&self) -> &Device;
    fn vocab_size(&self) -> usize;
    fn max_position_embeddings(&self) -> usize;
    /// The config's end-of-sequence ids.
    fn eos_token_id(&self) -> &[u32];
    /// All parameters of the model, embeddings included (and the LM head when not tied).
    fn parameter_count(&self) -> usize;
    /// The model FLOPs of a token through this model ([`FlopCounts`]).
    fn flop_counts(&self) -> FlopCounts;
    /// What a training pass keeps for its backward pass ([`ActivationCounts`]).
    fn activation_counts(&self) -> ActivationCounts;
    /// An empty cache for one sequence.
    fn new_cache(&self) -> Result<DecoderCache, ModelError>;
    /// An independent copy of a cache this architecture made: sequences that share a prompt
    /// continue from one prefill, each with its own copy.
    fn fork_cache(&self, cache: &DecoderCache) -> Result<DecoderCache, ModelError>;
    /// An independent copy of the first `len` tokens of a cache this architecture made, for a
    /// sequence whose prompt begins with them; `None` where a cache cannot be cut short (a
    /// recurrent state sums up every token fed).
    fn fork_cache_prefix(&self, cache: &DecoderCache, len: usize) -> Result<Option<DecoderCache>, ModelError>;
    /// One batched incremental step: the logits of each chunk's last token, `[steps.len(),
    /// vocab]` f32. Each step's cache was made by this architecture's [`Self::new_cache`].
    fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError>;
    /// This model with the PEFT LoRA adapter in `dir` applied, sharing this model's weights.
    fn with_peft_adapter(&self, dir: &Path) -> Result<Decoder, AdapterError>;
    /// A clone to decode with (an architecture may keep decoding-friendly copies of weights).
    fn for_decoding(&self) -> Decoder;
    /// A clone to decode with whose matrix products read 8-bit copies of the weights of now
    /// (`[model] quantized`); an error where the architecture, dtype or device has none.
    fn for_quantized_decoding(&self) -> Result<Decoder, ModelError>;
}

/// What a [`Decoder`] needs of the model it boxes besides [`Architecture`]: a clone, and the
/// model as [`Any`] for [`Decoder::downcast_ref`]. Every `Clone` architecture has it.
pub trait ArchitectureObject: Send + Sync + 'static {
    /// A clone of the model (sharing its weights), boxed.
    fn clone_boxed(&self) -> Box<dyn Architecture>;
    fn as_any(&self) -> &dyn Any;
}

impl<A: Architecture + Clone> ArchitectureObject for A {
    fn clone_boxed(&self) -> Box<dyn Architecture> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The model FLOPs of an architecture per token: the useful arithmetic of the model, not what
/// an implementation happens to spend (padding, masked attention cells, the chunked form of
/// the delta rule). Embedding lookups and norms are left out (no matmul).
///
/// With `B` = [`Self::body`], `H` = [`Self::head`], and `4·L·A·d` = [`Self::attention_per_key`]
/// (`L` full-attention layers of `A` query heads of size `d`), `R` =
/// [`Self::recurrence_per_token`], a forward pass over `n` tokens at positions `p` (0-based,
/// each attending to `p + 1` keys) that computes logits for `m` of them costs
/// `2·B·n + 2·H·m + 4·L·A·d·Σ(p + 1) + R·n` (projections and MLP, LM head, `QKᵀ` and `PV`,
/// recurrences): [`Self::forward`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlopCounts {
    /// Parameters of the decoder layers' matrices (and Qwen3.5's depthwise convolutions).
    pub body: f64,
    /// Parameters of the LM head.
    pub head: f64,
    /// FLOPs of one query attending to one key, all full-attention layers and heads: `4·L·A·d`.
    pub attention_per_key: f64,
    /// FLOPs of one token through every delta-rule recurrence of Qwen3.5's Gated DeltaNet layers
    /// (0 for an architecture without them). Per layer of `V` value heads with `k`-by-`v`
    /// states, three products of a state with a vector (the read-out before the update, the
    /// rank-one update, the output): `6·V·k·v`.
    pub recurrence_per_token: f64,
}

impl FlopCounts {
    /// A forward pass over positions `0..fed` computing `scored` logit rows.
    pub fn forward(&self, fed: usize, scored: usize) -> f64 {
        let fed_f = fed as f64;
        let keys = fed_f * (fed_f + 1.0) / 2.0;
        (2.0 * self.body + self.recurrence_per_token) * fed_f
            + 2.0 * self.head * scored as f64
            + self.attention_per_key * keys
    }
}

/// The floats a training pass over packed sequences holds at its peak, in the forward pass's
/// activations and the backward pass's gradients of them: an estimate from the architecture's
/// widths, so that a step that cannot fit in memory is refused before it is taken (whale-train's
/// `StepMemory`) rather than killed by the kernel halfway. Calibrated on measured peaks: a LoRA
/// step of Qwen2.5-Coder-1.5B over 512 tokens held 8.2 GiB beyond the weights, and this
/// estimate says 7.2 GiB (docs/benchmarks.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationCounts {
    /// Per token fed, all layers: each layer's inputs, projections, rotary terms, MLP products
    /// and residuals, twice (the value and its gradient).
    pub per_token: f64,
    /// Per scored position: the logits' row over the vocabulary, its softmax and its gradient.
    pub per_scored: f64,
}

impl ActivationCounts {
    /// Floats of the activations of one layer per token, widths `hidden`, `query` (all query
    /// heads), `key_value` (all key and value heads) and `intermediate` (the MLP), counted
    /// twice for their gradients.
    pub fn layer_per_token(hidden: usize, query: usize, key_value: usize, intermediate: usize) -> f64 {
        2.0 * (7 * hidden + 7 * query + 8 * key_value + 4 * intermediate) as f64
    }

    /// Bytes of a pass over `fed` tokens scoring `scored` of them: activations of
    /// `activation_bytes` each (the model's dtype), logits in f32 whatever the dtype.
    pub fn pass_bytes(&self, fed: usize, scored: usize, activation_bytes: usize) -> f64 {
        self.per_token * (fed * activation_bytes) as f64 + self.per_scored * (scored * 4) as f64
    }
}

/// What one sequence carries between decoding steps, of the architecture that made it.
pub struct DecoderCache(Box<dyn Any + Send>);

impl DecoderCache {
    pub fn new<C: Any + Send>(cache: C) -> Self {
        Self(Box::new(cache))
    }

    /// The architecture's own cache; an error when another architecture made this one.
    pub fn downcast_ref<C: Any>(&self) -> Result<&C, ModelError> {
        self.0.downcast_ref().ok_or_else(|| ModelError::Input("a cache was made for another architecture".to_string()))
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

/// A model the engine can decode with, of whichever architecture: a clone shares its weights.
pub struct Decoder(Box<dyn Architecture>);

impl Clone for Decoder {
    fn clone(&self) -> Self {
        Self(self.0.clone_boxed())
    }
}

impl<A: Architecture> From<A> for Decoder {
    fn from(model: A) -> Self {
        Self(Box::new(model))
    }
}

impl Decoder {
    /// The model, whatever its architecture.
    pub fn model(&self) -> &dyn Architecture {
        &*self.0
    }

    /// The model as the architecture `M`, or `None` when it is another.
    pub fn downcast_ref<M: Architecture>(&self) -> Option<&M> {
        self.0.as_any().downcast_ref()
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

    /// A clone to decode with from 8-bit copies of the weights
    /// ([`Architecture::for_quantized_decoding`]).
    pub fn for_quantized_decoding(&self) -> Result<Self, ModelError> {
        self.model().for_quantized_decoding()
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

    /// All parameters, embeddings included ([`Architecture::parameter_count`]).
    pub fn parameter_count(&self) -> usize {
        self.model().parameter_count()
    }

    /// The model FLOPs per token ([`Architecture::flop_counts`]).
    pub fn flop_counts(&self) -> FlopCounts {
        self.model().flop_counts()
    }

    /// What a training pass keeps for its backward pass ([`Architecture::activation_counts`]).
    pub fn activation_counts(&self) -> ActivationCounts {
        self.model().activation_counts()
    }

    /// An empty cache for one sequence.
    pub fn new_cache(&self) -> Result<DecoderCache, ModelError> {
        self.model().new_cache()
    }

    /// An independent copy of a sequence's cache ([`Architecture::fork_cache`]).
    pub fn fork_cache(&self, cache: &DecoderCache) -> Result<DecoderCache, ModelError> {
        self.model().fork_cache(cache)
    }

    /// A copy of a cache's first `len` tokens, where the architecture can cut its caches
    /// ([`Architecture::fork_cache_prefix`]).
    pub fn fork_cache_prefix(&self, cache: &DecoderCache, len: usize) -> Result<Option<DecoderCache>, ModelError> {
        self.model().fork_cache_prefix(cache, len)
    }

    /// Whether [`Self::fork_cache_prefix`] can cut this architecture's caches.
    pub fn forks_cache_prefixes(&self) -> Result<bool, ModelError> {
        Ok(self.fork_cache_prefix(&self.new_cache()?, 0)?.is_some())
    }

    /// One batched incremental step ([`Architecture::forward_step`]).
    pub fn forward_step(&self, steps: &mut [DecoderStep<'_>]) -> Result<Tensor, ModelError> {
        self.model().forward_step(steps)
    }
}
