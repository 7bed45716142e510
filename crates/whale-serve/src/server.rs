//! The HTTP server: tiny_http accepts connections and parses requests on its own threads, and
//! a fixed pool of worker threads takes requests off its queue and answers each one, blocking
//! while the engine generates. The engine batches across workers, so the pool is sized for
//! concurrency (default 256 requests at once), not for CPU.
//!
//! Routes (OpenAI's, plus vLLM's and SGLang's model management):
//! - `POST /v1/chat/completions`, `POST /v1/completions` (both may stream)
//! - `GET /v1/models`, `GET /health`
//! - `POST /v1/load_lora_adapter {lora_name, lora_path}`, `POST /v1/unload_lora_adapter
//!   {lora_name}` (also without `/v1`, SGLang's paths)
//! - `POST /update_weights_from_disk {model_path}`: new weights for the base model

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::Deserialize;
use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response};

use crate::error::ApiError;
use crate::fault::FaultInjector;
use crate::generate::{self, EventSink};
use crate::registry::{ModelInfo, ModelRegistry, RegistryError};
use crate::request::{Endpoint, GenerationRequest};
use crate::response::ReplyHeader;

/// Where and how to serve.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub host: String,
    /// 0 picks a free port; [`Server::addr`] tells which.
    pub port: u16,
    /// Requests answered at once (each waits on the engine in its own thread).
    pub workers: usize,
    /// Larger request bodies get a 413.
    pub max_body_bytes: usize,
    /// Fraction of generation requests answered 503 without generating (fault injection).
    pub fail_rate: f64,
    pub fail_seed: u64,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_string(),
            port: 8000,
            workers: 256,
            max_body_bytes: 8 << 20,
            fail_rate: 0.0,
            fail_seed: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {address}: {reason}")]
    Bind { address: String, reason: String },
    #[error("serve config `{key}`: {reason}")]
    Config { key: &'static str, reason: String },
    #[error("cannot start a worker thread: {0}")]
    Spawn(std::io::Error),
}

/// Counters since the server started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests received, on every route.
    pub requests: u64,
    /// Generation requests answered 503 by the fault injector.
    pub injected_faults: u64,
}

/// What the workers share.
struct State {
    registry: ModelRegistry,
    faults: FaultInjector,
    max_body_bytes: usize,
    requests: AtomicU64,
    stopping: AtomicBool,
}

/// A running server; dropping it stops it.
pub struct Server {
    http: Arc<tiny_http::Server>,
    state: Arc<State>,
    workers: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

impl Server {
    /// Binds `host:port` and starts the workers.
    pub fn start(config: &ServeConfig, registry: ModelRegistry) -> Result<Self, ServeError> {
        if config.workers == 0 {
            return Err(ServeError::Config { key: "workers", reason: "must be positive".to_string() });
        }
        if !(0.0..=1.0).contains(&config.fail_rate) {
            return Err(ServeError::Config {
                key: "fail_rate",
                reason: format!("{} is not in [0, 1]", config.fail_rate),
            });
        }
        let address = format!("{}:{}", config.host, config.port);
        let bind_error = |reason: String| ServeError::Bind { address: address.clone(), reason };
        let http = tiny_http::Server::http(&address).map_err(|e| bind_error(e.to_string()))?;
        let addr = http.server_addr().to_ip().ok_or_else(|| bind_error("not an IP address".to_string()))?;
        let http = Arc::new(http);
        let state = Arc::new(State {
            registry,
            faults: FaultInjector::new(config.fail_rate, config.fail_seed),
            max_body_bytes: config.max_body_bytes,
            requests: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let mut server = Self { http, state, workers: Vec::with_capacity(config.workers), addr };
        for index in 0..config.workers {
            let (http, state) = (Arc::clone(&server.http), Arc::clone(&server.state));
            let worker = std::thread::Builder::new()
                .name(format!("whale-serve-{index}"))
                .spawn(move || work(&http, &state))
                .map_err(ServeError::Spawn)?;
            server.workers.push(worker);
        }
        Ok(server)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI base URL clients take, `http://host:port/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn registry(&self) -> &ModelRegistry {
        &self.state.registry
    }

    pub fn stats(&self) -> ServerStats {
        ServerStats {
            requests: self.state.requests.load(Ordering::Relaxed),
            injected_faults: self.state.faults.injected(),
        }
    }

    /// Blocks the calling thread for as long as the server runs (until the process ends).
    pub fn wait(mut self) {
        for worker in self.workers.drain(..) {
            // A worker that panicked has already stopped; the others keep serving.
            let _ = worker.join();
        }
    }

    /// Stops taking requests, lets the workers finish the requests they hold, and waits for them.
    pub fn shutdown(&mut self) {
        self.state.stopping.store(true, Ordering::SeqCst);
        for _ in 0..self.workers.len() {
            self.http.unblock();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn work(http: &tiny_http::Server, state: &State) {
    while !state.stopping.load(Ordering::SeqCst) {
        match http.recv() {
            Ok(request) => serve(state, request),
            // Unblocked for shutdown; or a connection failed before its request was complete.
            Err(_) => continue,
        }
    }
}

/// How a request is answered once routed.
enum Reply {
    Json(u16, Value),
    /// A valid generation request that streams: the writer is taken from the request.
    Stream(Box<GenerationRequest>, Arc<whale_lm::LocalPolicy>, Vec<u32>),
}

fn serve(state: &State, mut request: Request) {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let path = request.url().split('?').next().unwrap_or_default().to_string();
    let method = request.method().clone();
    match route(state, &mut request, &method, &path) {
        Ok(Reply::Json(status, body)) => respond_json(request, status, &body),
        Ok(Reply::Stream(generation, policy, prompt)) => stream(request, &generation, &policy, &prompt),
        Err(error) => respond_json(request, error.status, &error.body()),
    }
}

fn route(state: &State, request: &mut Request, method: &Method, path: &str) -> Result<Reply, ApiError> {
    let allowed = match path {
        "/v1/models" | "/health" => "GET",
        "/v1/chat/completions"
        | "/v1/completions"
        | "/v1/load_lora_adapter"
        | "/load_lora_adapter"
        | "/v1/unload_lora_adapter"
        | "/unload_lora_adapter"
        | "/update_weights_from_disk" => "POST",
        _ => return Err(ApiError::no_route(method.as_str(), path)),
    };
    if method.as_str() != allowed {
        return Err(ApiError::method_not_allowed(method.as_str(), path, allowed));
    }
    match path {
        "/health" => Ok(Reply::Json(200, json!({}))),
        "/v1/models" => Ok(Reply::Json(200, models(&state.registry.list()))),
        "/v1/chat/completions" => generation(state, request, Endpoint::Chat),
        "/v1/completions" => generation(state, request, Endpoint::Text),
        "/v1/load_lora_adapter" | "/load_lora_adapter" => load(state, &read_body(request, state.max_body_bytes)?),
        "/v1/unload_lora_adapter" | "/unload_lora_adapter" => unload(state, &read_body(request, state.max_body_bytes)?),
        _ => reload_base(state, &read_body(request, state.max_body_bytes)?),
    }
}

fn read_body(request: &mut Request, limit: usize) -> Result<Vec<u8>, ApiError> {
    if request.body_length().is_some_and(|length| length > limit) {
        return Err(ApiError::too_large(limit));
    }
    let mut body = Vec::new();
    request
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
    if body.len() > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(body)
}

fn generation(state: &State, request: &mut Request, endpoint: Endpoint) -> Result<Reply, ApiError> {
    if state.faults.should_fail() {
        return Err(ApiError::unavailable(format!("injected fault (fail rate {})", state.faults.rate()))
            .with_code("injected_fault"));
    }
    let parsed = GenerationRequest::parse(&read_body(request, state.max_body_bytes)?, endpoint)?;
    let policy = state.registry.get(&parsed.model).ok_or_else(|| ApiError::model_not_found(&parsed.model))?;
    let prompt = generate::prompt_ids(&policy, &parsed)?;
    if parsed.stream {
        if request.http_version() < &tiny_http::HTTPVersion(1, 1) {
            return Err(ApiError::bad_request("streaming needs HTTP/1.1 (a chunked body)").with_param("stream"));
        }
        return Ok(Reply::Stream(Box::new(parsed), policy, prompt));
    }
    let completions = generate::complete(&policy, &parsed, &prompt)?;
    let header = ReplyHeader::new(endpoint, &parsed.model);
    Ok(Reply::Json(200, header.completion(&completions, policy.tokenizer(), parsed.logprobs)))
}

fn stream(request: Request, generation: &GenerationRequest, policy: &whale_lm::LocalPolicy, prompt: &[u32]) {
    let header = ReplyHeader::new(generation.endpoint, &generation.model);
    generate::stream(policy, generation, prompt, &header, EventSink::open(request.into_writer()));
}

fn models(entries: &[ModelInfo]) -> Value {
    let data: Vec<Value> = entries
        .iter()
        .map(|entry| {
            json!({
                "id": entry.name,
                "object": "model",
                "created": entry.created,
                "owned_by": "whale",
                "root": entry.root.display().to_string(),
                "parent": entry.parent,
            })
        })
        .collect();
    json!({"object": "list", "data": data})
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadAdapter {
    lora_name: String,
    lora_path: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnloadAdapter {
    lora_name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateWeights {
    model_path: PathBuf,
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

fn load(state: &State, body: &[u8]) -> Result<Reply, ApiError> {
    let LoadAdapter { lora_name, lora_path } = parse(body)?;
    if lora_name.is_empty() {
        return Err(ApiError::bad_request("`lora_name` must not be empty").with_param("lora_name"));
    }
    let info = state.registry.load(&lora_name, &lora_path).map_err(|e| registry_error(e, "lora_path"))?;
    let message = format!("loaded `{}` from {}", info.name, info.root.display());
    Ok(Reply::Json(200, json!({"success": true, "message": message})))
}

fn unload(state: &State, body: &[u8]) -> Result<Reply, ApiError> {
    let UnloadAdapter { lora_name } = parse(body)?;
    state.registry.unload(&lora_name).map_err(|e| registry_error(e, "lora_name"))?;
    Ok(Reply::Json(200, json!({"success": true, "message": format!("unloaded `{lora_name}`")})))
}

fn reload_base(state: &State, body: &[u8]) -> Result<Reply, ApiError> {
    let UpdateWeights { model_path } = parse(body)?;
    let version = state.registry.reload_base(&model_path).map_err(|e| registry_error(e, "model_path"))?;
    let message =
        format!("`{}` now serves {} (weights version {version})", state.registry.base_name(), model_path.display());
    Ok(Reply::Json(200, json!({"success": true, "message": message, "weights_version": version})))
}

fn registry_error(error: RegistryError, param: &str) -> ApiError {
    let message = error.to_string();
    match error {
        RegistryError::Unknown(_) => ApiError::not_found(message).with_param(param),
        RegistryError::AdapterUnsupported(_) => ApiError::not_implemented(message).with_param(param),
        RegistryError::Duplicate(_)
        | RegistryError::Base(_)
        | RegistryError::NotAModel(_)
        | RegistryError::Engine(_)
        | RegistryError::Checkpoint(_) => ApiError::bad_request(message).with_param(param),
    }
}

fn respond_json(request: Request, status: u16, body: &Value) {
    let content_type = Header::from_bytes("Content-Type", "application/json").ok();
    let mut response = Response::from_data(body.to_string().into_bytes()).with_status_code(status);
    if let Some(header) = content_type {
        response.add_header(header);
    }
    // A client that went away needs no answer.
    let _ = request.respond(response);
}
