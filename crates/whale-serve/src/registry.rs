//! The served models by name. A request's `model` picks the entry; the base model is always
//! there, and checkpoints and adapters come and go at run time (vLLM's
//! `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`), which is how an external trainer
//! hands each new set of weights to the rollouts without restarting the server.
//!
//! Every entry is its own [`LocalPolicy`] (its own scheduler), held by `Arc`: unloading removes
//! the name at once, and the requests already running on it finish before its engine stops. A
//! LoRA adapter's entry shares the base model's weights (only the adapter's matrices are new);
//! a full checkpoint's entry has weights of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use candle_core::{DType, Device};
use whale_engine::{EngineConfig, EngineError, LocalPolicy};
use whale_lm::checkpoint::CONFIG_FILE;
use whale_lm::lora::ADAPTER_CONFIG_FILE;
use whale_lm::{AdapterError, CheckpointError, Decoder, LoraError, ModelError};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("a model named `{0}` is already loaded")]
    Duplicate(String),
    #[error("no model named `{0}` is loaded")]
    Unknown(String),
    #[error("`{0}` is the base model; it cannot be unloaded")]
    Base(String),
    #[error("{}: neither {CONFIG_FILE} (a full checkpoint) nor {ADAPTER_CONFIG_FILE} (a LoRA adapter) is there", .0.display())]
    NotAModel(PathBuf),
    #[error(transparent)]
    Adapter(#[from] LoraError),
    #[error("the adapter does not fit the base model: {0}")]
    AdapterMismatch(#[from] ModelError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl From<AdapterError> for RegistryError {
    fn from(error: AdapterError) -> Self {
        match error {
            AdapterError::Load(error) => Self::Adapter(error),
            AdapterError::Mismatch(error) => Self::AdapterMismatch(error),
        }
    }
}

/// What an entry serves, for `/v1/models`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    /// The directory the weights came from.
    pub root: PathBuf,
    /// The base model's name for entries loaded at run time; `None` for the base itself.
    pub parent: Option<String>,
    /// Unix seconds when the entry was added.
    pub created: u64,
}

struct Entry {
    policy: Arc<LocalPolicy>,
    info: ModelInfo,
}

/// How models loaded at run time are put in memory.
#[derive(Debug, Clone)]
pub struct LoadSettings {
    pub dtype: DType,
    pub device: Device,
    pub engine: EngineConfig,
}

impl Default for LoadSettings {
    fn default() -> Self {
        Self { dtype: DType::F32, device: Device::Cpu, engine: EngineConfig::default() }
    }
}

/// Name → served model.
pub struct ModelRegistry {
    base: String,
    settings: LoadSettings,
    entries: RwLock<BTreeMap<String, Entry>>,
}

impl ModelRegistry {
    /// A registry serving `base` under `name`; `root` is where its weights came from.
    pub fn new(name: impl Into<String>, base: LocalPolicy, root: PathBuf, settings: LoadSettings) -> Self {
        let name = name.into();
        let info = ModelInfo { name: name.clone(), root, parent: None, created: now() };
        let entry = Entry { policy: Arc::new(base), info };
        Self { base: name.clone(), settings, entries: RwLock::new(BTreeMap::from([(name, entry)])) }
    }

    /// Serves the Hugging Face model directory `dir` under its file name (or `name`).
    pub fn open(dir: &Path, name: Option<String>, settings: LoadSettings) -> Result<Self, RegistryError> {
        let name = name.unwrap_or_else(|| default_name(dir));
        let policy = LocalPolicy::load(dir, settings.dtype, &settings.device, settings.engine.clone())?;
        Ok(Self::new(name.clone(), policy.with_name(name), dir.to_path_buf(), settings))
    }

    /// The base model's name.
    pub fn base_name(&self) -> &str {
        &self.base
    }

    pub fn get(&self, name: &str) -> Option<Arc<LocalPolicy>> {
        self.read().get(name).map(|entry| Arc::clone(&entry.policy))
    }

    /// Every entry, the base first, then by name.
    pub fn list(&self) -> Vec<ModelInfo> {
        let entries = self.read();
        let base = entries.get(&self.base).map(|entry| entry.info.clone());
        base.into_iter()
            .chain(entries.values().filter(|entry| entry.info.name != self.base).map(|entry| entry.info.clone()))
            .collect()
    }

    /// Loads the weights in `dir` under `name`: a PEFT LoRA adapter (`adapter_config.json`)
    /// applied to the base model, or a full checkpoint (`config.json`), each served by a new
    /// engine. The directory is read before the name is taken, so a slow load does not block
    /// requests to the other entries.
    pub fn load(&self, name: &str, dir: &Path) -> Result<ModelInfo, RegistryError> {
        if self.read().contains_key(name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        let policy = if dir.join(ADAPTER_CONFIG_FILE).is_file() {
            self.with_adapter(dir)?
        } else if dir.join(CONFIG_FILE).is_file() {
            let settings = &self.settings;
            LocalPolicy::load(dir, settings.dtype, &settings.device, settings.engine.clone())?
        } else {
            return Err(RegistryError::NotAModel(dir.to_path_buf()));
        }
        .with_name(name);
        let info = ModelInfo {
            name: name.to_string(),
            root: dir.to_path_buf(),
            parent: Some(self.base.clone()),
            created: now(),
        };
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        if entries.contains_key(name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        entries.insert(name.to_string(), Entry { policy: Arc::new(policy), info: info.clone() });
        Ok(info)
    }

    /// An engine serving the base model with the adapter in `dir` applied: the base weights are
    /// shared, and the tokenizer, chat template and end-of-sequence ids are the base model's.
    fn with_adapter(&self, dir: &Path) -> Result<LocalPolicy, RegistryError> {
        let base = self.get(&self.base).ok_or_else(|| RegistryError::Unknown(self.base.clone()))?;
        let adapted = base.decoder().with_peft_adapter(dir)?;
        let engine = EngineConfig { eos_token_ids: base.eos_token_ids().to_vec(), ..self.settings.engine.clone() };
        Ok(LocalPolicy::new(adapted, base.tokenizer().clone(), base.template().clone(), engine)?)
    }

    /// Removes `name`; its requests in flight still finish.
    pub fn unload(&self, name: &str) -> Result<(), RegistryError> {
        if name == self.base {
            return Err(RegistryError::Base(name.to_string()));
        }
        let removed = self.entries.write().unwrap_or_else(PoisonError::into_inner).remove(name);
        removed.map(drop).ok_or_else(|| RegistryError::Unknown(name.to_string()))
    }

    /// Replaces the base model's weights with those in `dir` (same vocabulary, a context at
    /// least as long), as SGLang's `/update_weights_from_disk` does, and returns the new weights
    /// version. Requests in flight continue on the new weights; the other entries keep theirs
    /// (adapters loaded earlier stay on the old base weights).
    pub fn reload_base(&self, dir: &Path) -> Result<u64, RegistryError> {
        let model = Decoder::load(dir, self.settings.dtype, &self.settings.device)?;
        let base = self.get(&self.base).ok_or_else(|| RegistryError::Unknown(self.base.clone()))?;
        let version = whale_policy::Policy::weights_version(base.as_ref()) + 1;
        base.reload(model, version)?;
        if let Some(entry) = self.entries.write().unwrap_or_else(PoisonError::into_inner).get_mut(&self.base) {
            entry.info.root = dir.to_path_buf();
        }
        Ok(version)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.entries.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A model directory's served name: its last path component.
pub fn default_name(dir: &Path) -> String {
    dir.file_name().map_or_else(|| dir.display().to_string(), |name| name.to_string_lossy().into_owned())
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}
