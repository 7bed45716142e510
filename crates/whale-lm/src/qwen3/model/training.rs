//! The training pass: the decoder over sequences packed end to end, token rows
//! `[Σ len, width]`, with whale's differentiable kernels ([`whale_kernels`]).
//!
//! Packing leaves padding out of every product: a padded batch of similar-length examples
//! still spends a fifth of its positions on padding (16 GSM8K examples in two micro-batches of
//! 8: 4,384 positions for 3,481 tokens). Autograd allocates, zeroes and accumulates a gradient
//! for every tensor a pass makes, views included, so the pass also makes as few as it can:
//! activations stay matrices from the embedding to the final norm (the projections multiply
//! them directly), each head's RMSNorm and rotary embedding run on the projection's rows in
//! place of a reshape and a transpose, and attention takes and gives token rows. It computes
//! what the cached decoding pass computes, to float rounding.

use super::{input_error, Attention, DecoderLayer, DenseModel, ModelError, RmsNorm, Rotary};
use crate::qwen3::dense::DenseConfig;
use candle_core::Tensor;
use whale_kernels as kernels;

/// What every layer of one training pass reads besides its input.
struct PackedPass {
    /// The sequences' lengths, in row order.
    lengths: Vec<usize>,
    /// `[Σ len, head_dim / 2]`: the rotary angles of each token row's position.
    cos: Tensor,
    sin: Tensor,
}

impl<C: DenseConfig> DenseModel<C> {
    /// The final normalised hidden states `[Σ len, hidden]` of `sequences` packed end to end,
    /// differentiable. Each sequence attends only to itself, causally, and its positions count
    /// from 0. Empty sequences add no rows.
    pub fn packed_hidden(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError> {
        let lengths: Vec<usize> = sequences.iter().map(|tokens| tokens.len()).collect();
        let ids: Vec<u32> = sequences.concat();
        if ids.is_empty() {
            return Err(input_error("no tokens to run"));
        }
        self.check_vocabulary(&ids)?;
        let positions: Vec<f32> = lengths.iter().flat_map(|&len| (0..len).map(|at| at as f32)).collect();
        let rows = ids.len();
        let rotary = Rotary::new(&self.inv_freq, &Tensor::from_vec(positions, (1, rows), &self.device)?, self.dtype)?;
        let half = rotary.cos.dim(2)?;
        let pass =
            PackedPass { lengths, cos: rotary.cos.reshape((rows, half))?, sin: rotary.sin.reshape((rows, half))? };
        let mut x = self.embed_tokens.index_select(&Tensor::from_vec(ids, rows, &self.device)?, 0)?;
        for layer in &self.layers {
            x = layer.forward_packed(&x, &pass)?;
        }
        Ok(self.norm.forward_rows(&x)?)
    }
}

impl DecoderLayer {
    fn forward_packed(&self, x: &Tensor, pass: &PackedPass) -> candle_core::Result<Tensor> {
        let x = (x + self.attention.forward_packed(&self.input_layernorm.forward_rows(x)?, pass)?)?;
        &x + self.mlp.forward(&self.post_attention_layernorm.forward_rows(&x)?)?
    }
}

impl Attention {
    fn forward_packed(&self, x: &Tensor, pass: &PackedPass) -> candle_core::Result<Tensor> {
        let q = kernels::rope(&normed_rows(self.q_norm.as_ref(), self.q_proj.forward(x)?)?, &pass.cos, &pass.sin)?;
        let k = kernels::rope(&normed_rows(self.k_norm.as_ref(), self.k_proj.forward(x)?)?, &pass.cos, &pass.sin)?;
        let v = self.v_proj.forward(x)?;
        let attended = kernels::attention(&q, &k, &v, &pass.lengths, self.head_dim, self.scale())?;
        self.o_proj.forward(&attended)
    }
}

/// Each head of a projection normalised by `norm`, or as it is when the model has no such norm.
fn normed_rows(norm: Option<&RmsNorm>, x: Tensor) -> candle_core::Result<Tensor> {
    match norm {
        Some(norm) => norm.forward_rows(&x),
        None => Ok(x),
    }
}

impl RmsNorm {
    /// Normalises each run of `weight.len()` values of the rows (each head of a projection).
    fn forward_rows(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        kernels::rms_norm(x, &self.weight, self.eps)
    }
}
