//! Qwen2's hyper-parameters, read from and written to a Hugging Face `config.json`
//! (`model_type` `qwen2`, `Qwen2ForCausalLM`; Qwen2.5-Coder-0.5B/1.5B-Instruct among them).
//!
//! Qwen2's `config.json` has only keys Qwen3's has too, plus the sliding-window ones
//! (`use_sliding_window`, `sliding_window`, `max_window_layers`), which are kept verbatim and
//! refused when the window is on. Its biases on the query, key and value projections are not a
//! key: `transformers` always builds them, so [`Qwen2Keys::QKV_BIAS`] is a constant.

use crate::qwen3::config::{refuse_scaling_and_window, ArchitectureKeys, ConfigIssue, DenseHfConfig, ModelSize};
use serde::Serialize;
use serde_json::{Map, Value};

/// The `architectures` entry of a Qwen2 causal language model.
pub const QWEN2_ARCHITECTURE: &str = "Qwen2ForCausalLM";
/// The `model_type` of a Qwen2 model.
pub const QWEN2_MODEL_TYPE: &str = "qwen2";

/// A Qwen2 configuration with the Hugging Face key names.
pub type Qwen2Config = DenseHfConfig<Qwen2Keys>;

/// Qwen2's own keys: none beyond the shared ones (the sliding-window keys stay in `extra`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Qwen2Keys;

/// Qwen2: `model_type` `qwen2`, biases on the query, key and value projections, no per-head
/// norms, unscaled rotary frequencies; keys written sorted, as `transformers` writes them.
impl ArchitectureKeys for Qwen2Keys {
    const NAME: &'static str = "Qwen2";
    const MODEL_TYPE: &'static str = QWEN2_MODEL_TYPE;
    const ARCHITECTURE: &'static str = QWEN2_ARCHITECTURE;
    const MAX_POSITION_EMBEDDINGS: usize = 32768;
    const KEYS: &'static [&'static str] = &[];
    const SORTED_KEYS: bool = true;
    const QK_NORM: bool = false;
    const QKV_BIAS: bool = true;

    fn read(_: &Map<String, Value>) -> Result<Self, ConfigIssue> {
        Ok(Qwen2Keys)
    }

    fn refuse(config: &Qwen2Config) -> Result<(), ConfigIssue> {
        refuse_scaling_and_window(config)
    }
}

impl Qwen2Config {
    /// A configuration of the given shape with Qwen2.5's values for everything else (rotary base
    /// 1,000,000, RMS epsilon 1e-6, tied embeddings).
    pub fn with_size(vocab_size: usize, size: ModelSize) -> Self {
        Self { rope_theta: 1_000_000.0, tie_word_embeddings: true, ..Self::shaped(vocab_size, size, Qwen2Keys) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen3::config::ConfigError;
    use crate::qwen3::dense::DenseConfig;
    use std::path::Path;

    fn parse(text: &str) -> Result<Qwen2Config, ConfigError> {
        Qwen2Config::from_json_str(text, Path::new("dir/config.json"))
    }

    /// Qwen2.5-Coder-0.5B-Instruct's `config.json` on the Hugging Face hub.
    const CODER_0_5B: &str = r#"{
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936}"#;

    #[test]
    fn reads_qwen2_5_coder_and_counts_its_parameters_with_the_biases() {
        let config = parse(CODER_0_5B).expect("Qwen2.5-Coder-0.5B's config");
        assert_eq!((config.num_attention_heads, config.num_key_value_heads, config.head_dim), (14, 2, 64));
        let settings = config.settings();
        assert!(settings.qkv_bias && !settings.qk_norm);
        // 494,032,768: the count Qwen publishes for Qwen2.5-0.5B (0.49B, tied embeddings).
        assert_eq!(settings.parameter_count(), 494_032_768);
        assert_eq!(config.extra["sliding_window"], 131072);
        let written = config.to_json_string();
        assert_eq!(parse(&written).expect("written back"), config);
        let keys: Vec<&str> = written.lines().filter_map(|line| line.strip_prefix("  \"")?.split('"').next()).collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "sorted: {keys:?}");
    }

    #[test]
    fn refuses_a_sliding_window_and_rotary_scaling_naming_the_key() {
        let cases = [
            (CODER_0_5B.replace("\"use_sliding_window\": false", "\"use_sliding_window\": true"), "use_sliding_window"),
            (
                CODER_0_5B.replace("\"use_cache\": true", r#""rope_scaling": {"type": "yarn", "factor": 4.0}"#),
                "rope_scaling",
            ),
            (CODER_0_5B.replace("Qwen2ForCausalLM", "Qwen3ForCausalLM"), "architectures"),
        ];
        for (text, key) in cases {
            let message = parse(&text).unwrap_err().to_string();
            assert!(message.contains("dir/config.json") && message.contains(&format!("`{key}`")), "{message}");
        }
    }
}
