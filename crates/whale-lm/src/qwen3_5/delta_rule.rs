//! The gated delta rule of Gated DeltaNet, from differentiable tensor ops.
//!
//! Per value head the state `S` (`[dk, dv]`) follows, for each token with query `q`, key `k`,
//! value `v`, decay `g ≤ 0` (log space) and write strength `β`:
//! `S ← e^g S`, `S ← S + k ⊗ β (v − Sᵀk)`, output `Sᵀq`.
//! [`recurrent`] runs that token by token (one decoded token needs nothing more).
//! [`chunked`] computes the same thing a chunk of [`CHUNK`] tokens at a time: within a chunk the
//! updates are condensed into matrix products through the inverse of a unit lower-triangular
//! system (the UT transform of the DeltaNet papers), so that autograd keeps one state per chunk
//! instead of one per token. Both are compositions of candle ops, so both have backward passes.

use candle_core::{Tensor, D};

/// Tokens per chunk of the training pass (as `transformers` and the FLA kernels use).
pub const CHUNK: usize = 64;

/// The inputs of one sequence: `q`, `k` `[H, T, dk]` (already L2-normalised, `q` scaled by
/// `dk^-1/2`), `v` `[H, T, dv]`, `g` and `beta` `[H, T]`, all f32.
pub struct DeltaInputs<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub g: &'a Tensor,
    pub beta: &'a Tensor,
}

/// Token by token from `state` (`[H, dk, dv]`): the outputs `[H, T, dv]` and the final state.
pub fn recurrent(inputs: &DeltaInputs<'_>, state: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let steps = inputs.q.dim(1)?;
    let mut state = state.clone();
    let mut outputs = Vec::with_capacity(steps);
    for t in 0..steps {
        let q = inputs.q.narrow(1, t, 1)?; // [H, 1, dk]
        let k = inputs.k.narrow(1, t, 1)?;
        let v = inputs.v.narrow(1, t, 1)?; // [H, 1, dv]
        let decay = inputs.g.narrow(1, t, 1)?.exp()?.unsqueeze(2)?; // [H, 1, 1]
        let beta = inputs.beta.narrow(1, t, 1)?.unsqueeze(2)?;
        state = state.broadcast_mul(&decay)?;
        let delta = (v - k.matmul(&state)?)?.broadcast_mul(&beta)?; // [H, 1, dv]
        state = (state + k.transpose(1, 2)?.matmul(&delta)?)?;
        outputs.push(q.matmul(&state)?);
    }
    Ok((Tensor::cat(&outputs, 1)?, state))
}

/// Chunk by chunk from `state`: the same outputs and final state as [`recurrent`].
///
/// The sequence is padded to whole chunks (padding has `k = 0`, `β = 0` and `g = 0`, so it
/// neither reads, writes nor decays the state). With `c` the cumulative decay within a chunk
/// and `Γ[i, j] = e^(c_i − c_j)` for `j ≤ i` (0 above the diagonal), everything that does not
/// depend on the incoming state is computed for all chunks at once: the UT transform
/// `T = (I + tril₋₁(βK Kᵀ ∘ Γ))⁻¹`, `W = T βV`, `R = T (β e^c K)` and the intra-chunk scores
/// `Q Kᵀ ∘ Γ`. The scan over chunks is then a few products each: with `U = W − R S`, the
/// outputs are `e^c Q S + (Q Kᵀ ∘ Γ) U` and the next state `e^(c_L) S + (e^(c_L − c) K)ᵀ U`.
pub fn chunked(x: &DeltaInputs<'_>, state: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let (heads, steps) = x.g.dims2()?;
    let chunks = steps.div_ceil(CHUNK);
    let batch = heads * chunks;
    let extra = chunks * CHUNK - steps;
    let split = |t: &Tensor| -> candle_core::Result<Tensor> {
        let padded = t.pad_with_zeros(1, 0, extra)?;
        match padded.rank() {
            2 => padded.reshape((batch, CHUNK)),
            _ => padded.reshape((batch, CHUNK, padded.dim(2)?)),
        }
    };
    let (q, k, v, g, beta) = (split(x.q)?, split(x.k)?, split(x.v)?, split(x.g)?, split(x.beta)?.unsqueeze(2)?);
    let cumulative = g.cumsum(1)?; // [HC, L]
    let last = cumulative.narrow(1, CHUNK - 1, 1)?; // [HC, 1]
    let pairwise = causal_exp(&cumulative.unsqueeze(2)?.broadcast_sub(&cumulative.unsqueeze(1)?)?)?;
    let k_beta = k.broadcast_mul(&beta)?;
    let inverse = unit_lower_inverse(&(k_beta.matmul(&k.transpose(1, 2)?)? * &pairwise)?, batch, CHUNK)?;
    let growth = cumulative.exp()?.unsqueeze(2)?; // [HC, L, 1]
    let per_chunk = |t: Tensor| -> candle_core::Result<Tensor> {
        let (rows, cols) = (t.dim(1)?, t.dim(2)?);
        t.reshape((heads, chunks, rows, cols))
    };
    let values = per_chunk(inverse.matmul(&v.broadcast_mul(&beta)?)?)?;
    let read_keys = per_chunk(inverse.matmul(&k_beta.broadcast_mul(&growth)?)?)?;
    let scores = per_chunk((q.matmul(&k.transpose(1, 2)?)? * &pairwise)?)?;
    let grown_queries = per_chunk(q.broadcast_mul(&growth)?)?;
    let keys_to_end =
        per_chunk(k.broadcast_mul(&last.broadcast_sub(&cumulative)?.exp()?.unsqueeze(2)?)?.transpose(1, 2)?)?;
    let chunk_decay = last.exp()?.reshape((heads, chunks, 1, 1))?;
    let mut state = state.clone();
    let mut outputs = Vec::with_capacity(chunks);
    for chunk in 0..chunks {
        let at = |t: &Tensor| t.narrow(1, chunk, 1)?.squeeze(1);
        let corrected = (at(&values)? - at(&read_keys)?.matmul(&state)?)?;
        outputs.push((at(&grown_queries)?.matmul(&state)? + at(&scores)?.matmul(&corrected)?)?);
        state = (state.broadcast_mul(&at(&chunk_decay)?)? + at(&keys_to_end)?.matmul(&corrected)?)?;
    }
    Ok((Tensor::cat(&outputs, 1)?.narrow(1, 0, steps)?, state))
}

/// `e^x` on and below the diagonal of the last two dimensions, 0 above it (where `x` may be
/// large and positive: it is replaced by −∞ before the exponential, never multiplied by 0 after).
fn causal_exp(x: &Tensor) -> candle_core::Result<Tensor> {
    let len = x.dim(D::Minus1)?;
    let mask: Vec<f32> = (0..len * len).map(|at| if at % len > at / len { f32::NEG_INFINITY } else { 0.0 }).collect();
    x.broadcast_add(&Tensor::from_vec(mask, (len, len), x.device())?)?.exp()
}

/// Rows per diagonal block of [`unit_lower_inverse`].
const BLOCK: usize = 16;

/// `(I + N)⁻¹` for `N` the strictly lower triangle of `a` (`[H, L, L]`), by blocks of [`BLOCK`]:
/// the diagonal blocks' inverses `Dᵢ` all at once by forward substitution, then each block below
/// the diagonal as `Xᵢⱼ = −Dᵢ Σ_{j≤k<i} Nᵢₖ Xₖⱼ` (block row `i` of `(I + N) X = I`). Fewer, larger
/// products than substituting all `L` rows one by one, for the backward pass too.
fn unit_lower_inverse(a: &Tensor, heads: usize, len: usize) -> candle_core::Result<Tensor> {
    if len <= BLOCK || !len.is_multiple_of(BLOCK) {
        return substitution_inverse(a, heads, len);
    }
    let blocks = len / BLOCK;
    // Copied out of `a`: CUDA's matmul takes no row stride other than the row's length.
    let block = |i: usize, j: usize| a.narrow(1, i * BLOCK, BLOCK)?.narrow(2, j * BLOCK, BLOCK)?.contiguous();
    let diagonal = Tensor::cat(&(0..blocks).map(|i| block(i, i)).collect::<candle_core::Result<Vec<_>>>()?, 0)?;
    let inverted = substitution_inverse(&diagonal, blocks * heads, BLOCK)?;
    let zero = Tensor::zeros((heads, BLOCK, BLOCK), a.dtype(), a.device())?;
    let mut x: Vec<Vec<Tensor>> = Vec::with_capacity(blocks);
    for i in 0..blocks {
        let own = inverted.narrow(0, i * heads, heads)?;
        let mut row = Vec::with_capacity(blocks);
        for j in 0..i {
            let mut sum = block(i, j)?.matmul(&x[j][j])?;
            for (k, above) in x.iter().enumerate().take(i).skip(j + 1) {
                sum = (sum + block(i, k)?.matmul(&above[j])?)?;
            }
            row.push(own.matmul(&sum)?.neg()?);
        }
        row.push(own);
        row.extend((i + 1..blocks).map(|_| zero.clone()));
        x.push(row);
    }
    let rows = x.iter().map(|row| Tensor::cat(row, 2)).collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&rows, 1)
}

/// `(I + N)⁻¹` by forward substitution one row at a time: row `i` of the inverse is
/// `eᵢ − Nᵢ,<ᵢ (rows < i of the inverse)`.
fn substitution_inverse(a: &Tensor, heads: usize, len: usize) -> candle_core::Result<Tensor> {
    let identity = Tensor::eye(len, a.dtype(), a.device())?;
    let mut rows: Vec<Tensor> =
        vec![identity.narrow(0, 0, 1)?.unsqueeze(0)?.broadcast_as((heads, 1, len))?.contiguous()?];
    for i in 1..len {
        let above = Tensor::cat(&rows, 1)?; // [H, i, L]
        let coefficients = a.narrow(1, i, 1)?.narrow(2, 0, i)?.contiguous()?; // [H, 1, i], contiguous for CUDA
        let unit = identity.narrow(0, i, 1)?.unsqueeze(0)?;
        rows.push(coefficients.matmul(&above)?.neg()?.broadcast_add(&unit)?);
    }
    Tensor::cat(&rows, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn inputs(heads: usize, steps: usize, dk: usize, dv: usize, seed: u64) -> Vec<Tensor> {
        let device = Device::Cpu;
        let normal = |shape: &[usize], offset: u64| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|i| {
                    let x = ((i as u64 + 1).wrapping_mul(6364136223846793005).wrapping_add(seed + offset) >> 33) as f32;
                    (x / (1u64 << 31) as f32) * 2.0 - 1.0
                })
                .collect();
            Tensor::from_vec(values, shape, &device).unwrap()
        };
        let l2 = |x: Tensor| x.broadcast_div(&x.sqr().unwrap().sum_keepdim(2).unwrap().sqrt().unwrap()).unwrap();
        let q = (l2(normal(&[heads, steps, dk], 1)) / (dk as f64).sqrt()).unwrap();
        let k = l2(normal(&[heads, steps, dk], 2));
        let v = normal(&[heads, steps, dv], 3);
        let g = ((normal(&[heads, steps], 4) - 1.0).unwrap() * 0.5).unwrap(); // in [-1, 0]
        let beta = ((normal(&[heads, steps], 5) + 1.0).unwrap() * 0.5).unwrap();
        vec![q, k, v, g, beta]
    }

    fn max_difference(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
    }

    #[test]
    fn the_chunked_rule_equals_the_recurrence_across_chunk_boundaries() {
        let x = inputs(3, 2 * CHUNK + 9, 8, 6, 11);
        let delta = DeltaInputs { q: &x[0], k: &x[1], v: &x[2], g: &x[3], beta: &x[4] };
        let start = (Tensor::ones((3, 8, 6), DType::F32, &Device::Cpu).unwrap() * 0.1).unwrap();
        let (out_r, state_r) = recurrent(&delta, &start).unwrap();
        let (out_c, state_c) = chunked(&delta, &start).unwrap();
        assert_eq!(out_c.dims(), &[3, 2 * CHUNK + 9, 6]);
        assert!(max_difference(&out_r, &out_c) < 1e-4, "{}", max_difference(&out_r, &out_c));
        assert!(max_difference(&state_r, &state_c) < 1e-4, "{}", max_difference(&state_r, &state_c));
    }

    #[test]
    fn the_blocked_inverse_inverts_the_unit_lower_triangular_system() {
        let x = inputs(3, CHUNK, CHUNK, 1, 5);
        let a = (&x[0] * 4.0).unwrap(); // any values: only the strict lower triangle counts
        let blocked = unit_lower_inverse(&a, 3, CHUNK).unwrap();
        assert!(max_difference(&blocked, &substitution_inverse(&a, 3, CHUNK).unwrap()) < 1e-4);
        let strict: Vec<f32> = (0..CHUNK * CHUNK).map(|at| if at % CHUNK < at / CHUNK { 1.0 } else { 0.0 }).collect();
        let strict = Tensor::from_vec(strict, (CHUNK, CHUNK), &Device::Cpu).unwrap();
        let system =
            (a.broadcast_mul(&strict).unwrap().broadcast_add(&Tensor::eye(CHUNK, DType::F32, &Device::Cpu).unwrap()))
                .unwrap();
        let product = system.matmul(&blocked).unwrap();
        let identity = Tensor::eye(CHUNK, DType::F32, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap()
            .broadcast_as((3, CHUNK, CHUNK))
            .unwrap();
        assert!(
            max_difference(&product, &identity.contiguous().unwrap()) < 1e-3,
            "{}",
            max_difference(&product, &identity.contiguous().unwrap())
        );
    }

    #[test]
    fn both_rules_have_the_same_gradients() {
        let x = inputs(2, CHUNK + 5, 4, 4, 3);
        let vars: Vec<Var> = x.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let gradients = |rule: fn(&DeltaInputs<'_>, &Tensor) -> candle_core::Result<(Tensor, Tensor)>| {
            let delta = DeltaInputs { q: &vars[0], k: &vars[1], v: &vars[2], g: &vars[3], beta: &vars[4] };
            let start = Tensor::zeros((2, 4, 4), DType::F32, &Device::Cpu).unwrap();
            let (out, state) = rule(&delta, &start).unwrap();
            let loss = ((out.sqr().unwrap().sum_all().unwrap()) + state.sum_all().unwrap()).unwrap();
            let grads = loss.backward().unwrap();
            vars.iter().map(|v| grads.get(v).unwrap().clone()).collect::<Vec<_>>()
        };
        let (a, b) = (gradients(recurrent), gradients(chunked));
        for (index, (a, b)) in a.iter().zip(&b).enumerate() {
            let scale: f32 = a.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
            assert!(scale > 0.0, "input {index} gets no gradient");
            assert!(max_difference(a, b) < 1e-4 * scale.max(1.0), "input {index}: {}", max_difference(a, b));
        }
    }
}
