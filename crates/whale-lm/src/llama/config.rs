//! Llama's hyper-parameters, read from and written to a Hugging Face `config.json`
//! (`model_type` `llama`, `LlamaForCausalLM`; SmolLM2 among them).
//!
//! Why its own keys and not a flag of Qwen3's: the keys, defaults and refusals are Llama's
//! (`rope_scaling`, `mlp_bias`, `pretraining_tp`; `max_position_embeddings` 2048 by default) and
//! a checkpoint saved from a Llama model must say Llama, so that `transformers`, PEFT and vLLM
//! load it as one. The keys it shares with Qwen3 are read, checked and written back by
//! [`DenseHfConfig`] ([`crate::qwen3::config`]); [`LlamaKeys`] is what is Llama's own, and its
//! settings of the dense decoder: no per-head query and key norms, the rotary frequencies
//! scaled as `rope_scaling` says.

use super::rope_scaling::RopeScaling;
use crate::qwen3::config::{optional, ArchitectureKeys, ConfigIssue, DenseHfConfig, ModelSize};
use serde::Serialize;
use serde_json::{Map, Value};

/// The `architectures` entry of a Llama causal language model.
pub const LLAMA_ARCHITECTURE: &str = "LlamaForCausalLM";
/// The `model_type` of a Llama model.
pub const LLAMA_MODEL_TYPE: &str = "llama";

/// A Llama configuration with the Hugging Face key names.
pub type LlamaConfig = DenseHfConfig<LlamaKeys>;

/// The keys of a Llama `config.json` that Qwen3's has not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaKeys {
    /// How the rotary frequencies are scaled; written as `null` when they are not.
    pub rope_scaling: Option<RopeScaling>,
    /// Biases of the MLP projections: not supported, so `false` whenever valid.
    pub mlp_bias: bool,
}

/// Llama: `model_type` `llama`, no per-head query and key norms, the rotary frequencies scaled
/// as `rope_scaling` says; keys written sorted, as `transformers` (and `whale lm convert`) write
/// them.
impl ArchitectureKeys for LlamaKeys {
    const NAME: &'static str = "Llama";
    const MODEL_TYPE: &'static str = LLAMA_MODEL_TYPE;
    const ARCHITECTURE: &'static str = LLAMA_ARCHITECTURE;
    const MAX_POSITION_EMBEDDINGS: usize = 2048;
    const KEYS: &'static [&'static str] = &["rope_scaling", "mlp_bias"];
    const SORTED_KEYS: bool = true;
    const QK_NORM: bool = false;

    fn read(object: &Map<String, Value>) -> Result<Self, ConfigIssue> {
        Ok(Self { rope_scaling: rope_scaling(object)?, mlp_bias: optional(object, "mlp_bias")?.unwrap_or(false) })
    }

    fn refuse(config: &LlamaConfig) -> Result<(), ConfigIssue> {
        if config.attention_bias {
            return Err(ConfigIssue::new("attention_bias", "biases of the attention projections are not supported"));
        }
        if config.own.mlp_bias {
            return Err(ConfigIssue::new("mlp_bias", "biases of the MLP projections are not supported"));
        }
        if config.extra.get("pretraining_tp").is_some_and(|v| v.as_u64() != Some(1)) {
            return Err(ConfigIssue::new("pretraining_tp", "only 1 is supported"));
        }
        Ok(())
    }

    fn inverse_frequencies(&self, plain: Vec<f64>) -> Vec<f64> {
        match &self.rope_scaling {
            Some(scaling) => scaling.scale(&plain),
            None => plain,
        }
    }
}

impl LlamaConfig {
    /// A configuration of the given shape with the defaults of `transformers`' `LlamaConfig` for
    /// everything else (no rope scaling, untied embeddings, no special ids).
    pub fn with_size(vocab_size: usize, size: ModelSize) -> Self {
        Self::shaped(vocab_size, size, LlamaKeys { rope_scaling: None, mlp_bias: false })
    }
}

/// The scaling of `rope_scaling`, or where `transformers` 5 writes it, of `rope_parameters`;
/// both there and different is an error.
fn rope_scaling(object: &Map<String, Value>) -> Result<Option<RopeScaling>, ConfigIssue> {
    let top = RopeScaling::read(object, "rope_scaling")?;
    let nested = RopeScaling::read(object, "rope_parameters")?;
    match (top, nested) {
        (Some(top), Some(nested)) if top != nested => Err(ConfigIssue::new(
            "rope_parameters",
            format!("its scaling {nested:?} differs from rope_scaling's {top:?}"),
        )),
        (top, nested) => Ok(top.or(nested)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen3::config::ConfigError;
    use crate::qwen3::dense::DenseConfig;
    use candle_core::DType;
    use std::path::Path;

    fn parse(text: &str) -> Result<LlamaConfig, ConfigError> {
        LlamaConfig::from_json_str(text, Path::new("dir/config.json"))
    }

    /// SmolLM2-135M's `config.json` as `whale lm convert` writes it.
    const SMOLLM2: &str = r#"{
        "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576,
        "initializer_range": 0.02, "intermediate_size": 1536, "max_position_embeddings": 8192,
        "mlp_bias": false, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
        "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": null, "rope_theta": 100000.0, "tie_word_embeddings": true,
        "torch_dtype": "float32", "use_cache": true, "vocab_size": 49152}"#;

    #[test]
    fn reads_a_converted_smollm2_config_and_round_trips_it() {
        let config = parse(SMOLLM2).expect("SmolLM2's config");
        assert_eq!((config.num_attention_heads, config.num_key_value_heads, config.head_dim), (9, 3, 64));
        assert_eq!((config.rope_theta, config.own.rope_scaling, config.rms_norm_eps), (100_000.0, None, 1e-5));
        assert_eq!((config.bos_token_id, config.eos_token_id.as_slice()), (Some(1), &[2][..]));
        assert!(config.tie_word_embeddings);
        assert_eq!(config.extra["pad_token_id"], 2);
        let text = config.to_json_string();
        assert!(text.contains("\"rope_scaling\": null"), "{text}");
        let keys: Vec<&str> = text.lines().filter_map(|line| line.strip_prefix("  \"")?.split('"').next()).collect();
        assert!(
            keys.windows(2).all(|pair| pair[0] < pair[1]) && keys.len() == 25,
            "sorted as transformers writes: {keys:?}"
        );
        assert_eq!(parse(&text).expect("written back"), config);
    }

    #[test]
    fn applies_the_defaults_of_transformers() {
        let config = parse(
            r#"{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 1, "num_attention_heads": 8}"#,
        )
        .unwrap();
        assert_eq!(config.model_type, LLAMA_MODEL_TYPE);
        assert_eq!((config.num_key_value_heads, config.head_dim), (8, 8));
        assert_eq!((config.rope_theta, config.max_position_embeddings), (10_000.0, 2048));
        assert_eq!(config.own.rope_scaling, None);
        assert!(!config.tie_word_embeddings);
    }

    #[test]
    fn rope_scaling_is_read_and_written_back() {
        let with = |scaling: &str| SMOLLM2.replace("\"rope_scaling\": null", &format!("\"rope_scaling\": {scaling}"));
        let table = r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}"#;
        let config = parse(&with(table)).expect("llama3 scaling");
        let expected = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        assert_eq!(config.own.rope_scaling, Some(expected));
        assert_eq!(parse(&config.to_json_string()).expect("written back").own.rope_scaling, Some(expected));
        let legacy = parse(&with(r#"{"type": "linear", "factor": 2.0}"#)).expect("the older key");
        assert_eq!(legacy.own.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
        let message = parse(&with(r#"{"rope_type": "yarn", "factor": 4.0}"#)).unwrap_err().to_string();
        for part in ["dir/config.json", "`rope_scaling.rope_type`", "\"yarn\""] {
            assert!(message.contains(part), "{message:?} does not name {part}");
        }
    }

    #[test]
    fn rope_parameters_of_transformers_5_give_the_base_and_the_scaling() {
        let text = SMOLLM2.replace("\"rope_theta\": 100000.0,", "").replace(
            "\"rope_scaling\": null",
            r#""rope_parameters": {"rope_theta": 500000.0, "rope_type": "linear", "factor": 2.0}"#,
        );
        let config = parse(&text).expect("transformers 5");
        assert_eq!(
            (config.rope_theta, config.own.rope_scaling),
            (500_000.0, Some(RopeScaling::Linear { factor: 2.0 }))
        );
        let both = text.replace(
            "\"rope_parameters\"",
            r#""rope_scaling": {"rope_type": "linear", "factor": 4.0}, "rope_parameters""#,
        );
        let message = parse(&both).unwrap_err().to_string();
        assert!(message.contains("`rope_parameters`") && message.contains("differs"), "{message}");
    }

    #[test]
    fn refuses_what_the_decoder_does_not_compute_naming_the_key() {
        let cases = [
            (SMOLLM2.replace("\"attention_bias\": false", "\"attention_bias\": true"), "attention_bias"),
            (SMOLLM2.replace("\"mlp_bias\": false", "\"mlp_bias\": true"), "mlp_bias"),
            (SMOLLM2.replace("\"pretraining_tp\": 1", "\"pretraining_tp\": 2"), "pretraining_tp"),
            (SMOLLM2.replace("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), "hidden_act"),
            (SMOLLM2.replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 2"), "num_key_value_heads"),
            (SMOLLM2.replace("\"model_type\": \"llama\"", "\"model_type\": \"qwen3\""), "model_type"),
            (SMOLLM2.replace("LlamaForCausalLM", "Qwen3ForCausalLM"), "architectures"),
            (SMOLLM2.replace("\"eos_token_id\": 2", "\"eos_token_id\": 49152"), "eos_token_id"),
        ];
        for (text, key) in cases {
            let message = parse(&text).unwrap_err().to_string();
            assert!(message.contains("dir/config.json"), "{message}");
            assert!(message.contains(&format!("`{key}`")), "{key}: {message}");
        }
    }

    /// A head of 8 at base 10,000: unscaled 1, 0.1, 0.01, 0.001.
    fn config(scaling: Option<RopeScaling>) -> LlamaConfig {
        let size = ModelSize { head_dim: 8, ..ModelSize::TINY };
        LlamaConfig { own: LlamaKeys { rope_scaling: scaling, mlp_bias: false }, ..LlamaConfig::with_size(100, size) }
    }

    #[test]
    fn llama_has_no_query_and_key_norms_and_counts_its_parameters() {
        let settings = config(None).settings();
        assert!(!settings.qk_norm);
        let (h, d, i, layers) = (64, 8, 192, 2);
        let layer = h * d * (2 * 4 + 2 * 2) + 3 * h * i + 2 * h;
        assert_eq!(settings.parameter_count(), layers * layer + 2 * 100 * h + h, "untied: embeddings and head");
    }

    #[test]
    fn the_settings_carry_the_scaled_rotary_frequencies() {
        let close = |ours: &[f64], expected: &[f64]| {
            ours.len() == expected.len() && ours.iter().zip(expected).all(|(a, b)| (a - b).abs() <= 1e-12 * b.abs())
        };
        assert!(close(&config(None).settings().inverse_frequencies, &[1.0, 0.1, 0.01, 0.001]));
        let linear = config(Some(RopeScaling::Linear { factor: 2.0 })).settings();
        assert!(close(&linear.inverse_frequencies, &[0.5, 0.05, 0.005, 0.0005]), "{:?}", linear.inverse_frequencies);
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 10,
        };
        // Every wavelength (2π and up) is above 10 / 4, all but the first above 10: those divided
        // by 8, the first blended with weight (10 / 2π - 1) / 3.
        let smooth = (10.0 / (2.0 * std::f64::consts::PI) - 1.0) / 3.0;
        let first = (1.0 - smooth) / 8.0 + smooth;
        let scaled = config(Some(llama3)).settings();
        assert!(
            close(&scaled.inverse_frequencies, &[first, 0.0125, 0.00125, 0.000125]),
            "{:?}",
            scaled.inverse_frequencies
        );
    }

    #[test]
    fn a_checkpoint_config_says_llama_and_names_the_dtype() {
        let mut config = config(None);
        config.extra.insert("dtype".to_string(), "float16".into());
        let written: serde_json::Value = serde_json::from_str(&config.checkpoint_json(DType::BF16)).unwrap();
        assert_eq!(written["model_type"], "llama");
        assert_eq!(written["architectures"], serde_json::json!(["LlamaForCausalLM"]));
        assert_eq!((written["torch_dtype"].as_str(), written.get("dtype")), (Some("bfloat16"), None));
    }
}
