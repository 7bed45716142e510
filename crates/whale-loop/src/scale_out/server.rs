//! Rollouts on an inference server (vLLM, SGLang or `whale serve`) and the hot-loading of the
//! weights an external trainer writes.
//!
//! Why: on a GPU cluster the model is served by an engine the user already runs, so whale loads
//! no weights itself. Every rollout (weight phase, search, test evaluation) is a chat request to
//! the server's OpenAI-compatible API, and after each weight step whale tells the server to load
//! the new LoRA adapter (or full checkpoint) and to drop the previous one, then sends the next
//! rollouts to the adapter by name. The engines agree on the chat API but not on these admin
//! endpoints, which is what [`ServerKind`] says:
//!
//! | kind     | load an adapter                  | unload                             | full checkpoint                |
//! |----------|----------------------------------|------------------------------------|--------------------------------|
//! | `vllm`   | `POST /v1/load_lora_adapter`     | `POST /v1/unload_lora_adapter`     | `POST /collective_rpc`, then `POST /reset_prefix_cache` |
//! | `sglang` | `POST /load_lora_adapter`        | `POST /unload_lora_adapter`        | `POST /update_weights_from_disk` |
//! | `whale`  | as vLLM                          | as vLLM                            | as SGLang                      |
//!
//! with the JSON bodies `{"lora_name", "lora_path"}`, `{"lora_name"}`, `{"model_path"}` and, for
//! vLLM, `{"method": "reload_weights", "kwargs": {"weights_path"}}`. vLLM takes adapters only when
//! started with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` and `--enable-lora`, and checkpoints only
//! with `VLLM_SERVER_DEV_MODE=1`. Its reload keeps the old `lm_head` of a model whose embeddings
//! are tied (a log line is all it says), and its prefix cache holds keys and values computed by
//! the old weights; so whale refuses a tied checkpoint before sending it, and empties the cache
//! after. The paths are the trainer's output directories, sent absolute (the server's working
//! directory is not whale's): the server must see the same paths (a shared filesystem).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use whale_http::{ClientConfig, HttpError, JsonClient, RetryPolicy};
use whale_lm::checkpoint::{self, CheckpointError};
use whale_policy::{ChatRequest, Completion, Policy, PolicyError, RemoteConfig, RemoteError, RemotePolicy};

/// How the server hot-loads new weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerKind {
    Vllm,
    Sglang,
    Whale,
}

impl ServerKind {
    fn adapter_endpoint(self, action: &str) -> String {
        match self {
            ServerKind::Vllm | ServerKind::Whale => format!("/v1/{action}_lora_adapter"),
            ServerKind::Sglang => format!("/{action}_lora_adapter"),
        }
    }
}

/// `[server]`: where rollouts go instead of the in-process engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The OpenAI API root, e.g. `http://10.0.0.5:8000/v1` (chat requests go to
    /// `<base_url>/chat/completions`).
    pub base_url: String,
    /// The root of the admin endpoints (adapter and weight loading); absent: `base_url`
    /// without its trailing `/v1`.
    pub admin_url: Option<String>,
    /// The served base model's name (the `model` of requests until the first adapter is loaded).
    pub model: String,
    pub kind: ServerKind,
    /// The environment variable holding the API key sent as a bearer token (`--api-key` of
    /// vLLM and SGLang); unset or empty: no key.
    pub api_key_env: String,
    /// Most chat requests in flight at once.
    pub max_concurrency: usize,
    /// Seconds one chat request may take.
    pub request_timeout_s: f64,
    /// Seconds to establish a connection.
    pub connect_timeout_s: f64,
    /// Retries of a request after a transient fault (429, 5xx, reset, timeout).
    pub max_retries: u32,
    /// Cap of the first backoff draw, doubled per retry up to `backoff_max_ms`.
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// Send the vLLM / SGLang sampling extensions (`top_k`, token ids); false for servers that
    /// reject unknown request fields.
    pub extensions: bool,
    /// Seconds an adapter or checkpoint load may take.
    pub load_timeout_s: f64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            base_url: "http://127.0.0.1:8000/v1".to_string(),
            admin_url: None,
            model: String::new(),
            kind: ServerKind::Vllm,
            api_key_env: "WHALE_SERVER_API_KEY".to_string(),
            max_concurrency: 64,
            request_timeout_s: 600.0,
            connect_timeout_s: 10.0,
            max_retries: 8,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
            extensions: true,
            load_timeout_s: 600.0,
        }
    }
}

impl ServerConfig {
    /// Checks the table; the error names the key at fault (`server.<key>`).
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let is_http = |url: &str| url.starts_with("http://") || url.starts_with("https://");
        if !is_http(&self.base_url) {
            return Err(("server.base_url", format!("`{}` is not an http:// or https:// URL", self.base_url)));
        }
        if let Some(admin) = self.admin_url.as_deref().filter(|url| !is_http(url)) {
            return Err(("server.admin_url", format!("`{admin}` is not an http:// or https:// URL")));
        }
        if self.model.trim().is_empty() {
            return Err(("server.model", "must name the served base model".to_string()));
        }
        if self.max_concurrency == 0 {
            return Err(("server.max_concurrency", "must be positive".to_string()));
        }
        for (key, seconds) in [
            ("server.request_timeout_s", self.request_timeout_s),
            ("server.connect_timeout_s", self.connect_timeout_s),
            ("server.load_timeout_s", self.load_timeout_s),
        ] {
            if !(seconds.is_finite() && seconds > 0.0 && seconds <= crate::scale_out::trainer_command::MAX_SECONDS) {
                return Err((key, "must be a positive number of seconds, at most a year".to_string()));
            }
        }
        if self.backoff_max_ms < self.backoff_initial_ms {
            return Err(("server.backoff_max_ms", "must be at least backoff_initial_ms".to_string()));
        }
        Ok(())
    }

    /// The admin root: `admin_url`, else `base_url` without a trailing `/v1`.
    pub fn admin_root(&self) -> String {
        match &self.admin_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                let base = self.base_url.trim_end_matches('/');
                base.strip_suffix("/v1").unwrap_or(base).to_string()
            }
        }
    }

    /// The API key from `api_key_env`, if set and non-empty.
    pub fn api_key(&self) -> Option<String> {
        if self.api_key_env.is_empty() {
            return None;
        }
        std::env::var(&self.api_key_env).ok().filter(|key| !key.is_empty())
    }

    /// The chat client's settings.
    pub fn remote_config(&self) -> RemoteConfig {
        RemoteConfig {
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            api_key: self.api_key(),
            api_key_env: String::new(),
            max_concurrency: self.max_concurrency,
            request_timeout_s: self.request_timeout_s,
            connect_timeout_s: self.connect_timeout_s,
            max_retries: self.max_retries,
            backoff_initial_ms: self.backoff_initial_ms,
            backoff_max_ms: self.backoff_max_ms,
            extensions: self.extensions,
        }
    }
}

/// The policy of a run on a server: the chat client, routed to the weights installed last, and
/// the run's weights version (kept across a resume, where the client's own count starts afresh).
pub struct ServedPolicy {
    remote: RemotePolicy,
    version: AtomicU64,
}

impl ServedPolicy {
    /// The served base model, as weights version 0.
    pub fn new(config: &ServerConfig) -> Result<Self, RemoteError> {
        Ok(Self { remote: RemotePolicy::new(config.remote_config())?, version: AtomicU64::new(0) })
    }

    /// Sends requests from now on to the served model or adapter `model`, as weights `version`.
    pub fn route(&self, model: &str, version: u64) {
        self.remote.set_model(model);
        self.version.store(version, Ordering::SeqCst);
    }
}

impl Policy for ServedPolicy {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        self.remote.chat(request)
    }

    fn name(&self) -> String {
        self.remote.name()
    }

    fn weights_version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }
}

/// Why the server did not take new weights.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("POST {url}: {message}")]
    Transport { url: String, message: String },
    #[error("POST {url}: HTTP {status}: {message}")]
    Status { url: String, status: u16, message: String },
    /// A success status whose body says the operation failed (SGLang's `{"success": false}`).
    #[error("POST {url}: the server reports failure: {message}")]
    Refused { url: String, message: String },
    #[error(
        "POST {url}: HTTP 404: vLLM serves its weight reload only in development mode; start it with \
         VLLM_SERVER_DEV_MODE=1, or train LoRA adapters (output = \"adapter\")"
    )]
    DevModeOff { url: String },
    /// vLLM would keep the old `lm_head` of this checkpoint.
    #[error(
        "{path}: {reason}; vLLM's in-place reload keeps the old lm_head of a model with tied embeddings, so \
         serve and train an untied model (tie_word_embeddings false, an lm_head.weight tensor), or train LoRA \
         adapters (output = \"adapter\")"
    )]
    TiedCheckpoint { path: String, reason: String },
    /// A checkpoint whose config or tensor names cannot be read, so whether it is tied is unknown.
    #[error(
        "{path}: {reason}; before vLLM reloads a checkpoint whale reads its config.json and the tensor \
         names of model.safetensors (or model.safetensors.index.json) to refuse tied embeddings"
    )]
    UnreadableCheckpoint { path: String, reason: String },
}

impl From<HttpError> for ServerError {
    fn from(error: HttpError) -> Self {
        let attempts = match &error {
            HttpError::GaveUp { attempts, .. } => format!(" (after {attempts} attempts)"),
            _ => String::new(),
        };
        match error.last() {
            HttpError::Status { url, status, message, .. } => {
                ServerError::Status { url: url.clone(), status: *status, message: format!("{message}{attempts}") }
            }
            HttpError::Transport { url, .. } | HttpError::Reply { url, .. } => {
                ServerError::Transport { url: url.clone(), message: error.to_string() }
            }
            HttpError::Config { .. } | HttpError::GaveUp { .. } => ServerError::Client(error.to_string()),
        }
    }
}

impl ServerError {
    /// The server answered the request as invalid.
    fn is_client_error(&self) -> bool {
        matches!(self, ServerError::Status { status, .. } if (400..500).contains(status))
    }

    /// The server does not hold what the request names: a 404, or a 400 saying so (older vLLM
    /// answers an unknown adapter that way). Authorization and other refusals are not this.
    fn is_not_found(&self) -> bool {
        let ServerError::Status { status, message, .. } = self else { return false };
        let text = message.to_lowercase();
        *status == 404
            || (*status == 400
                && ["not found", "cannot be found", "does not exist", "not loaded"].iter().any(|w| text.contains(w)))
    }
}

/// `path` as the server must get it: absolute, since the server's working directory is not
/// whale's.
fn absolute(path: &Path) -> Result<String, ServerError> {
    std::path::absolute(path)
        .map(|path| path.display().to_string())
        .map_err(|e| ServerError::Client(format!("cannot make {} absolute: {e}", path.display())))
}

/// Refuses a checkpoint whose output layer is tied to its embeddings (its `config.json` says so,
/// at the top or in a multimodal wrapper's `text_config`) or absent from its weights: vLLM's
/// in-place reload would serve it with the old `lm_head`.
fn refuse_tied(dir: &Path) -> Result<(), ServerError> {
    let path = || dir.display().to_string();
    let tied = |reason: &str| ServerError::TiedCheckpoint { path: path(), reason: reason.to_string() };
    let unreadable = |e: CheckpointError| ServerError::UnreadableCheckpoint { path: path(), reason: e.to_string() };
    let config = Value::Object(checkpoint::config_object(dir).map_err(unreadable)?);
    let flag = |config: &Value| config.get("tie_word_embeddings").and_then(Value::as_bool);
    if flag(&config).or_else(|| config.get("text_config").and_then(flag)) == Some(true) {
        return Err(tied("config.json says tie_word_embeddings: true"));
    }
    let names = checkpoint::tensor_names(dir).map_err(unreadable)?;
    if !names.iter().any(|name| name == "lm_head.weight" || name.ends_with(".lm_head.weight")) {
        return Err(tied("its weights hold no lm_head.weight"));
    }
    Ok(())
}

/// The admin endpoints of one server.
pub struct ServerAdmin {
    http: JsonClient,
    root: String,
    kind: ServerKind,
}

impl ServerAdmin {
    pub fn new(config: &ServerConfig) -> Result<Self, ServerError> {
        let http = JsonClient::new(ClientConfig {
            request_timeout: Duration::from_secs_f64(config.load_timeout_s),
            connect_timeout: Duration::from_secs_f64(config.connect_timeout_s),
            api_key: config.api_key(),
            retry: RetryPolicy::from_millis(config.max_retries, config.backoff_initial_ms, config.backoff_max_ms),
            max_in_flight: None,
        })?;
        Ok(Self { http, root: config.admin_root(), kind: config.kind })
    }

    /// Loads the PEFT adapter in `path` under `name`. A server that already holds an adapter
    /// of that name (left by an interrupted attempt of the same step) refuses the load with a
    /// 4xx; the stale one is then unloaded and the load repeated once.
    pub fn load_adapter(&self, name: &str, path: &Path) -> Result<(), ServerError> {
        let endpoint = self.kind.adapter_endpoint("load");
        let body = json!({"lora_name": name, "lora_path": absolute(path)?});
        match self.post(&endpoint, &body) {
            Err(error) if error.is_client_error() => {
                self.unload_adapter(name)?;
                self.post(&endpoint, &body)
            }
            other => other,
        }
    }

    /// Unloads the adapter `name`; one the server says it does not hold is already gone.
    pub fn unload_adapter(&self, name: &str) -> Result<(), ServerError> {
        match self.post(&self.kind.adapter_endpoint("unload"), &json!({"lora_name": name})) {
            Err(error) if error.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// Replaces the served base weights by the checkpoint in `path`.
    pub fn load_checkpoint(&self, path: &Path) -> Result<(), ServerError> {
        let path = absolute(path)?;
        if self.kind != ServerKind::Vllm {
            return self.post("/update_weights_from_disk", &json!({"model_path": path}));
        }
        refuse_tied(Path::new(&path))?;
        let reload = json!({"method": "reload_weights", "kwargs": {"weights_path": path}});
        match self.post("/collective_rpc", &reload) {
            Err(ServerError::Status { status: 404, url, .. }) => return Err(ServerError::DevModeOff { url }),
            other => other?,
        }
        self.post("/reset_prefix_cache", &json!({}))
    }

    /// POSTs `body`, retrying transient faults; a success whose body says `"success": false`
    /// (SGLang's way) is a refusal.
    fn post(&self, endpoint: &str, body: &Value) -> Result<(), ServerError> {
        let url = format!("{}{endpoint}", self.root);
        let text = self.http.post(&url, body)?;
        let refused = serde_json::from_str::<Value>(&text).is_ok_and(|reply| reply["success"] == json!(false));
        if refused {
            return Err(ServerError::Refused { url, message: whale_http::server_message(&text) });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_root_drops_the_api_suffix_unless_given() {
        let mut config = ServerConfig { base_url: "http://h:8000/v1/".to_string(), ..ServerConfig::default() };
        assert_eq!(config.admin_root(), "http://h:8000");
        config.admin_url = Some("http://admin:9000/".to_string());
        assert_eq!(config.admin_root(), "http://admin:9000");
    }

    #[test]
    fn validation_names_the_key() {
        let valid = ServerConfig { model: "Qwen/Qwen3-8B".to_string(), ..ServerConfig::default() };
        assert_eq!(valid.validate(), Ok(()));
        let no_model = ServerConfig::default();
        assert_eq!(no_model.validate().map_err(|(key, _)| key), Err("server.model"));
        let bad_url = ServerConfig { base_url: "127.0.0.1:8000".to_string(), ..valid.clone() };
        assert_eq!(bad_url.validate().map_err(|(key, _)| key), Err("server.base_url"));
        let bad_timeout = ServerConfig { load_timeout_s: 0.0, ..valid };
        assert_eq!(bad_timeout.validate().map_err(|(key, _)| key), Err("server.load_timeout_s"));
    }

    #[test]
    fn only_a_not_found_answer_means_an_adapter_is_gone() {
        let status = |status: u16, message: &str| ServerError::Status {
            url: "http://h/v1/unload_lora_adapter".to_string(),
            status,
            message: message.to_string(),
        };
        assert!(status(404, "The lora adapter 'a' cannot be found.").is_not_found());
        assert!(status(400, "The lora adapter 'a' cannot be found.").is_not_found());
        assert!(!status(401, "Unauthorized").is_not_found());
        assert!(!status(403, "Forbidden").is_not_found());
        assert!(!status(400, "lora_name is required").is_not_found());
        assert!(!status(500, "not found").is_not_found());
    }

    #[test]
    fn servers_get_absolute_paths_whatever_whale_s_directory() {
        let sent = absolute(Path::new("runs/r/weights/step-000001/adapter")).expect("absolute");
        assert!(Path::new(&sent).is_absolute(), "{sent}");
        assert!(sent.ends_with("runs/r/weights/step-000001/adapter"), "{sent}");
        assert_eq!(absolute(Path::new("/data/a")).expect("absolute"), "/data/a");
    }

    #[test]
    fn timeouts_beyond_a_year_are_refused() {
        let config = ServerConfig { model: "m".to_string(), load_timeout_s: 1e20, ..ServerConfig::default() };
        assert_eq!(config.validate().map_err(|(key, _)| key), Err("server.load_timeout_s"));
    }
}
