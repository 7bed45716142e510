//! Reaching the f32 values of CPU tensors, and mapping a function over rows in parallel when
//! they are many: what every fused kernel's forward and backward pass starts from.

use candle_core::{CpuStorage, Layout, Storage, StorageRef, Tensor};
use rayon::prelude::*;

/// Rows of at least this many elements in all go to rayon's pool.
pub(super) const PARALLEL_ELEMENTS: usize = 1 << 15;

/// Runs `read` on the values of CPU f32 tensors, made contiguous first: how the backward passes,
/// which get tensors rather than storages, reach their inputs.
pub(super) fn on_host<const N: usize, R>(
    tensors: [&Tensor; N],
    op: &str,
    read: impl FnOnce([&[f32]; N]) -> R,
) -> candle_core::Result<R> {
    let contiguous = tensors.iter().map(|t| t.contiguous()).collect::<candle_core::Result<Vec<_>>>()?;
    let hosts: Vec<(StorageRef<'_>, &Layout)> = contiguous.iter().map(Tensor::storage_and_layout).collect();
    let mut slices = Vec::with_capacity(N);
    for (storage, layout) in &hosts {
        let Storage::Cpu(storage) = &**storage else {
            candle_core::bail!("{op}: expected a CPU tensor");
        };
        slices.push(f32_slice(storage, layout, op)?);
    }
    let slices: [&[f32]; N] =
        slices.try_into().map_err(|_| candle_core::Error::msg("on_host: one slice per tensor"))?;
    Ok(read(slices))
}

/// The values `layout` covers in f32 `storage`, which must be contiguous; errors name `op`.
pub(super) fn f32_slice<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else {
        candle_core::bail!("{op}: expected f32 storage");
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => candle_core::bail!("{op}: expected a contiguous tensor"),
    }
}

/// Applies `row_op(input_row, output_row, row_index)` to every row of `dim` elements.
pub(super) fn map_rows(input: &[f32], dim: usize, row_op: impl Fn(&[f32], &mut [f32], usize) + Sync) -> Vec<f32> {
    let mut output = vec![0f32; input.len()];
    if input.len() >= PARALLEL_ELEMENTS {
        output.par_chunks_mut(dim).zip(input.par_chunks(dim)).enumerate().for_each(|(i, (out, x))| row_op(x, out, i));
    } else {
        output.chunks_mut(dim).zip(input.chunks(dim)).enumerate().for_each(|(i, (out, x))| row_op(x, out, i));
    }
    output
}
