//! Causal grouped-query attention over packed sequences, as one CPU op with its backward pass.
//!
//! Composed from tensor ops, attention writes the `[B, heads, T, T]` scores several times
//! (scaled, masked, normalised) and autograd as many again, each allocated, zeroed and
//! accumulated: on the small models that memory traffic cost more than the matrix products.
//! This op runs, per sequence and key/value head, two matrix products and one pass over the
//! scores forward and keeps only the probabilities `P`. The backward pass is four products and
//! one pass:
//! `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ⊙ (dP − rowsum(P ⊙ dP)) · scale`, `dQ = dS K`, `dK = dSᵀ Q`.
//!
//! The sequences come packed, end to end without padding (`[Σ len, heads·d]` token rows, as
//! the projections make them), so no product or mask covers a padded position; each attends
//! causally within itself. Inside, the op works head-major per sequence. The query heads that
//! share a key/value head read the same keys, so grouped keys are never copied, and a block of
//! [`QUERY_BLOCK`] steps of all of them is one matrix; each block multiplies only the keys up to
//! its last step, which skips about half of the products.

use std::ops::Range;
use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::host::{f32_slice, on_host};
use super::vectorised::{dot, exp, sum};

/// Query steps per block.
const QUERY_BLOCK: usize = 64;

/// `softmax(q kᵀ · scale + causal mask) v` within each packed sequence, for `q` `[Σ len, H·d]`
/// and `k`, `v` `[Σ len, KV·d]` (query head `h` reads key/value head `h / (H / KV)`).
pub(super) struct Attention {
    layout: PackedLayout,
    scale: f32,
    /// What the backward pass reads, set by the forward pass.
    forward: Mutex<Option<SavedForward>>,
}

struct SavedForward {
    /// Per task `[len · groups, len]`, zero above the diagonal.
    probs: Vec<f32>,
    /// The inputs, head-major (see [`PackedLayout::head_major`]).
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Attention {
    /// The op for inputs that passed [`check_shapes`] with `heads` and `kv_heads`.
    pub(super) fn new(lengths: &[usize], heads: usize, kv_heads: usize, head_dim: usize, scale: f64) -> Self {
        let layout = PackedLayout::new(lengths, heads, kv_heads, head_dim);
        Self { layout, scale: scale as f32, forward: Mutex::default() }
    }

    fn forward_state(&self) -> candle_core::Result<std::sync::MutexGuard<'_, Option<SavedForward>>> {
        self.forward.lock().map_err(|_| candle_core::Error::msg("whale-attention: poisoned lock"))
    }
}

/// The query and key/value head counts of `q` `[Σ len, H·d]` and `k`, `v` `[Σ len, KV·d]`, or
/// why they do not fit each other, the sequences and the head size.
pub(super) fn check_shapes(
    q: &[usize],
    k: &[usize],
    v: &[usize],
    lengths: &[usize],
    head_dim: usize,
) -> candle_core::Result<(usize, usize)> {
    let (rows, d) = (lengths.iter().sum::<usize>(), head_dim);
    let (&[q_rows, q_width], &[k_rows, k_width]) = (q, k) else {
        candle_core::bail!("whale-attention: q {q:?} and k {k:?} are not [rows, heads·d]");
    };
    let consistent = d > 0
        && rows > 0
        && q_rows == rows
        && k_rows == rows
        && v == k
        && q_width % d == 0
        && k_width % d == 0
        && k_width > 0
        && q_width % k_width == 0;
    if !consistent {
        candle_core::bail!(
            "whale-attention: q {q:?}, k {k:?}, v {v:?}, heads of {d} and sequences of {rows} rows in all do not fit"
        );
    }
    Ok((q_width / d, k_width / d))
}

/// Where each (sequence, key/value head) task's values sit, head-major: per sequence
/// `[KV, len, groups, d]` for queries and `[KV, len, d]` for keys and values, and
/// `[KV, len · groups, len]` probabilities.
struct PackedLayout {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Each sequence's first token row and length.
    sequences: Vec<(usize, usize)>,
    tasks: Vec<Task>,
}

/// One sequence and key/value head: `steps` steps of `groups` query heads.
struct Task {
    steps: usize,
    queries: Range<usize>,
    keys: Range<usize>,
    probs: Range<usize>,
}

impl PackedLayout {
    fn new(lengths: &[usize], heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        let groups = heads / kv_heads;
        let (mut row, mut query, mut key, mut prob) = (0, 0, 0, 0);
        let mut sequences = Vec::with_capacity(lengths.len());
        let mut tasks = Vec::with_capacity(lengths.len() * kv_heads);
        for &steps in lengths {
            sequences.push((row, steps));
            row += steps;
            for _ in 0..kv_heads {
                let (q_len, kv_len, p_len) = (steps * groups * head_dim, steps * head_dim, steps * groups * steps);
                tasks.push(Task {
                    steps,
                    queries: query..query + q_len,
                    keys: key..key + kv_len,
                    probs: prob..prob + p_len,
                });
                (query, key, prob) = (query + q_len, key + kv_len, prob + p_len);
            }
        }
        Self { heads, kv_heads, head_dim, sequences, tasks }
    }

    fn groups(&self) -> usize {
        self.heads / self.kv_heads
    }

    fn probs_len(&self) -> usize {
        self.tasks.last().map_or(0, |task| task.probs.end)
    }

    /// `[rows, heads·d]` token rows (`heads` is H or KV) as the head-major task blocks.
    fn head_major(&self, rows: &[f32], heads: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows.len()];
        self.for_each_head(heads, |token_major, head_major| {
            out[head_major..][..self.head_dim].copy_from_slice(&rows[token_major..][..self.head_dim]);
        });
        out
    }

    /// The inverse of [`Self::head_major`].
    fn token_major(&self, values: &[f32], heads: usize) -> Vec<f32> {
        let mut out = vec![0f32; values.len()];
        self.for_each_head(heads, |token_major, head_major| {
            out[token_major..][..self.head_dim].copy_from_slice(&values[head_major..][..self.head_dim]);
        });
        out
    }

    /// Calls `visit(token-major offset, head-major offset)` for every head of every token row.
    fn for_each_head(&self, heads: usize, mut visit: impl FnMut(usize, usize)) {
        let (d, groups) = (self.head_dim, heads / self.kv_heads);
        for &(first, steps) in &self.sequences {
            for step in 0..steps {
                for head in 0..heads {
                    let head_major =
                        first * heads * d + (((head / groups) * steps + step) * groups + head % groups) * d;
                    visit(((first + step) * heads + head) * d, head_major);
                }
            }
        }
    }

    /// Each task's part of `values`, which holds the tasks' blocks end to end.
    fn split<'a>(&self, values: &'a mut [f32], part: impl Fn(&Task) -> &Range<usize>) -> Vec<&'a mut [f32]> {
        let mut rest = values;
        let mut parts = Vec::with_capacity(self.tasks.len());
        for task in &self.tasks {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(part(task).len());
            parts.push(head);
            rest = tail;
        }
        parts
    }
}

/// Query blocks of a task: the rows of steps `[step, step + len)` for all its query heads.
fn blocks(steps: usize) -> impl Iterator<Item = Range<usize>> {
    (0..steps.div_ceil(QUERY_BLOCK)).map(move |index| index * QUERY_BLOCK..((index + 1) * QUERY_BLOCK).min(steps))
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
        let layout = &self.layout;
        let q = layout.head_major(f32_slice(q_storage, q_layout, self.name())?, layout.heads);
        let k = layout.head_major(f32_slice(k_storage, k_layout, self.name())?, layout.kv_heads);
        let v = layout.head_major(f32_slice(v_storage, v_layout, self.name())?, layout.kv_heads);
        let (d, groups) = (layout.head_dim, layout.groups());
        let mut out = vec![0f32; q.len()];
        let mut probs = vec![0f32; layout.probs_len()];
        let outs = layout.split(&mut out, |task| &task.queries);
        let task_probs = layout.split(&mut probs, |task| &task.probs);
        (&layout.tasks, outs, task_probs).into_par_iter().for_each(|(task, out, probs)| {
            let (q, k, v) = (&q[task.queries.clone()], &k[task.keys.clone()], &v[task.keys.clone()]);
            let keys = task.steps;
            for block in blocks(task.steps) {
                let (rows, visible) = (block.start * groups..block.end * groups, block.end);
                let scores = &mut probs[rows.start * keys..];
                let queries = Matrix::rows(&q[rows.start * d..rows.end * d], rows.len(), d);
                matmul(scores, keys, queries, Matrix::rows(&k[..visible * d], visible, d).t(), false);
                for (i, row) in rows.clone().enumerate() {
                    causal_softmax(&mut scores[i * keys..][..visible], row / groups + 1, self.scale);
                }
                let p = Matrix { data: scores, rows: rows.len(), cols: visible, row_stride: keys, col_stride: 1 };
                let values = Matrix::rows(&v[..visible * d], visible, d);
                matmul(&mut out[rows.start * d..rows.end * d], d, p, values, false);
            }
        });
        let out = layout.token_major(&out, layout.heads);
        *self.forward_state()? = Some(SavedForward { probs, q, k, v });
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
        let layout = &self.layout;
        // The saved state is released here: candle runs a graph's backward pass once.
        let saved = self.forward_state()?.take();
        let Some(forward) = saved.filter(|f| f.probs.len() == layout.probs_len()) else {
            candle_core::bail!("whale-attention: backward pass without its forward pass");
        };
        let d_out = on_host([d_out], self.name(), |[d_out]| layout.head_major(d_out, layout.heads))?;
        let (dq, dk, dv) = self.gradients(&forward, &d_out);
        let tensor = |values: Vec<f32>, heads: usize, like: &Tensor| {
            Tensor::from_vec(layout.token_major(&values, heads), like.shape(), &Device::Cpu)
        };
        Ok((
            Some(tensor(dq, layout.heads, q)?),
            Some(tensor(dk, layout.kv_heads, k)?),
            Some(tensor(dv, layout.kv_heads, v)?),
        ))
    }
}

type Gradients = (Vec<f32>, Vec<f32>, Vec<f32>);

impl Attention {
    /// `dQ`, `dK` and `dV` (head-major) from the forward pass and `dO` (head-major).
    fn gradients(&self, forward: &SavedForward, d_out: &[f32]) -> Gradients {
        let layout = &self.layout;
        let (d, groups) = (layout.head_dim, layout.groups());
        let (mut dq, mut dk, mut dv) =
            (vec![0f32; forward.q.len()], vec![0f32; forward.k.len()], vec![0f32; forward.v.len()]);
        let parts = (
            layout.split(&mut dq, |t| &t.queries),
            layout.split(&mut dk, |t| &t.keys),
            layout.split(&mut dv, |t| &t.keys),
        );
        (&layout.tasks, parts.0, parts.1, parts.2).into_par_iter().for_each(|(task, dq, dk, dv)| {
            let probs = &forward.probs[task.probs.clone()];
            let (q, k, v) =
                (&forward.q[task.queries.clone()], &forward.k[task.keys.clone()], &forward.v[task.keys.clone()]);
            let d_out = &d_out[task.queries.clone()];
            let keys = task.steps;
            let mut scratch = vec![0f32; QUERY_BLOCK * groups * keys];
            for block in blocks(task.steps) {
                let (rows, visible) = (block.start * groups..block.end * groups, block.end);
                let p = Matrix {
                    data: &probs[rows.start * keys..],
                    rows: rows.len(),
                    cols: visible,
                    row_stride: keys,
                    col_stride: 1,
                };
                let queries = Matrix::rows(&q[rows.start * d..rows.end * d], rows.len(), d);
                let d_block = Matrix::rows(&d_out[rows.start * d..rows.end * d], rows.len(), d);
                let (k, v) = (Matrix::rows(&k[..visible * d], visible, d), Matrix::rows(&v[..visible * d], visible, d));
                matmul(&mut dv[..visible * d], d, p.t(), d_block, true);
                let ds = &mut scratch[..rows.len() * visible];
                matmul(ds, visible, d_block, v.t(), false);
                for (i, ds) in ds.chunks_mut(visible).enumerate() {
                    let p = &p.data[i * keys..][..visible];
                    let delta = dot(ds, p);
                    ds.iter_mut().zip(p).for_each(|(g, p)| *g = p * (*g - delta) * self.scale);
                }
                let ds = Matrix::rows(ds, rows.len(), visible);
                matmul(&mut dq[rows.start * d..rows.end * d], d, ds, k, false);
                matmul(&mut dk[..visible * d], d, ds.t(), queries, true);
            }
        });
        (dq, dk, dv)
    }
}

/// `scores[..visible] ← softmax(scores[..visible] · scale)` and zeros after.
fn causal_softmax(scores: &mut [f32], visible: usize, scale: f32) {
    let (seen, hidden) = scores.split_at_mut(visible.min(scores.len()));
    hidden.fill(0.0);
    let max = seen.iter().fold(f32::NEG_INFINITY, |max, &x| max.max(x * scale));
    seen.iter_mut().for_each(|x| *x = exp(*x * scale - max));
    let inverse = 1.0 / sum(seen);
    seen.iter_mut().for_each(|x| *x *= inverse);
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

    /// The number of values from the first element to just past the last (`None` on overflow).
    fn extent(rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> Option<usize> {
        if rows == 0 || cols == 0 {
            return Some(0);
        }
        (rows - 1).checked_mul(row_stride)?.checked_add((cols - 1).checked_mul(col_stride)?)?.checked_add(1)
    }

    fn in_bounds(&self) -> bool {
        Self::extent(self.rows, self.cols, self.row_stride, self.col_stride).is_some_and(|end| end <= self.data.len())
    }
}

/// `out = a b` (`out += a b` when `accumulate`) with `out` `[a.rows, b.cols]` at `out_row_stride`,
/// on the calling thread (the callers parallelise over tasks).
fn matmul(out: &mut [f32], out_row_stride: usize, a: Matrix, b: Matrix, accumulate: bool) {
    let fits = a.cols == b.rows
        && a.in_bounds()
        && b.in_bounds()
        && b.cols <= out_row_stride
        && Matrix::extent(a.rows, b.cols, out_row_stride, 1).is_some_and(|end| end <= out.len());
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
