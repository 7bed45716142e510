//! whale's numeric kernels: the ops the models' passes are built from where candle's own will
//! not do, and the process settings they run best under.
//!
//! Why a crate of their own: the kernels know tensors and nothing of a model, a checkpoint or a
//! request, and every layer above (the architectures of whale-lm, the engine's sampler, the
//! trainer's loss) calls them. Data flow: a model's training pass calls [`rms_norm`], [`rope`],
//! [`swiglu`], [`attention()`] and [`gather_rows`] on token rows, the trainer scores the logits
//! with [`cross_entropy()`] and autograd runs each op's backward pass; a product with a
//! frozen weight (a LoRA pass's base, a tied head) is [`frozen_weight_product`], whose backward
//! pass skips the weight's gradient; a decoding step reads the
//! sequences' caches with [`cached_attention()`]; the sampler scans logits with [`vectorised`];
//! the `whale` binary and the examples call [`runtime::configure_cpu`] first thing.
//!
//! Fused CPU kernels for training, each with its backward pass: candle's fused softmax,
//! RMSNorm and rotary kernels have no backward pass, and composing them
//! from basic ops (so that autograd sees them) makes four or five full-size temporaries per
//! call in the forward pass and more in the backward pass, each allocated, zeroed and
//! accumulated by autograd. On the CPU that memory traffic, not the matrix products, dominated
//! a training step of the small models. These custom ops run one loop forward and compute the
//! gradient in one or a few passes (the formulas below); attention (`attention.rs`) and the
//! cross-entropy of the logits (`cross_entropy.rs`) have their own modules. They take f32
//! tensors on the CPU; every other case uses the composition, which computes the same function.
//! One kernel is for decoding and has no backward pass: [`cached_attention()`], attention read
//! straight from the sequences' key-value caches.

mod attention;
mod cached_attention;
mod cross_entropy;
mod frozen_product;
mod host;
pub mod runtime;
pub mod vectorised;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, Layout, Shape, Tensor, D};
use rayon::prelude::*;

pub use cached_attention::{cached_attention, AttentionShape, CachedSequence};
pub use frozen_product::frozen_weight_product;
use host::{f32_slice, map_rows, on_host, PARALLEL_ELEMENTS};

/// The dtype norms and softmaxes compute in for inputs of `dtype`: f32 for f32, bf16 and f16
/// (as `transformers` computes them), f64 for f64, so that an f64 model (the parity checks')
/// rounds nowhere to f32.
pub fn computing_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// True when the fused kernels can run `x` (contiguity is arranged by the callers).
fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// `softmax(x)` over the last dimension, differentiable.
pub fn softmax_last_dim(x: &Tensor) -> candle_core::Result<Tensor> {
    if fused(x) {
        return x.contiguous()?.apply_op1(Softmax);
    }
    // The max is a constant shift, so detaching it leaves the gradient exact.
    let max = x.max_keepdim(D::Minus1)?.detach();
    let exp = x.broadcast_sub(&max)?.exp()?;
    exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)
}

/// `x / sqrt(mean(x²) + eps) * weight` over each run of `weight.len()` values of the last
/// dimension (the whole of it, or each head of `[.., heads · d]`), computed in f32 as in
/// `transformers` (in f64 for f64 inputs), differentiable in `x` and `weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let dim = weight.dim(0)?;
    if dim == 0 || x.dim(D::Minus1)? % dim != 0 {
        candle_core::bail!("whale-rms-norm: weight of {dim} for input {:?}", x.dims());
    }
    if fused(x) && fused(weight) {
        return x.contiguous()?.apply_op2(&weight.contiguous()?, RmsNorm { eps });
    }
    let wide = x.to_dtype(computing_dtype(x.dtype()))?.reshape(((), dim))?;
    let inverse_rms = (wide.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    wide.broadcast_mul(&inverse_rms)?.to_dtype(x.dtype())?.broadcast_mul(weight)?.reshape(x.shape())
}

/// Rotary embedding of token rows `x` `[N, heads · d]` with `cos`, `sin` `[N, d / 2]` (the
/// angles of each row's position) in the `rotate_half` convention of `transformers`: the first
/// half of each head pairs with the second. Differentiable in `x` (the angles are constants).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    if fused(x) && fused(cos) && fused(sin) {
        return x.contiguous()?.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope);
    }
    let (rows, half) = cos.dims2()?;
    let heads = x.dim(D::Minus1)? / (2 * half);
    let heads_x = x.reshape((rows, heads, 2 * half))?;
    let (cos, sin) =
        (Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?, Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?);
    let rotated = Tensor::cat(
        &[&heads_x.narrow(D::Minus1, half, half)?.neg()?, &heads_x.narrow(D::Minus1, 0, half)?],
        D::Minus1,
    )?;
    (heads_x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?.reshape(x.shape())
}

/// Causal grouped-query self-attention `softmax(q kᵀ · scale + causal mask) v` within each of
/// the sequences packed end to end in the token rows, differentiable in `q`, `k` and `v`: `q`
/// `[Σ len, H·d]`, `k` and `v` `[Σ len, KV·d]` with `H` a multiple of `KV` (query head `h` reads
/// key/value head `h / (H / KV)`), `lengths` the sequences' lengths. The output is `[Σ len, H·d]`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lengths: &[usize],
    head_dim: usize,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (heads, kv_heads) = attention::check_shapes(q.dims(), k.dims(), v.dims(), lengths, head_dim)?;
    if fused(q) && fused(k) && fused(v) {
        return q.contiguous()?.apply_op3(
            &k.contiguous()?,
            &v.contiguous()?,
            attention::Attention::new(lengths, heads, kv_heads, head_dim, scale),
        );
    }
    padded_attention(q, k, v, lengths, head_dim, scale)
}

/// [`attention`] composed: the sequences padded to the longest as a batch, [`composed_attention`]
/// under a causal mask that hides the padding ([`attention_bias`]), and the real rows gathered
/// back.
fn padded_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lengths: &[usize],
    head_dim: usize,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (batch, steps) = (lengths.len(), lengths.iter().copied().max().unwrap_or(0));
    let (mut padded, mut packed, mut first) = (Vec::new(), Vec::new(), 0);
    for (row, &len) in lengths.iter().enumerate() {
        padded.extend((0..steps).map(|t| (t < len).then_some((first + t) as u32)));
        packed.extend((0..len).map(|t| Some((row * steps + t) as u32)));
        first += len;
    }
    let heads_of = |x: &Tensor| -> candle_core::Result<Tensor> {
        let rows = gather_rows(x, &padded)?;
        rows.reshape((batch, steps, x.dim(1)? / head_dim, head_dim))?.transpose(1, 2)?.contiguous()
    };
    let mask = attention_bias(batch, steps, steps, |t| t, |row, t, s| s < t && s < lengths[row], q.device())?;
    let out = composed_attention(&heads_of(q)?, &heads_of(k)?, &heads_of(v)?, &mask, scale, softmax_last_dim)?;
    gather_rows(&out.transpose(1, 2)?.reshape((batch * steps, q.dim(1)?))?, &packed)
}

/// An additive attention mask `[rows, 1, 1, steps, keys]`: 0 where `allowed(row, query, key)`
/// and at each query's own key, -inf elsewhere. A query may always see its own key, so that no
/// softmax row is empty (padding rows then hold finite values that nobody reads); real tokens
/// never see padding because `allowed` excludes it.
pub fn attention_bias(
    rows: usize,
    steps: usize,
    keys: usize,
    own_key: impl Fn(usize) -> usize,
    allowed: impl Fn(usize, usize, usize) -> bool,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let mut bias = Vec::with_capacity(rows * steps * keys);
    for row in 0..rows {
        for query in 0..steps {
            bias.extend((0..keys).map(|key| {
                if key == own_key(query) || allowed(row, query, key) {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            }));
        }
    }
    Tensor::from_vec(bias, (rows, 1, 1, steps, keys), device)
}

/// Row `rows[i]` of `x` `[N, width]` for each `i`, or a row of zeros where it is `None`;
/// differentiable in `x`.
pub fn gather_rows(x: &Tensor, rows: &[Option<u32>]) -> candle_core::Result<Tensor> {
    let zero_row = x.dim(0)? as u32;
    let indices: Vec<u32> = rows.iter().map(|row| row.unwrap_or(zero_row)).collect();
    let with_zero_row = Tensor::cat(&[x, &Tensor::zeros((1, x.dim(1)?), x.dtype(), x.device())?], 0)?;
    with_zero_row.index_select(&Tensor::from_vec(indices, rows.len(), x.device())?, 0)
}

/// Grouped-query attention from tensor ops, with the given softmax over the last dimension:
/// `q` `[B, H, T, d]`, `k` and `v` `[B, KV, S, d]`, `mask` additive `[B, 1, 1, T, S]`; the output
/// is `[B, H, T, d]`. The queries of a group are stacked instead of the keys being copied
/// (`repeat_kv`); the scores are normalised in f32 (f64 for f64 inputs).
pub fn composed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
    softmax: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    let (batch, heads, steps, head_dim) = q.dims4()?;
    let (_, kv_heads, keys, _) = k.dims4()?;
    let groups = heads / kv_heads;
    let q = q.reshape((batch, kv_heads, groups * steps, head_dim))?;
    let wide = computing_dtype(q.dtype());
    let scores = (q.matmul(&k.t()?)? * scale)?
        .reshape((batch, kv_heads, groups, steps, keys))?
        .to_dtype(wide)?
        .broadcast_add(&mask.to_dtype(wide)?.reshape((batch, 1, 1, steps, keys))?)?;
    let probs = softmax(&scores)?.to_dtype(v.dtype())?.reshape((batch, kv_heads, groups * steps, keys))?;
    probs.matmul(v)?.reshape((batch, heads, steps, head_dim))
}

/// `logsumexp(logits_i) − logits_i[targets_i]` for each row of `[N, V]` logits (f32): the
/// cross-entropy of every row, `[N]`, differentiable in the logits.
pub fn cross_entropy(logits: &Tensor, targets: &[u32]) -> candle_core::Result<Tensor> {
    if fused(logits) {
        return logits.contiguous()?.apply_op1(cross_entropy::CrossEntropy::new(targets.to_vec()));
    }
    let rows = targets.len();
    let targets = Tensor::from_slice(targets, (rows, 1), logits.device())?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let log_normaliser = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    (log_normaliser - shifted.gather(&targets, 1)?)?.squeeze(1)
}

/// `silu(gate) · up`, the SwiGLU activation, differentiable in both.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    if fused(gate) && fused(up) && gate.dims() == up.dims() {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu);
    }
    gate.silu()? * up
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "whale-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_slice(storage, layout, self.name())?;
        let dim = layout.dims().last().copied().unwrap_or(1).max(1);
        let output = map_rows(x, dim, |x, out, _| {
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            out.iter_mut().zip(x).for_each(|(o, &v)| *o = vectorised::exp(v - max));
            let inverse = 1.0 / vectorised::sum(out);
            out.iter_mut().for_each(|o| *o *= inverse);
        });
        Ok((CpuStorage::F32(output), layout.shape().clone()))
    }

    /// With `y = softmax(x)`: `dx = y * (dy - sum(dy * y))`.
    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let dot = (dy * y)?.sum_keepdim(D::Minus1)?;
        Ok(Some((y * dy.broadcast_sub(&dot)?)?))
    }
}

struct RmsNorm {
    eps: f64,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "whale-rms-norm"
    }

    fn cpu_fwd(
        &self,
        x_storage: &CpuStorage,
        x_layout: &Layout,
        w_storage: &CpuStorage,
        w_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_slice(x_storage, x_layout, self.name())?;
        let weight = f32_slice(w_storage, w_layout, self.name())?;
        let dim = weight.len();
        let eps = self.eps as f32;
        let output = map_rows(x, dim, |x, out, _| {
            let mean_square = vectorised::dot(x, x) / dim as f32;
            let inverse_rms = 1.0 / (mean_square + eps).sqrt();
            for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
                *o = v * inverse_rms * w;
            }
        });
        Ok((CpuStorage::F32(output), x_layout.shape().clone()))
    }

    /// With `r = 1 / rms(x)`, `n = x r` and `g = dy w`:
    /// `dx = r (g - n mean(g n))` and `dw = sum over rows of dy n`.
    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = on_host([x, weight, dy], self.name(), |[xs, ws, dys]| self.gradients(xs, ws, dys))?;
        let (dx, dw) =
            (Tensor::from_vec(dx, x.shape(), &Device::Cpu)?, Tensor::from_vec(dw, weight.shape(), &Device::Cpu)?);
        Ok((Some(dx), Some(dw)))
    }
}

impl RmsNorm {
    /// `dx` and `dw` of the formulas above.
    fn gradients(&self, xs: &[f32], ws: &[f32], dys: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let dim = ws.len().max(1);
        let eps = self.eps as f32;
        let inverse_rms = |x: &[f32]| 1.0 / (vectorised::dot(x, x) / dim as f32 + eps).sqrt();
        let dx = map_rows(xs, dim, |x, out, row| {
            let dy = &dys[row * dim..(row + 1) * dim];
            let r = inverse_rms(x);
            let projection = x.iter().zip(dy).zip(ws).map(|((x, dy), w)| dy * w * x * r).sum::<f32>() / dim as f32;
            for (((o, x), dy), w) in out.iter_mut().zip(x).zip(dy).zip(ws) {
                *o = r * (dy * w - x * r * projection);
            }
        });
        let partial_dw = |(x, dy): (&[f32], &[f32])| {
            let mut dw = vec![0f32; dim];
            for (x, dy) in x.chunks(dim).zip(dy.chunks(dim)) {
                let r = inverse_rms(x);
                dw.iter_mut().zip(x).zip(dy).for_each(|((dw, x), dy)| *dw += dy * x * r);
            }
            dw
        };
        // Fixed chunks summed in order: the same bits whatever thread ran which chunk.
        let rows_per_task = (PARALLEL_ELEMENTS / dim).max(1) * dim;
        let partials: Vec<Vec<f32>> =
            xs.par_chunks(rows_per_task).zip(dys.par_chunks(rows_per_task)).map(partial_dw).collect();
        let dw = partials.iter().fold(vec![0f32; dim], |sum, part| sum.iter().zip(part).map(|(a, b)| a + b).collect());
        (dx, dw)
    }
}

struct Rope;

impl Rope {
    /// `(rows, heads · d, d / 2)` of `x` `[N, heads · d]` and angles `[N, d / 2]`.
    fn check(x: &Layout, angles: &Layout) -> candle_core::Result<(usize, usize, usize)> {
        let (&[rows, width], &[angle_rows, half]) = (x.dims(), angles.dims()) else {
            candle_core::bail!("whale-rope: input {:?} and angles {:?} are not matrices", x.dims(), angles.dims());
        };
        if angle_rows != rows || half == 0 || width == 0 || width % (2 * half) != 0 {
            candle_core::bail!("whale-rope: angles {:?} do not fit input {:?}", angles.dims(), x.dims());
        }
        Ok((rows, width, half))
    }
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "whale-rope"
    }

    fn cpu_fwd(
        &self,
        x_storage: &CpuStorage,
        x_layout: &Layout,
        cos_storage: &CpuStorage,
        cos_layout: &Layout,
        sin_storage: &CpuStorage,
        sin_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, width, half) = Self::check(x_layout, cos_layout)?;
        Self::check(x_layout, sin_layout)?;
        let x = f32_slice(x_storage, x_layout, self.name())?;
        let cos = f32_slice(cos_storage, cos_layout, self.name())?;
        let sin = f32_slice(sin_storage, sin_layout, self.name())?;
        let output = map_rows(x, width, |x, out, row| {
            let (cos, sin) = (&cos[row * half..(row + 1) * half], &sin[row * half..(row + 1) * half]);
            for (x, out) in x.chunks(2 * half).zip(out.chunks_mut(2 * half)) {
                for i in 0..half {
                    let (a, b) = (x[i], x[i + half]);
                    out[i] = a * cos[i] - b * sin[i];
                    out[i + half] = b * cos[i] + a * sin[i];
                }
            }
        });
        Ok((CpuStorage::F32(output), x_layout.shape().clone()))
    }

    /// The rotation is orthogonal, so its gradient is the rotation by the opposite angle.
    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = dy.contiguous()?.apply_op3_no_bwd(cos, &sin.neg()?, &Rope)?;
        Ok((Some(dx), None, None))
    }
}

struct SwiGlu;

/// `silu(x) = x σ(x)`.
fn silu(x: f32) -> f32 {
    x / (1.0 + vectorised::exp(-x))
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "whale-swiglu"
    }

    fn cpu_fwd(
        &self,
        gate_storage: &CpuStorage,
        gate_layout: &Layout,
        up_storage: &CpuStorage,
        up_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let gate = f32_slice(gate_storage, gate_layout, self.name())?;
        let up = f32_slice(up_storage, up_layout, self.name())?;
        if gate_layout.dims() != up_layout.dims() {
            candle_core::bail!("{}: gate {:?} and up {:?} differ", self.name(), gate_layout.dims(), up_layout.dims());
        }
        let dim = gate_layout.dims().last().copied().unwrap_or(1).max(1);
        let output = map_rows(gate, dim, |gate, out, row| {
            let up = &up[row * dim..(row + 1) * dim];
            out.iter_mut().zip(gate).zip(up).for_each(|((o, &g), &u)| *o = silu(g) * u);
        });
        Ok((CpuStorage::F32(output), gate_layout.shape().clone()))
    }

    /// With `s = σ(gate)`: `d gate = dy · up · s (1 + gate (1 − s))` and `d up = dy · gate · s`.
    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _out: &Tensor,
        d_out: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dim = gate.dims().last().copied().unwrap_or(1).max(1);
        let (d_gate, d_up) = on_host([gate, up, d_out], self.name(), |[gates, ups, d_outs]| {
            let (mut d_gate, mut d_up) = (vec![0f32; gates.len()], vec![0f32; gates.len()]);
            let row_grad = |(row, (d_gate, d_up)): (usize, (&mut [f32], &mut [f32]))| {
                let at = row * dim;
                for (i, (dg, du)) in d_gate.iter_mut().zip(d_up.iter_mut()).enumerate() {
                    let (g, u, dy) = (gates[at + i], ups[at + i], d_outs[at + i]);
                    let sigmoid = 1.0 / (1.0 + vectorised::exp(-g));
                    *dg = dy * u * sigmoid * (1.0 + g * (1.0 - sigmoid));
                    *du = dy * g * sigmoid;
                }
            };
            if gates.len() >= PARALLEL_ELEMENTS {
                d_gate.par_chunks_mut(dim).zip(d_up.par_chunks_mut(dim)).enumerate().for_each(row_grad);
            } else {
                d_gate.chunks_mut(dim).zip(d_up.chunks_mut(dim)).enumerate().for_each(row_grad);
            }
            (d_gate, d_up)
        })?;
        let tensor = |values: Vec<f32>| Tensor::from_vec(values, gate.shape(), &Device::Cpu);
        Ok((Some(tensor(d_gate)?), Some(tensor(d_up)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()).expect("difference")
    }

    /// The loss `sum(f(x) * probe)` and its gradients through the fused op and through the
    /// composition (the same op on f64, which takes the composed path).
    fn compare(
        inputs: &[Tensor],
        op: impl Fn(&[Tensor]) -> candle_core::Result<Tensor>,
        trained: &[usize],
    ) -> (f32, Vec<f32>) {
        let run = |dtype: DType| {
            let vars: Vec<Var> =
                inputs.iter().map(|t| Var::from_tensor(&t.to_dtype(dtype).expect("dtype")).expect("var")).collect();
            let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
            let out = op(&tensors).expect("forward");
            let count = out.elem_count() as u32;
            let probe = Tensor::arange(0u32, count, &Device::Cpu)
                .and_then(|p| p.to_dtype(dtype)?.sin()?.reshape(out.shape()))
                .expect("probe");
            let grads = (&out * &probe).and_then(|l| l.sum_all()).and_then(|l| l.backward()).expect("backward");
            let grads: Vec<Tensor> = trained
                .iter()
                .map(|&i| grads.get(&tensors[i]).expect("gradient").to_dtype(DType::F32).expect("dtype"))
                .collect();
            (out.to_dtype(DType::F32).expect("dtype"), grads)
        };
        let (fused_out, fused_grads) = run(DType::F32);
        let (composed_out, composed_grads) = run(DType::F64);
        let grad_diffs = fused_grads.iter().zip(&composed_grads).map(|(a, b)| max_diff(a, b)).collect();
        (max_diff(&fused_out, &composed_out), grad_diffs)
    }

    fn random(shape: &[usize]) -> Tensor {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu).expect("random")
    }

    #[test]
    fn fused_softmax_matches_the_composition_forward_and_backward() {
        let mut x = random(&[3, 5, 70]);
        let mask = Tensor::from_vec(
            (0..70).map(|i| if i % 3 == 0 { f32::NEG_INFINITY } else { 0.0 }).collect::<Vec<_>>(),
            70,
            &Device::Cpu,
        )
        .expect("mask");
        x = x.broadcast_add(&mask).expect("masked");
        let (out, grads) = compare(&[x], |t| softmax_last_dim(&t[0]), &[0]);
        assert!(out < 1e-6 && grads[0] < 1e-5, "{out} {grads:?}");
    }

    #[test]
    fn fused_rms_norm_matches_the_composition_forward_and_backward() {
        let (out, grads) = compare(&[random(&[4, 6, 48]), random(&[48])], |t| rms_norm(&t[0], &t[1], 1e-6), &[0, 1]);
        assert!(out < 1e-5 && grads.iter().all(|&g| g < 1e-4), "{out} {grads:?}");
    }

    fn rows_f64(x: &Tensor) -> Vec<Vec<f64>> {
        x.to_vec2().expect("rows")
    }

    /// In f64 the compositions round nowhere to f32 (an f64 model is the parity checks'
    /// reference): RMSNorm and packed attention equal their formulas computed by hand in f64
    /// to 1e-12, where a pass through f32 is about 1e-7 off.
    #[test]
    fn f64_inputs_are_normalised_and_attended_in_f64() {
        let f64_random = |shape: &[usize]| random(shape).to_dtype(DType::F64).expect("f64");
        let (x, weight) = (f64_random(&[3, 48]), f64_random(&[48]));
        let normed = rows_f64(&rms_norm(&x, &weight, 1e-6).expect("norm"));
        let weights: Vec<f64> = weight.to_vec1().expect("weights");
        for (row, out) in rows_f64(&x).iter().zip(&normed) {
            let inverse_rms = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / 48.0 + 1e-6).sqrt();
            for ((v, w), o) in row.iter().zip(&weights).zip(out) {
                assert!((v * inverse_rms * w - o).abs() < 1e-12, "{} against {o}", v * inverse_rms * w);
            }
        }
        let (lengths, heads, d, scale) = ([5, 3], 2, 4, 0.5);
        let (q, k, v) = (f64_random(&[8, heads * d]), f64_random(&[8, d]), f64_random(&[8, d]));
        let out = rows_f64(&attention(&q, &k, &v, &lengths, d, scale).expect("attention"));
        let (q, k, v) = (rows_f64(&q), rows_f64(&k), rows_f64(&v));
        for (first, len) in [(0, 5), (5, 3)] {
            for t in first..first + len {
                for h in 0..heads {
                    let query = &q[t][h * d..(h + 1) * d];
                    let scores: Vec<f64> =
                        (first..=t).map(|s| scale * query.iter().zip(&k[s]).map(|(a, b)| a * b).sum::<f64>()).collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for j in 0..d {
                        let expected: f64 = (first..=t).zip(&weights).map(|(s, w)| w / total * v[s][j]).sum();
                        let got = out[t][h * d + j];
                        assert!((expected - got).abs() < 1e-12, "row {t} head {h}: {got} against {expected}");
                    }
                }
            }
        }
    }

    #[test]
    fn rms_norm_refuses_a_weight_that_does_not_divide_the_rows() {
        for dtype in [DType::F32, DType::F64] {
            let x = random(&[2, 5]).to_dtype(dtype).expect("dtype");
            let weight = random(&[3]).to_dtype(dtype).expect("dtype");
            let error = rms_norm(&x, &weight, 1e-6).expect_err("5 values in runs of 3");
            assert!(error.to_string().contains("weight of 3"), "{error}");
        }
    }

    #[test]
    fn fused_rope_matches_the_composition_forward_and_backward() {
        let angles = random(&[14, 8]);
        let (cos, sin) = (angles.cos().expect("cos"), angles.sin().expect("sin"));
        let (out, grads) = compare(&[random(&[14, 3 * 16]), cos, sin], |t| rope(&t[0], &t[1], &t[2]), &[0]);
        assert!(out < 1e-6 && grads[0] < 1e-5, "{out} {grads:?}");
    }

    #[test]
    fn fused_rms_norm_matches_on_rows_split_across_threads_and_per_head() {
        for (x, w) in [([300, 128], 128), ([300, 4 * 32], 32)] {
            let (out, grads) = compare(&[random(&x), random(&[w])], |t| rms_norm(&t[0], &t[1], 1e-6), &[0, 1]);
            assert!(out < 1e-5 && grads.iter().all(|&g| g < 1e-3), "{w}: {out} {grads:?}");
        }
    }

    fn check_attention(lengths: &[usize], heads: usize, kv_heads: usize) {
        let (rows, d) = (lengths.iter().sum::<usize>(), 16);
        let inputs = [random(&[rows, heads * d]), random(&[rows, kv_heads * d]), random(&[rows, kv_heads * d])];
        let (out, grads) = compare(&inputs, |t| attention(&t[0], &t[1], &t[2], lengths, d, 0.25), &[0, 1, 2]);
        assert!(out < 1e-5 && grads.iter().all(|&g| g < 1e-4), "{lengths:?}: {out} {grads:?}");
    }

    #[test]
    fn fused_attention_matches_the_composition_over_packed_sequences() {
        check_attention(&[70, 0, 25, 1, 130], 4, 2);
        check_attention(&[64, 65], 3, 3);
        check_attention(&[33], 4, 1);
    }

    #[test]
    fn fused_attention_keeps_packed_sequences_apart() {
        let (d, lengths) = (8, [3, 4]);
        let (q, k, v) = (random(&[7, 2 * d]), random(&[7, d]), random(&[7, d]));
        let packed = attention(&q, &k, &v, &lengths, d, 0.5).expect("packed");
        let second = |x: &Tensor| x.narrow(0, 3, 4).expect("rows");
        let alone = attention(&second(&q), &second(&k), &second(&v), &[4], d, 0.5).expect("alone");
        assert_eq!(max_diff(&second(&packed), &alone), 0.0);
        let first_token = packed.narrow(0, 3, 1).and_then(|o| o.narrow(1, 0, d)).expect("row");
        assert!(max_diff(&first_token, &v.narrow(0, 3, 1).expect("row")) < 1e-6, "a first token sees only itself");
    }

    #[test]
    fn fused_attention_refuses_shapes_that_do_not_fit() {
        let (k, v) = (random(&[6, 2 * 8]), random(&[6, 2 * 8]));
        let error = attention(&random(&[6, 3 * 8]), &k, &v, &[6], 8, 1.0).expect_err("3 heads over 2");
        assert!(error.to_string().contains("do not fit"), "{error}");
        let error = attention(&random(&[6, 2 * 8]), &k, &v, &[4], 8, 1.0).expect_err("6 rows, 4 in sequences");
        assert!(error.to_string().contains("do not fit"), "{error}");
        let (q64, k64) = (random(&[6, 2 * 8]).to_dtype(DType::F64).expect("f64"), k.to_dtype(DType::F64).expect("f64"));
        let error = attention(&q64, &k64, &k64, &[4], 8, 1.0).expect_err("the composition checks the same");
        assert!(error.to_string().contains("do not fit"), "{error}");
        let empty = Tensor::zeros((0, 8), DType::F32, &Device::Cpu).expect("empty");
        let error = attention(&empty, &empty, &empty, &[0], 8, 1.0).expect_err("no rows");
        assert!(error.to_string().contains("do not fit"), "{error}");
    }

    #[test]
    fn fused_cross_entropy_matches_the_composition_forward_and_backward() {
        for rows in [7, 300] {
            let targets: Vec<u32> = (0..rows as u32).map(|i| i * 37 % 250).collect();
            let (out, grads) = compare(&[random(&[rows, 250])], |t| cross_entropy(&t[0], &targets), &[0]);
            assert!(out < 1e-5 && grads[0] < 1e-6, "{rows}: {out} {grads:?}");
        }
    }

    #[test]
    fn fused_cross_entropy_refuses_a_target_outside_the_vocabulary() {
        let error = cross_entropy(&random(&[2, 10]), &[3, 10]).expect_err("target 10 of 10");
        assert!(error.to_string().contains("outside a vocabulary of 10"), "{error}");
    }

    #[test]
    fn fused_swiglu_matches_the_composition_forward_and_backward() {
        for shape in [[2, 5, 24], [4, 100, 96]] {
            let (out, grads) = compare(&[random(&shape), random(&shape)], |t| swiglu(&t[0], &t[1]), &[0, 1]);
            assert!(out < 1e-5 && grads.iter().all(|&g| g < 1e-5), "{shape:?}: {out} {grads:?}");
        }
    }
}
