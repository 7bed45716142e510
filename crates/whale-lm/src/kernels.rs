//! Fused CPU kernels for training, each with its backward pass.
//!
//! candle's fused softmax, RMSNorm and rotary kernels have no backward pass, and composing them
//! from basic ops (so that autograd sees them) makes four or five full-size temporaries per
//! call in the forward pass and more in the backward pass. On the CPU that memory traffic, not
//! the matrix products, dominated a training step of the small models. These custom ops run
//! one loop forward and express the gradient as a few tensor ops (the formulas below). They
//! take contiguous f32 tensors on the CPU; every other case uses the composition, which
//! computes the same function.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor, D};
use rayon::prelude::*;

/// Rows of at least this many elements in all go to rayon's pool.
const PARALLEL_ELEMENTS: usize = 1 << 15;

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

/// `x / sqrt(mean(x²) + eps) * weight` over the last dimension, computed in f32 as in
/// `transformers`, differentiable in `x` and `weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    if fused(x) && fused(weight) {
        return x.contiguous()?.apply_op2(&weight.contiguous()?, RmsNorm { eps });
    }
    let x32 = x.to_dtype(DType::F32)?;
    let inverse_rms = (x32.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x32.broadcast_mul(&inverse_rms)?.to_dtype(x.dtype())?.broadcast_mul(weight)
}

/// Rotary embedding of `x` `[B, H, T, d]` with `cos`, `sin` `[B, T, d / 2]` in the
/// `rotate_half` convention of `transformers`: the first half of each head pairs with the
/// second. Differentiable in `x` (the angles are constants).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    if fused(x) {
        return x.contiguous()?.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope);
    }
    let half = x.dim(D::Minus1)? / 2;
    let (cos, sin) =
        (Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?, Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?);
    let rotated = Tensor::cat(&[&x.narrow(D::Minus1, half, half)?.neg()?, &x.narrow(D::Minus1, 0, half)?], D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

fn f32_slice<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else {
        candle_core::bail!("{op}: expected f32 storage");
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => candle_core::bail!("{op}: expected a contiguous tensor"),
    }
}

/// Applies `row_op(input_row, output_row, row_index)` to every row of `dim` elements.
fn map_rows(input: &[f32], dim: usize, row_op: impl Fn(&[f32], &mut [f32], usize) + Sync) -> Vec<f32> {
    let mut output = vec![0f32; input.len()];
    if input.len() >= PARALLEL_ELEMENTS {
        output.par_chunks_mut(dim).zip(input.par_chunks(dim)).enumerate().for_each(|(i, (out, x))| row_op(x, out, i));
    } else {
        output.chunks_mut(dim).zip(input.chunks(dim)).enumerate().for_each(|(i, (out, x))| row_op(x, out, i));
    }
    output
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
            let mut sum = 0f32;
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (v - max).exp();
                sum += *o;
            }
            out.iter_mut().for_each(|o| *o /= sum);
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
        if x_layout.dims().last() != Some(&dim) {
            candle_core::bail!("{}: weight of {dim} for input {:?}", self.name(), x_layout.dims());
        }
        let eps = self.eps as f32;
        let output = map_rows(x, dim, |x, out, _| {
            let mean_square = x.iter().map(|v| v * v).sum::<f32>() / dim as f32;
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
        let inverse_rms = (x.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?.sqrt()?.recip()?;
        let normed = x.broadcast_mul(&inverse_rms)?;
        let scaled = dy.broadcast_mul(weight)?;
        let projection = (&scaled * &normed)?.mean_keepdim(D::Minus1)?;
        let dx = scaled.sub(&normed.broadcast_mul(&projection)?)?.broadcast_mul(&inverse_rms)?;
        let dim = weight.dim(0)?;
        let dw = (dy * normed)?.reshape(((), dim))?.sum(0)?;
        Ok((Some(dx), Some(dw)))
    }
}

struct Rope;

impl Rope {
    fn check(x: &Layout, angles: &Layout) -> candle_core::Result<(usize, usize, usize, usize)> {
        let &[batch, heads, steps, dim] = x.dims() else {
            candle_core::bail!("whale-rope: input {:?} is not [B, H, T, d]", x.dims());
        };
        if angles.dims() != [batch, steps, dim / 2] || dim % 2 != 0 {
            candle_core::bail!("whale-rope: angles {:?} do not fit input {:?}", angles.dims(), x.dims());
        }
        Ok((batch, heads, steps, dim))
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
        let (_, heads, steps, dim) = Self::check(x_layout, cos_layout)?;
        Self::check(x_layout, sin_layout)?;
        let x = f32_slice(x_storage, x_layout, self.name())?;
        let cos = f32_slice(cos_storage, cos_layout, self.name())?;
        let sin = f32_slice(sin_storage, sin_layout, self.name())?;
        let half = dim / 2;
        let output = map_rows(x, dim, |x, out, row| {
            let (batch, step) = (row / (heads * steps), row % steps);
            let angle = (batch * steps + step) * half;
            let (cos, sin) = (&cos[angle..angle + half], &sin[angle..angle + half]);
            for i in 0..half {
                let (a, b) = (x[i], x[i + half]);
                out[i] = a * cos[i] - b * sin[i];
                out[i + half] = b * cos[i] + a * sin[i];
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

    #[test]
    fn fused_rope_matches_the_composition_forward_and_backward() {
        let angles = random(&[2, 7, 8]);
        let (cos, sin) = (angles.cos().expect("cos"), angles.sin().expect("sin"));
        let (out, grads) = compare(&[random(&[2, 3, 7, 16]), cos, sin], |t| rope(&t[0], &t[1], &t[2]), &[0]);
        assert!(out < 1e-6 && grads[0] < 1e-5, "{out} {grads:?}");
    }
}
