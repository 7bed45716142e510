//! Per-row cross-entropy of logits as one CPU op with its backward pass.
//!
//! The logits of a training micro-batch are the largest tensor of the step (`[scored tokens,
//! vocab]`); composed from tensor ops, the log-softmax and its gradient pass over them a dozen
//! times. Here the forward pass reads each row twice (max, then the sum of exponentials) and the
//! backward pass writes `dy · (softmax − one_hot(target))` in one pass, recovering
//! `logsumexp = loss + logit[target]` from the forward pass's output.

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::host::{f32_slice, map_rows, on_host, PARALLEL_ELEMENTS};
use super::vectorised::{exp, sum_exp};

/// `logsumexp(logits_i) − logits_i[targets_i]` for each row `i` of `[N, V]` logits.
pub(super) struct CrossEntropy {
    targets: Vec<u32>,
}

impl CrossEntropy {
    pub(super) fn new(targets: Vec<u32>) -> Self {
        Self { targets }
    }

    /// The vocabulary size `V`, checked against the targets.
    fn vocab(&self, dims: &[usize]) -> candle_core::Result<usize> {
        let &[rows, vocab] = dims else {
            candle_core::bail!("whale-cross-entropy: logits {dims:?} are not [N, V]");
        };
        if vocab == 0 {
            candle_core::bail!("whale-cross-entropy: logits {dims:?} over an empty vocabulary");
        }
        if rows != self.targets.len() {
            candle_core::bail!("whale-cross-entropy: {rows} rows of logits for {} targets", self.targets.len());
        }
        if let Some(target) = self.targets.iter().find(|&&t| t as usize >= vocab) {
            candle_core::bail!("whale-cross-entropy: target {target} outside a vocabulary of {vocab}");
        }
        Ok(vocab)
    }
}

impl CustomOp1 for CrossEntropy {
    fn name(&self) -> &'static str {
        "whale-cross-entropy"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let vocab = self.vocab(layout.dims())?;
        let logits = f32_slice(storage, layout, self.name())?;
        let loss = |(row, &target): (&[f32], &u32)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            max + sum_exp(row, max).ln() - row[target as usize]
        };
        let losses: Vec<f32> = if logits.len() >= PARALLEL_ELEMENTS {
            logits.par_chunks(vocab).zip(&self.targets).map(loss).collect()
        } else {
            logits.chunks(vocab).zip(&self.targets).map(loss).collect()
        };
        Ok((CpuStorage::F32(losses), Shape::from(self.targets.len())))
    }

    /// `d logits_i = dy_i · (softmax(logits_i) − one_hot(target_i))`.
    fn bwd(&self, logits: &Tensor, losses: &Tensor, d_losses: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let vocab = self.vocab(logits.dims())?;
        let grad = on_host([logits, losses, d_losses], self.name(), |[values, losses, d_losses]| {
            map_rows(values, vocab, |x, out, row| {
                let (target, dy) = (self.targets[row] as usize, d_losses[row]);
                let log_normaliser = losses[row] + x[target];
                out.iter_mut().zip(x).for_each(|(g, &x)| *g = dy * exp(x - log_normaliser));
                out[target] -= dy;
            })
        })?;
        Ok(Some(Tensor::from_vec(grad, logits.shape(), &Device::Cpu)?))
    }
}
