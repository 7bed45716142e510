//! The dense decoder of Qwen3, Qwen2 and Llama ([`DenseModel`]): embeddings, `num_hidden_layers`
//! pre-norm blocks (grouped-query attention with rotary embeddings, for Qwen3 q/k RMSNorm, for
//! Qwen2 q/k/v biases, then a SwiGLU MLP), a final RMSNorm and the LM head. It is built from the
//! [`DenseSettings`] of an architecture's [`DenseConfig`] and keeps that config to write back:
//! [`Qwen3Model`] is `DenseModel<Qwen3Config>`, Llama's model is `DenseModel<LlamaConfig>`
//! ([`crate::llama`]), Qwen2's `DenseModel<Qwen2Config>` ([`crate::qwen2`]).
//!
//! candle's fused softmax, RMSNorm and rotary kernels have no backward pass and would silently
//! cut the gradient, so the training pass ([`training`]) runs whale's own ([`whale_kernels`]:
//! fused on the CPU with backward passes, composed from differentiable ops elsewhere) over
//! the token rows of sequences packed end to end, `[Σ len, width]`. The cached decoding pass
//! (this file) needs no gradient and runs candle's kernels over `[B, heads, T, d]`, the layout of
//! the key/value cache; its attention reads each sequence's cache where it lies ([`step_kv`]).
//! The two passes share the weights, the projections (LoRA included) and the MLP (whose SwiGLU
//! is whale's op in both), and agree to float rounding (the tests hold their logits to 1e-4).
//!
//! A model may carry a LoRA adapter ([`DenseModel::with_adapter`]): each targeted projection
//! then adds `scale * (x A^T) B^T` to `x W^T`, in every entry point; a model without one does no
//! extra work.
//!
//! Entry points:
//! - [`DenseModel::packed_hidden`]: the training pass, final hidden states of packed sequences.
//! - [`DenseModel::forward_train`]: a padded batch `[B, T]` with its attention mask, all logits
//!   (packed onto the training pass).
//! - [`DenseModel::forward_step`]: batched incremental decoding. Each sequence owns a
//!   [`KvCache`]; one call feeds a chunk of new tokens for each of several sequences (a whole
//!   prompt for a sequence that just joined, one sampled token for one that is decoding) and
//!   returns the logits of each chunk's last token. Sequences of any lengths can be mixed, and
//!   sequences may join or leave between calls: the batch is formed anew on every call.

pub mod error;
mod helper_thread;
mod kv_cache;
mod packing;
mod quantized;
mod step_kv;
mod training;

pub use error::ModelError;
pub use kv_cache::KvCache;

pub use packing::Packing;
use quantized::QuantizedWeight;
use step_kv::StepKv;

use crate::parameters;
use crate::qwen3::config::Qwen3Config;
use crate::qwen3::dense::{DenseConfig, DenseSettings};
use crate::qwen3::lora::{base_weight_name, bias_name, LoraAdapter, LoraTarget};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use whale_kernels as kernels;

fn input_error(message: impl Into<String>) -> ModelError {
    ModelError::Input(message.into())
}

/// Every parameter of a model with these settings: its Hugging Face name and shape.
pub fn parameter_shapes(config: &DenseSettings) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (config.hidden_size, config.head_dim, config.intermediate_size);
    let (q_out, kv_out) = (config.num_attention_heads * d, config.num_key_value_heads * d);
    let mut shapes = vec![("model.embed_tokens.weight".to_string(), vec![config.vocab_size, h])];
    for layer in 0..config.num_hidden_layers {
        let prefix = format!("model.layers.{layer}");
        let layer_shapes = [
            ("input_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![q_out, h]),
            ("self_attn.k_proj.weight", vec![kv_out, h]),
            ("self_attn.v_proj.weight", vec![kv_out, h]),
            ("self_attn.o_proj.weight", vec![h, q_out]),
            ("self_attn.q_norm.weight", vec![d]),
            ("self_attn.k_norm.weight", vec![d]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ];
        let qk_norm = |name: &str| matches!(name, "self_attn.q_norm.weight" | "self_attn.k_norm.weight");
        let kept = layer_shapes.into_iter().filter(|(name, _)| config.qk_norm || !qk_norm(name));
        shapes.extend(kept.map(|(name, shape)| (format!("{prefix}.{name}"), shape)));
        if config.qkv_bias {
            let biases = [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)];
            shapes.extend(biases.map(|(name, size)| (format!("{prefix}.self_attn.{name}.bias"), vec![size])));
        }
    }
    shapes.push(("model.norm.weight".to_string(), vec![h]));
    if !config.tie_word_embeddings {
        shapes.push(("lm_head.weight".to_string(), vec![config.vocab_size, h]));
    }
    shapes
}

/// `x @ w^T` over the last dimension of `x`, any leading dimensions (a matrix `x` goes
/// straight to the product, without reshapes for autograd to carry).
pub(crate) fn linear(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    linear_with(x, weight, None)
}

/// [`linear`], taking the product from `transposed` (`w^T` made contiguous) where that gives
/// the same result ([`transposed_product`]).
fn linear_with(x: &Tensor, weight: &Tensor, transposed: Option<&Tensor>) -> candle_core::Result<Tensor> {
    over_rows(x, weight.dim(0)?, |x| match transposed {
        Some(transposed) => transposed_product(x, weight, transposed),
        None => product(x, weight),
    })
}

/// `product` (of a matrix, to `out_dim` outputs) applied to the rows of `x`, any leading
/// dimensions.
fn over_rows(
    x: &Tensor,
    out_dim: usize,
    product: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    if x.rank() == 2 {
        return product(x);
    }
    let in_dim = x.dim(candle_core::D::Minus1)?;
    let mut shape = x.dims().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = out_dim;
    }
    let rows = x.elem_count() / in_dim;
    product(&x.reshape((rows, in_dim))?)?.reshape(shape)
}

/// Outputs times rows up to which `gemm` computes a product with dot-product kernels that
/// read `w` row by row; above (with at least two rows and three inputs), with its general
/// kernel, which adds up the same terms in the same order whichever way `w` lies in memory.
const GEMM_DOT_KERNEL_MAX: usize = 16 * 16;

/// `x @ w^T` of a matrix `x`, read from `transposed` (`w^T`, contiguous) where `gemm` runs its
/// general kernel on both layouts. `gemm` reads `transposed` as it lies, while from `w` it
/// first copies (packs) the weights into that layout, on every call: a decoding step of many
/// sequences copied every weight before multiplying (`whale lm bench` at 64 concurrent
/// requests gives the difference, docs/benchmarks.md). Every output is the same sum in the same order, so the result is the same to the last bit
/// (a unit test holds it there); elsewhere (one row, small products), [`product`].
fn transposed_product(x: &Tensor, weight: &Tensor, transposed: &Tensor) -> candle_core::Result<Tensor> {
    let (out_dim, in_dim) = weight.dims2()?;
    let rows = x.dim(0)?;
    if rows >= 2 && in_dim >= 3 && out_dim * rows > GEMM_DOT_KERNEL_MAX {
        x.matmul(transposed)
    } else {
        product(x, weight)
    }
}

/// Most bytes of the transposed copies of [`DenseModel::for_decoding`]: about a CPU's last-level
/// cache. The copies pay while a step's projections stay in the caches between steps, where
/// `gemm` reads a copy as it lies and would otherwise pack `W` anew on every call. Projections
/// that stream from memory are read once per product when packed, more than once from an
/// unpacked copy: SmolLM2's 420 MB decoded 11-13% faster at 8 and 64 concurrent sequences
/// without copies, while products over 13 MB of cached weights ran faster with them at 8 rows
/// (docs/benchmarks.md).
const DECODING_COPY_MAX_BYTES: usize = 32 << 20;

/// Outputs of a one-row product from which `gemm` computes it with its matrix-vector kernel;
/// below, with another kernel. A product is split only where the whole and both halves take the
/// same kernel.
const GEMV_MIN_OUTPUTS: usize = 257;

/// Weights below which a one-row product stays whole (handing half to another thread costs
/// more than it saves).
const SPLIT_MIN_WEIGHTS: usize = 1 << 14;

/// `x @ w^T` of a matrix `x`. A decoding step of one sequence multiplies one row by each
/// weight: `gemm` computes that as independent dot products, one per output, on one thread.
/// On the CPU each half of the outputs of such a product goes to its own thread
/// ([`helper_thread`]); every output is the same dot product by the same kernel as before, so
/// the result is the same to the last bit (a unit test holds it there). In a training pass, a
/// constant weight (the base of a LoRA pass, a frozen head) is multiplied by
/// [`kernels::frozen_weight_product`]: the same bits, and a backward pass that does not
/// compute a gradient nobody reads.
pub(crate) fn product(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    let (out_dim, in_dim) = weight.dims2()?;
    let same_kernel = out_dim >= 2 * GEMV_MIN_OUTPUTS || (64..GEMV_MIN_OUTPUTS).contains(&out_dim);
    let split = x.dim(0)? == 1
        && x.is_contiguous()
        && x.device().is_cpu()
        && x.dtype() == DType::F32
        && same_kernel
        && out_dim * in_dim >= SPLIT_MIN_WEIGHTS;
    if split {
        halved_product(x, weight)
    } else if x.track_op() && !weight.track_op() {
        kernels::frozen_weight_product(x, weight)
    } else {
        x.matmul(&weight.t()?)
    }
}

/// `x @ w^T` with the first half of the outputs computed here and the second on the helper.
fn halved_product(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    let out_dim = weight.dim(0)?;
    let half = out_dim / 2;
    let (row, second) = (x.clone(), weight.narrow(0, half, out_dim - half)?);
    let (first, second) =
        helper_thread::join(|| x.matmul(&weight.narrow(0, 0, half)?.t()?), Box::new(move || row.matmul(&second.t()?)));
    Tensor::cat(&[first?, second?], 1)
}

/// A linear projection `x W^T` (plus a bias where the architecture has one), plus a LoRA update
/// when an adapter targets it.
#[derive(Clone)]
pub(crate) struct Projection {
    pub(crate) weight: Tensor,
    /// `[out]`, added to every row (Qwen2's query, key and value projections).
    pub(crate) bias: Option<Tensor>,
    pub(crate) lora: Option<LoraUpdate>,
    /// `W^T` made contiguous, on the engine's decoding models only
    /// ([`DenseModel::for_decoding`]): a copy, so it holds the weights of when it was made.
    pub(crate) transposed: Option<Tensor>,
    /// `W` in 8-bit blocks, on quantized decoding models only
    /// ([`DenseModel::for_quantized_decoding`]): a copy, as `transposed` is.
    quantized: Option<QuantizedWeight>,
}

impl Projection {
    pub(crate) fn new(weight: Tensor, lora: Option<LoraUpdate>) -> Self {
        Self { weight, bias: None, lora, transposed: None, quantized: None }
    }

    fn with_bias(self, bias: Option<Tensor>) -> Self {
        Self { bias, ..self }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let base = match &self.quantized {
            Some(quantized) => over_rows(x, self.weight.dim(0)?, |rows| quantized.product(rows))?,
            None => linear_with(x, &self.weight, self.transposed.as_ref())?,
        };
        let base = match &self.bias {
            Some(bias) => base.broadcast_add(bias)?,
            None => base,
        };
        match &self.lora {
            None => Ok(base),
            Some(lora) => base + lora.forward(x)?,
        }
    }
}

/// `scale * (dropout(x) A^T) B^T`, with A `[rank, in]` and B `[out, rank]` sharing the
/// adapter's variables.
#[derive(Clone)]
pub(crate) struct LoraUpdate {
    pub(crate) a: Tensor,
    pub(crate) b: Tensor,
    pub(crate) scale: f64,
    /// Set on the models of training passes only ([`DenseModel::with_dropout`]).
    pub(crate) dropout: Option<Dropout>,
}

impl LoraUpdate {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let input = match &self.dropout {
            Some(dropout) => dropout.apply(x)?,
            None => x.clone(),
        };
        linear(&linear(&input, &self.a)?, &self.b)? * self.scale
    }
}

/// Inverted dropout whose mask is drawn on the host from `seed`, so that a training pass is
/// reproducible (and a resumed run repeats it) on any device.
#[derive(Clone, Copy)]
pub(crate) struct Dropout {
    probability: f64,
    seed: u64,
}

impl Dropout {
    fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let kept = (1.0 / (1.0 - self.probability)) as f32;
        let mask: Vec<f32> =
            (0..x.elem_count()).map(|_| if rng.gen::<f64>() < self.probability { 0.0 } else { kept }).collect();
        x * Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?
    }
}

/// Root-mean-square normalisation over the last dimension, computed in f32 as in `transformers`.
#[derive(Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// candle's kernel (no backward pass; [`kernels::rms_norm`] in training).
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps as f32)
    }
}

/// Rotary position embeddings for one pass: `cos` and `sin` of shape `[B, T, head_dim / 2]`.
struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// `positions` is `[B, T]` in f32; `inv_freq` is `[head_dim / 2]` in f32 (in f64 in an f64
    /// model), and the angles are computed in its dtype.
    fn new(inv_freq: &Tensor, positions: &Tensor, dtype: DType) -> candle_core::Result<Self> {
        let half = inv_freq.dim(0)?;
        let positions = positions.to_dtype(inv_freq.dtype())?;
        let freqs = positions.unsqueeze(2)?.broadcast_mul(&inv_freq.reshape((1, 1, half))?)?;
        Ok(Self { cos: freqs.cos()?.to_dtype(dtype)?, sin: freqs.sin()?.to_dtype(dtype)? })
    }

    /// `x * cos + rotate_half(x) * sin` with `rotate_half([a, b]) = [-b, a]` (the HF convention),
    /// `x` `[B, heads, T, d]`; candle's kernel (no backward pass; [`kernels::rope`] in training).
    fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::rotary_emb::rope(&x.contiguous()?, &self.cos, &self.sin)
    }
}

#[derive(Clone)]
struct Attention {
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: Projection,
    /// Qwen3's per-head norms of queries and keys; Llama has none.
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    /// Stores this pass's keys and values (after k-norm and rotary) as layer `layer` of `kv`
    /// and attends over everything `kv` holds for it.
    fn forward(&self, x: &Tensor, rotary: &Rotary, kv: &StepKv, layer: usize) -> candle_core::Result<Tensor> {
        let (batch, steps, _) = x.dims3()?;
        let q = rotary.apply(&self.heads(x, &self.q_proj, self.num_heads, self.q_norm.as_ref())?)?;
        let k = rotary.apply(&self.heads(x, &self.k_proj, self.num_kv_heads, self.k_norm.as_ref())?)?;
        let v = self.heads(x, &self.v_proj, self.num_kv_heads, None)?;
        let attended = kv.attend(layer, &q, &k, &v, self.scale())?;
        let merged = attended.transpose(1, 2)?.reshape((batch, steps, self.num_heads * self.head_dim))?;
        self.o_proj.forward(&merged)
    }

    /// Projects to `[B, heads, T, head_dim]`, normalising each head when `norm` is given.
    fn heads(
        &self,
        x: &Tensor,
        projection: &Projection,
        heads: usize,
        norm: Option<&RmsNorm>,
    ) -> candle_core::Result<Tensor> {
        let (batch, steps, _) = x.dims3()?;
        let projected = projection.forward(x)?.reshape((batch, steps, heads, self.head_dim))?;
        let projected = match norm {
            Some(norm) => norm.forward(&projected)?,
            None => projected,
        };
        projected.transpose(1, 2)?.contiguous()
    }

    /// `1 / sqrt(head_dim)`, the attention scores' scale.
    fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }
}

#[derive(Clone)]
struct Mlp {
    gate_proj: Projection,
    up_proj: Projection,
    down_proj: Projection,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let gated = kernels::swiglu(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?;
        self.down_proj.forward(&gated)
    }
}

#[derive(Clone)]
struct DecoderLayer {
    input_layernorm: RmsNorm,
    attention: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    fn forward(&self, x: &Tensor, rotary: &Rotary, kv: &StepKv, layer: usize) -> candle_core::Result<Tensor> {
        let attended = self.attention.forward(&self.input_layernorm.forward(x)?, rotary, kv, layer)?;
        let x = (x + attended)?;
        &x + self.mlp.forward(&self.post_attention_layernorm.forward(&x)?)?
    }

    fn projections_mut(&mut self) -> [(LoraTarget, &mut Projection); 7] {
        let (attention, mlp) = (&mut self.attention, &mut self.mlp);
        [
            (LoraTarget::QProj, &mut attention.q_proj),
            (LoraTarget::KProj, &mut attention.k_proj),
            (LoraTarget::VProj, &mut attention.v_proj),
            (LoraTarget::OProj, &mut attention.o_proj),
            (LoraTarget::GateProj, &mut mlp.gate_proj),
            (LoraTarget::UpProj, &mut mlp.up_proj),
            (LoraTarget::DownProj, &mut mlp.down_proj),
        ]
    }
}

/// One pass's host-prepared inputs.
struct PassInputs {
    /// `[B, T]` u32.
    ids: Tensor,
    /// `[B, T]` f32 rotary positions.
    positions: Tensor,
}

/// One sequence's share of a batched [`DenseModel::forward_step`]: the tokens to feed now and
/// the sequence's cache, which the step extends by `tokens.len()`.
pub struct SeqStep<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
}

/// A dense causal language model of the architecture whose config is `C`, with its parameters
/// in a [`VarMap`], optionally carrying a LoRA adapter.
///
/// Cloning is cheap and shares the parameters (and the adapter's): an optimizer step through
/// one clone is seen by all of them.
#[derive(Clone)]
pub struct DenseModel<C> {
    config: C,
    settings: DenseSettings,
    varmap: VarMap,
    adapter: Option<LoraAdapter>,
    device: Device,
    dtype: DType,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Tensor,
    /// The head in 8-bit blocks, on quantized decoding models only
    /// ([`DenseModel::for_quantized_decoding`]).
    quantized_head: Option<QuantizedWeight>,
    /// `[head_dim / 2]` f32 rotary frequencies.
    inv_freq: Tensor,
}

/// The Qwen3 decoder.
pub type Qwen3Model = DenseModel<Qwen3Config>;

impl<C: DenseConfig> DenseModel<C> {
    /// A model with Hugging Face's initialisation (normal with `initializer_range` standard
    /// deviation for matrices, ones for norms, zeros for biases), reproducible from `seed`.
    pub fn new_random(config: &C, seed: u64, dtype: DType, device: &Device) -> Result<Self, ModelError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = HashMap::new();
        let settings = config.settings();
        for (name, shape) in parameter_shapes(&settings) {
            let tensor = if name.ends_with(".bias") {
                Tensor::zeros(shape, DType::F32, &Device::Cpu)?
            } else if shape.len() == 1 {
                Tensor::ones(shape, DType::F32, &Device::Cpu)?
            } else {
                let count = shape.iter().product();
                let values = (0..count)
                    .map(|_| (parameters::standard_normal(&mut rng) * settings.initializer_range) as f32)
                    .collect();
                Tensor::from_vec(values, shape, &Device::Cpu)?
            };
            tensors.insert(name, tensor);
        }
        Self::from_tensors(config, tensors, dtype, device)
    }

    /// A model from named tensors (Hugging Face names, see [`parameter_shapes`]), converted to
    /// `dtype` on `device`. Tensors that the model does not use are ignored.
    pub fn from_tensors(
        config: &C,
        mut tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        let shapes = parameter_shapes(&config.settings());
        let (varmap, params) = parameters::checked_variables(shapes, &mut tensors, dtype, device)?;
        Self::assemble(config, varmap, params, dtype, device, None)
    }

    /// A model reading `params` (tensors of `varmap`'s variables, or constants sharing their
    /// storage) and, when given, the adapter's variables.
    fn assemble(
        config: &C,
        varmap: VarMap,
        params: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
        adapter: Option<&LoraAdapter>,
    ) -> Result<Self, ModelError> {
        let take =
            |name: &str| params.get(name).cloned().ok_or_else(|| ModelError::MissingTensor { name: name.to_string() });
        let settings = config.settings();
        let eps = settings.rms_norm_eps;
        let mut layers = Vec::with_capacity(settings.num_hidden_layers);
        for layer in 0..settings.num_hidden_layers {
            let weight = |name: &str| take(&format!("model.layers.{layer}.{name}.weight"));
            let head_norm = |name: &str| -> Result<Option<RmsNorm>, ModelError> {
                Ok(if settings.qk_norm { Some(RmsNorm { weight: weight(name)?, eps }) } else { None })
            };
            let projection = |target: LoraTarget| -> Result<Projection, ModelError> {
                let lora = adapter.and_then(|adapter| {
                    let (a, b) = adapter.matrices(layer, target)?;
                    Some(LoraUpdate { a, b, scale: adapter.scale(), dropout: None })
                });
                let biased = settings.qkv_bias && target.has_qkv_bias();
                let bias = if biased { Some(take(&bias_name(layer, target))?) } else { None };
                Ok(Projection::new(take(&base_weight_name(layer, target))?, lora).with_bias(bias))
            };
            layers.push(DecoderLayer {
                input_layernorm: RmsNorm { weight: weight("input_layernorm")?, eps },
                attention: Attention {
                    q_proj: projection(LoraTarget::QProj)?,
                    k_proj: projection(LoraTarget::KProj)?,
                    v_proj: projection(LoraTarget::VProj)?,
                    o_proj: projection(LoraTarget::OProj)?,
                    q_norm: head_norm("self_attn.q_norm")?,
                    k_norm: head_norm("self_attn.k_norm")?,
                    num_heads: settings.num_attention_heads,
                    num_kv_heads: settings.num_key_value_heads,
                    head_dim: settings.head_dim,
                },
                post_attention_layernorm: RmsNorm { weight: weight("post_attention_layernorm")?, eps },
                mlp: Mlp {
                    gate_proj: projection(LoraTarget::GateProj)?,
                    up_proj: projection(LoraTarget::UpProj)?,
                    down_proj: projection(LoraTarget::DownProj)?,
                },
            });
        }
        let embed_tokens = take("model.embed_tokens.weight")?;
        let lm_head = if settings.tie_word_embeddings { embed_tokens.clone() } else { take("lm_head.weight")? };
        let norm = RmsNorm { weight: take("model.norm.weight")?, eps };
        let inv_freq = rotary_inverse_frequencies(&settings, dtype, device)?;
        Ok(Self {
            config: config.clone(),
            settings,
            varmap,
            adapter: adapter.cloned(),
            device: device.clone(),
            dtype,
            embed_tokens,
            layers,
            norm,
            lm_head,
            quantized_head: None,
            inv_freq,
        })
    }

    /// The architecture's configuration, as it is written back with a checkpoint.
    pub fn config(&self) -> &C {
        &self.config
    }

    /// What the layers were assembled from.
    pub fn settings(&self) -> &DenseSettings {
        &self.settings
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The parameter store, keyed by Hugging Face names.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// The adapter this model applies, if any.
    pub fn adapter(&self) -> Option<&LoraAdapter> {
        self.adapter.as_ref()
    }

    /// This model with `adapter` applied (replacing any adapter it carries). It shares this
    /// model's parameters and the adapter's variables, so updates of either are seen by both;
    /// the base parameters enter its passes as constants, so a backward pass through it yields
    /// gradients for the adapter only. The adapter must have been made for this configuration,
    /// dtype and device.
    pub fn with_adapter(&self, adapter: &LoraAdapter) -> Result<Self, ModelError> {
        adapter.check_fits(&self.settings).map_err(input_error)?;
        if adapter.dtype() != self.dtype || !adapter.device().same_device(&self.device) {
            return Err(input_error(format!(
                "the adapter is {:?} on {:?}, the model {:?} on {:?}",
                adapter.dtype(),
                adapter.device().location(),
                self.dtype,
                self.device.location()
            )));
        }
        let params = self.named_parameters().into_iter().map(|(name, var)| (name, var.as_tensor().detach())).collect();
        Self::assemble(&self.config, self.varmap.clone(), params, self.dtype, &self.device, Some(adapter))
    }

    /// A clone whose adapter applies its dropout, with masks drawn from `seed` (a stream per
    /// layer and projection): the model of one training pass. Without an adapter, or with a
    /// dropout of 0, a plain clone.
    pub fn with_dropout(&self, seed: u64) -> Self {
        let mut model = self.clone();
        let probability = self.adapter.as_ref().map_or(0.0, |adapter| adapter.config().dropout);
        if probability == 0.0 {
            return model;
        }
        for (index, layer) in model.layers.iter_mut().enumerate() {
            for (target, projection) in layer.projections_mut() {
                if let Some(lora) = &mut projection.lora {
                    let stream = (index * LoraTarget::ALL.len() + target as usize + 1) as u64;
                    let seed = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    lora.dropout = Some(Dropout { probability, seed });
                }
            }
        }
        model
    }

    /// A new model with its own parameters, each targeted weight replaced by
    /// `W + scale * B A` (computed in f32, in f64 for an f64 model), and no adapter: what a full checkpoint of the
    /// adapted model holds. Without an adapter, a copy.
    pub fn merged(&self) -> Result<Self, ModelError> {
        let mut tensors: HashMap<String, Tensor> =
            self.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
        if let Some(adapter) = &self.adapter {
            for layer in 0..self.settings.num_hidden_layers {
                for &target in adapter.targets() {
                    let Some((a, b)) = adapter.matrices(layer, target) else { continue };
                    let name = base_weight_name(layer, target);
                    let weight =
                        tensors.remove(&name).ok_or_else(|| ModelError::MissingTensor { name: name.clone() })?;
                    let wide = kernels::computing_dtype(self.dtype);
                    let update = (b.to_dtype(wide)?.matmul(&a.to_dtype(wide)?)? * adapter.scale())?;
                    tensors.insert(name, (weight.to_dtype(wide)? + update)?.to_dtype(self.dtype)?);
                }
            }
        }
        Self::from_tensors(&self.config, tensors, self.dtype, &self.device)
    }

    /// A clone for the generation engine to decode with: on the CPU in f32, each projection
    /// also holds `W^T` made contiguous, from which batched decoding steps take their
    /// products faster and to the same bits ([`transposed_product`]), unless those copies
    /// would take more than [`DECODING_COPY_MAX_BYTES`]. The copies hold the weights of now
    /// (any older ones are dropped): after an in-place update of the parameters, make a new
    /// one (the engine does, at whale-engine's `LocalPolicy::set_weights_version`). Elsewhere, or
    /// where a copy cannot be made, a clone without copies.
    pub fn for_decoding(&self) -> Self {
        self.for_decoding_within(DECODING_COPY_MAX_BYTES)
    }

    /// [`Self::for_decoding`] with copies of at most `max_bytes` in all.
    fn for_decoding_within(&self, max_bytes: usize) -> Self {
        let mut model = self.clone();
        model.quantized_head = None;
        let mut projections = model.projections_mut();
        projections.iter_mut().for_each(|p| p.quantized = None);
        let bytes: usize = projections.iter().map(|p| p.weight.elem_count() * self.dtype.size_in_bytes()).sum();
        let eligible = self.device.is_cpu() && self.dtype == DType::F32 && bytes <= max_bytes;
        let copies = eligible
            .then(|| projections.iter().map(|p| p.weight.t()?.contiguous()).collect::<candle_core::Result<Vec<_>>>())
            .and_then(Result::ok);
        match copies {
            Some(copies) => projections.iter_mut().zip(copies).for_each(|(p, copy)| p.transposed = Some(copy)),
            None => projections.iter_mut().for_each(|p| p.transposed = None),
        }
        model
    }

    /// A clone for the generation engine to decode with whose projections and head read Q8_0
    /// copies of the weights of now ([`quantized`]), where their inputs are a multiple of 256 or
    /// padded to one with at most a quarter more work (elsewhere candle's Q8_0 products are
    /// slower than f32, and [`Self::for_decoding`]'s f32 product stays). After an update of the
    /// parameters, make a new one. Only an f32 model on a CPU with VNNI has them; elsewhere an
    /// error.
    pub fn for_quantized_decoding(&self) -> Result<Self, ModelError> {
        if !self.device.is_cpu() || self.dtype != DType::F32 {
            return Err(input_error(format!(
                "quantized decoding needs an f32 model on the CPU, not {:?} on {:?}",
                self.dtype,
                self.device.location()
            )));
        }
        if !quantized::fast_kernels() {
            return Err(input_error(
                "quantized decoding needs a CPU with VNNI (AVX-512 VNNI or AVX-VNNI): without it candle's Q8_0 \
                 products are slower than f32",
            ));
        }
        let parts = rayon::current_num_threads();
        let mut model = self.for_decoding();
        model.quantized_head = QuantizedWeight::of(&self.lm_head, parts)?;
        for projection in model.projections_mut() {
            projection.quantized = QuantizedWeight::of(&projection.weight, parts)?;
            if projection.quantized.is_some() {
                projection.transposed = None;
            }
        }
        Ok(model)
    }

    /// Every layer's projections.
    fn projections_mut(&mut self) -> Vec<&mut Projection> {
        self.layers.iter_mut().flat_map(|layer| layer.projections_mut().map(|(_, p)| p)).collect()
    }

    /// Every base parameter with its Hugging Face name, sorted by name (an adapter's are in
    /// [`LoraAdapter::named_parameters`]).
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        parameters::sorted(&self.varmap)
    }

    /// Logits `[B, T, vocab]` (f32) of a padded batch.
    ///
    /// `input_ids` is `[B, T]` u32; `attention_mask` is `[B, T]` (any dtype), 1 for real tokens
    /// and 0 for padding. Padding may sit anywhere: the real tokens of a row are one sequence,
    /// numbered 0, 1, 2, ... for the rotary positions, and never attend to padding (the pass runs
    /// on [`Self::packed_hidden`], which never sees it). Logits at padded positions are zero.
    pub fn forward_train(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.logits(&self.forward_hidden(input_ids, attention_mask)?)?)
    }

    /// The final (normalised) hidden states `[B, T, hidden]` of a padded batch (zero at padded
    /// positions); see [`Self::forward_train`].
    pub fn forward_hidden(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor, ModelError> {
        let (rows, steps) = input_ids.dims2()?;
        if attention_mask.dims() != input_ids.dims() {
            return Err(input_error(format!(
                "attention mask {:?} does not match input ids {:?}",
                attention_mask.dims(),
                input_ids.dims()
            )));
        }
        if input_ids.dtype() != DType::U32 {
            return Err(input_error(format!("input ids are {:?}, expected U32", input_ids.dtype())));
        }
        let ids = input_ids.flatten_all()?.to_vec1::<u32>()?;
        let mask_values = attention_mask.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let packing = Packing::of_padded(&ids, steps, |at| mask_values[at] != 0.0);
        if packing.tokens() == 0 {
            return Err(input_error("the attention mask leaves no real token"));
        }
        let hidden = self.packed_hidden(&packing.sequence_slices())?;
        Ok(kernels::gather_rows(&hidden, &packing.rows)?.reshape((rows, steps, self.settings.hidden_size))?)
    }

    /// Logits (f32; f64 in an f64 model) of hidden states with any leading dimensions.
    pub fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        let logits = match &self.quantized_head {
            Some(head) => over_rows(hidden, self.settings.vocab_size, |rows| head.product(rows))?,
            None => linear(hidden, &self.lm_head)?,
        };
        logits.to_dtype(kernels::computing_dtype(self.dtype))
    }

    fn check_vocabulary(&self, ids: &[u32]) -> Result<(), ModelError> {
        match ids.iter().find(|&&id| id as usize >= self.settings.vocab_size) {
            Some(id) => {
                Err(input_error(format!("token id {id} is outside the vocabulary of {}", self.settings.vocab_size)))
            }
            None => Ok(()),
        }
    }

    /// Runs the decoder on `[B, T]` ids, each layer storing its keys and values in `kv` and
    /// attending over what `kv` holds. Returns the normalised hidden states.
    fn run_layers(&self, inputs: &PassInputs, kv: &StepKv) -> candle_core::Result<Tensor> {
        let (rows, steps) = inputs.ids.dims2()?;
        let rotary = Rotary::new(&self.inv_freq, &inputs.positions, self.dtype)?;
        let mut x = self.embed_tokens.index_select(&inputs.ids.flatten_all()?, 0)?.reshape((
            rows,
            steps,
            self.settings.hidden_size,
        ))?;
        for (index, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, &rotary, kv, index)?;
        }
        self.norm.forward(&x)
    }

    /// An empty cache for one sequence of this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache {
            layers: Vec::new(),
            capacity: 0,
            len: 0,
            num_layers: self.settings.num_hidden_layers,
            num_kv_heads: self.settings.num_key_value_heads,
            head_dim: self.settings.head_dim,
            dtype: self.dtype,
            device: self.device.clone(),
        }
    }

    /// One batched incremental step: feeds `steps[i].tokens` to sequence `i` after the tokens
    /// already in its cache, appends their keys and values to the cache and returns the logits
    /// of each chunk's last token as `[steps.len(), vocab]` f32 (row `i` for `steps[i]`).
    ///
    /// Chunks may have any non-zero lengths (a prompt being prefilled, a single sampled token,
    /// or a continuation after tool output) and caches any lengths: chunks are right-padded to
    /// the longest chunk, and each sequence attends only to its own tokens ([`step_kv`]).
    /// Sequence `i`'s new token `j` sits at position `cache.len() + j`. The result agrees with
    /// running each sequence alone up to float rounding. The projections cost grows with
    /// `steps.len() * longest chunk`, so a scheduler may prefer to prefill long prompts apart
    /// from decode steps.
    ///
    /// The inputs are checked before any cache is touched.
    pub fn forward_step(&self, steps: &mut [SeqStep<'_>]) -> Result<Tensor, ModelError> {
        self.check_steps(steps)?;
        let past_lens: Vec<usize> = steps.iter().map(|step| step.cache.len).collect();
        let chunk_lens: Vec<usize> = steps.iter().map(|step| step.tokens.len()).collect();
        let past_max = past_lens.iter().copied().max().unwrap_or(0);
        let chunk_max = chunk_lens.iter().copied().max().unwrap_or(0);
        let gathers = StepKv::gathers(&self.device, self.dtype);
        for step in steps.iter_mut() {
            let own = step.cache.len + step.tokens.len();
            step.cache.reserve(if gathers { past_max.max(own) } else { own })?;
        }
        let inputs = self.step_inputs(steps, chunk_max)?;
        let hidden = {
            let caches: Vec<&KvCache> = steps.iter().map(|step| &*step.cache).collect();
            let kv = StepKv::new(&caches, &chunk_lens, &self.device, self.dtype)?;
            let hidden = self.run_layers(&inputs, &kv)?;
            kv.write_back(&caches, &chunk_lens)?;
            hidden
        };
        for (step, len) in steps.iter_mut().zip(&chunk_lens) {
            step.cache.len += len;
        }
        let last: Vec<u32> =
            chunk_lens.iter().enumerate().map(|(row, &len)| (row * chunk_max + len - 1) as u32).collect();
        let last = Tensor::from_vec(last, steps.len(), &self.device)?;
        let hidden = hidden.reshape((steps.len() * chunk_max, self.settings.hidden_size))?.index_select(&last, 0)?;
        Ok(self.logits(&hidden)?.detach())
    }

    fn check_steps(&self, steps: &[SeqStep<'_>]) -> Result<(), ModelError> {
        if steps.is_empty() {
            return Err(input_error("a step needs at least one sequence"));
        }
        for (index, step) in steps.iter().enumerate() {
            if step.tokens.is_empty() {
                return Err(input_error(format!("sequence {index} feeds no token")));
            }
            if !step.cache.fits(&self.settings, self.dtype, &self.device) {
                return Err(input_error(format!(
                    "sequence {index}'s cache was made for another model, dtype or device"
                )));
            }
            self.check_vocabulary(step.tokens)?;
        }
        Ok(())
    }

    fn step_inputs(&self, steps: &[SeqStep<'_>], chunk_max: usize) -> candle_core::Result<PassInputs> {
        let rows = steps.len();
        let mut ids = vec![0u32; rows * chunk_max];
        let mut positions = vec![0f32; rows * chunk_max];
        for (row, step) in steps.iter().enumerate() {
            let start = row * chunk_max;
            ids[start..start + step.tokens.len()].copy_from_slice(step.tokens);
            for (offset, position) in positions[start..start + chunk_max].iter_mut().enumerate() {
                *position = (step.cache.len + offset) as f32;
            }
        }
        Ok(PassInputs {
            ids: Tensor::from_vec(ids, (rows, chunk_max), &self.device)?,
            positions: Tensor::from_vec(positions, (rows, chunk_max), &self.device)?,
        })
    }
}

/// The settings' rotary inverse frequencies as a tensor `[head_dim / 2]`: in f32 (as
/// `transformers` computes the rotary angles, whatever the model's dtype), except in an f64
/// model, which is there to compute the model without f32 rounding (parity checks).
fn rotary_inverse_frequencies(settings: &DenseSettings, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
    let half = settings.inverse_frequencies.len();
    if dtype == DType::F64 {
        return Tensor::from_vec(settings.inverse_frequencies.clone(), half, device);
    }
    let inv_freq: Vec<f32> = settings.inverse_frequencies.iter().map(|&frequency| frequency as f32).collect();
    Tensor::from_vec(inv_freq, half, device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f64 model (the parity checks' reference) rounds nowhere to f32: its rotary angles are
    /// computed in f64 (in f32 an angle of a million radians is off by up to 0.03) and its
    /// logits come out in f64, equal to the f32 model's up to f32 rounding. (Its norms and
    /// attention: whale-kernels' `f64_inputs_are_normalised_and_attended_in_f64`.)
    #[test]
    fn an_f64_model_computes_its_angles_and_logits_in_f64() {
        let config = Qwen3Config::with_size(64, crate::qwen3::config::ModelSize::TINY);
        let settings = config.settings();
        let inverse = rotary_inverse_frequencies(&settings, DType::F64, &Device::Cpu).unwrap();
        let position = 1_000_003f32;
        let positions = Tensor::new(&[[position]], &Device::Cpu).unwrap();
        let rotary = Rotary::new(&inverse, &positions, DType::F64).unwrap();
        let cos: Vec<f64> = rotary.cos.flatten_all().unwrap().to_vec1().unwrap();
        for (cos, frequency) in cos.iter().zip(&settings.inverse_frequencies) {
            let expected = (f64::from(position) * frequency).cos();
            assert!((cos - expected).abs() < 1e-9, "{cos} against {expected}");
        }
        let wide = Qwen3Model::new_random(&config, 3, DType::F64, &Device::Cpu).unwrap();
        let narrow = Qwen3Model::new_random(&config, 3, DType::F32, &Device::Cpu).unwrap();
        let ids = [1u32, 5, 9, 2, 7];
        let logits = |model: &Qwen3Model| model.logits(&model.packed_hidden(&[&ids]).unwrap()).unwrap();
        let (wide, narrow) = (logits(&wide), logits(&narrow));
        assert_eq!((wide.dtype(), narrow.dtype()), (DType::F64, DType::F32));
        let difference: f64 = (wide - narrow.to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(difference < 1e-4, "the same model in both: {difference}");
    }

    /// A `[rows, cols]` matrix of uniform draws in (-1, 1).
    fn random_matrix(rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> Tensor {
        let values: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap()
    }

    /// The split one-row product gives `gemm`'s own result bit for bit, at the sizes the models
    /// use (tall weights, wide inputs, odd counts; both of `gemm`'s kernels) and with the halves
    /// unequal.
    #[test]
    fn a_split_one_row_product_equals_the_whole_to_the_last_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let sizes = [
            (8192, 256),
            (768, 256),
            (514, 768),
            (3001, 517),
            (151_936, 64),
            (256, 256),
            (128, 256),
            (256, 768),
            (64, 64),
            (255, 129),
        ];
        for (out_dim, in_dim) in sizes {
            let x = random_matrix(&mut rng, 1, in_dim);
            let weight = random_matrix(&mut rng, out_dim, in_dim);
            let split: Vec<f32> = halved_product(&x, &weight).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let whole: Vec<f32> = x.matmul(&weight.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(split.len(), out_dim);
            let differing = split.iter().zip(&whole).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differing, 0, "{out_dim} x {in_dim}: {differing} outputs differ");
        }
    }

    /// The largest absolute element of `tensor`.
    fn max_abs(tensor: &Tensor) -> f32 {
        tensor.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    fn bits(tensor: &Tensor) -> Vec<u32> {
        let values: Vec<f32> = tensor.flatten_all().unwrap().to_vec1().unwrap();
        values.into_iter().map(f32::to_bits).collect()
    }

    /// Reading the product from the transposed copy changes no bit, at every row count (one
    /// row, the dot-product kernels' small products, `gemm`'s general kernel, threaded or not)
    /// and at the sizes the models use.
    #[test]
    fn a_product_from_the_transposed_copy_equals_the_plain_one_to_the_last_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let sizes = [
            (768, 256),
            (256, 768),
            (256, 256),
            (128, 256),
            (64, 64),
            (32, 64),
            (192, 64),
            (64, 192),
            (7, 13),
            (1000, 100),
        ];
        for (out_dim, in_dim) in sizes {
            let weight = random_matrix(&mut rng, out_dim, in_dim);
            let transposed = weight.t().unwrap().contiguous().unwrap();
            for rows in [1, 2, 3, 5, 8, 16, 17, 33, 64, 100, 600] {
                let x = random_matrix(&mut rng, rows, in_dim);
                let plain = bits(&product(&x, &weight).unwrap());
                let copied = bits(&transposed_product(&x, &weight, &transposed).unwrap());
                assert_eq!(plain, copied, "{rows} rows, {out_dim} x {in_dim}");
            }
        }
    }

    /// A decoding model's logits are the plain model's to the last bit, in a prefill of
    /// several prompts and in decode steps of many sequences; made again after an in-place
    /// update, it follows the new weights (the copies of the old one do not).
    #[test]
    fn a_decoding_model_gives_the_same_logits_and_is_remade_after_an_update() {
        let config = Qwen3Config::with_size(512, crate::qwen3::config::ModelSize::BASE);
        let model = Qwen3Model::new_random(&config, 3, DType::F32, &Device::Cpu).unwrap();
        let logits = |model: &Qwen3Model| -> Vec<Vec<u32>> {
            let mut caches: Vec<KvCache> = (0..24).map(|_| model.new_cache()).collect();
            let prompts: Vec<Vec<u32>> =
                (0..24u32).map(|i| (0..5 + i % 7).map(|t| (i * 31 + t * 7) % 512).collect()).collect();
            let mut steps: Vec<SeqStep<'_>> =
                prompts.iter().zip(&mut caches).map(|(tokens, cache)| SeqStep { tokens, cache }).collect();
            let mut out = vec![bits(&model.forward_step(&mut steps).unwrap())];
            for round in 0..3u32 {
                let next: Vec<[u32; 1]> = (0..24u32).map(|i| [(i * 13 + round) % 512]).collect();
                let mut steps: Vec<SeqStep<'_>> =
                    next.iter().zip(&mut caches).map(|(tokens, cache)| SeqStep { tokens, cache }).collect();
                out.push(bits(&model.forward_step(&mut steps).unwrap()));
            }
            out
        };
        let mut decoding = model.for_decoding();
        assert!(decoding
            .layers
            .iter_mut()
            .flat_map(DecoderLayer::projections_mut)
            .all(|(_, p)| p.transposed.is_some()));
        assert_eq!(logits(&decoding), logits(&model));
        let mut uncopied = model.for_decoding_within(0);
        assert!(uncopied
            .layers
            .iter_mut()
            .flat_map(DecoderLayer::projections_mut)
            .all(|(_, p)| p.transposed.is_none()));
        assert_eq!(logits(&uncopied), logits(&model));
        let (_, gate) =
            model.named_parameters().into_iter().find(|(name, _)| name.ends_with("1.mlp.gate_proj.weight")).unwrap();
        gate.set(&gate.as_tensor().affine(-2.0, 0.0).unwrap()).unwrap();
        let updated = logits(&model);
        assert_ne!(logits(&decoding), updated, "the old copies hold the old weights");
        assert_eq!(logits(&decoding.for_decoding()), updated);
    }

    /// Logits `[rows, vocab]` of a prefill of `prompts` and two decoding steps after it.
    fn decoded_logits(model: &Qwen3Model, prompts: &[Vec<u32>]) -> Vec<Tensor> {
        let mut caches: Vec<KvCache> = prompts.iter().map(|_| model.new_cache()).collect();
        let mut steps: Vec<SeqStep<'_>> =
            prompts.iter().zip(&mut caches).map(|(tokens, cache)| SeqStep { tokens, cache }).collect();
        let mut out = vec![model.forward_step(&mut steps).unwrap()];
        for round in 0..2u32 {
            let next: Vec<[u32; 1]> = (0..prompts.len() as u32).map(|i| [(i * 13 + round) % 512]).collect();
            let mut steps: Vec<SeqStep<'_>> =
                next.iter().zip(&mut caches).map(|(tokens, cache)| SeqStep { tokens, cache }).collect();
            out.push(model.forward_step(&mut steps).unwrap());
        }
        out
    }

    #[test]
    fn a_quantized_decoding_model_is_near_the_f32_one_and_is_remade_after_an_update() {
        let config = Qwen3Config::with_size(512, crate::qwen3::config::ModelSize::BASE);
        let model = Qwen3Model::new_random(&config, 3, DType::F32, &Device::Cpu).unwrap();
        if !quantized::fast_kernels() {
            let error = model.for_quantized_decoding().err().expect("refused without VNNI").to_string();
            assert!(error.contains("VNNI"), "{error}");
            return;
        }
        let mut quantized = model.for_quantized_decoding().unwrap();
        assert!(quantized.quantized_head.is_some());
        assert!(quantized.projections_mut().iter().all(|p| p.quantized.is_some() && p.transposed.is_none()));
        let prompts: Vec<Vec<u32>> =
            (0..12u32).map(|i| (0..4 + i % 5).map(|t| (i * 31 + t * 7) % 512).collect()).collect();
        let exact = decoded_logits(&model, &prompts);
        let near = decoded_logits(&quantized, &prompts);
        for (exact, near) in exact.iter().zip(&near) {
            let scale = max_abs(exact);
            let gap = max_abs(&(exact - near).unwrap());
            // Each product rounds the weights and also every row of its inputs to 8 bits per
            // block of 32 (as llama.cpp's Q8_0 products do); over four layers and the head the
            // logits move by about 2% of the largest here.
            assert!(gap > 0.0, "the quantized products differ from f32");
            assert!(gap < 0.05 * scale, "Q8_0 logits within 5% of the largest: gap {gap}, largest {scale}");
        }
        // Plain decoding from the quantized clone drops its copies.
        let mut plain = quantized.for_decoding();
        assert!(plain.quantized_head.is_none() && plain.projections_mut().iter().all(|p| p.quantized.is_none()));
        let (_, gate) =
            model.named_parameters().into_iter().find(|(name, _)| name.ends_with("1.mlp.gate_proj.weight")).unwrap();
        gate.set(&gate.as_tensor().affine(-2.0, 0.0).unwrap()).unwrap();
        let remade = decoded_logits(&quantized.for_quantized_decoding().unwrap(), &prompts);
        let stale = decoded_logits(&quantized, &prompts);
        let bits_of = |logits: &[Tensor]| logits.iter().map(bits).collect::<Vec<_>>();
        assert_ne!(bits_of(&stale), bits_of(&remade), "the old copies hold the old weights");
        let updated = decoded_logits(&model, &prompts);
        let gap = max_abs(&(&updated[2] - &remade[2]).unwrap());
        let scale = max_abs(&updated[2]);
        assert!(gap < 0.05 * scale, "the remade copies follow the update: gap {gap}, largest {scale}");
    }

    #[test]
    fn a_quantized_product_of_a_row_is_the_same_alone_or_among_others() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let weight = random_matrix(&mut rng, 896, 256);
        let rows = random_matrix(&mut rng, 24, 256);
        let quantized = QuantizedWeight::of(&weight, 2).unwrap().expect("f32, 256 inputs");
        let together = quantized.product(&rows).unwrap();
        let five = QuantizedWeight::of(&weight, 5).unwrap().expect("f32, 256 inputs");
        assert_eq!(five.parts.len(), 5);
        assert_eq!(bits(&five.product(&rows).unwrap()), bits(&together), "five parts on rayon's threads, as two");
        for row in [0, 7, 23] {
            let alone = quantized.product(&rows.narrow(0, row, 1).unwrap()).unwrap();
            assert_eq!(bits(&alone), bits(&together.narrow(0, row, 1).unwrap()), "row {row}");
        }
        // Within Q8_0's rounding of the f32 product (a test of the halves' offsets too).
        let exact = rows.matmul(&weight.t().unwrap()).unwrap();
        let gap = max_abs(&(&together - &exact).unwrap());
        let scale = max_abs(&exact);
        assert!(gap < 0.01 * scale, "gap {gap}, largest {scale}");
        let narrow = random_matrix(&mut rng, 64, 160);
        assert!(QuantizedWeight::of(&narrow, 2).unwrap().is_none(), "160 inputs: 96 zeros would not pay, no copy");
    }

    /// The 0.5B's 896 inputs, padded with zeros to 1,024 in the copy and before each product:
    /// near the f32 product, and a row's result does not depend on the rows beside it.
    #[test]
    fn a_padded_quantized_product_is_near_the_f32_one_and_batch_invariant() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let weight = random_matrix(&mut rng, 192, 896);
        let rows = random_matrix(&mut rng, 9, 896);
        let quantized = QuantizedWeight::of(&weight, 3).unwrap().expect("896 inputs pad to 1,024");
        let together = quantized.product(&rows).unwrap();
        assert_eq!(together.dims(), [9, 192]);
        let exact = rows.matmul(&weight.t().unwrap()).unwrap();
        let gap = max_abs(&(&together - &exact).unwrap());
        let scale = max_abs(&exact);
        assert!(gap > 0.0 && gap < 0.01 * scale, "gap {gap}, largest {scale}");
        for row in [0, 4, 8] {
            let alone = quantized.product(&rows.narrow(0, row, 1).unwrap()).unwrap();
            assert_eq!(bits(&alone), bits(&together.narrow(0, row, 1).unwrap()), "row {row}");
        }
    }
}
