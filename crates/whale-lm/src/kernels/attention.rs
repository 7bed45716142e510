//! Grouped-query attention as one CPU op with its backward pass.
//!
//! Composed from tensor ops, attention writes the `[B, heads, T, S]` scores several times
//! (scaled, masked, normalised) and autograd as many again, each allocated, zeroed and
//! accumulated: on the small models that memory traffic cost more than the matrix products.
//! This op runs, per batch row and key/value head, two matrix products and one pass over the
//! scores forward and keeps only the probabilities `P`. The backward pass is four products and
//! one pass:
//! `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ⊙ (dP − rowsum(P ⊙ dP)) · scale`, `dQ = dS K`, `dK = dSᵀ Q`.
//!
//! The op takes and gives token-major rows (`[B·T, heads·d]`, as the projections make them) and
//! works head-major inside, so the model's training pass has no reshapes or transposes around
//! it (each would be one more tensor for autograd to allocate, zero and accumulate). The query
//! heads that share a key/value head read the same keys, so grouped keys are never copied; `dK`
//! and `dV` sum over the group. Queries go in blocks of [`QUERY_BLOCK`] rows, and each block
//! multiplies only the span of keys some row of it may see: under a causal mask that skips
//! about half of the products.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::vectorised::{dot, exp, sum};
use super::{cpu_f32, f32_slice};

/// Query rows per block.
const QUERY_BLOCK: usize = 64;

/// `softmax(q kᵀ · scale + mask) v` for `q` `[B·T, H·d]`, `k` and `v` `[B·T, KV·d]` (query head
/// `h` reads key/value head `h / (H / KV)`) and an additive mask `[B, T, T]`.
pub(super) struct Attention {
    mask: Vec<f32>,
    scale: f32,
    batch: usize,
    head_dim: usize,
    /// What the backward pass reads, set by the forward pass.
    forward: Mutex<Option<Forward>>,
}

struct Forward {
    /// `[B, KV, T, H / KV, S]`, zero outside the spans.
    probs: Vec<f32>,
    spans: Vec<Span>,
    /// The inputs, head-major: `[B, KV, T, H / KV, d]` and `[B, KV, S, d]`.
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Attention {
    pub(super) fn new(mask: Vec<f32>, scale: f64, batch: usize, head_dim: usize) -> Self {
        Self { mask, scale: scale as f32, batch, head_dim, forward: Mutex::default() }
    }

    fn dims(&self, q: &[usize], k: &[usize], v: &[usize]) -> candle_core::Result<Dims> {
        let (batch, head_dim) = (self.batch, self.head_dim);
        let (&[q_rows, q_width], &[k_rows, k_width]) = (q, k) else {
            candle_core::bail!("whale-attention: q {q:?} and k {k:?} are not [B·T, heads·d]");
        };
        let consistent = batch > 0
            && head_dim > 0
            && q_rows % batch == 0
            && k_rows == q_rows
            && v == k
            && q_width % head_dim == 0
            && k_width % head_dim == 0
            && k_width > 0
            && q_width % k_width == 0
            && self.mask.len() == q_rows * (q_rows / batch);
        if !consistent {
            candle_core::bail!(
                "whale-attention: q {q:?}, k {k:?}, v {v:?}, a batch of {batch}, heads of {head_dim} and a mask of {} do not fit",
                self.mask.len()
            );
        }
        let steps = q_rows / batch;
        Ok(Dims { batch, heads: q_width / head_dim, kv_heads: k_width / head_dim, steps, keys: steps, head_dim })
    }

    fn forward_state(&self) -> candle_core::Result<std::sync::MutexGuard<'_, Option<Forward>>> {
        self.forward.lock().map_err(|_| candle_core::Error::msg("whale-attention: poisoned lock"))
    }
}

/// The sizes of one call, checked against each other.
#[derive(Debug, Clone, Copy)]
struct Dims {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    steps: usize,
    keys: usize,
    head_dim: usize,
}

impl Dims {
    /// One task per batch row and key/value head.
    fn tasks(&self) -> usize {
        self.batch * self.kv_heads
    }

    /// Query rows of a task: the `groups · T` rows of its query heads.
    fn rows(&self) -> usize {
        self.heads / self.kv_heads * self.steps
    }

    fn blocks(&self) -> usize {
        self.steps.div_ceil(QUERY_BLOCK)
    }

    /// The query blocks of a task: the first row of each and its span index within the batch row.
    fn groups(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// The query blocks of a task: [`QUERY_BLOCK`] steps of every query head of the group.
    fn task_blocks(&self) -> impl Iterator<Item = Block> {
        let (steps, groups) = (self.steps, self.groups());
        (0..self.blocks()).map(move |index| {
            let step = index * QUERY_BLOCK;
            Block { row: step * groups, step, len: QUERY_BLOCK.min(steps - step) * groups, index }
        })
    }
}

/// `len` query rows of a task from `row` (query step `step`), block `index` of its batch row.
struct Block {
    row: usize,
    step: usize,
    len: usize,
    index: usize,
}

/// The keys `[start, end)` that some query of a block may see.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
}

impl Span {
    fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }
}

/// The key span of every query block, `[B][blocks]`.
fn spans(mask: &[f32], dims: Dims) -> Vec<Span> {
    let keys = dims.keys;
    let mut spans = Vec::with_capacity(dims.batch * dims.blocks());
    for rows in mask.chunks(dims.steps * keys) {
        for block in rows.chunks(QUERY_BLOCK * keys) {
            let mut span = Span { start: keys, end: 0 };
            for row in block.chunks(keys) {
                if let Some(first) = row.iter().position(|&m| m != f32::NEG_INFINITY) {
                    let last = row.iter().rposition(|&m| m != f32::NEG_INFINITY).unwrap_or(first);
                    span = Span { start: span.start.min(first), end: span.end.max(last + 1) };
                }
            }
            spans.push(span);
        }
    }
    spans
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "whale-attention"
    }

    fn cpu_fwd(
        &self,
        q_storage: &CpuStorage,
        q_layout: &Layout,
        k_storage: &CpuStorage,
        k_layout: &Layout,
        v_storage: &CpuStorage,
        v_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = self.dims(q_layout.dims(), k_layout.dims(), v_layout.dims())?;
        let q = dims.head_major(f32_slice(q_storage, q_layout, self.name())?, dims.heads);
        let k = dims.head_major(f32_slice(k_storage, k_layout, self.name())?, dims.kv_heads);
        let v = dims.head_major(f32_slice(v_storage, v_layout, self.name())?, dims.kv_heads);
        let Dims { steps, keys, head_dim: d, .. } = dims;
        let rows = dims.rows();
        let spans = spans(&self.mask, dims);
        let mut out = vec![0f32; q.len()];
        let mut probs = vec![0f32; dims.tasks() * rows * keys];
        out.par_chunks_mut(rows * d).zip(probs.par_chunks_mut(rows * keys)).enumerate().for_each(
            |(task, (out, probs))| {
                let batch_row = task / dims.kv_heads;
                let (q, k, v) = (chunk(&q, task, rows * d), chunk(&k, task, keys * d), chunk(&v, task, keys * d));
                let mask = chunk(&self.mask, batch_row, steps * keys);
                for block in dims.task_blocks() {
                    let span = spans[batch_row * dims.blocks() + block.index];
                    if span.len() == 0 {
                        continue;
                    }
                    let (k, v) = (key_rows(k, span, d), key_rows(v, span, d));
                    let scores = &mut probs[block.row * keys + span.start..];
                    matmul(scores, keys, query_rows(q, &block, d), k.t(), false);
                    for i in 0..block.len {
                        let at = (block.step + i / dims.groups()) * keys + span.start;
                        masked_softmax(&mut scores[i * keys..][..span.len()], &mask[at..][..span.len()], self.scale);
                    }
                    let p = Matrix { data: scores, rows: block.len, cols: span.len(), row_stride: keys, col_stride: 1 };
                    matmul(&mut out[block.row * d..(block.row + block.len) * d], d, p, v, false);
                }
            },
        );
        let out = dims.token_major(&out, dims.heads);
        *self.forward_state()? = Some(Forward { probs, spans, q, k, v });
        Ok((CpuStorage::F32(out), q_layout.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        d_out: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dims = self.dims(q.dims(), k.dims(), v.dims())?;
        let state = self.forward_state()?;
        let Some(forward) = state.as_ref().filter(|f| f.probs.len() == dims.tasks() * dims.rows() * dims.keys) else {
            candle_core::bail!("whale-attention: backward pass without its forward pass");
        };
        let d_out = d_out.contiguous()?;
        let d_host = d_out.storage_and_layout();
        let d_out = dims.head_major(cpu_f32(&d_host, self.name())?, dims.heads);
        let (dq, dk, dv) = self.gradients(dims, forward, &d_out);
        let tensor = |values: Vec<f32>, heads: usize, like: &Tensor| {
            Tensor::from_vec(dims.token_major(&values, heads), like.shape(), &Device::Cpu)
        };
        Ok((Some(tensor(dq, dims.heads, q)?), Some(tensor(dk, dims.kv_heads, k)?), Some(tensor(dv, dims.kv_heads, v)?)))
    }
}

type Gradients = (Vec<f32>, Vec<f32>, Vec<f32>);

impl Attention {
    /// `dQ`, `dK` and `dV` (head-major) from the forward pass and `dO` (head-major).
    fn gradients(&self, dims: Dims, forward: &Forward, d_out: &[f32]) -> Gradients {
        let (q, k, v) = (&forward.q, &forward.k, &forward.v);
        let Dims { keys, head_dim: d, .. } = dims;
        let rows = dims.rows();
        let (mut dq, mut dk, mut dv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
        dq.par_chunks_mut(rows * d)
            .zip(dk.par_chunks_mut(keys * d))
            .zip(dv.par_chunks_mut(keys * d))
            .enumerate()
            .for_each(|(task, ((dq, dk), dv))| {
                let batch_row = task / dims.kv_heads;
                let probs = chunk(&forward.probs, task, rows * keys);
                let (q, k, v) = (chunk(q, task, rows * d), chunk(k, task, keys * d), chunk(v, task, keys * d));
                let d_out = chunk(d_out, task, rows * d);
                let mut scratch = vec![0f32; QUERY_BLOCK * dims.groups() * keys];
                for block in dims.task_blocks() {
                    let span = forward.spans[batch_row * dims.blocks() + block.index];
                    if span.len() == 0 {
                        continue;
                    }
                    let cols = span.len();
                    let p = Matrix {
                        data: &probs[block.row * keys + span.start..],
                        rows: block.len,
                        cols,
                        row_stride: keys,
                        col_stride: 1,
                    };
                    let (q_block, d_out) = (query_rows(q, &block, d), query_rows(d_out, &block, d));
                    let (k, v) = (key_rows(k, span, d), key_rows(v, span, d));
                    let (dk, dv) = (&mut dk[span.start * d..span.end * d], &mut dv[span.start * d..span.end * d]);
                    matmul(dv, d, p.t(), d_out, true);
                    let ds = &mut scratch[..block.len * cols];
                    matmul(ds, cols, d_out, v.t(), false);
                    for (i, ds) in ds.chunks_mut(cols).enumerate() {
                        let p = &p.data[i * keys..][..cols];
                        let delta = dot(ds, p);
                        ds.iter_mut().zip(p).for_each(|(g, p)| *g = p * (*g - delta) * self.scale);
                    }
                    let ds = Matrix::rows(ds, block.len, cols);
                    matmul(&mut dq[block.row * d..(block.row + block.len) * d], d, ds, k, false);
                    matmul(dk, d, ds.t(), q_block, true);
                }
            });
        (dq, dk, dv)
    }
}

impl Dims {
    /// `[B·T, heads·d]` rows as `[B, KV, T, heads / KV, d]`: each task's rows together, and
    /// within a task the query heads of a step side by side, so that a block of steps is one
    /// matrix for all of them.
    fn head_major(&self, rows: &[f32], heads: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows.len()];
        for (at, values) in rows.chunks(self.head_dim).enumerate() {
            out[self.head_major_offset(at, heads)..][..self.head_dim].copy_from_slice(values);
        }
        out
    }

    /// The inverse of [`Self::head_major`].
    fn token_major(&self, values: &[f32], heads: usize) -> Vec<f32> {
        let mut out = vec![0f32; values.len()];
        for (at, row) in out.chunks_mut(self.head_dim).enumerate() {
            row.copy_from_slice(&values[self.head_major_offset(at, heads)..][..self.head_dim]);
        }
        out
    }

    /// Where head `at % heads` of token row `at / heads` sits head-major.
    fn head_major_offset(&self, at: usize, heads: usize) -> usize {
        let groups = heads / self.kv_heads;
        let (token, head) = (at / heads, at % heads);
        let (batch_row, step) = (token / self.steps, token % self.steps);
        (((batch_row * self.kv_heads + head / groups) * self.steps + step) * groups + head % groups) * self.head_dim
    }
}

/// The `index`-th chunk of `len` values.
fn chunk(values: &[f32], index: usize, len: usize) -> &[f32] {
    &values[index * len..(index + 1) * len]
}

/// A block's rows of a task's `[rows, d]` queries (or their gradient).
fn query_rows<'a>(values: &'a [f32], block: &Block, d: usize) -> Matrix<'a> {
    Matrix::rows(&values[block.row * d..(block.row + block.len) * d], block.len, d)
}

/// A span's rows of a task's `[S, d]` keys or values.
fn key_rows(values: &[f32], span: Span, d: usize) -> Matrix<'_> {
    Matrix::rows(&values[span.start * d..span.end * d], span.len(), d)
}

/// `scores ← softmax(scores · scale + mask)`; a row that may see nothing becomes zeros.
fn masked_softmax(scores: &mut [f32], mask: &[f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for (x, &m) in scores.iter_mut().zip(mask) {
        *x = *x * scale + m;
        max = max.max(*x);
    }
    if max == f32::NEG_INFINITY {
        scores.fill(0.0);
        return;
    }
    scores.iter_mut().for_each(|x| *x = exp(*x - max));
    let sum = sum(scores);
    let inverse = 1.0 / sum;
    scores.iter_mut().for_each(|x| *x *= inverse);
}

/// A matrix inside a slice: element `(i, j)` sits at `i · row_stride + j · col_stride`.
#[derive(Clone, Copy)]
struct Matrix<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Matrix<'a> {
    fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self { data, rows, cols, row_stride: cols, col_stride: 1 }
    }

    fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// The number of values from the first element to just past the last.
    fn extent(rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> usize {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * row_stride + (cols - 1) * col_stride + 1
        }
    }

    fn in_bounds(&self) -> bool {
        Self::extent(self.rows, self.cols, self.row_stride, self.col_stride) <= self.data.len()
    }
}

/// `out = a b` (`out += a b` when `accumulate`) with `out` `[a.rows, b.cols]` at `out_row_stride`,
/// on the calling thread (the callers parallelise over tasks).
fn matmul(out: &mut [f32], out_row_stride: usize, a: Matrix, b: Matrix, accumulate: bool) {
    let fits = a.cols == b.rows
        && a.in_bounds()
        && b.in_bounds()
        && b.cols <= out_row_stride
        && Matrix::extent(a.rows, b.cols, out_row_stride, 1) <= out.len();
    assert!(fits, "whale-attention: [{}, {}] x [{}, {}] into {} values", a.rows, a.cols, b.rows, b.cols, out.len());
    // SAFETY: the assertion keeps every element gemm reads inside `a.data` and `b.data` and
    // every element it writes inside `out`, which nothing else borrows.
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            out.as_mut_ptr(),
            1,
            out_row_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
