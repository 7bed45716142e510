//! `whale serve`: an OpenAI-compatible HTTP server over whale's continuous-batching engine.
//!
//! Why a server at all: the same rollout code then runs against the local engine, `whale serve`
//! on another machine, vLLM or SGLang, through one client ([`whale_policy::RemotePolicy`]); and
//! `whale serve` is what that client's retries, timeouts and adapter routing are tested
//! against on loopback, fault injection included.
//!
//! Data flow of one chat request: hyper parses the HTTP request and reads the body (capped)
//! → on a blocking [`server`] thread, [`request::GenerationRequest::parse`] checks it strictly → the [`registry::ModelRegistry`] picks the [`whale_engine::LocalPolicy`]
//! named by `model` → [`generate`] renders the messages with the model's chat template and
//! submits one engine request per choice (seed, seed + 1, ...) → the engine batches them with
//! every other request in flight → [`response::ReplyHeader`] writes the OpenAI body, or
//! [`generate::stream`] sends each token as a `chat.completion.chunk` event as it is sampled.
//! Every failure is an [`error::ApiError`] with an OpenAI-shaped body and a 4xx/5xx status.
//!
//! Who may do what: before any of this, [`auth`] refuses a request without the server's API key
//! (401), and [`runtime_loading`] keeps the endpoints that load, unload and reload models off
//! (403) unless they are turned on, and then lets them read only under allowed directories.

pub mod auth;
pub mod error;
pub mod fault;
pub mod generate;
pub mod registry;
pub mod request;
pub mod response;
pub mod runtime_loading;
pub mod server;
pub mod tools;

pub use auth::{ApiKey, InvalidApiKey};
pub use error::ApiError;
pub use fault::FaultInjector;
pub use registry::{LoadSettings, ModelInfo, ModelRegistry, RegistryError};
pub use request::{Endpoint, GenerationRequest, Prompt};
pub use runtime_loading::{AllowedPathError, RuntimeLoading};
pub use server::{ServeConfig, ServeError, Server, ServerStats, StopReport, StopSignals};
pub use tools::{ToolChoice, ToolRequest};
