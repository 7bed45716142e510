//! The key/value cache of one sequence: every layer's keys and values of the tokens fed so far,
//! which the cached decoding pass extends and its attention reads ([`super::step_kv`]).

use super::error::ModelError;
use crate::qwen3::dense::DenseSettings;
use candle_core::{DType, Device, Tensor};

/// Keys and values of one layer, `[B, num_key_value_heads, S, head_dim]`.
pub(super) type LayerKv = (Tensor, Tensor);

/// The keys and values of every token of one sequence so far, per layer.
///
/// Create one with [`DenseModel::new_cache`](super::DenseModel::new_cache) when a sequence starts
/// and drop it when the sequence leaves. Storage grows geometrically and is zero-initialised, so the slots past
/// [`KvCache::len`] are finite and can be read (and masked) as padding by a batched step.
/// Steps write into the storage in place, hence no `Clone`: [`KvCache::fork`] deep-copies.
pub struct KvCache {
    pub(super) layers: Vec<LayerKv>,
    pub(super) capacity: usize,
    pub(super) len: usize,
    pub(super) num_layers: usize,
    pub(super) num_kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) dtype: DType,
    pub(super) device: Device,
}

impl KvCache {
    /// How many tokens of the sequence have been fed to the model.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of device memory held by this cache.
    pub fn allocated_bytes(&self) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim * self.capacity * self.dtype.size_in_bytes()
    }

    /// Forgets every token from `len` on (no-op when `len >= self.len()`), e.g. to keep only
    /// the prefix a re-rendered conversation shares with what was fed before.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// An independent copy: several continuations of one prefilled prompt can each take one.
    pub fn fork(&self) -> Result<Self, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(|(keys, values)| Ok((keys.copy()?, values.copy()?)))
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { layers, device: self.device.clone(), ..*self })
    }

    /// An independent copy of the first `len` tokens, in storage of its own sized for them: a
    /// sequence whose prompt begins with tokens another sequence has fed continues from this
    /// copy and feeds only the rest. An error when the cache holds fewer than `len` tokens.
    pub fn fork_prefix(&self, len: usize) -> Result<Self, ModelError> {
        if len > self.len {
            return Err(ModelError::Input(format!("a prefix of {len} tokens of a cache holding {}", self.len)));
        }
        if len == 0 {
            return Ok(Self { layers: Vec::new(), capacity: 0, len: 0, device: self.device.clone(), ..*self });
        }
        let capacity = len.next_multiple_of(16);
        let shape = (1, self.num_kv_heads, capacity, self.head_dim);
        let copy = |stored: &Tensor| -> candle_core::Result<Tensor> {
            let fresh = Tensor::zeros(shape, self.dtype, &self.device)?;
            fresh.slice_set(&stored.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
            Ok(fresh)
        };
        let layers = (self.layers.iter())
            .map(|(keys, values)| Ok((copy(keys)?, copy(values)?)))
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { layers, capacity, len, device: self.device.clone(), ..*self })
    }

    /// Whether this cache was made for a model of `config` in `dtype` on `device`.
    pub(super) fn fits(&self, config: &DenseSettings, dtype: DType, device: &Device) -> bool {
        self.num_layers == config.num_hidden_layers
            && self.num_kv_heads == config.num_key_value_heads
            && self.head_dim == config.head_dim
            && self.dtype == dtype
            && self.device.same_device(device)
    }

    /// Makes room for at least `needed` tokens, keeping what is stored.
    pub(super) fn reserve(&mut self, needed: usize) -> candle_core::Result<()> {
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = needed.max(2 * self.capacity).next_multiple_of(16);
        let shape = (1, self.num_kv_heads, capacity, self.head_dim);
        let mut grown = Vec::with_capacity(self.num_layers);
        for layer in 0..self.num_layers {
            let keys = Tensor::zeros(shape, self.dtype, &self.device)?;
            let values = Tensor::zeros(shape, self.dtype, &self.device)?;
            if let Some((old_keys, old_values)) = self.layers.get(layer) {
                keys.slice_set(old_keys, 2, 0)?;
                values.slice_set(old_values, 2, 0)?;
            }
            grown.push((keys, values));
        }
        self.layers = grown;
        self.capacity = capacity;
        Ok(())
    }

    /// Stores `[1, kv_heads, n, head_dim]` keys and values at slots `len..len + n` of one layer.
    pub(super) fn write(&self, layer: usize, keys: &Tensor, values: &Tensor) -> candle_core::Result<()> {
        let (stored_keys, stored_values) = &self.layers[layer];
        stored_keys.slice_set(&keys.contiguous()?, 2, self.len)?;
        stored_values.slice_set(&values.contiguous()?, 2, self.len)
    }
}
