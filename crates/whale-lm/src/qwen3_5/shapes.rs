//! The parameters of a Qwen3.5 model, by checkpoint name and shape: what the model creates and
//! loads, the checkpoint's weight files are checked against, and LoRA adapters target.

use super::config::{LayerKind, Qwen35Config};

/// Every parameter of a model with this configuration: its checkpoint name and shape.
pub fn parameter_shapes(config: &Qwen35Config) -> Vec<(String, Vec<usize>)> {
    let prefix = config.weight_prefix();
    let (h, d) = (config.hidden_size, config.head_dim);
    let (heads, kv) = (config.num_attention_heads, config.num_key_value_heads);
    let (conv, vd, hv) = (config.conv_dim(), config.linear_value_dim(), config.linear_num_value_heads);
    let mut shapes = vec![(format!("{prefix}embed_tokens.weight"), vec![config.vocab_size, h])];
    for (layer, kind) in config.layer_types.iter().enumerate() {
        let mixer: Vec<(&str, Vec<usize>)> = match kind {
            LayerKind::LinearAttention => vec![
                ("linear_attn.in_proj_qkv.weight", vec![conv, h]),
                ("linear_attn.in_proj_z.weight", vec![vd, h]),
                ("linear_attn.in_proj_b.weight", vec![hv, h]),
                ("linear_attn.in_proj_a.weight", vec![hv, h]),
                ("linear_attn.conv1d.weight", vec![conv, 1, config.linear_conv_kernel_dim]),
                ("linear_attn.dt_bias", vec![hv]),
                ("linear_attn.A_log", vec![hv]),
                ("linear_attn.norm.weight", vec![config.linear_value_head_dim]),
                ("linear_attn.out_proj.weight", vec![h, vd]),
            ],
            LayerKind::FullAttention => vec![
                ("self_attn.q_proj.weight", vec![2 * heads * d, h]),
                ("self_attn.k_proj.weight", vec![kv * d, h]),
                ("self_attn.v_proj.weight", vec![kv * d, h]),
                ("self_attn.o_proj.weight", vec![h, heads * d]),
                ("self_attn.q_norm.weight", vec![d]),
                ("self_attn.k_norm.weight", vec![d]),
            ],
        };
        let common = [
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![config.intermediate_size, h]),
            ("mlp.up_proj.weight", vec![config.intermediate_size, h]),
            ("mlp.down_proj.weight", vec![h, config.intermediate_size]),
        ];
        shapes.extend(
            mixer.into_iter().chain(common).map(|(name, shape)| (format!("{prefix}layers.{layer}.{name}"), shape)),
        );
    }
    shapes.push((format!("{prefix}norm.weight"), vec![h]));
    if !config.tie_word_embeddings {
        shapes.push(("lm_head.weight".to_string(), vec![config.vocab_size, h]));
    }
    shapes
}
