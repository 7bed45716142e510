//! Llama's hyper-parameters, read from and written to a Hugging Face `config.json`
//! (`model_type` `llama`, `LlamaForCausalLM`; SmolLM2 among them).
//!
//! Why its own config and not a flag of Qwen3's: the keys, defaults and refusals are Llama's
//! (`rope_scaling`, `mlp_bias`, `pretraining_tp`; `max_position_embeddings` 2048 by default) and
//! a checkpoint saved from a Llama model must say Llama, so that `transformers`, PEFT and vLLM
//! load it as one. Keys are read one at a time so that every problem names the file and the key;
//! keys whale does not use are kept and written back. The JSON helpers and the checks every
//! dense decoder's keys pass are Qwen3's folder's ([`crate::qwen3::config`]).

use super::rope_scaling::RopeScaling;
use crate::qwen3::config::{
    one_or_many, optional, required, rope_theta, token_ids, ConfigError, ConfigIssue, DecoderKeys, ModelSize,
};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The `architectures` entry of a Llama causal language model.
pub const LLAMA_ARCHITECTURE: &str = "LlamaForCausalLM";
/// The `model_type` of a Llama model.
pub const LLAMA_MODEL_TYPE: &str = "llama";

/// A Llama configuration with the Hugging Face key names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaConfig {
    pub architectures: Vec<String>,
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Fewer than `num_attention_heads` for grouped-query attention.
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// How the rotary frequencies are scaled; written as `null` when they are not.
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    /// Biases of the attention projections: not supported, so `false` whenever valid.
    pub attention_bias: bool,
    /// Biases of the MLP projections: not supported, so `false` whenever valid.
    pub mlp_bias: bool,
    /// The dtype the weights were saved in (`"float32"`, `"bfloat16"`, ...), informative only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// One or more end-of-sequence ids; written as a number when there is exactly one.
    #[serde(serialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub eos_token_id: Vec<u32>,
    /// Keys this crate does not interpret, kept so that saving writes them back.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// Keys the parser interprets; everything else goes to `extra`.
const KNOWN_KEYS: [&str; 21] = [
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "torch_dtype",
    "bos_token_id",
    "eos_token_id",
];

impl LlamaConfig {
    /// A configuration of the given shape with the defaults of `transformers`' `LlamaConfig` for
    /// everything else (no rope scaling, untied embeddings, no special ids).
    pub fn with_size(vocab_size: usize, size: ModelSize) -> Self {
        Self {
            architectures: vec![LLAMA_ARCHITECTURE.to_string()],
            model_type: LLAMA_MODEL_TYPE.to_string(),
            vocab_size,
            hidden_size: size.hidden_size,
            intermediate_size: size.intermediate_size,
            num_hidden_layers: size.num_hidden_layers,
            num_attention_heads: size.num_attention_heads,
            num_key_value_heads: size.num_key_value_heads,
            head_dim: size.head_dim,
            hidden_act: "silu".to_string(),
            max_position_embeddings: 2048,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_scaling: None,
            tie_word_embeddings: false,
            attention_bias: false,
            mlp_bias: false,
            torch_dtype: None,
            bos_token_id: None,
            eos_token_id: Vec::new(),
            extra: BTreeMap::new(),
        }
    }

    /// Reads and validates a `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Io { file: path.to_path_buf(), source })?;
        Self::from_json_str(&text, path)
    }

    /// Parses and validates the text of a `config.json`; `file` is only used in errors.
    pub fn from_json_str(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let syntax = |reason: String| ConfigError::Syntax { file: file.to_path_buf(), reason };
        let value: Value = serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?;
        let Value::Object(object) = value else { return Err(syntax("the top level is not an object".to_string())) };
        let config = Self::from_object(object).map_err(|issue| ConfigError::invalid(file, issue))?;
        config.validate().map_err(|issue| ConfigError::invalid(file, issue))?;
        Ok(config)
    }

    /// Reads the keys with the defaults of `transformers`' `LlamaConfig`.
    fn from_object(mut object: Map<String, Value>) -> Result<Self, ConfigIssue> {
        let hidden_size: usize = required(&object, "hidden_size")?;
        let num_attention_heads: usize = required(&object, "num_attention_heads")?;
        let config = Self {
            architectures: optional(&object, "architectures")?.unwrap_or_default(),
            model_type: optional(&object, "model_type")?.unwrap_or_else(|| LLAMA_MODEL_TYPE.to_string()),
            vocab_size: required(&object, "vocab_size")?,
            hidden_size,
            intermediate_size: required(&object, "intermediate_size")?,
            num_hidden_layers: required(&object, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: optional(&object, "num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim: optional(&object, "head_dim")?
                .unwrap_or_else(|| hidden_size.checked_div(num_attention_heads).unwrap_or(0)),
            hidden_act: optional(&object, "hidden_act")?.unwrap_or_else(|| "silu".to_string()),
            max_position_embeddings: optional(&object, "max_position_embeddings")?.unwrap_or(2048),
            initializer_range: optional(&object, "initializer_range")?.unwrap_or(0.02),
            rms_norm_eps: optional(&object, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: rope_theta(&object)?,
            rope_scaling: rope_scaling(&object)?,
            tie_word_embeddings: optional(&object, "tie_word_embeddings")?.unwrap_or(false),
            attention_bias: optional(&object, "attention_bias")?.unwrap_or(false),
            mlp_bias: optional(&object, "mlp_bias")?.unwrap_or(false),
            torch_dtype: optional(&object, "torch_dtype")?
                .map_or_else(|| optional(&object, "dtype"), |d| Ok(Some(d)))?,
            bos_token_id: optional(&object, "bos_token_id")?,
            eos_token_id: token_ids(&object, "eos_token_id")?,
            extra: BTreeMap::new(),
        };
        object.retain(|key, _| !KNOWN_KEYS.contains(&key.as_str()));
        Ok(Self { extra: object.into_iter().collect(), ..config })
    }

    /// Checks that the configuration describes a Llama model whale can run.
    pub fn validate(&self) -> Result<(), ConfigIssue> {
        if self.model_type != LLAMA_MODEL_TYPE {
            return Err(ConfigIssue::new("model_type", format!("{:?} is not {LLAMA_MODEL_TYPE:?}", self.model_type)));
        }
        if !self.architectures.is_empty() && !self.architectures.iter().any(|a| a == LLAMA_ARCHITECTURE) {
            return Err(ConfigIssue::new(
                "architectures",
                format!("{:?} does not contain {LLAMA_ARCHITECTURE}", self.architectures),
            ));
        }
        self.decoder_keys().validate()?;
        if self.attention_bias {
            return Err(ConfigIssue::new("attention_bias", "biases of the attention projections are not supported"));
        }
        if self.mlp_bias {
            return Err(ConfigIssue::new("mlp_bias", "biases of the MLP projections are not supported"));
        }
        if self.extra.get("pretraining_tp").is_some_and(|v| v.as_u64() != Some(1)) {
            return Err(ConfigIssue::new("pretraining_tp", "only 1 is supported"));
        }
        Ok(())
    }

    /// The keys every dense decoder's configuration has.
    fn decoder_keys(&self) -> DecoderKeys<'_> {
        DecoderKeys {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            max_position_embeddings: self.max_position_embeddings,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            hidden_act: &self.hidden_act,
            bos_token_id: self.bos_token_id,
            eos_token_id: &self.eos_token_id,
        }
    }

    /// The configuration as the text of a `config.json`, its keys sorted as `transformers` (and
    /// `whale lm convert`) write them, so that a checkpoint saved from a converted one lists its
    /// keys as the original did.
    pub fn to_json_string(&self) -> String {
        // Serializing plain numbers, strings and JSON values cannot fail.
        let keys = match serde_json::to_value(self) {
            Ok(Value::Object(keys)) => keys,
            _ => Map::new(),
        };
        let sorted: BTreeMap<String, Value> = keys.into_iter().collect();
        serde_json::to_string_pretty(&sorted).unwrap_or_default()
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
        assert_eq!((config.rope_theta, config.rope_scaling, config.rms_norm_eps), (100_000.0, None, 1e-5));
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
        assert_eq!(config.rope_scaling, None);
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
        assert_eq!(config.rope_scaling, Some(expected));
        assert_eq!(parse(&config.to_json_string()).expect("written back").rope_scaling, Some(expected));
        let legacy = parse(&with(r#"{"type": "linear", "factor": 2.0}"#)).expect("the older key");
        assert_eq!(legacy.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
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
        assert_eq!((config.rope_theta, config.rope_scaling), (500_000.0, Some(RopeScaling::Linear { factor: 2.0 })));
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
}
