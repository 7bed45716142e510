//! LoRA adapters for the dense decoder (Qwen3, Llama), stored in Hugging Face PEFT's layout.
//!
//! Why: training a low-rank update `scale * B A` of chosen projections instead of the whole
//! model trains a small fraction of the parameters, leaves the base weights untouched (one base,
//! many adapters) and yields what serving engines such as vLLM and SGLang hot-load. The adapter's
//! tensors live in their own `VarMap` under the exact names PEFT saves
//! (`base_model.model.model.layers.{N}.self_attn.q_proj.lora_A.weight`, ...), so
//! `adapter_model.safetensors` is read and written without renaming, and a model built with
//! [`crate::qwen3::model::DenseModel::with_adapter`] holds the same variables: an optimizer step on the
//! adapter is seen by every model built on it.
//!
//! A is `[rank, in]` and starts uniform in `±1/sqrt(in)` (PEFT's Kaiming-uniform with `a = √5`),
//! B is `[out, rank]` and starts at zero, so a fresh adapter leaves the model's outputs unchanged.

use crate::parameters;
use crate::qwen3::config::{optional, required, ConfigIssue};
use crate::qwen3::dense::{DenseConfig, DenseSettings};
use crate::tensor_file::{read_exact_tensors, read_json_object, write_atomic, write_tensors, CheckpointError};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::PoisonError;

pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Why an adapter could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("lora config `{key}`: {reason}")]
    Config { key: String, reason: String },
    /// A key of `adapter_config.json` that is missing, wrong, or asks for a feature whale does
    /// not implement.
    #[error("{}: `{key}`: {reason}", file.display())]
    Invalid { file: PathBuf, key: String, reason: String },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub(crate) fn config_error(key: &str, reason: impl Into<String>) -> LoraError {
    LoraError::Config { key: key.to_string(), reason: reason.into() }
}

/// A projection of a decoder layer that an adapter can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl LoraTarget {
    /// Every target, in the order of a layer's forward pass.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// The module name PEFT's `target_modules` uses.
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|target| target.name() == name)
    }

    /// The module's path inside a decoder layer, e.g. `self_attn.q_proj`.
    pub fn module_path(self) -> String {
        let block = match self {
            LoraTarget::QProj | LoraTarget::KProj | LoraTarget::VProj | LoraTarget::OProj => "self_attn",
            LoraTarget::GateProj | LoraTarget::UpProj | LoraTarget::DownProj => "mlp",
        };
        format!("{block}.{}", self.name())
    }

    /// Whether the projection is one of those Qwen2 adds a bias to (query, key, value).
    pub fn has_qkv_bias(self) -> bool {
        matches!(self, LoraTarget::QProj | LoraTarget::KProj | LoraTarget::VProj)
    }

    /// `(out, in)` of the projection's weight in a model of these settings.
    pub fn weight_shape(self, config: &DenseSettings) -> (usize, usize) {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let q = config.num_attention_heads * config.head_dim;
        let kv = config.num_key_value_heads * config.head_dim;
        match self {
            LoraTarget::QProj => (q, h),
            LoraTarget::KProj | LoraTarget::VProj => (kv, h),
            LoraTarget::OProj => (h, q),
            LoraTarget::GateProj | LoraTarget::UpProj => (i, h),
            LoraTarget::DownProj => (h, i),
        }
    }
}

/// The PEFT name of one adapter matrix (`matrix` is `lora_A` or `lora_B`).
pub fn peft_tensor_name(layer: usize, target: LoraTarget, matrix: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{}.{matrix}.weight", target.module_path())
}

/// The name of the base weight a target adapts, e.g. `model.layers.0.self_attn.q_proj.weight`.
pub fn base_weight_name(layer: usize, target: LoraTarget) -> String {
    format!("model.layers.{layer}.{}.weight", target.module_path())
}

/// The Hugging Face name of a projection's bias (Qwen2's query, key and value projections).
pub fn bias_name(layer: usize, target: LoraTarget) -> String {
    format!("model.layers.{layer}.{}.bias", target.module_path())
}

fn default_target_modules() -> Vec<String> {
    LoraTarget::ALL.iter().map(|target| target.name().to_string()).collect()
}

/// An adapter's hyper-parameters (the `[weights.lora]` table of a run config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// The rank r of the update `B A`.
    pub rank: usize,
    /// The update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// Dropout on the adapter's input during training (never when generating).
    pub dropout: f64,
    /// Projections adapted in every layer: `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
    /// `up_proj`, `down_proj`.
    pub target_modules: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self { rank: 8, alpha: 16.0, dropout: 0.0, target_modules: default_target_modules() }
    }
}

impl LoraConfig {
    /// Checks the ranges and the module names; the error names the key at fault.
    pub fn validate(&self) -> Result<(), LoraError> {
        self.validate_ranges()?;
        self.targets().map(|_| ())
    }

    /// Checks rank, alpha and dropout (the module names are the architecture's to check).
    pub(crate) fn validate_ranges(&self) -> Result<(), LoraError> {
        if self.rank == 0 {
            return Err(config_error("rank", "must be positive"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(config_error("alpha", "must be a positive number"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(config_error("dropout", "must lie in [0, 1)"));
        }
        Ok(())
    }

    /// The targeted projections in forward order; an error for an empty list, an unknown name
    /// or a name given twice.
    pub fn targets(&self) -> Result<Vec<LoraTarget>, LoraError> {
        if self.target_modules.is_empty() {
            return Err(config_error("target_modules", "empty"));
        }
        let mut targets = Vec::with_capacity(self.target_modules.len());
        for name in &self.target_modules {
            let target = LoraTarget::from_name(name).ok_or_else(|| {
                config_error(
                    "target_modules",
                    format!("`{name}` is not one of {}", default_target_modules().join(", ")),
                )
            })?;
            if targets.contains(&target) {
                return Err(config_error("target_modules", format!("`{name}` is listed twice")));
            }
            targets.push(target);
        }
        targets.sort_unstable();
        Ok(targets)
    }

    /// `alpha / rank`, the factor of the update.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

/// A LoRA adapter for models of one configuration: its hyper-parameters and, in their own
/// `VarMap` under PEFT names, the matrices A (`[rank, in]`) and B (`[out, rank]`) of every
/// targeted projection of every layer.
///
/// Cloning is cheap and shares the variables.
#[derive(Clone)]
pub struct LoraAdapter {
    config: LoraConfig,
    targets: Vec<LoraTarget>,
    num_layers: usize,
    varmap: VarMap,
    dtype: DType,
    device: Device,
}

impl LoraAdapter {
    /// A fresh adapter for models of `model`'s configuration: A random (reproducible from
    /// `seed`), B zero.
    pub fn new(
        config: LoraConfig,
        model: &impl DenseConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, LoraError> {
        config.validate()?;
        let targets = config.targets()?;
        let model = model.settings();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = HashMap::new();
        for layer in 0..model.num_hidden_layers {
            for &target in &targets {
                let (out_dim, in_dim) = target.weight_shape(&model);
                let (a, b) = parameters::fresh_lora_pair(&mut rng, config.rank, in_dim, out_dim)?;
                tensors.insert(peft_tensor_name(layer, target, "lora_A"), a);
                tensors.insert(peft_tensor_name(layer, target, "lora_B"), b);
            }
        }
        Self::from_tensors(config, targets, model.num_hidden_layers, tensors, dtype, device)
    }

    fn from_tensors(
        config: LoraConfig,
        targets: Vec<LoraTarget>,
        num_layers: usize,
        tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, LoraError> {
        if !parameters::is_float(dtype) {
            return Err(config_error("dtype", format!("{dtype:?} is not a float type")));
        }
        let varmap = parameters::variables(tensors, dtype, device)?;
        Ok(Self { config, targets, num_layers, varmap, dtype, device: device.clone() })
    }

    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The targeted projections, in forward order.
    pub fn targets(&self) -> &[LoraTarget] {
        &self.targets
    }

    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.config.scale()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Every matrix with its PEFT name, sorted by name.
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        parameters::sorted(&self.varmap)
    }

    /// Scalars in all matrices.
    pub fn parameter_count(&self) -> usize {
        self.named_parameters().iter().map(|(_, var)| var.elem_count()).sum()
    }

    /// A and B of one projection (tensors sharing the variables' storage), `None` when the
    /// adapter does not target it.
    pub fn matrices(&self, layer: usize, target: LoraTarget) -> Option<(Tensor, Tensor)> {
        let data = self.varmap.data().lock().unwrap_or_else(PoisonError::into_inner);
        let a = data.get(&peft_tensor_name(layer, target, "lora_A"))?;
        let b = data.get(&peft_tensor_name(layer, target, "lora_B"))?;
        Some((a.as_tensor().clone(), b.as_tensor().clone()))
    }

    /// Whether the adapter's matrices fit models of these settings.
    pub(crate) fn check_fits(&self, model: &DenseSettings) -> Result<(), String> {
        if self.num_layers != model.num_hidden_layers {
            return Err(format!("the adapter has {} layers, the model {}", self.num_layers, model.num_hidden_layers));
        }
        for (name, expected) in expected_shapes(&self.targets, self.config.rank, model) {
            let found =
                self.varmap.data().lock().unwrap_or_else(PoisonError::into_inner).get(&name).map(|v| v.dims().to_vec());
            if found.as_ref() != Some(&expected) {
                return Err(format!("adapter tensor `{name}` has shape {found:?}, the model needs {expected:?}"));
            }
        }
        Ok(())
    }

    /// Writes the adapter in PEFT's layout into `dir` (created if needed):
    /// `adapter_model.safetensors` with PEFT's tensor names in the adapter's dtype, and
    /// `adapter_config.json` naming `base_model_name_or_path`, so that
    /// `peft.PeftModel.from_pretrained` loads it onto the base model (`Qwen3ForCausalLM`,
    /// `LlamaForCausalLM`): the module names are the same in both.
    pub fn save_peft(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), LoraError> {
        std::fs::create_dir_all(dir).map_err(|source| CheckpointError::Io { file: dir.to_path_buf(), source })?;
        let tensors = self.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
        write_tensors(&dir.join(ADAPTER_WEIGHTS_FILE), tensors)?;
        let text = serde_json::to_string_pretty(&self.peft_config(base_model_name_or_path)).unwrap_or_default();
        write_atomic(&dir.join(ADAPTER_CONFIG_FILE), text.as_bytes())?;
        Ok(())
    }

    fn peft_config(&self, base_model_name_or_path: &str) -> Value {
        let target_modules: Vec<&str> = self.targets.iter().map(|target| target.name()).collect();
        peft_config(&self.config, &target_modules, base_model_name_or_path)
    }

    /// Reads an adapter directory written by [`Self::save_peft`] or by PEFT for models of
    /// `model`'s configuration, converting the matrices to `dtype` on `device`. Every problem
    /// names the file and the key or tensor at fault; PEFT features whale does not implement
    /// (DoRA, rsLoRA, biases, per-module ranks, extra trained modules) are refused.
    pub fn load_peft(dir: &Path, model: &impl DenseConfig, dtype: DType, device: &Device) -> Result<Self, LoraError> {
        let model = model.settings();
        let config_file = dir.join(ADAPTER_CONFIG_FILE);
        let object = read_json_object(&config_file)?;
        let config = lora_config_from_peft(&object).map_err(|issue| LoraError::Invalid {
            file: config_file.clone(),
            key: issue.key,
            reason: issue.reason,
        })?;
        let invalid =
            |key: &str, reason: String| LoraError::Invalid { file: config_file.clone(), key: key.to_string(), reason };
        config.validate().map_err(|error| match error {
            LoraError::Config { key, reason } => invalid(&peft_key(&key), reason),
            other => other,
        })?;
        let targets = config.targets()?;
        let wanted = expected_shapes(&targets, config.rank, &model);
        let tensors = read_exact_tensors(&dir.join(ADAPTER_WEIGHTS_FILE), &wanted)?;
        Self::from_tensors(config, targets, model.num_hidden_layers, tensors, dtype, device)
    }
}

/// `adapter_config.json` as PEFT writes it for a plain LoRA of a causal LM.
pub(crate) fn peft_config(config: &LoraConfig, target_modules: &[&str], base_model_name_or_path: &str) -> Value {
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "revision": null,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": target_modules,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    })
}

/// The name PEFT gives a key of [`LoraConfig`].
pub(crate) fn peft_key(key: &str) -> String {
    match key {
        "rank" => "r".to_string(),
        "alpha" => "lora_alpha".to_string(),
        "dropout" => "lora_dropout".to_string(),
        other => other.to_string(),
    }
}

/// Every matrix an adapter with these targets and rank has for `model`, with its shape.
fn expected_shapes(targets: &[LoraTarget], rank: usize, model: &DenseSettings) -> Vec<(String, Vec<usize>)> {
    let mut shapes = Vec::with_capacity(2 * targets.len() * model.num_hidden_layers);
    for layer in 0..model.num_hidden_layers {
        for &target in targets {
            let (out_dim, in_dim) = target.weight_shape(model);
            shapes.push((peft_tensor_name(layer, target, "lora_A"), vec![rank, in_dim]));
            shapes.push((peft_tensor_name(layer, target, "lora_B"), vec![out_dim, rank]));
        }
    }
    shapes
}

/// The hyper-parameters of a PEFT `adapter_config.json`, refusing what whale cannot apply.
pub(crate) fn lora_config_from_peft(object: &Map<String, Value>) -> Result<LoraConfig, ConfigIssue> {
    let peft_type: String = required(object, "peft_type")?;
    if peft_type != "LORA" {
        return Err(ConfigIssue::new("peft_type", format!("`{peft_type}` is not LORA")));
    }
    let unsupported = |key: &str, plain: &dyn Fn(&Value) -> bool| -> Result<(), ConfigIssue> {
        match object.get(key) {
            Some(value) if !plain(value) => Err(ConfigIssue::new(key, format!("{value} is not supported"))),
            _ => Ok(()),
        }
    };
    let is_false = |value: &Value| matches!(value, Value::Null | Value::Bool(false));
    let is_empty = |value: &Value| match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    };
    for key in ["use_dora", "use_rslora", "fan_in_fan_out"] {
        unsupported(key, &is_false)?;
    }
    for key in ["modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern"] {
        unsupported(key, &is_empty)?;
    }
    unsupported("bias", &|value| matches!(value, Value::Null) || value == "none")?;
    let target_modules = match object.get("target_modules") {
        Some(Value::String(pattern)) => {
            return Err(ConfigIssue::new(
                "target_modules",
                format!("the pattern {pattern:?} is not supported; list the modules"),
            ))
        }
        _ => required(object, "target_modules")?,
    };
    Ok(LoraConfig {
        rank: required(object, "r")?,
        alpha: required(object, "lora_alpha")?,
        dropout: optional(object, "lora_dropout")?.unwrap_or(0.0),
        target_modules,
    })
}
