//! A Qwen3.5 configuration: the text model's keys of `transformers`' `Qwen3_5TextConfig`, read
//! from a `qwen3_5_text` `config.json` or from the `text_config` of the multimodal `qwen3_5` one.
//!
//! Every problem names the key (and the file, through [`ConfigError`]). The whole JSON object is
//! kept as read, so that saving writes back the same file, the vision tower's keys included.

use crate::qwen3::config::{optional, required, token_ids, ConfigError, ConfigIssue};
use serde_json::{Map, Value};
use std::path::Path;

/// The `model_type` of a text-only Qwen3.5 checkpoint (`Qwen3_5ForCausalLM`).
pub const TEXT_MODEL_TYPE: &str = "qwen3_5_text";
/// The `model_type` of a released, multimodal Qwen3.5 checkpoint (`Qwen3_5ForConditionalGeneration`),
/// whose text weights sit under `model.language_model.`.
pub const MULTIMODAL_MODEL_TYPE: &str = "qwen3_5";

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet: a causal depthwise convolution, then the gated delta-rule recurrence.
    LinearAttention,
    /// Grouped-query attention with an output gate and partial rotary embeddings.
    FullAttention,
}

impl LayerKind {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "linear_attention" => Some(Self::LinearAttention),
            "full_attention" => Some(Self::FullAttention),
            _ => None,
        }
    }
}

/// The hyper-parameters of a Qwen3.5 text model.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen35Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    /// The longest context the model is meant for (`transformers`' default: 32,768).
    pub max_position_embeddings: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// The share of each full-attention head that is rotated (Qwen3.5: 0.25).
    pub partial_rotary_factor: f64,
    pub tie_word_embeddings: bool,
    pub linear_conv_kernel_dim: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub layer_types: Vec<LayerKind>,
    pub eos_token_id: Vec<u32>,
    /// Whether the checkpoint is the multimodal wrapper (text weights under `model.language_model.`).
    pub multimodal: bool,
    /// The `config.json` object as read (empty for a configuration made here); saving writes
    /// its keys back beside the fields above ([`Qwen35Config::to_config_json`]).
    pub raw: Map<String, Value>,
}

impl Qwen35Config {
    /// Reads and validates a `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Io { file: path.to_path_buf(), source })?;
        let invalid = |issue| ConfigError::Invalid { file: path.to_path_buf(), issue };
        match serde_json::from_str(&text) {
            Ok(Value::Object(object)) => Self::from_object(object).map_err(invalid),
            Ok(_) => {
                Err(ConfigError::Syntax { file: path.to_path_buf(), reason: "the top level is not an object".into() })
            }
            Err(e) => Err(ConfigError::Syntax { file: path.to_path_buf(), reason: e.to_string() }),
        }
    }

    /// Reads a configuration object of either model type, then validates it.
    pub fn from_object(raw: Map<String, Value>) -> Result<Self, ConfigIssue> {
        let model_type: String = required(&raw, "model_type")?;
        let (text, prefix, multimodal) = match model_type.as_str() {
            TEXT_MODEL_TYPE => (raw.clone(), "", false),
            MULTIMODAL_MODEL_TYPE => match raw.get("text_config") {
                Some(Value::Object(text)) => (text.clone(), "text_config.", true),
                _ => return Err(ConfigIssue::new("text_config", "missing or not an object")),
            },
            other => {
                return Err(ConfigIssue::new(
                    "model_type",
                    format!("{other:?} is neither {TEXT_MODEL_TYPE:?} nor {MULTIMODAL_MODEL_TYPE:?}"),
                ))
            }
        };
        let nested = |issue: ConfigIssue| ConfigIssue::new(&format!("{prefix}{}", issue.key), issue.reason);
        let mut config = Self::from_text_object(&text).map_err(nested)?;
        if multimodal {
            if let Some(tied) = optional(&raw, "tie_word_embeddings")? {
                config.tie_word_embeddings = tied;
            }
        }
        config.multimodal = multimodal;
        config.raw = raw;
        config.validate().map_err(nested)?;
        Ok(config)
    }

    /// The keys of a `Qwen3_5TextConfig`, with its defaults where it has them.
    fn from_text_object(text: &Map<String, Value>) -> Result<Self, ConfigIssue> {
        let num_hidden_layers: usize = required(text, "num_hidden_layers")?;
        let (rope_theta, partial_rotary_factor) = rotary(text)?;
        let hidden_act: String = optional(text, "hidden_act")?.unwrap_or_else(|| "silu".into());
        if hidden_act != "silu" {
            return Err(ConfigIssue::new("hidden_act", format!("{hidden_act:?} is not supported (only \"silu\")")));
        }
        if optional(text, "attention_bias")?.unwrap_or(false) {
            return Err(ConfigIssue::new("attention_bias", "biases are not supported"));
        }
        Ok(Self {
            vocab_size: required(text, "vocab_size")?,
            hidden_size: required(text, "hidden_size")?,
            intermediate_size: required(text, "intermediate_size")?,
            num_hidden_layers,
            max_position_embeddings: optional(text, "max_position_embeddings")?.unwrap_or(32_768),
            num_attention_heads: required(text, "num_attention_heads")?,
            num_key_value_heads: required(text, "num_key_value_heads")?,
            head_dim: optional(text, "head_dim")?.unwrap_or(256),
            rms_norm_eps: optional(text, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            partial_rotary_factor,
            tie_word_embeddings: optional(text, "tie_word_embeddings")?.unwrap_or(false),
            linear_conv_kernel_dim: optional(text, "linear_conv_kernel_dim")?.unwrap_or(4),
            linear_key_head_dim: optional(text, "linear_key_head_dim")?.unwrap_or(128),
            linear_value_head_dim: optional(text, "linear_value_head_dim")?.unwrap_or(128),
            linear_num_key_heads: optional(text, "linear_num_key_heads")?.unwrap_or(16),
            linear_num_value_heads: optional(text, "linear_num_value_heads")?.unwrap_or(32),
            layer_types: layer_types(text, num_hidden_layers)?,
            eos_token_id: token_ids(text, "eos_token_id")?,
            multimodal: false,
            raw: Map::new(),
        })
    }

    fn validate(&self) -> Result<(), ConfigIssue> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("max_position_embeddings", self.max_position_embeddings),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(ConfigIssue::new(key, "must be positive"));
        }
        if self.linear_conv_kernel_dim < 2 {
            return Err(ConfigIssue::new("linear_conv_kernel_dim", "must be at least 2"));
        }
        let divides = [
            ("num_key_value_heads", self.num_key_value_heads, "num_attention_heads", self.num_attention_heads),
            ("linear_num_key_heads", self.linear_num_key_heads, "linear_num_value_heads", self.linear_num_value_heads),
        ];
        for (key, divisor, of, value) in divides {
            if !value.is_multiple_of(divisor) {
                return Err(ConfigIssue::new(key, format!("{divisor} does not divide {of} {value}")));
            }
        }
        let rotary = self.rotary_dim();
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim {
            return Err(ConfigIssue::new(
                "partial_rotary_factor",
                format!(
                    "{} of head_dim {} gives {rotary} rotated dimensions, not an even number in 2..=head_dim",
                    self.partial_rotary_factor, self.head_dim
                ),
            ));
        }
        if let Some(id) = self.eos_token_id.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(ConfigIssue::new(
                "eos_token_id",
                format!("{id} is outside the vocabulary of {}", self.vocab_size),
            ));
        }
        Ok(())
    }

    /// How many leading dimensions of each full-attention head are rotated.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// The width of the convolved `[q | k | v]` of a linear-attention layer.
    pub fn conv_dim(&self) -> usize {
        2 * self.linear_key_dim() + self.linear_value_dim()
    }

    pub fn linear_key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    pub fn linear_value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Where the text model's tensors are named from: `model.language_model.` in the multimodal
    /// wrapper, `model.` otherwise.
    pub fn weight_prefix(&self) -> &'static str {
        if self.multimodal {
            "model.language_model."
        } else {
            "model."
        }
    }

    /// A text-only configuration (`model_type` `qwen3_5_text`) of the given sizes, with Qwen3.5's
    /// layer pattern (every fourth layer full attention) and its defaults for the rest.
    pub fn text(vocab_size: usize, size: Qwen35Size) -> Self {
        let layer_types = (0..size.num_hidden_layers)
            .map(|i| if (i + 1) % 4 == 0 { LayerKind::FullAttention } else { LayerKind::LinearAttention })
            .collect();
        Self {
            vocab_size,
            hidden_size: size.hidden_size,
            intermediate_size: size.intermediate_size,
            num_hidden_layers: size.num_hidden_layers,
            max_position_embeddings: 32_768,
            num_attention_heads: size.num_attention_heads,
            num_key_value_heads: size.num_key_value_heads,
            head_dim: size.head_dim,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            partial_rotary_factor: 0.25,
            tie_word_embeddings: false,
            linear_conv_kernel_dim: 4,
            linear_key_head_dim: size.linear_head_dim,
            linear_value_head_dim: size.linear_head_dim,
            linear_num_key_heads: size.linear_num_key_heads,
            linear_num_value_heads: size.linear_num_value_heads,
            layer_types,
            eos_token_id: Vec::new(),
            multimodal: false,
            raw: Map::new(),
        }
    }

    /// The `config.json` to save: the object read, with the text configuration's keys (at the
    /// top level, or under `text_config` in the multimodal wrapper) set from the fields.
    pub fn to_config_json(&self) -> Map<String, Value> {
        let mut object = self.raw.clone();
        let mut text = self.to_json_object();
        if self.multimodal {
            text.remove("architectures");
            text.insert("model_type".into(), Value::from("qwen3_5_text"));
            let tied = text.remove("tie_word_embeddings");
            object.insert("tie_word_embeddings".into(), tied.unwrap_or(Value::Bool(false)));
            let mut nested = match object.remove("text_config") {
                Some(Value::Object(nested)) => nested,
                _ => Map::new(),
            };
            nested.extend(text);
            object.insert("text_config".into(), Value::Object(nested));
        } else {
            object.extend(text);
        }
        object
    }

    /// The text configuration as `transformers` writes a `Qwen3_5TextConfig`.
    fn to_json_object(&self) -> Map<String, Value> {
        let kinds: Vec<&str> = self
            .layer_types
            .iter()
            .map(|kind| match kind {
                LayerKind::LinearAttention => "linear_attention",
                LayerKind::FullAttention => "full_attention",
            })
            .collect();
        let value = serde_json::json!({
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": TEXT_MODEL_TYPE,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": false,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "layer_types": kinds,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
        });
        match value {
            Value::Object(object) => object,
            _ => Map::new(),
        }
    }
}

/// The sizes of a Qwen3.5 text model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qwen35Size {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub linear_head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
}

impl Qwen35Size {
    /// Four layers (three Gated DeltaNet, one full attention), 64 wide: for tests.
    pub const TINY: Qwen35Size = Qwen35Size {
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        linear_head_dim: 16,
        linear_num_key_heads: 2,
        linear_num_value_heads: 4,
    };

    /// The decoder layers of Qwen3.5-0.8B (the `text_config` of `Qwen/Qwen3.5-0.8B`'s
    /// `config.json`): 24 layers 1024 wide, in six runs of three Gated DeltaNet layers (16 key and
    /// 16 value heads of 128) and one gated full attention (8 query and 2 key/value heads of 256),
    /// each with an MLP of 3584. The released model also ties its embeddings to a 248,320-token
    /// vocabulary and rotates with base 10,000,000; [`Qwen35Config::text`] keeps its own defaults
    /// for those, which change no layer's shape.
    pub const QWEN3_5_0_8B: Qwen35Size = Qwen35Size {
        hidden_size: 1024,
        intermediate_size: 3584,
        num_hidden_layers: 24,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 256,
        linear_head_dim: 128,
        linear_num_key_heads: 16,
        linear_num_value_heads: 16,
    };
}

/// The rotary base and the rotated share: from `rope_parameters` (transformers 5), else the top
/// level; 10,000 and 0.25 (the defaults of `Qwen3_5TextConfig`) when neither has them.
fn rotary(text: &Map<String, Value>) -> Result<(f64, f64), ConfigIssue> {
    let parameters = match text.get("rope_parameters") {
        Some(Value::Object(parameters)) => parameters.clone(),
        None | Some(Value::Null) => Map::new(),
        Some(other) => return Err(ConfigIssue::new("rope_parameters", format!("not an object (found {other})"))),
    };
    let nested = |issue: ConfigIssue| ConfigIssue::new(&format!("rope_parameters.{}", issue.key), issue.reason);
    let kind: Option<String> = optional(&parameters, "rope_type").map_err(nested)?;
    if let Some(kind) = kind.filter(|kind| kind != "default") {
        return Err(ConfigIssue::new(
            "rope_parameters.rope_type",
            format!("{kind:?} is not supported (only \"default\")"),
        ));
    }
    let theta = optional(&parameters, "rope_theta")
        .map_err(nested)?
        .map_or_else(|| optional(text, "rope_theta"), |t| Ok(Some(t)))?;
    let factor = optional(&parameters, "partial_rotary_factor")
        .map_err(nested)?
        .map_or_else(|| optional(text, "partial_rotary_factor"), |f| Ok(Some(f)))?;
    let theta: f64 = theta.unwrap_or(10_000.0);
    if !(theta.is_finite() && theta > 0.0) {
        return Err(ConfigIssue::new("rope_parameters.rope_theta", format!("{theta} is not a positive number")));
    }
    Ok((theta, factor.unwrap_or(0.25)))
}

/// `layer_types`, or when absent the pattern of `full_attention_interval` (default 4): every
/// interval-th layer full attention, the others linear.
fn layer_types(text: &Map<String, Value>, layers: usize) -> Result<Vec<LayerKind>, ConfigIssue> {
    let Some(names) = optional::<Vec<String>>(text, "layer_types")? else {
        let interval: usize = optional(text, "full_attention_interval")?.unwrap_or(4);
        if interval == 0 {
            return Err(ConfigIssue::new("full_attention_interval", "must be positive"));
        }
        return Ok((0..layers)
            .map(|i| if (i + 1) % interval == 0 { LayerKind::FullAttention } else { LayerKind::LinearAttention })
            .collect());
    };
    if names.len() != layers {
        return Err(ConfigIssue::new("layer_types", format!("{} entries for num_hidden_layers {layers}", names.len())));
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            LayerKind::parse(name).ok_or_else(|| {
                ConfigIssue::new(
                    &format!("layer_types[{i}]"),
                    format!("{name:?} is neither \"linear_attention\" nor \"full_attention\""),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(text: &str) -> Map<String, Value> {
        match serde_json::from_str(text).unwrap() {
            Value::Object(object) => object,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn reads_the_text_config_of_the_multimodal_wrapper() {
        let mut text = Qwen35Config::text(300, Qwen35Size::TINY).to_config_json();
        text.remove("layer_types");
        text.insert("full_attention_interval".into(), Value::from(2));
        let wrapper = serde_json::json!({"model_type": "qwen3_5", "tie_word_embeddings": true,
            "text_config": text, "vision_config": {"depth": 1}});
        let config = Qwen35Config::from_object(object(&wrapper.to_string())).unwrap();
        assert!(config.multimodal && config.tie_word_embeddings);
        assert_eq!(config.weight_prefix(), "model.language_model.");
        assert_eq!(config.layer_types[1], LayerKind::FullAttention);
        assert_eq!(config.layer_types[2], LayerKind::LinearAttention);
        assert_eq!(config.rotary_dim(), 4);
        assert!(config.raw.contains_key("vision_config"));
    }

    #[test]
    fn the_0_8b_size_has_the_released_checkpoints_text_parameters() {
        let mut config = Qwen35Config::text(248_320, Qwen35Size::QWEN3_5_0_8B);
        config.tie_word_embeddings = true;
        config.validate().unwrap();
        let shapes = super::super::parameter_shapes(&config);
        let count: usize = shapes.iter().map(|(_, shape)| shape.iter().product::<usize>()).sum();
        // The parameters of the text tensors in Qwen/Qwen3.5-0.8B's model.safetensors (the
        // vision tower and the MTP head left out), the figure published for its text model.
        assert_eq!(count, 752_393_024);
        let full = config.layer_types.iter().filter(|kind| **kind == LayerKind::FullAttention).count();
        assert_eq!((full, config.rotary_dim(), config.conv_dim()), (6, 64, 6144));
    }

    #[test]
    fn errors_name_the_key() {
        let valid = Value::Object(Qwen35Config::text(300, Qwen35Size::TINY).to_config_json()).to_string();
        let cases = [
            (valid.replace("\"linear_num_value_heads\":4", "\"linear_num_value_heads\":3"), "linear_num_key_heads"),
            (valid.replace("\"full_attention\"", "\"sliding\""), "layer_types[3]"),
            (valid.replace("\"partial_rotary_factor\":0.25", "\"partial_rotary_factor\":0.1"), "partial_rotary_factor"),
            (valid.replace("\"hidden_size\":64,", ""), "hidden_size"),
            (valid.replace("\"model_type\":\"qwen3_5_text\"", "\"model_type\":\"qwen3\""), "model_type"),
        ];
        for (text, key) in cases {
            let issue = Qwen35Config::from_object(object(&text)).unwrap_err();
            assert_eq!(issue.key, key, "{issue}");
        }
        let wrapper = format!(
            "{{\"model_type\": \"qwen3_5\", \"text_config\": {}}}",
            valid.replace("\"head_dim\":16", "\"head_dim\":\"16\"")
        );
        assert_eq!(Qwen35Config::from_object(object(&wrapper)).unwrap_err().key, "text_config.head_dim");
    }
}
