//! The Qwen3.5 text decoder: embeddings, `num_hidden_layers` pre-norm blocks whose token mixer
//! is either Gated DeltaNet ([`GatedDeltaNet`]) or gated full attention ([`GatedAttention`]),
//! each followed by a SwiGLU MLP, then a final norm and the LM head. Every RMSNorm is
//! zero-centred (`x̂ · (1 + w)`), except the gated norm inside Gated DeltaNet (`x̂ · w · silu(z)`).
//!
//! One pass ([`Qwen35Model::run`]) serves training and decoding: the token rows of several
//! sequences packed end to end, each sequence continuing from its [`Qwen35Cache`] (the
//! convolution window and delta-rule state of every linear layer, the keys and values of every
//! full-attention layer). The projections and the MLP run on all rows at once; the convolution,
//! the delta rule and attention run per sequence. The pass is built from differentiable ops
//! (whale's fused kernels where they exist), so a backward pass through it reaches every
//! parameter.
//!
//! In bf16 it rounds where `transformers` does: the norms, the convolution, the decay `g`, the
//! gate of the gated norm and the delta rule run in f32, the projections and attention in bf16.

use super::config::{LayerKind, Qwen35Config};
use super::delta_rule::{self, DeltaInputs};
use super::lora::Qwen35Lora;
use super::shapes::parameter_shapes;
use crate::parameters;
use crate::qwen3::model::{linear, LoraUpdate, ModelError, Projection};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use whale_kernels as kernels;

fn input_error(message: impl Into<String>) -> ModelError {
    ModelError::Input(message.into())
}

/// `x̂ · (1 + w)` over runs of `w.len()` values (Qwen3.5's zero-centred RMSNorm), in f32 as
/// `transformers` computes it: in bf16, `1 + w` would keep only 8 bits of a small `w`.
fn zero_centred_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let scale = (weight.to_dtype(DType::F32)? + 1.0)?;
    kernels::rms_norm(&x.to_dtype(DType::F32)?, &scale, eps)?.to_dtype(x.dtype())
}

/// `1 / (1 + e^-x)` as `(tanh(x/2) + 1) / 2`, finite in value and gradient for any `x`;
/// computed in f32 and rounded once to `x`'s dtype, as torch's `sigmoid` is.
fn sigmoid(x: &Tensor) -> candle_core::Result<Tensor> {
    (((x.to_dtype(DType::F32)? * 0.5)?.tanh()? + 1.0)? * 0.5)?.to_dtype(x.dtype())
}

/// `ln(1 + e^x)` as `max(x, 0) + ln(1 + e^-|x|)`, which never overflows.
fn softplus(x: &Tensor) -> candle_core::Result<Tensor> {
    x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?
}

/// `x / sqrt(Σx² + 1e-6)` over the last dimension (the FLA library's epsilon).
fn l2_normalise(x: &Tensor) -> candle_core::Result<Tensor> {
    x.broadcast_mul(&(x.sqr()?.sum_keepdim(D::Minus1)? + 1e-6)?.sqrt()?.recip()?)
}

/// What one sequence carries from one pass to the next, per layer. A pass replaces these
/// tensors rather than writing into them, so a clone is an independent copy.
#[derive(Clone)]
enum LayerCache {
    /// The last `kernel - 1` inputs of the convolution `[kernel - 1, conv_dim]` and the
    /// delta-rule state `[value_heads, key_head_dim, value_head_dim]`.
    Linear { window: Tensor, state: Tensor },
    /// Keys and values so far, `[len, kv_heads · head_dim]` (after the norm and rotary), or
    /// none before the first token.
    Full { keys: Option<Tensor>, values: Option<Tensor> },
}

/// The recurrent state and key/value cache of one sequence of a [`Qwen35Model`]; a clone is
/// an independent copy (a pass replaces the tensors it updates).
#[derive(Clone)]
pub struct Qwen35Cache {
    layers: Vec<LayerCache>,
    len: usize,
}

impl Qwen35Cache {
    /// How many tokens of the sequence have been fed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One sequence's share of a [`Qwen35Model::forward_step`].
pub struct Qwen35Step<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut Qwen35Cache,
}

/// Gated DeltaNet: `[q | k | v]` through a causal depthwise convolution and SiLU, `q` and `k`
/// L2-normalised and shared by groups of value heads, the gated delta rule, then a gated RMSNorm
/// (`silu(z)`) and the output projection.
#[derive(Clone)]
struct GatedDeltaNet {
    in_proj_qkv: Projection,
    in_proj_z: Projection,
    in_proj_b: Projection,
    in_proj_a: Projection,
    /// `[kernel, conv_dim]`: row `j` weighs the input `kernel - 1 - j` tokens back.
    conv: Tensor,
    dt_bias: Tensor,
    a_log: Tensor,
    norm: Tensor,
    out_proj: Projection,
    key_heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
    eps: f64,
}

impl GatedDeltaNet {
    fn forward(&self, x: &Tensor, lengths: &[usize], caches: &mut [&mut LayerCache]) -> candle_core::Result<Tensor> {
        let qkv = self.in_proj_qkv.forward(x)?;
        let z = self.in_proj_z.forward(x)?;
        let beta = sigmoid(&self.in_proj_b.forward(x)?)?;
        let f32 = |t: &Tensor| t.to_dtype(DType::F32);
        let rate = softplus(&f32(&self.in_proj_a.forward(x)?)?.broadcast_add(&f32(&self.dt_bias)?)?)?;
        let g = rate.broadcast_mul(&f32(&self.a_log)?.exp()?.neg()?)?;
        let out = self.mix(&qkv, &g, &beta, lengths, caches)?.to_dtype(x.dtype())?;
        let normed = kernels::rms_norm(&out, &self.norm, self.eps)?.to_dtype(DType::F32)?;
        let gated = (normed * z.to_dtype(DType::F32)?.silu()?)?.to_dtype(x.dtype())?;
        self.out_proj.forward(&gated)
    }

    /// Each sequence's rows of `[q | k | v]` through its convolution window and its delta-rule
    /// state (both advanced in its cache): the rule's outputs `[rows, value_heads · dv]` in f32.
    fn mix(
        &self,
        qkv: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        lengths: &[usize],
        caches: &mut [&mut LayerCache],
    ) -> candle_core::Result<Tensor> {
        // Every sequence's rule inputs, padded to the longest and stacked along the heads: the
        // padding (k = 0, β = 0, g = 0) leaves each state as its real tokens left it.
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let (mut inputs, mut states): ([Vec<Tensor>; 5], Vec<Tensor>) = Default::default();
        let mut start = 0;
        for (&len, cache) in lengths.iter().zip(caches.iter_mut()) {
            let LayerCache::Linear { window, state } = &mut **cache else {
                candle_core::bail!("a linear-attention layer was given another layer's cache");
            };
            let rows = |t: &Tensor| t.narrow(0, start, len);
            let (mixed, next_window) = self.convolve(&rows(qkv)?, window)?;
            *window = next_window.detach();
            let (q, k, v) = self.heads(&mixed.to_dtype(DType::F32)?)?;
            let per_head = |t: &Tensor| rows(t)?.t()?.to_dtype(DType::F32)?.contiguous();
            for (stack, t) in inputs.iter_mut().zip([q, k, v, per_head(g)?, per_head(beta)?]) {
                stack.push(t.pad_with_zeros(1, 0, longest - len)?);
            }
            states.push(state.clone());
            start += len;
        }
        let [q, k, v, g, beta] = inputs.map(|stack| Tensor::cat(&stack, 0));
        let stacked = DeltaInputs { q: &q?, k: &k?, v: &v?, g: &g?, beta: &beta? };
        let rule = if longest == 1 { delta_rule::recurrent } else { delta_rule::chunked };
        let (out, next_states) = rule(&stacked, &Tensor::cat(&states, 0)?)?;
        let heads = self.value_heads;
        let mut outputs = Vec::with_capacity(lengths.len());
        for (index, (&len, cache)) in lengths.iter().zip(caches.iter_mut()).enumerate() {
            if let LayerCache::Linear { state, .. } = &mut **cache {
                *state = next_states.narrow(0, index * heads, heads)?.detach();
            }
            let own = out.narrow(0, index * heads, heads)?.narrow(1, 0, len)?;
            outputs.push(own.transpose(0, 1)?.reshape((len, heads * self.value_dim))?);
        }
        Tensor::cat(&outputs, 0)
    }

    /// The causal depthwise convolution of `x` `[n, conv_dim]` after `window`, then SiLU,
    /// summed in f32 and returned in `x`'s dtype; returns the output and the new window.
    fn convolve(&self, x: &Tensor, window: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let (kernel, n) = (self.conv.dim(0)?, x.dim(0)?);
        let full = Tensor::cat(&[window, x], 0)?;
        let (inputs, weights) = (full.to_dtype(DType::F32)?, self.conv.to_dtype(DType::F32)?);
        let mut out = inputs.narrow(0, 0, n)?.broadcast_mul(&weights.narrow(0, 0, 1)?)?;
        for j in 1..kernel {
            out = (out + inputs.narrow(0, j, n)?.broadcast_mul(&weights.narrow(0, j, 1)?)?)?;
        }
        Ok((out.silu()?.to_dtype(x.dtype())?, full.narrow(0, n, kernel - 1)?))
    }

    /// Splits convolved rows `[n, conv_dim]` into the delta rule's `q`, `k` `[Hv, n, dk]`
    /// (normalised, `q` scaled) and `v` `[Hv, n, dv]`.
    fn heads(&self, mixed: &Tensor) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let n = mixed.dim(0)?;
        let key_width = self.key_heads * self.key_dim;
        let shared = |offset: usize| -> candle_core::Result<Tensor> {
            let groups = self.value_heads / self.key_heads;
            let x = mixed.narrow(1, offset, key_width)?.reshape((n, self.key_heads, 1, self.key_dim))?;
            let x = x.broadcast_as((n, self.key_heads, groups, self.key_dim))?.reshape((
                n,
                self.value_heads,
                self.key_dim,
            ))?;
            l2_normalise(&x)?.transpose(0, 1)?.contiguous()
        };
        let q = (shared(0)? / (self.key_dim as f64).sqrt())?;
        let k = shared(key_width)?;
        let v = mixed
            .narrow(1, 2 * key_width, self.value_heads * self.value_dim)?
            .reshape((n, self.value_heads, self.value_dim))?
            .transpose(0, 1)?
            .contiguous()?;
        Ok((q, k, v))
    }
}

/// Grouped-query attention whose query projection also yields a per-head gate
/// (`out · sigmoid(gate)` before `o_proj`), with zero-centred q/k norms and rotary embeddings
/// on the first `rotary_dim` dimensions of each head.
#[derive(Clone)]
struct GatedAttention {
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: Projection,
    q_norm: Tensor,
    k_norm: Tensor,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    eps: f64,
}

impl GatedAttention {
    fn forward(
        &self,
        x: &Tensor,
        rotary: &Rotary,
        lengths: &[usize],
        caches: &mut [&mut LayerCache],
    ) -> candle_core::Result<Tensor> {
        let rows = x.dim(0)?;
        let (d, width) = (self.head_dim, self.heads * self.head_dim);
        let query_gate = self.q_proj.forward(x)?.reshape((rows, self.heads, 2 * d))?;
        let q = query_gate.narrow(2, 0, d)?.contiguous()?.reshape((rows, width))?;
        let gate = query_gate.narrow(2, d, d)?.contiguous()?.reshape((rows, width))?;
        let q = self.rotate(&zero_centred_norm(&q, &self.q_norm, self.eps)?, rotary, self.heads)?;
        let k =
            self.rotate(&zero_centred_norm(&self.k_proj.forward(x)?, &self.k_norm, self.eps)?, rotary, self.kv_heads)?;
        let v = self.v_proj.forward(x)?;
        let scale = 1.0 / (d as f64).sqrt();
        let fresh = caches.iter().all(|cache| matches!(&**cache, LayerCache::Full { keys: None, .. }));
        let attended = if fresh {
            self.attend_fresh(&q, &k, &v, lengths, caches, scale)?
        } else {
            self.attend_after_cache(&q, &k, &v, lengths, caches, scale)?
        };
        self.o_proj.forward(&(attended * sigmoid(&gate)?)?)
    }

    /// Causal attention within each sequence, none cached yet (the training pass, a first
    /// prefill); each sequence's keys and values become its cache.
    fn attend_fresh(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        lengths: &[usize],
        caches: &mut [&mut LayerCache],
        scale: f64,
    ) -> candle_core::Result<Tensor> {
        let attended = kernels::attention(q, k, v, lengths, self.head_dim, scale)?;
        let mut start = 0;
        for (&len, cache) in lengths.iter().zip(caches.iter_mut()) {
            let LayerCache::Full { keys, values } = &mut **cache else {
                candle_core::bail!("a full-attention layer was given another layer's cache");
            };
            *keys = Some(k.narrow(0, start, len)?.detach());
            *values = Some(v.narrow(0, start, len)?.detach());
            start += len;
        }
        Ok(attended)
    }

    /// Attention of each sequence's new rows to its cached keys and its new ones (causal); the
    /// keys and values attended to become its cache.
    fn attend_after_cache(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        lengths: &[usize],
        caches: &mut [&mut LayerCache],
        scale: f64,
    ) -> candle_core::Result<Tensor> {
        let d = self.head_dim;
        let heads_of = |x: &Tensor, heads: usize| -> candle_core::Result<Tensor> {
            let len = x.dim(0)?;
            x.reshape((1, len, heads, d))?.transpose(1, 2)?.contiguous()
        };
        let mut outputs = Vec::with_capacity(lengths.len());
        let mut start = 0;
        for (&len, cache) in lengths.iter().zip(caches.iter_mut()) {
            let LayerCache::Full { keys, values } = &mut **cache else {
                candle_core::bail!("a full-attention layer was given another layer's cache");
            };
            let with_past = |past: &Option<Tensor>, new: &Tensor| -> candle_core::Result<Tensor> {
                let new = new.narrow(0, start, len)?;
                match past {
                    Some(past) => Tensor::cat(&[past, &new], 0),
                    None => Ok(new),
                }
            };
            let (all_k, all_v) = (with_past(keys, k)?, with_past(values, v)?);
            let past = all_k.dim(0)? - len;
            let mask = kernels::attention_bias(
                1,
                len,
                past + len,
                |query| past + query,
                |_, query, key| key <= past + query,
                q.device(),
            )?;
            let out = kernels::composed_attention(
                &heads_of(&q.narrow(0, start, len)?, self.heads)?,
                &heads_of(&all_k, self.kv_heads)?,
                &heads_of(&all_v, self.kv_heads)?,
                &mask,
                scale,
                kernels::softmax_last_dim,
            )?;
            outputs.push(out.transpose(1, 2)?.reshape((len, self.heads * d))?);
            *keys = Some(all_k.detach());
            *values = Some(all_v.detach());
            start += len;
        }
        Tensor::cat(&outputs, 0)
    }

    /// Rotates the first `rotary_dim` dimensions of each head of `x` `[n, heads · d]`.
    fn rotate(&self, x: &Tensor, rotary: &Rotary, heads: usize) -> candle_core::Result<Tensor> {
        let (rows, d, r) = (x.dim(0)?, self.head_dim, self.rotary_dim);
        let per_head = x.reshape((rows, heads, d))?;
        let rotated = kernels::rope(
            &per_head.narrow(2, 0, r)?.contiguous()?.reshape((rows, heads * r))?,
            &rotary.cos,
            &rotary.sin,
        )?
        .reshape((rows, heads, r))?;
        if r == d {
            return rotated.reshape((rows, heads * d));
        }
        Tensor::cat(&[&rotated, &per_head.narrow(2, r, d - r)?], 2)?.reshape((rows, heads * d))
    }
}

/// The angles of one pass's rows, `[n, rotary_dim / 2]`.
struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

#[derive(Clone)]
enum Mixer {
    Linear(GatedDeltaNet),
    Full(GatedAttention),
}

#[derive(Clone)]
struct DecoderLayer {
    input_layernorm: Tensor,
    mixer: Mixer,
    post_attention_layernorm: Tensor,
    gate_proj: Projection,
    up_proj: Projection,
    down_proj: Projection,
}

/// A Qwen3.5 causal language model whose parameters live in a [`VarMap`] under their
/// checkpoint names. Cloning shares the parameters.
#[derive(Clone)]
pub struct Qwen35Model {
    config: Qwen35Config,
    varmap: VarMap,
    adapter: Option<Qwen35Lora>,
    device: Device,
    dtype: DType,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: Tensor,
    lm_head: Tensor,
    /// `[rotary_dim / 2]` f32.
    inv_freq: Tensor,
}

impl Qwen35Model {
    /// A model with `transformers`' initialisation (normal with standard deviation 0.02 for
    /// matrices and the convolution, zeros for the zero-centred norms, ones for the gated norm
    /// and `dt_bias`, `A_log = ln U(1, 16)`), reproducible from `seed`.
    pub fn new_random(config: &Qwen35Config, seed: u64, dtype: DType, device: &Device) -> Result<Self, ModelError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = HashMap::new();
        for (name, shape) in parameter_shapes(config) {
            let count: usize = shape.iter().product();
            let values: Vec<f32> = if name.ends_with("A_log") {
                (0..count).map(|_| rng.gen_range(1.0f32..16.0).ln()).collect()
            } else if name.ends_with("dt_bias") || name.ends_with("linear_attn.norm.weight") {
                vec![1.0; count]
            } else if shape.len() == 1 {
                vec![0.0; count]
            } else {
                (0..count).map(|_| (parameters::standard_normal(&mut rng) * 0.02) as f32).collect()
            };
            tensors.insert(name, Tensor::from_vec(values, shape, &Device::Cpu)?);
        }
        Self::from_tensors(config, tensors, dtype, device)
    }

    /// A model from named tensors ([`parameter_shapes`]), converted to `dtype` on `device`;
    /// tensors the text model does not use (a vision tower, MTP heads) are ignored. Not in f64:
    /// the delta rule, norms and rotary angles compute in f32, so an f64 model would round
    /// there silently.
    pub fn from_tensors(
        config: &Qwen35Config,
        mut tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        if dtype == DType::F64 {
            return Err(input_error("Qwen3.5 computes in f32 at most; float64 is not supported"));
        }
        let (varmap, params) = parameters::checked_variables(parameter_shapes(config), &mut tensors, dtype, device)?;
        Self::assemble(config, varmap, params, dtype, device, None)
    }

    /// A model reading `params` (its variables' tensors, or constants sharing their storage)
    /// and, when given, the adapter's matrices.
    fn assemble(
        config: &Qwen35Config,
        varmap: VarMap,
        params: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
        adapter: Option<&Qwen35Lora>,
    ) -> Result<Self, ModelError> {
        let take =
            |name: &str| params.get(name).cloned().ok_or_else(|| ModelError::MissingTensor { name: name.to_string() });
        let prefix = config.weight_prefix();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for (layer, kind) in config.layer_types.iter().enumerate() {
            let weight = |name: &str| take(&format!("{prefix}layers.{layer}.{name}"));
            let projection = |name: &str| -> Result<Projection, ModelError> {
                let path = format!("{prefix}layers.{layer}.{name}");
                let lora = adapter.and_then(|adapter| {
                    let (a, b) = adapter.matrices(&path)?;
                    Some(LoraUpdate { a, b, scale: adapter.scale(), dropout: None })
                });
                Ok(Projection::new(take(&format!("{path}.weight"))?, lora))
            };
            let mixer = match kind {
                LayerKind::LinearAttention => Mixer::Linear(GatedDeltaNet {
                    in_proj_qkv: projection("linear_attn.in_proj_qkv")?,
                    in_proj_z: projection("linear_attn.in_proj_z")?,
                    in_proj_b: projection("linear_attn.in_proj_b")?,
                    in_proj_a: projection("linear_attn.in_proj_a")?,
                    conv: weight("linear_attn.conv1d.weight")?.squeeze(1)?.t()?,
                    dt_bias: weight("linear_attn.dt_bias")?,
                    a_log: weight("linear_attn.A_log")?,
                    norm: weight("linear_attn.norm.weight")?,
                    out_proj: projection("linear_attn.out_proj")?,
                    key_heads: config.linear_num_key_heads,
                    value_heads: config.linear_num_value_heads,
                    key_dim: config.linear_key_head_dim,
                    value_dim: config.linear_value_head_dim,
                    eps: config.rms_norm_eps,
                }),
                LayerKind::FullAttention => Mixer::Full(GatedAttention {
                    q_proj: projection("self_attn.q_proj")?,
                    k_proj: projection("self_attn.k_proj")?,
                    v_proj: projection("self_attn.v_proj")?,
                    o_proj: projection("self_attn.o_proj")?,
                    q_norm: weight("self_attn.q_norm.weight")?,
                    k_norm: weight("self_attn.k_norm.weight")?,
                    heads: config.num_attention_heads,
                    kv_heads: config.num_key_value_heads,
                    head_dim: config.head_dim,
                    rotary_dim: config.rotary_dim(),
                    eps: config.rms_norm_eps,
                }),
            };
            layers.push(DecoderLayer {
                input_layernorm: weight("input_layernorm.weight")?,
                mixer,
                post_attention_layernorm: weight("post_attention_layernorm.weight")?,
                gate_proj: projection("mlp.gate_proj")?,
                up_proj: projection("mlp.up_proj")?,
                down_proj: projection("mlp.down_proj")?,
            });
        }
        let embed_tokens = take(&format!("{prefix}embed_tokens.weight"))?;
        let lm_head = if config.tie_word_embeddings { embed_tokens.clone() } else { take("lm_head.weight")? };
        let half = config.rotary_dim() / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0 / config.rope_theta.powf((2 * i) as f64 / config.rotary_dim() as f64)) as f32)
            .collect();
        Ok(Self {
            norm: take(&format!("{prefix}norm.weight"))?,
            config: config.clone(),
            varmap,
            adapter: adapter.cloned(),
            device: device.clone(),
            dtype,
            embed_tokens,
            layers,
            lm_head,
            inv_freq: Tensor::from_vec(inv_freq, half, device)?,
        })
    }

    pub fn config(&self) -> &Qwen35Config {
        &self.config
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The parameter store, keyed by checkpoint names.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// The adapter this model applies, if any.
    pub fn adapter(&self) -> Option<&Qwen35Lora> {
        self.adapter.as_ref()
    }

    /// This model with `adapter` applied (replacing any it carries): it shares this model's
    /// parameters, as constants of its passes (a backward pass reaches the adapter only), and
    /// the adapter's variables. The adapter must have been made for this configuration.
    pub fn with_adapter(&self, adapter: &Qwen35Lora) -> Result<Self, ModelError> {
        if adapter.named_parameters().iter().any(|(_, var)| var.dtype() != self.dtype) {
            return Err(input_error(format!("the adapter is not {:?} like the model", self.dtype)));
        }
        let params = self.named_parameters().into_iter().map(|(name, var)| (name, var.as_tensor().detach())).collect();
        Self::assemble(&self.config, self.varmap.clone(), params, self.dtype, &self.device, Some(adapter))
    }

    /// A new model with its own parameters, each adapted weight replaced by `W + scale B A`
    /// (in f32), and no adapter: what a full checkpoint of the adapted model holds.
    pub fn merged(&self) -> Result<Self, ModelError> {
        let mut tensors: HashMap<String, Tensor> =
            self.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
        if let Some(adapter) = &self.adapter {
            for (name, tensor) in tensors.iter_mut() {
                let Some((a, b)) = name.strip_suffix(".weight").and_then(|path| adapter.matrices(path)) else {
                    continue;
                };
                let update = (b.to_dtype(DType::F32)?.matmul(&a.to_dtype(DType::F32)?)? * adapter.scale())?;
                *tensor = (tensor.to_dtype(DType::F32)? + update)?.to_dtype(self.dtype)?;
            }
        }
        Self::from_tensors(&self.config, tensors, self.dtype, &self.device)
    }

    /// Every parameter with its checkpoint name, sorted by name.
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        parameters::sorted(&self.varmap)
    }

    /// An empty cache for one sequence.
    pub fn new_cache(&self) -> Result<Qwen35Cache, ModelError> {
        let config = &self.config;
        let layers = config
            .layer_types
            .iter()
            .map(|kind| match kind {
                LayerKind::LinearAttention => Ok(LayerCache::Linear {
                    window: Tensor::zeros(
                        (config.linear_conv_kernel_dim - 1, config.conv_dim()),
                        self.dtype,
                        &self.device,
                    )?,
                    state: Tensor::zeros(
                        (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim),
                        DType::F32,
                        &self.device,
                    )?,
                }),
                LayerKind::FullAttention => Ok(LayerCache::Full { keys: None, values: None }),
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Qwen35Cache { layers, len: 0 })
    }

    /// The final (normalised) hidden states `[Σ len, hidden]` of whole sequences packed end to
    /// end: the training pass, differentiable in every parameter.
    pub fn packed_hidden(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError> {
        let mut caches = sequences.iter().map(|_| self.new_cache()).collect::<Result<Vec<_>, _>>()?;
        let mut refs: Vec<&mut Qwen35Cache> = caches.iter_mut().collect();
        self.run(sequences, &mut refs)
    }

    /// Logits (f32) of hidden states with any leading dimensions.
    pub fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        linear(hidden, &self.lm_head)?.to_dtype(DType::F32)
    }

    /// One batched incremental step: feeds each step's tokens after its cache and returns the
    /// logits of each chunk's last token, `[steps.len(), vocab]` f32. Sequences of any lengths
    /// mix, and may join or leave between calls.
    pub fn forward_step(&self, steps: &mut [Qwen35Step<'_>]) -> Result<Tensor, ModelError> {
        let chunks: Vec<&[u32]> = steps.iter().map(|step| step.tokens).collect();
        let mut caches: Vec<&mut Qwen35Cache> = steps.iter_mut().map(|step| &mut *step.cache).collect();
        let hidden = self.run(&chunks, &mut caches)?;
        let mut last = Vec::with_capacity(chunks.len());
        let mut end = 0;
        for chunk in &chunks {
            end += chunk.len();
            last.push((end - 1) as u32);
        }
        let last = Tensor::from_vec(last, chunks.len(), &self.device)?;
        Ok(self.logits(&hidden.index_select(&last, 0)?)?.detach())
    }

    /// The decoder over `chunks` packed end to end, chunk `i` continuing `caches[i]`, which are
    /// extended; returns the normalised hidden states of every row.
    pub fn run(&self, chunks: &[&[u32]], caches: &mut [&mut Qwen35Cache]) -> Result<Tensor, ModelError> {
        if chunks.is_empty() || chunks.len() != caches.len() || chunks.iter().any(|chunk| chunk.is_empty()) {
            return Err(input_error("a pass needs one non-empty chunk per cache"));
        }
        let ids: Vec<u32> = chunks.concat();
        if let Some(id) = ids.iter().find(|&&id| id as usize >= self.config.vocab_size) {
            return Err(input_error(format!("token id {id} is outside the vocabulary of {}", self.config.vocab_size)));
        }
        if caches.iter().any(|cache| cache.layers.len() != self.layers.len()) {
            return Err(input_error("a cache was made for another model"));
        }
        let lengths: Vec<usize> = chunks.iter().map(|chunk| chunk.len()).collect();
        let rotary = self.rotary(&lengths, caches)?;
        let mut x =
            self.embed_tokens.index_select(&Tensor::from_vec(ids, lengths.iter().sum::<usize>(), &self.device)?, 0)?;
        let eps = self.config.rms_norm_eps;
        for (index, layer) in self.layers.iter().enumerate() {
            let mut layer_caches: Vec<&mut LayerCache> =
                caches.iter_mut().map(|cache| &mut cache.layers[index]).collect();
            let normed = zero_centred_norm(&x, &layer.input_layernorm, eps)?;
            let mixed = match &layer.mixer {
                Mixer::Linear(mixer) => mixer.forward(&normed, &lengths, &mut layer_caches)?,
                Mixer::Full(mixer) => mixer.forward(&normed, &rotary, &lengths, &mut layer_caches)?,
            };
            x = (x + mixed)?;
            let normed = zero_centred_norm(&x, &layer.post_attention_layernorm, eps)?;
            let gated = kernels::swiglu(&layer.gate_proj.forward(&normed)?, &layer.up_proj.forward(&normed)?)?;
            x = (&x + layer.down_proj.forward(&gated)?)?;
        }
        for (cache, len) in caches.iter_mut().zip(&lengths) {
            cache.len += len;
        }
        Ok(zero_centred_norm(&x, &self.norm, eps)?)
    }

    /// The rotary angles of every row: sequence `i`'s token `j` sits at `caches[i].len() + j`.
    fn rotary(&self, lengths: &[usize], caches: &[&mut Qwen35Cache]) -> candle_core::Result<Rotary> {
        let positions: Vec<f32> = lengths
            .iter()
            .zip(caches)
            .flat_map(|(&len, cache)| (cache.len..cache.len + len).map(|p| p as f32))
            .collect();
        let rows = positions.len();
        let angles =
            Tensor::from_vec(positions, (rows, 1), &self.device)?.broadcast_mul(&self.inv_freq.unsqueeze(0)?)?;
        Ok(Rotary { cos: angles.cos()?.to_dtype(self.dtype)?, sin: angles.sin()?.to_dtype(self.dtype)? })
    }
}
