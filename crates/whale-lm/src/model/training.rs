//! The training pass: the decoder over token rows `[B·T, width]` with whale's differentiable
//! kernels ([`crate::kernels`]).
//!
//! Autograd allocates, zeroes and accumulates a gradient for every tensor a pass makes, views
//! included, so this pass makes as few as it can: activations stay matrices from the embedding
//! to the final norm (the projections multiply them directly), each head's RMSNorm and rotary
//! embedding run on the projection's rows in place of a reshape and a transpose, and attention
//! takes and gives token rows. It computes what the cached decoding pass computes, to float
//! rounding.

use super::{Attention, DecoderLayer, PassInputs, Qwen3Model, RmsNorm, Rotary};
use crate::kernels;
use candle_core::Tensor;

/// What every layer of one training pass reads besides its input.
struct RowPass<'a> {
    batch: usize,
    /// `[B·T, head_dim / 2]`: the rotary angles of each token row's position.
    cos: Tensor,
    sin: Tensor,
    /// Additive, `[B, 1, 1, T, T]`.
    mask: &'a Tensor,
}

impl Qwen3Model {
    /// The final normalised hidden states `[B, T, hidden]` of a padded batch, differentiable.
    pub(super) fn training_hidden(&self, inputs: &PassInputs) -> candle_core::Result<Tensor> {
        let (batch, steps) = inputs.ids.dims2()?;
        let rows = batch * steps;
        let rotary = Rotary::new(&self.inv_freq, &inputs.positions, self.dtype)?;
        let half = rotary.cos.dim(2)?;
        let pass = RowPass {
            batch,
            cos: rotary.cos.reshape((rows, half))?,
            sin: rotary.sin.reshape((rows, half))?,
            mask: &inputs.mask,
        };
        let mut x = self.embed_tokens.index_select(&inputs.ids.flatten_all()?, 0)?;
        for layer in &self.layers {
            x = layer.forward_rows(&x, &pass)?;
        }
        self.norm.forward_rows(&x)?.reshape((batch, steps, self.config.hidden_size))
    }
}

impl DecoderLayer {
    fn forward_rows(&self, x: &Tensor, pass: &RowPass) -> candle_core::Result<Tensor> {
        let x = (x + self.attention.forward_rows(&self.input_layernorm.forward_rows(x)?, pass)?)?;
        &x + self.mlp.forward(&self.post_attention_layernorm.forward_rows(&x)?)?
    }
}

impl Attention {
    fn forward_rows(&self, x: &Tensor, pass: &RowPass) -> candle_core::Result<Tensor> {
        let q = kernels::rope(&self.q_norm.forward_rows(&self.q_proj.forward(x)?)?, &pass.cos, &pass.sin)?;
        let k = kernels::rope(&self.k_norm.forward_rows(&self.k_proj.forward(x)?)?, &pass.cos, &pass.sin)?;
        let v = self.v_proj.forward(x)?;
        let attended = kernels::attention(&q, &k, &v, pass.mask, pass.batch, self.head_dim, self.scale())?;
        self.o_proj.forward(&attended)
    }
}

impl RmsNorm {
    /// Normalises each run of `weight.len()` values of the rows (each head of a projection).
    fn forward_rows(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        kernels::rms_norm(x, &self.weight, self.eps)
    }
}
