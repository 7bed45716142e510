//! llama.cpp's tensor names for a Llama or Qwen2 model and the Hugging Face names they came from,
//! and the one layout change llama.cpp's converter makes on the way for a Llama: it reorders the
//! rows of the query and key projections for its own rotary embedding. (A Qwen2's rotary
//! embedding is llama.cpp's NEOX one, the Hugging Face rotation, so its rows are stored as they
//! are; its blocks also have the biases `attn_q.bias`, `attn_k.bias` and `attn_v.bias`.)
//!
//! Hugging Face's `LlamaForCausalLM` rotates the two halves of each head (`rotate_half`: row `i`
//! pairs with row `i + head_dim / 2`); llama.cpp rotates adjacent rows (`2i` with `2i + 1`). Its
//! converter therefore interleaves the halves of every head: HF row `h * d + a * d/2 + i` is
//! stored as GGUF row `h * d + 2i + a` (d the head size, a in {0, 1}). transformers' GGUF loader
//! undoes this, and so does [`unpermute_rotary_rows`], with the query heads for `attn_q` and the
//! key-value heads for `attn_k`.

use crate::architecture::GgufArchitecture;
use candle_core::Tensor;

/// What a GGUF tensor becomes in a Hugging Face checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfTensor {
    pub name: String,
    pub rows: RowOrder,
}

/// Whether the rows are stored as Hugging Face has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    AsStored,
    /// Rotary rows interleaved per head: the query projection (with the query heads) or the key
    /// projection (with the key-value heads).
    RotaryQuery,
    RotaryKey,
}

/// The weights of a block: llama.cpp's leaf name, Hugging Face's, and a Llama's row order.
const LAYER_TENSORS: [(&str, &str, RowOrder); 9] = [
    ("attn_norm", "input_layernorm", RowOrder::AsStored),
    ("ffn_norm", "post_attention_layernorm", RowOrder::AsStored),
    ("attn_q", "self_attn.q_proj", RowOrder::RotaryQuery),
    ("attn_k", "self_attn.k_proj", RowOrder::RotaryKey),
    ("attn_v", "self_attn.v_proj", RowOrder::AsStored),
    ("attn_output", "self_attn.o_proj", RowOrder::AsStored),
    ("ffn_gate", "mlp.gate_proj", RowOrder::AsStored),
    ("ffn_up", "mlp.up_proj", RowOrder::AsStored),
    ("ffn_down", "mlp.down_proj", RowOrder::AsStored),
];

pub const EMBEDDING: &str = "token_embd.weight";
pub const OUTPUT: &str = "output.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";

/// The biased projections of a Qwen2 block: llama.cpp's leaf name and Hugging Face's.
const BIAS_TENSORS: [(&str, &str); 3] =
    [("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj")];

/// The Hugging Face tensor of a GGUF tensor name of a model of `architecture`; `None` for a name
/// outside its layout.
pub fn hf_tensor(gguf_name: &str, architecture: GgufArchitecture) -> Option<HfTensor> {
    let top = match gguf_name {
        EMBEDDING => Some("model.embed_tokens.weight"),
        OUTPUT_NORM => Some("model.norm.weight"),
        OUTPUT => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = top {
        return Some(HfTensor { name: name.to_string(), rows: RowOrder::AsStored });
    }
    let (layer, rest) = gguf_name.strip_prefix("blk.")?.split_once('.')?;
    let layer = canonical_layer(layer)?;
    if let Some(leaf) = rest.strip_suffix(".bias") {
        let (_, hf_leaf) = BIAS_TENSORS.iter().find(|(gguf_leaf, _)| *gguf_leaf == leaf)?;
        let name = format!("model.layers.{layer}.{hf_leaf}.bias");
        return architecture.has_qkv_bias().then_some(HfTensor { name, rows: RowOrder::AsStored });
    }
    let leaf = rest.strip_suffix(".weight")?;
    let (_, hf_leaf, rows) = LAYER_TENSORS.iter().find(|(gguf_leaf, _, _)| *gguf_leaf == leaf)?;
    let rows = if architecture.interleaves_rotary_rows() { *rows } else { RowOrder::AsStored };
    Some(HfTensor { name: format!("model.layers.{layer}.{hf_leaf}.weight"), rows })
}

/// A layer number as llama.cpp writes it: plain decimal, so that "01" or "+1" is not a second
/// name for block 1 (two tensors would then become one Hugging Face tensor).
fn canonical_layer(text: &str) -> Option<usize> {
    text.parse().ok().filter(|layer: &usize| layer.to_string() == text)
}

/// Every GGUF tensor a model of `architecture` with `layers` blocks needs (the output projection
/// is optional: without it the embedding is tied), made one at a time as they are looked up: a
/// hostile block count would otherwise make them all before the first missing one is found.
pub fn required_tensors(layers: usize, architecture: GgufArchitecture) -> impl Iterator<Item = String> {
    let biases: &[(&str, &str)] = if architecture.has_qkv_bias() { &BIAS_TENSORS } else { &[] };
    let blocks = (0..layers).flat_map(move |layer| {
        let weights = LAYER_TENSORS.iter().map(move |(leaf, _, _)| format!("blk.{layer}.{leaf}.weight"));
        weights.chain(biases.iter().map(move |(leaf, _)| format!("blk.{layer}.{leaf}.bias")))
    });
    [EMBEDDING, OUTPUT_NORM].into_iter().map(str::to_string).chain(blocks)
}

/// Undoes llama.cpp's per-head interleaving of rotary rows (see the module docs) on a
/// `(heads * head_dim, columns)` matrix.
pub fn unpermute_rotary_rows(weight: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, columns) = weight.dims2()?;
    if heads == 0 || rows % (2 * heads) != 0 {
        candle_core::bail!("{rows} rows are not {heads} heads of an even size");
    }
    let half = rows / heads / 2;
    weight.reshape((heads, half, 2, columns))?.transpose(1, 2)?.contiguous()?.reshape((rows, columns))
}
