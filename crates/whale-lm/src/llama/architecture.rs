//! Llama on the dense decoder: its [`DenseConfig`], which gives [`super::LlamaModel`] the
//! [`Architecture`](crate::decoder::Architecture) and
//! [`TrainableModel`](crate::trainable::TrainableModel) impls written once for every dense
//! config (`crate::qwen3::architecture`): the name, `model_type` `llama`, a checkpoint's
//! `config.json` written as Llama's, and the settings (no per-head query and key norms, the
//! rotary frequencies scaled as `rope_scaling` says).

use super::config::{LlamaConfig, LLAMA_MODEL_TYPE};
use crate::qwen3::checkpoint::torch_dtype_name;
use crate::qwen3::config::{ConfigError, ConfigIssue};
use crate::qwen3::dense::{plain_inverse_frequencies, DenseConfig, DenseSettings};
use candle_core::DType;
use std::path::Path;

impl DenseConfig for LlamaConfig {
    const NAME: &'static str = "Llama";
    const MODEL_TYPES: &'static [&'static str] = &[LLAMA_MODEL_TYPE];

    fn read(file: &Path) -> Result<Self, ConfigError> {
        LlamaConfig::from_file(file)
    }

    fn validate(&self) -> Result<(), ConfigIssue> {
        LlamaConfig::validate(self)
    }

    fn settings(&self) -> DenseSettings {
        let plain = plain_inverse_frequencies(self.rope_theta, self.head_dim);
        DenseSettings {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            rms_norm_eps: self.rms_norm_eps,
            tie_word_embeddings: self.tie_word_embeddings,
            qk_norm: false,
            inverse_frequencies: match &self.rope_scaling {
                Some(scaling) => scaling.scale(&plain),
                None => plain,
            },
            initializer_range: self.initializer_range,
            max_position_embeddings: self.max_position_embeddings,
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id.clone(),
        }
    }

    /// The config as read (`model_type` `llama`, `LlamaForCausalLM`), with `torch_dtype` naming
    /// `dtype` (and no `dtype` key beside it).
    fn checkpoint_json(&self, dtype: DType) -> String {
        let mut config = self.clone();
        config.torch_dtype = Some(torch_dtype_name(dtype).to_string());
        config.extra.remove("dtype");
        config.to_json_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::RopeScaling;
    use crate::qwen3::config::ModelSize;

    /// A head of 8 at base 10,000: unscaled 1, 0.1, 0.01, 0.001.
    fn config(scaling: Option<RopeScaling>) -> LlamaConfig {
        let size = ModelSize { head_dim: 8, ..ModelSize::TINY };
        LlamaConfig { rope_scaling: scaling, ..LlamaConfig::with_size(100, size) }
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
