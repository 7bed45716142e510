//! LoRA adapters for Qwen3.5, in PEFT's layout.
//!
//! A module name (`q_proj`, `in_proj_qkv`, ...) targets every projection of that name, as PEFT
//! matches `target_modules`: the attention projections exist in the full-attention layers only,
//! the Gated DeltaNet ones in the linear layers only, the MLP's in all. Each matrix is stored under
//! PEFT's name, `base_model.model.<module path>.lora_A.weight` (the module path under
//! `model.language_model.` in the multimodal layout). The initialisation is the Qwen3 adapter's:
//! A uniform in `±1/sqrt(in)`, B zero.

use super::config::Qwen35Config;
use super::shapes::parameter_shapes;
use crate::parameters;
use crate::qwen3::lora::{
    config_error, lora_config_from_peft, peft_config, peft_key, LoraConfig, LoraError, ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
};
use crate::tensor_file::{read_exact_tensors, read_json_object, write_atomic, write_tensors, CheckpointError};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;
use std::sync::PoisonError;

/// The module names a Qwen3.5 adapter may target.
pub const TARGET_MODULES: [&str; 12] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "out_proj",
];

/// One adapted projection: its module path and weight shape `(out, in)`.
struct Module {
    path: String,
    out_dim: usize,
    in_dim: usize,
}

/// The projections `config.target_modules` names in a model of `model`'s configuration.
fn modules(config: &LoraConfig, model: &Qwen35Config) -> Result<Vec<Module>, LoraError> {
    if config.target_modules.is_empty() {
        return Err(config_error("target_modules", "empty"));
    }
    for (index, name) in config.target_modules.iter().enumerate() {
        if !TARGET_MODULES.contains(&name.as_str()) {
            return Err(config_error(
                "target_modules",
                format!("`{name}` is not one of Qwen3.5's {}", TARGET_MODULES.join(", ")),
            ));
        }
        if config.target_modules[..index].contains(name) {
            return Err(config_error("target_modules", format!("`{name}` is listed twice")));
        }
    }
    Ok(parameter_shapes(model)
        .into_iter()
        .filter_map(|(name, shape)| {
            let path = name.strip_suffix(".weight")?;
            let module = path.rsplit('.').next()?;
            let targeted = shape.len() == 2 && config.target_modules.iter().any(|t| t == module);
            targeted.then(|| Module { path: path.to_string(), out_dim: shape[0], in_dim: shape[1] })
        })
        .collect())
}

fn peft_name(path: &str, matrix: &str) -> String {
    format!("base_model.model.{path}.{matrix}.weight")
}

/// A LoRA adapter for Qwen3.5 models of one configuration. Cloning shares the variables.
#[derive(Clone)]
pub struct Qwen35Lora {
    config: LoraConfig,
    varmap: VarMap,
}

impl Qwen35Lora {
    /// A fresh adapter: A random (reproducible from `seed`), B zero. Dropout is not built for
    /// Qwen3.5, so a dropout above 0 is refused.
    pub fn new(
        config: LoraConfig,
        model: &Qwen35Config,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, LoraError> {
        config.validate_ranges()?;
        if config.dropout > 0.0 {
            return Err(config_error("dropout", "adapter dropout is not built for Qwen3.5; set it to 0"));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = HashMap::new();
        for module in modules(&config, model)? {
            let (a, b) = parameters::fresh_lora_pair(&mut rng, config.rank, module.in_dim, module.out_dim)?;
            tensors.insert(peft_name(&module.path, "lora_A"), a);
            tensors.insert(peft_name(&module.path, "lora_B"), b);
        }
        Self::from_tensors(config, tensors, dtype, device)
    }

    fn from_tensors(
        config: LoraConfig,
        tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, LoraError> {
        if !parameters::is_float(dtype) {
            return Err(config_error("dtype", format!("{dtype:?} is not a float type")));
        }
        let varmap = parameters::variables(tensors, dtype, device)?;
        Ok(Self { config, varmap })
    }

    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.config.scale()
    }

    /// The matrices under their PEFT names, sorted by name.
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        parameters::sorted(&self.varmap)
    }

    /// A (`[rank, in]`) and B (`[out, rank]`) of the projection at `path`, if it is adapted.
    pub(crate) fn matrices(&self, path: &str) -> Option<(Tensor, Tensor)> {
        let data = self.varmap.data().lock().unwrap_or_else(PoisonError::into_inner);
        let a = data.get(&peft_name(path, "lora_A"))?.as_tensor().clone();
        let b = data.get(&peft_name(path, "lora_B"))?.as_tensor().clone();
        Some((a, b))
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` into `dir`, which
    /// `peft.PeftModel.from_pretrained(Qwen3_5ForCausalLM, dir)` loads.
    pub fn save_peft(&self, dir: &Path, base_model_name_or_path: &str) -> Result<(), LoraError> {
        std::fs::create_dir_all(dir).map_err(|source| CheckpointError::Io { file: dir.to_path_buf(), source })?;
        let tensors = self.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
        write_tensors(&dir.join(ADAPTER_WEIGHTS_FILE), tensors)?;
        let targets: Vec<&str> = self.config.target_modules.iter().map(String::as_str).collect();
        let text = serde_json::to_string_pretty(&peft_config(&self.config, &targets, base_model_name_or_path))
            .unwrap_or_default();
        write_atomic(&dir.join(ADAPTER_CONFIG_FILE), text.as_bytes())?;
        Ok(())
    }

    /// Reads a PEFT adapter directory for models of `model`'s configuration; every problem
    /// names the file and the key or tensor at fault.
    pub fn load_peft(dir: &Path, model: &Qwen35Config, dtype: DType, device: &Device) -> Result<Self, LoraError> {
        let config_file = dir.join(ADAPTER_CONFIG_FILE);
        let object = read_json_object(&config_file)?;
        let invalid =
            |key: &str, reason: String| LoraError::Invalid { file: config_file.clone(), key: key.to_string(), reason };
        let config = lora_config_from_peft(&object).map_err(|issue| invalid(&issue.key, issue.reason))?;
        let checked = config.validate_ranges().and_then(|()| modules(&config, model));
        let modules = checked.map_err(|error| match error {
            LoraError::Config { key, reason } => invalid(&peft_key(&key), reason),
            other => other,
        })?;
        let wanted: Vec<(String, Vec<usize>)> = modules
            .iter()
            .flat_map(|m| {
                [
                    (peft_name(&m.path, "lora_A"), vec![config.rank, m.in_dim]),
                    (peft_name(&m.path, "lora_B"), vec![m.out_dim, config.rank]),
                ]
            })
            .collect();
        let tensors = read_exact_tensors(&dir.join(ADAPTER_WEIGHTS_FILE), &wanted)?;
        Self::from_tensors(config, tensors, dtype, device)
    }
}
