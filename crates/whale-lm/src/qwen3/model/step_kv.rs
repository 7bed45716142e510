//! Where one decoding step's attention stores the chunk's keys and values and reads every key
//! it attends to.
//!
//! On the CPU in f32 each layer writes the chunk into the sequences' own caches and attends
//! over them where they lie ([`kernels::cached_attention`]): no cached key is copied or padded,
//! and a sequence's attention reads only its own keys. Elsewhere (a GPU, bf16, f16) the step
//! gathers each cache once into a padded `[B, kv_heads, past_max + chunk_max, head_dim]` buffer
//! per layer, each layer writes its chunk into the buffer's last slots, and candle's products
//! attend over it under a mask; the chunk is copied into the caches after the pass.

use super::kv_cache::{KvCache, LayerKv};
use candle_core::{DType, Device, Storage, Tensor};
use whale_kernels::{self as kernels, AttentionShape, CachedSequence};

/// The keys and values one step's layers attend over.
pub(super) enum StepKv<'a> {
    /// CPU, f32: the sequences' caches, which must have room for their chunks.
    InCaches { caches: &'a [&'a KvCache], chunk_lens: &'a [usize] },
    /// Padded copies of the caches with slots for the chunk, and the mask that keeps each
    /// sequence to its own keys.
    Gathered { layers: Vec<LayerKv>, past_max: usize, mask: Tensor },
}

impl<'a> StepKv<'a> {
    /// Whether a step of a model in `dtype` on `device` gathers the caches into padded
    /// buffers, which needs every cache to have room for the longest cache of the step; in
    /// place, each needs room for its own chunk only.
    pub(super) fn gathers(device: &Device, dtype: DType) -> bool {
        !(device.is_cpu() && dtype == DType::F32)
    }

    /// For a step feeding `chunk_lens[i]` tokens to the sequence of `caches[i]`, whose caches
    /// have the room [`Self::gathers`] says.
    pub(super) fn new(
        caches: &'a [&'a KvCache],
        chunk_lens: &'a [usize],
        device: &Device,
        dtype: DType,
    ) -> candle_core::Result<Self> {
        if !Self::gathers(device, dtype) {
            return Ok(Self::InCaches { caches, chunk_lens });
        }
        let past_lens: Vec<usize> = caches.iter().map(|cache| cache.len).collect();
        let past_max = past_lens.iter().copied().max().unwrap_or(0);
        let chunk_max = chunk_lens.iter().copied().max().unwrap_or(0);
        let gather = |pick: fn(&LayerKv) -> &Tensor, layer: usize| -> candle_core::Result<Tensor> {
            let padded = caches
                .iter()
                .map(|cache| pick(&cache.layers[layer]).narrow(2, 0, past_max))
                .collect::<candle_core::Result<Vec<_>>>()?;
            let first = pick(&caches[0].layers[layer]);
            let (_, kv_heads, _, head_dim) = first.dims4()?;
            let chunk = Tensor::zeros((caches.len(), kv_heads, chunk_max, head_dim), first.dtype(), first.device())?;
            Tensor::cat(&[Tensor::cat(&padded, 0)?, chunk], 2)
        };
        let layers = (0..caches[0].num_layers)
            .map(|layer| Ok((gather(|kv| &kv.0, layer)?, gather(|kv| &kv.1, layer)?)))
            .collect::<candle_core::Result<_>>()?;
        let mask = kernels::attention_bias(
            caches.len(),
            chunk_max,
            past_max + chunk_max,
            |query| past_max + query,
            |row, query, key| {
                if key < past_max {
                    key < past_lens[row]
                } else {
                    key - past_max <= query && query < chunk_lens[row]
                }
            },
            device,
        )?;
        Ok(Self::Gathered { layers, past_max, mask })
    }

    /// Stores one layer's chunk keys and values (`[B, kv_heads, chunk_max, head_dim]`) and
    /// returns the attention of `queries` (`[B, heads, chunk_max, head_dim]`) over every key the
    /// layer holds for each sequence, in the queries' shape.
    pub(super) fn attend(
        &self,
        layer: usize,
        queries: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        scale: f64,
    ) -> candle_core::Result<Tensor> {
        match self {
            Self::InCaches { caches, chunk_lens } => {
                for (row, (cache, &len)) in caches.iter().zip(chunk_lens.iter()).enumerate() {
                    let row_keys = keys.narrow(0, row, 1)?.narrow(2, 0, len)?;
                    cache.write(layer, &row_keys, &values.narrow(0, row, 1)?.narrow(2, 0, len)?)?;
                }
                attend_in_caches(caches, chunk_lens, layer, queries, scale)
            }
            Self::Gathered { layers, past_max, mask } => {
                let (stored_keys, stored_values) = &layers[layer];
                stored_keys.slice_set(keys, 2, *past_max)?;
                stored_values.slice_set(values, 2, *past_max)?;
                kernels::composed_attention(queries, stored_keys, stored_values, mask, scale, |scores| {
                    candle_nn::ops::softmax_last_dim(&scores.contiguous()?)
                })
            }
        }
    }

    /// Copies each sequence's share of the chunk into its own cache where the pass left it in
    /// the gathered buffers (an in-cache step wrote it there already).
    pub(super) fn write_back(&self, caches: &[&KvCache], lens: &[usize]) -> candle_core::Result<()> {
        let Self::Gathered { layers, past_max, .. } = self else { return Ok(()) };
        for (row, (cache, &len)) in caches.iter().zip(lens).enumerate() {
            for (layer, (keys, values)) in layers.iter().enumerate() {
                let keys = keys.narrow(0, row, 1)?.narrow(2, *past_max, len)?;
                let values = values.narrow(0, row, 1)?.narrow(2, *past_max, len)?;
                cache.write(layer, &keys, &values)?;
            }
        }
        Ok(())
    }
}

/// [`kernels::cached_attention`] over the caches' storage, which holds each chunk already.
fn attend_in_caches(
    caches: &[&KvCache],
    chunk_lens: &[usize],
    layer: usize,
    queries: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (rows, heads, steps, head_dim) = queries.dims4()?;
    let queries = queries.contiguous()?;
    let (query_storage, query_layout) = queries.storage_and_layout();
    let query_values = &cpu_f32(&query_storage)?[query_layout.start_offset()..];
    let guards: Vec<_> = caches
        .iter()
        .map(|cache| {
            let (keys, values) = &cache.layers[layer];
            (keys.storage_and_layout(), values.storage_and_layout())
        })
        .collect();
    let sequences = guards
        .iter()
        .zip(caches.iter().zip(chunk_lens))
        .map(|(((keys, key_layout), (values, value_layout)), (cache, &chunk))| {
            Ok(CachedSequence {
                keys: &cpu_f32(keys)?[key_layout.start_offset()..],
                values: &cpu_f32(values)?[value_layout.start_offset()..],
                capacity: cache.capacity,
                past: cache.len,
                chunk,
            })
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    let shape = AttentionShape { heads, kv_heads: caches[0].num_kv_heads, steps, head_dim, scale: scale as f32 };
    let attended = kernels::cached_attention(query_values, &sequences, shape);
    Tensor::from_vec(attended, (rows, heads, steps, head_dim), &Device::Cpu)
}

/// The f32 values of CPU storage.
fn cpu_f32(storage: &Storage) -> candle_core::Result<&[f32]> {
    match storage {
        Storage::Cpu(storage) => storage.as_slice::<f32>(),
        _ => candle_core::bail!("the decoding kernel needs CPU storage"),
    }
}
