//! The hyper-parameters of the dense decoder's architectures (Qwen3's, Llama's), read from and
//! written to a Hugging Face `config.json`.
//!
//! Checkpoints are exchanged with other tools in the Hugging Face layout, so a configuration
//! uses the keys of `transformers`. Keys are read one at a time so that every problem names the
//! file and the key at fault; keys this crate does not use are kept verbatim and written back,
//! so loading and saving a foreign checkpoint loses nothing.
//!
//! Why one generic configuration: Qwen3's and Llama's `config.json`s share most of their keys
//! and differ in a few of their own, in defaults and in what they refuse. [`DenseHfConfig`]
//! declares, reads, checks and writes the shared keys once; an architecture's
//! [`ArchitectureKeys`] is what is its own ([`Qwen3Keys`] here, Llama's in
//! [`crate::llama::config`]). The JSON helpers and errors serve Qwen3.5's configuration too.

use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};

/// The `architectures` entry of a Qwen3 causal language model.
pub const QWEN3_ARCHITECTURE: &str = "Qwen3ForCausalLM";
/// The `model_type` of a Qwen3 model.
pub const QWEN3_MODEL_TYPE: &str = "qwen3";

/// The shape of a model: everything that fixes its parameter count apart from the vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSize {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
}

impl ModelSize {
    /// About 0.1M parameters plus the embeddings (0.6M with an 8k vocabulary): for tests.
    pub const TINY: ModelSize = ModelSize {
        hidden_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        intermediate_size: 192,
    };
    /// About 3.1M parameters plus the embeddings: the default model trained on the CPU.
    pub const BASE: ModelSize = ModelSize {
        hidden_size: 256,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        intermediate_size: 768,
    };
}

/// What one architecture on the dense decoder has of its own in its `config.json`: its names,
/// the keys only it has (the fields of `Self`), a default, what it refuses and how it sets the
/// layers.
pub trait ArchitectureKeys: Debug + Clone + PartialEq + Serialize + Send + Sync + 'static {
    /// The architecture's name, for messages.
    const NAME: &'static str;
    /// The `model_type` it reads and writes; a `config.json` without one is read as this.
    const MODEL_TYPE: &'static str;
    /// The `architectures` entry of its causal language model.
    const ARCHITECTURE: &'static str;
    /// `max_position_embeddings` when `config.json` has none (`transformers`' default).
    const MAX_POSITION_EMBEDDINGS: usize;
    /// The keys [`ArchitectureKeys::read`] interprets, kept out of `extra`.
    const KEYS: &'static [&'static str];
    /// Whether `config.json` lists its keys sorted, as `transformers` writes them, rather than
    /// in the order of the fields.
    const SORTED_KEYS: bool;
    /// Whether each attention head normalises its queries and keys.
    const QK_NORM: bool;
    /// Whether the query, key and value projections have biases (Qwen2's always do, whatever
    /// `attention_bias` says: its `config.json` has no such key).
    const QKV_BIAS: bool = false;
    /// Reads the architecture's own keys.
    fn read(object: &Map<String, Value>) -> Result<Self, ConfigIssue>;
    /// Refuses what the decoder does not compute for this architecture, naming the key; called
    /// once the shared keys have passed their checks.
    fn refuse(config: &DenseHfConfig<Self>) -> Result<(), ConfigIssue>;
    /// The rotary inverse frequencies from the unscaled ones: those, unless the architecture
    /// scales them.
    fn inverse_frequencies(&self, plain: Vec<f64>) -> Vec<f64> {
        plain
    }
}

/// A dense decoder's configuration with the Hugging Face key names: the keys Qwen3's and
/// Llama's share, the architecture's own (`own`) and every other key as read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DenseHfConfig<K> {
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
    pub tie_word_embeddings: bool,
    /// Biases of the attention projections: not supported, so `false` whenever valid.
    pub attention_bias: bool,
    /// The dtype the weights were saved in (`"float32"`, `"bfloat16"`, ...), informative only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// One or more end-of-sequence ids; written as a number when there is exactly one.
    #[serde(serialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub eos_token_id: Vec<u32>,
    /// The keys only this architecture has.
    #[serde(flatten)]
    pub own: K,
    /// Keys this crate does not interpret, kept so that saving writes them back.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A Qwen3 configuration with the Hugging Face key names.
pub type Qwen3Config = DenseHfConfig<Qwen3Keys>;

/// Qwen3's own keys: none beyond the shared ones. What is Qwen3's own is in its
/// [`ArchitectureKeys`] impl: per-head query and key norms, 32,768 positions by default and what
/// it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Qwen3Keys;

/// What is wrong with a configuration, independent of where it came from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("key `{key}`: {reason}")]
pub struct ConfigIssue {
    pub key: String,
    pub reason: String,
}

impl ConfigIssue {
    pub(crate) fn new(key: &str, reason: impl Into<String>) -> Self {
        Self { key: key.to_string(), reason: reason.into() }
    }
}

/// A `config.json` that could not be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
    #[error("{}: not a JSON object: {reason}", file.display())]
    Syntax { file: PathBuf, reason: String },
    #[error("{}: {issue}", file.display())]
    Invalid { file: PathBuf, issue: ConfigIssue },
}

impl ConfigError {
    pub(crate) fn invalid(file: &Path, issue: ConfigIssue) -> Self {
        Self::Invalid { file: file.to_path_buf(), issue }
    }
}

/// The shared keys [`DenseHfConfig`] reads; everything but these and the architecture's own
/// goes to `extra`.
const SHARED_KEYS: [&str; 19] = [
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
    "tie_word_embeddings",
    "attention_bias",
    "torch_dtype",
    "bos_token_id",
    "eos_token_id",
];

impl<K: ArchitectureKeys> DenseHfConfig<K> {
    /// A configuration of the given shape with the architecture's `own` keys and, for the
    /// shared keys, the defaults `transformers` reads a `config.json` without them with (SiLU,
    /// base 10,000, untied embeddings, no biases, no special ids).
    pub(crate) fn shaped(vocab_size: usize, size: ModelSize, own: K) -> Self {
        Self {
            architectures: vec![K::ARCHITECTURE.to_string()],
            model_type: K::MODEL_TYPE.to_string(),
            vocab_size,
            hidden_size: size.hidden_size,
            intermediate_size: size.intermediate_size,
            num_hidden_layers: size.num_hidden_layers,
            num_attention_heads: size.num_attention_heads,
            num_key_value_heads: size.num_key_value_heads,
            head_dim: size.head_dim,
            hidden_act: "silu".to_string(),
            max_position_embeddings: K::MAX_POSITION_EMBEDDINGS,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_word_embeddings: false,
            attention_bias: false,
            torch_dtype: None,
            bos_token_id: None,
            eos_token_id: Vec::new(),
            own,
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

    /// Reads the keys with the defaults of `transformers` where it has them.
    fn from_object(mut object: Map<String, Value>) -> Result<Self, ConfigIssue> {
        let hidden_size: usize = required(&object, "hidden_size")?;
        let num_attention_heads: usize = required(&object, "num_attention_heads")?;
        let config = Self {
            architectures: optional(&object, "architectures")?.unwrap_or_default(),
            model_type: optional(&object, "model_type")?.unwrap_or_else(|| K::MODEL_TYPE.to_string()),
            vocab_size: required(&object, "vocab_size")?,
            hidden_size,
            intermediate_size: required(&object, "intermediate_size")?,
            num_hidden_layers: required(&object, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: optional(&object, "num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim: optional(&object, "head_dim")?
                .unwrap_or_else(|| hidden_size.checked_div(num_attention_heads).unwrap_or(0)),
            hidden_act: optional(&object, "hidden_act")?.unwrap_or_else(|| "silu".to_string()),
            max_position_embeddings: optional(&object, "max_position_embeddings")?
                .unwrap_or(K::MAX_POSITION_EMBEDDINGS),
            initializer_range: optional(&object, "initializer_range")?.unwrap_or(0.02),
            rms_norm_eps: optional(&object, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: rope_theta(&object)?,
            tie_word_embeddings: optional(&object, "tie_word_embeddings")?.unwrap_or(false),
            attention_bias: optional(&object, "attention_bias")?.unwrap_or(false),
            torch_dtype: optional(&object, "torch_dtype")?
                .map_or_else(|| optional(&object, "dtype"), |d| Ok(Some(d)))?,
            bos_token_id: optional(&object, "bos_token_id")?,
            eos_token_id: token_ids(&object, "eos_token_id")?,
            own: K::read(&object)?,
            extra: BTreeMap::new(),
        };
        object.retain(|key, _| !SHARED_KEYS.contains(&key.as_str()) && !K::KEYS.contains(&key.as_str()));
        Ok(Self { extra: object.into_iter().collect(), ..config })
    }

    /// Checks that the configuration describes a model of the architecture the decoder can run.
    pub fn validate(&self) -> Result<(), ConfigIssue> {
        if self.model_type != K::MODEL_TYPE {
            return Err(ConfigIssue::new("model_type", format!("{:?} is not {:?}", self.model_type, K::MODEL_TYPE)));
        }
        if !self.architectures.is_empty() && !self.architectures.iter().any(|a| a == K::ARCHITECTURE) {
            return Err(ConfigIssue::new(
                "architectures",
                format!("{:?} does not contain {}", self.architectures, K::ARCHITECTURE),
            ));
        }
        self.validate_shared_keys()?;
        K::refuse(self)
    }

    /// Sizes positive and consistent, the floats positive, the special ids in the vocabulary
    /// and the activation SiLU (what the decoder's MLP computes).
    fn validate_shared_keys(&self) -> Result<(), ConfigIssue> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(ConfigIssue::new(key, "must be positive"));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(ConfigIssue::new(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ConfigIssue::new(
                "head_dim",
                format!("{} is odd; rotary embeddings need an even size", self.head_dim),
            ));
        }
        let positive_floats = [("rms_norm_eps", self.rms_norm_eps), ("rope_theta", self.rope_theta)];
        if let Some((key, value)) = positive_floats.iter().find(|(_, value)| !(value.is_finite() && *value > 0.0)) {
            return Err(ConfigIssue::new(key, format!("{value} is not a positive number")));
        }
        let outside = |id: &&u32| **id as usize >= self.vocab_size;
        if let Some(id) = self.bos_token_id.iter().chain(&self.eos_token_id).find(outside) {
            let key = if Some(*id) == self.bos_token_id { "bos_token_id" } else { "eos_token_id" };
            return Err(ConfigIssue::new(key, format!("{id} is outside the vocabulary of {}", self.vocab_size)));
        }
        if self.hidden_act != "silu" {
            return Err(ConfigIssue::new(
                "hidden_act",
                format!("{:?} is not supported (only \"silu\")", self.hidden_act),
            ));
        }
        Ok(())
    }

    /// The configuration as the text of a `config.json`: its keys in the order of the fields,
    /// or sorted where the architecture's are ([`ArchitectureKeys::SORTED_KEYS`]) so that a
    /// checkpoint saved from a converted one lists its keys as the original did.
    pub fn to_json_string(&self) -> String {
        // Serializing plain numbers, strings and JSON values cannot fail.
        if !K::SORTED_KEYS {
            return serde_json::to_string_pretty(self).unwrap_or_default();
        }
        let keys = match serde_json::to_value(self) {
            Ok(Value::Object(keys)) => keys,
            _ => Map::new(),
        };
        let sorted: BTreeMap<String, Value> = keys.into_iter().collect();
        serde_json::to_string_pretty(&sorted).unwrap_or_default()
    }

    /// How many query heads share one key/value head.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

/// Qwen3: `model_type` `qwen3`, per-head query and key norms, unscaled rotary frequencies; no
/// biases, rotary scaling or sliding window.
impl ArchitectureKeys for Qwen3Keys {
    const NAME: &'static str = "Qwen3";
    const MODEL_TYPE: &'static str = QWEN3_MODEL_TYPE;
    const ARCHITECTURE: &'static str = QWEN3_ARCHITECTURE;
    const MAX_POSITION_EMBEDDINGS: usize = 32768;
    const KEYS: &'static [&'static str] = &[];
    const SORTED_KEYS: bool = false;
    const QK_NORM: bool = true;

    fn read(_: &Map<String, Value>) -> Result<Self, ConfigIssue> {
        Ok(Qwen3Keys)
    }

    fn refuse(config: &Qwen3Config) -> Result<(), ConfigIssue> {
        if config.attention_bias {
            return Err(ConfigIssue::new("attention_bias", "biases are not supported"));
        }
        refuse_scaling_and_window(config)
    }
}

/// Refuses a scaled rotary embedding (`rope_scaling`, or a `rope_parameters.rope_type` other than
/// `default`) and sliding-window attention, which neither Qwen3 nor Qwen2 runs here.
pub(crate) fn refuse_scaling_and_window<K: ArchitectureKeys>(config: &DenseHfConfig<K>) -> Result<(), ConfigIssue> {
    if config.extra.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        return Err(ConfigIssue::new("rope_scaling", "scaled rotary embeddings are not supported"));
    }
    let rope_type = config.extra.get("rope_parameters").and_then(|p| p.get("rope_type")).and_then(Value::as_str);
    if let Some(kind) = rope_type.filter(|kind| *kind != "default") {
        return Err(ConfigIssue::new(
            "rope_parameters.rope_type",
            format!("{kind:?} rotary embeddings are not supported (only \"default\")"),
        ));
    }
    if config.extra.get("use_sliding_window").is_some_and(|v| v.as_bool() != Some(false)) {
        return Err(ConfigIssue::new("use_sliding_window", "sliding-window attention is not supported"));
    }
    Ok(())
}

impl Qwen3Config {
    /// A configuration of the given shape with Qwen3's defaults for everything else.
    pub fn with_size(vocab_size: usize, size: ModelSize) -> Self {
        Self {
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            tie_word_embeddings: true,
            ..Self::shaped(vocab_size, size, Qwen3Keys)
        }
    }

    /// A tiny model with tied embeddings, for tests.
    pub fn tiny(vocab_size: usize) -> Self {
        Self::with_size(vocab_size, ModelSize::TINY)
    }

    /// The default base model trained on the CPU.
    pub fn base(vocab_size: usize) -> Self {
        Self::with_size(vocab_size, ModelSize::BASE)
    }
}

pub(crate) fn one_or_many<S: Serializer>(ids: &[u32], serializer: S) -> Result<S::Ok, S::Error> {
    match ids {
        [one] => serializer.serialize_u32(*one),
        many => many.serialize(serializer),
    }
}

pub fn optional<T: DeserializeOwned>(object: &Map<String, Value>, key: &str) -> Result<Option<T>, ConfigIssue> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            T::deserialize(value).map(Some).map_err(|e| ConfigIssue::new(key, format!("{e} (found {value})")))
        }
    }
}

pub(crate) fn required<T: DeserializeOwned>(object: &Map<String, Value>, key: &str) -> Result<T, ConfigIssue> {
    optional(object, key)?.ok_or_else(|| ConfigIssue::new(key, "missing"))
}

/// The rotary base: `rope_theta`, or where transformers 5 writes it, `rope_parameters.rope_theta`;
/// 10,000 when neither is there. Both there and different is an error, and so is a
/// `rope_parameters` of one table per layer type (no single base to read).
pub(crate) fn rope_theta(object: &Map<String, Value>) -> Result<f64, ConfigIssue> {
    let top: Option<f64> = optional(object, "rope_theta")?;
    let nested: Option<f64> = match object.get("rope_parameters") {
        Some(Value::Object(parameters)) => {
            if parameters.values().any(Value::is_object) {
                return Err(ConfigIssue::new(
                    "rope_parameters",
                    "rotary settings per layer type are not supported (one table of rope_theta and rope_type)",
                ));
            }
            optional(parameters, "rope_theta")
                .map_err(|issue| ConfigIssue::new("rope_parameters.rope_theta", issue.reason))?
        }
        _ => None,
    };
    match (top, nested) {
        (Some(top), Some(nested)) if top != nested => {
            Err(ConfigIssue::new("rope_parameters.rope_theta", format!("{nested} differs from rope_theta {top}")))
        }
        _ => Ok(top.or(nested).unwrap_or(10_000.0)),
    }
}

/// A token id given either as one number or as a list of numbers.
pub(crate) fn token_ids(object: &Map<String, Value>, key: &str) -> Result<Vec<u32>, ConfigIssue> {
    match object.get(key) {
        Some(Value::Array(_)) => Ok(optional(object, key)?.unwrap_or_default()),
        _ => Ok(optional::<u32>(object, key)?.into_iter().collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Qwen3Config, ConfigError> {
        Qwen3Config::from_json_str(text, Path::new("dir/config.json"))
    }

    #[test]
    fn round_trips_through_json_and_keeps_unknown_keys() {
        let mut config = Qwen3Config::tiny(300);
        config.eos_token_id = vec![7];
        config.extra.insert("transformers_version".to_string(), Value::from("4.51.0"));
        let text = config.to_json_string();
        assert!(text.contains("\"eos_token_id\": 7"), "{text}");
        assert_eq!(parse(&text).unwrap(), config);
    }

    #[test]
    fn reads_the_rotary_base_and_dtype_where_transformers_5_writes_them() {
        let text = |rope: &str| {
            format!(
                r#"{{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                    "num_attention_heads": 8, "dtype": "bfloat16", "rope_parameters": {rope}}}"#
            )
        };
        let config = parse(&text(r#"{"rope_theta": 1000000.0, "rope_type": "default"}"#)).expect("transformers 5");
        assert_eq!((config.rope_theta, config.torch_dtype.as_deref()), (1e6, Some("bfloat16")));
        assert_eq!(parse(&text("{}")).expect("no base").rope_theta, 10_000.0);
        let error = parse(&text(r#"{"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}"#)).expect_err("yarn");
        assert!(error.to_string().contains("rope_parameters.rope_type"), "{error}");
        let error = parse(&text(r#"{"rope_theta": "big"}"#)).expect_err("not a number");
        assert!(error.to_string().contains("rope_parameters.rope_theta"), "{error}");
        let error = parse(&text(r#"{"full_attention": {"rope_theta": 1e6}}"#)).expect_err("per layer type");
        assert!(error.to_string().contains("per layer type"), "{error}");
        let both = |top: &str| {
            parse(&text(r#"{"rope_theta": 1000000.0}"#).replacen('{', &format!("{{\"rope_theta\": {top}, "), 1))
        };
        assert_eq!(both("1000000.0").expect("the same base twice").rope_theta, 1e6);
        let error = both("10000.0").expect_err("two bases");
        assert!(error.to_string().contains("differs from rope_theta"), "{error}");
    }

    #[test]
    fn applies_hugging_face_defaults() {
        let config = parse(
            r#"{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 1, "num_attention_heads": 8, "eos_token_id": [3, 4]}"#,
        )
        .unwrap();
        assert_eq!(config.num_key_value_heads, 8);
        assert_eq!(config.head_dim, 8);
        assert_eq!(config.rope_theta, 10_000.0);
        assert!(!config.tie_word_embeddings);
        assert_eq!(config.eos_token_id, vec![3, 4]);
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let valid = Qwen3Config::tiny(100).to_json_string();
        let cases = [
            (valid.replace("\"hidden_size\": 64", "\"hidden_size\": \"64\""), "hidden_size"),
            (valid.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"), "num_key_value_heads"),
            (valid.replace("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), "hidden_act"),
            (valid.replace("\"vocab_size\": 100,", ""), "vocab_size"),
            (valid.replace("\"model_type\": \"qwen3\"", "\"model_type\": \"gpt2\""), "model_type"),
            (valid.replace("\"model_type\": \"qwen3\"", "\"model_type\": \"llama\""), "model_type"),
            (valid.replace("Qwen3ForCausalLM", "LlamaForCausalLM"), "architectures"),
            (valid.replace("\"head_dim\": 16", "\"head_dim\": 15"), "head_dim"),
        ];
        for (text, key) in cases {
            let message = parse(&text).unwrap_err().to_string();
            assert!(message.contains("dir/config.json"), "{message}");
            assert!(message.contains(&format!("`{key}`")), "{message}");
        }
        let message = parse("{\"hidden_size\": 64,").unwrap_err().to_string();
        assert!(message.contains("dir/config.json"), "{message}");
    }

    #[test]
    fn rejects_features_the_model_does_not_implement() {
        let mut config = Qwen3Config::tiny(100);
        config.extra.insert("rope_scaling".to_string(), serde_json::json!({"rope_type": "yarn", "factor": 4.0}));
        assert_eq!(config.validate().unwrap_err().key, "rope_scaling");
        config.extra.insert("rope_scaling".to_string(), Value::Null);
        config.validate().unwrap();
        config.eos_token_id = vec![100];
        assert_eq!(config.validate().unwrap_err().key, "eos_token_id");
    }
}
