//! The HTTP server: hyper on a small tokio runtime parses requests and streams replies; each
//! request's work (parsing, generation, model loading) runs on tokio's blocking pool, where it
//! may wait on the engine as long as it takes. The engine batches across those threads, so the
//! pool is sized for concurrency (default 256 requests at once), not for CPU.
//!
//! Why not a simpler blocking server: tiny_http, tried first, hands connections to a pool that
//! keeps 4 threads and queues a burst of new keep-alive connections behind them, so 60 of 64
//! concurrent clients waited until others hung up. hyper and tokio are in the build already
//! (reqwest is made of them).
//!
//! Routes (OpenAI's, plus vLLM's and SGLang's model management):
//! - `POST /v1/chat/completions`, `POST /v1/completions` (both may stream)
//! - `GET /v1/models`, `GET /health` (503 once the base model's engine has stopped)
//! - `POST /v1/load_lora_adapter {lora_name, lora_path}`, `POST /v1/unload_lora_adapter
//!   {lora_name}` (also without `/v1`, SGLang's paths)
//! - `POST /update_weights_from_disk {model_path}`: new weights for the base model
//!
//! With an API key every route answers 401 unless the request carries it ([`crate::auth`]); a
//! server without one starts only on loopback, unless [`ServeConfig::insecure_no_auth`]. The
//! last three routes change what is served: they answer 403 unless runtime loading is on, and
//! then read only under the allowed directories ([`crate::runtime_loading`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use serde_json::{json, Value};
use whale_engine::LocalPolicy;

use crate::auth::{self, ApiKey, InvalidApiKey};
use crate::error::ApiError;
use crate::fault::FaultInjector;
use crate::generate::{self, EventSink};
use crate::registry::{ModelInfo, ModelRegistry, RegistryError};
use crate::request::{json_body, Endpoint, GenerationRequest};
use crate::response::ReplyHeader;
use crate::runtime_loading::{AdminAccess, AllowedPathError, RuntimeLoading};

/// Where and how to serve.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub host: String,
    /// 0 picks a free port; [`Server::addr`] tells which.
    pub port: u16,
    /// Requests worked on at once (each waits on the engine in its own thread); more wait.
    pub workers: usize,
    /// Generation requests that may wait for a worker beyond the `workers` running; past
    /// `workers + max_queued_requests`, a generation request is answered 429 at once, with
    /// `Retry-After`, without reading its body or taking a worker.
    pub max_queued_requests: usize,
    /// Connections open at once; past it, new connections wait in the kernel's backlog until
    /// one closes (idle ones close after `header_read_timeout`).
    pub max_connections: usize,
    /// Larger request bodies get a 413.
    pub max_body_bytes: usize,
    /// Fraction of generation requests answered 503 without generating (fault injection).
    pub fail_rate: f64,
    pub fail_seed: u64,
    /// The key every request must carry as `Authorization: Bearer KEY`; `None`: no key.
    pub api_key: Option<ApiKey>,
    /// Serve a host that is not loopback without a key; otherwise [`Server::start`] refuses.
    pub insecure_no_auth: bool,
    /// Whether clients may load, unload and reload models, and from where.
    pub runtime_loading: RuntimeLoading,
    /// How long a client may take to send a request's headers, counted from when the server
    /// waits for them (an idle keep-alive connection included); the connection is closed then,
    /// so that clients trickling headers (slowloris) cannot hold connections open forever.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body once its headers are in (408 then).
    pub body_read_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_string(),
            port: 8000,
            workers: 256,
            max_queued_requests: 256,
            max_connections: 1024,
            max_body_bytes: 8 << 20,
            fail_rate: 0.0,
            fail_seed: 0,
            api_key: None,
            insecure_no_auth: false,
            runtime_loading: RuntimeLoading::default(),
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {address}: {reason}")]
    Bind { address: String, reason: String },
    #[error("serve config `{key}`: {reason}")]
    Config { key: &'static str, reason: String },
    #[error("cannot start the server's runtime: {0}")]
    Runtime(std::io::Error),
    #[error(
        "refusing to serve {address} without an API key: it is not a loopback address, so anyone who \
         reaches it could use the server; give it a key (`whale serve --api-key KEY`, or the variable \
         WHALE_API_KEY), or serve it open on purpose with --insecure-no-auth"
    )]
    OpenWithoutKey { address: String },
    #[error(transparent)]
    ApiKey(#[from] InvalidApiKey),
    #[error(transparent)]
    AllowedPath(#[from] AllowedPathError),
}

/// Counters since the server started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests received, on every route.
    pub requests: u64,
    /// Generation requests answered 503 by the fault injector.
    pub injected_faults: u64,
    /// Whole-reply generation requests given up because their client hung up first (counted
    /// once every choice has stopped).
    pub abandoned: u64,
    /// Generation requests answered 429 because the queue was full.
    pub queue_full: u64,
    /// Generation requests running or queued now.
    pub admitted: usize,
    /// Connections open now.
    pub connections: usize,
}

/// How a stop went ([`Server::stop`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Generation requests that were running or queued when the stop began.
    pub in_flight: usize,
    /// Of those, the ones still running at the end of the grace period, answered 503 (a stream:
    /// an error event) at their next token.
    pub cut_off: usize,
}

/// What the request handlers share.
struct State {
    registry: ModelRegistry,
    api_key: Option<ApiKey>,
    admin: AdminAccess,
    faults: FaultInjector,
    max_body_bytes: usize,
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    requests: AtomicU64,
    abandoned: AtomicU64,
    queue_full: AtomicU64,
    /// Generation requests running or queued ([`Ticket`]), and how many may be.
    admitted: AtomicUsize,
    admit_limit: usize,
    connections: AtomicUsize,
    /// Raised when a stop begins: new requests are answered 503 and connections close after
    /// the request they carry.
    draining: AtomicBool,
    /// Raised at the end of the grace period: generations in flight stop at their next token.
    cutting_off: AtomicBool,
    stop: tokio::sync::watch::Sender<bool>,
}

/// A generation request's place among the admitted ones, given back when dropped: once its
/// generation is over (a whole reply's body is then built and written; a stream's last events
/// may still be on their way). A stop waits for the connections to close as well.
pub(crate) struct Ticket(Arc<State>);

impl Ticket {
    /// A place, or the 429 of a full queue. Counted with the stop's draining flag in one
    /// order (`SeqCst`), so that a stop either sees this ticket or this request sees the stop.
    fn take(state: &Arc<State>) -> Result<Self, ApiError> {
        let admitted = state.admitted.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |admitted| {
            (admitted < state.admit_limit).then_some(admitted + 1)
        });
        if admitted.is_err() {
            state.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::queue_full(state.admit_limit));
        }
        Ok(Self(Arc::clone(state)))
    }

    /// Whether the generation should stop now: its client hung up, or the stop's grace has ended.
    fn cut_off(&self) -> bool {
        self.0.cutting_off.load(Ordering::Relaxed)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's place among the open ones, given back when the connection ends.
struct ConnectionSlot(Arc<State>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A running server; dropping it stops it ([`Server::stop`] with a grace of a few seconds).
pub struct Server {
    runtime: Option<tokio::runtime::Runtime>,
    state: Arc<State>,
    addr: SocketAddr,
}

/// How long dropping a server lets requests in flight finish.
const DROP_GRACE: Duration = Duration::from_secs(5);

/// How long a stop waits for the connections to close once no generation is left.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How long a stop waits, after the grace period, for cut-off generations to write their 503.
const CUT_OFF_WAIT: Duration = Duration::from_secs(5);

impl Server {
    /// Binds `host:port` and starts serving.
    pub fn start(config: &ServeConfig, registry: ModelRegistry) -> Result<Self, ServeError> {
        validate(config)?;
        let admin = AdminAccess::new(&config.runtime_loading)?;
        let address = format!("{}:{}", config.host, config.port);
        if config.api_key.is_none() && !config.insecure_no_auth && !is_loopback(&address) {
            return Err(ServeError::OpenWithoutKey { address });
        }
        let bind_error = |e: std::io::Error| ServeError::Bind { address: address.clone(), reason: e.to_string() };
        let listener = std::net::TcpListener::bind(&address).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(config.workers)
            .thread_name("whale-serve")
            .enable_io()
            .enable_time()
            .build()
            .map_err(ServeError::Runtime)?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(bind_error)?
        };
        let state = Arc::new(State {
            registry,
            api_key: config.api_key.clone(),
            admin,
            faults: FaultInjector::new(config.fail_rate, config.fail_seed),
            max_body_bytes: config.max_body_bytes,
            header_read_timeout: config.header_read_timeout,
            body_read_timeout: config.body_read_timeout,
            requests: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
            admitted: AtomicUsize::new(0),
            admit_limit: config.workers + config.max_queued_requests,
            connections: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            cutting_off: AtomicBool::new(false),
            stop: tokio::sync::watch::channel(false).0,
        });
        runtime.spawn(accept(listener, Arc::clone(&state), config.max_connections));
        Ok(Self { runtime: Some(runtime), state, addr })
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
            abandoned: self.state.abandoned.load(Ordering::Relaxed),
            queue_full: self.state.queue_full.load(Ordering::Relaxed),
            admitted: self.state.admitted.load(Ordering::Relaxed),
            connections: self.state.connections.load(Ordering::Relaxed),
        }
    }

    /// Starts listening for SIGTERM and SIGINT (Ctrl-C), before the server says where it is, so
    /// that a supervisor that stops it as soon as it is up gets a graceful stop.
    pub fn stop_signals(&self) -> Result<StopSignals, ServeError> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = self.runtime.as_ref().expect("a server that has not stopped has its runtime");
        let _entered = runtime.enter();
        Ok(StopSignals {
            terminate: signal(SignalKind::terminate()).map_err(ServeError::Runtime)?,
            interrupt: signal(SignalKind::interrupt()).map_err(ServeError::Runtime)?,
        })
    }

    /// Blocks until one of `signals` arrives, then stops with `grace`. A second signal during
    /// the stop calls `on_second_signal` (the command line exits at once).
    pub fn run_until_signalled(
        mut self,
        mut signals: StopSignals,
        grace: Duration,
        on_second_signal: impl FnOnce() + Send + 'static,
    ) -> StopReport {
        let runtime = self.runtime.as_ref().expect("a server that has not stopped has its runtime");
        runtime.block_on(std::future::poll_fn(|cx| signals.poll_any(cx)));
        runtime.spawn(async move {
            std::future::poll_fn(|cx| signals.poll_any(cx)).await;
            on_second_signal();
        });
        self.stop(grace)
    }

    /// Stops gracefully: closes the listening socket at once (new connections are refused),
    /// answers new requests on open connections 503 and closes each connection after the
    /// request it carries, lets the generation requests in flight finish for up to `grace`,
    /// then cuts off those still running (503, or an error event in a stream) and stops.
    pub fn stop(&mut self, grace: Duration) -> StopReport {
        let Some(runtime) = self.runtime.take() else { return StopReport::default() };
        let state = &self.state;
        state.draining.store(true, Ordering::SeqCst);
        let in_flight = state.admitted.load(Ordering::SeqCst);
        state.stop.send_replace(true);
        let generating = || state.admitted.load(Ordering::SeqCst) > 0;
        // Each connection closes once its last reply is written, admin requests' too.
        let closed = || state.connections.load(Ordering::SeqCst) == 0;
        let cut_off = if wait_until(|| !generating() && closed(), grace) || !generating() {
            0
        } else {
            let running = state.admitted.load(Ordering::SeqCst);
            state.cutting_off.store(true, Ordering::SeqCst);
            wait_until(|| !generating(), CUT_OFF_WAIT);
            running
        };
        wait_until(closed, CLOSE_WAIT);
        runtime.shutdown_timeout(Duration::from_millis(500));
        StopReport { in_flight, cut_off }
    }
}

/// Whether `done` came true within `limit` (a limit past what the clock can count waits for
/// ever), checking every few milliseconds.
fn wait_until(done: impl Fn() -> bool, limit: Duration) -> bool {
    let deadline = std::time::Instant::now().checked_add(limit);
    while !done() {
        if deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// The signals that stop a server ([`Server::stop_signals`]).
pub struct StopSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn poll_any(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.terminate.poll_recv(cx).is_ready() || self.interrupt.poll_recv(cx).is_ready() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

fn validate(config: &ServeConfig) -> Result<(), ServeError> {
    let positive = [
        ("workers", config.workers == 0),
        ("max_connections", config.max_connections == 0),
        ("max_body_bytes", config.max_body_bytes == 0),
        ("header_read_timeout", config.header_read_timeout.is_zero()),
        ("body_read_timeout", config.body_read_timeout.is_zero()),
    ];
    if let Some((key, _)) = positive.iter().find(|(_, zero)| *zero) {
        return Err(ServeError::Config { key, reason: "must be positive".to_string() });
    }
    if config.workers.checked_add(config.max_queued_requests).is_none() {
        return Err(ServeError::Config {
            key: "max_queued_requests",
            reason: "workers + max_queued_requests overflows".into(),
        });
    }
    if !(0.0..=1.0).contains(&config.fail_rate) {
        return Err(ServeError::Config { key: "fail_rate", reason: format!("{} is not in [0, 1]", config.fail_rate) });
    }
    Ok(())
}

/// Whether every address `host:port` names is a loopback one (127.0.0.0/8, ::1; `localhost`
/// resolves to them). A name that does not resolve is not loopback (binding it fails anyway).
fn is_loopback(address: &str) -> bool {
    let Ok(addresses) = address.to_socket_addrs() else { return false };
    let addresses: Vec<SocketAddr> = addresses.collect();
    !addresses.is_empty() && addresses.iter().all(|address| address.ip().to_canonical().is_loopback())
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop(DROP_GRACE);
    }
}

/// Accepts connections, at most `max_connections` open at once, until the stop is raised; the
/// listening socket closes when this returns.
async fn accept(listener: tokio::net::TcpListener, state: Arc<State>, max_connections: usize) {
    let mut stop = stop_signal(&state);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    loop {
        let mut acquire = std::pin::pin!(Arc::clone(&slots).acquire_owned());
        let permit = std::future::poll_fn(|cx| match stop.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => acquire.as_mut().poll(cx).map(Result::ok),
        });
        let Some(permit) = permit.await else { return };
        let accepted = std::future::poll_fn(|cx| match stop.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => listener.poll_accept(cx).map(Some),
        });
        let stream = match accepted.await {
            None => return,
            Some(Ok((stream, _))) => stream,
            Some(Err(_)) => {
                // Out of file descriptors or a connection reset before it was accepted: wait
                // a moment rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        state.connections.fetch_add(1, Ordering::AcqRel);
        let slot = ConnectionSlot(Arc::clone(&state));
        tokio::spawn(serve_connection(stream, Arc::clone(&state), (permit, slot)));
    }
}

/// A future that is ready once the stop is raised, and stays ready (it may be polled again).
fn stop_signal(state: &State) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let mut stop = state.stop.subscribe();
    let mut waiting = Some(Box::pin(async move {
        // An error means the sender is gone, with the server's state: stopped as well.
        let _ = stop.wait_for(|stopped| *stopped).await;
    }));
    Box::pin(std::future::poll_fn(move |cx| match waiting.as_mut().map(|future| future.as_mut().poll(cx)) {
        Some(Poll::Pending) => Poll::Pending,
        Some(Poll::Ready(())) | None => {
            waiting = None;
            Poll::Ready(())
        }
    }))
}

/// One connection's requests, one after another, until the client closes it or the server
/// stops (then after the request it carries).
async fn serve_connection<Held>(stream: tokio::net::TcpStream, state: Arc<State>, _held: Held) {
    let mut stop = stop_signal(&state);
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper enforces the header timeout only with a timer.
    builder.timer(TokioTimer::new()).header_read_timeout(state.header_read_timeout);
    let service = hyper::service::service_fn(move |request| handle(Arc::clone(&state), request));
    let mut connection = std::pin::pin!(builder.serve_connection(TokioIo::new(stream), service));
    let mut closing = false;
    // A connection that breaks concerns only its own client.
    let _ = std::future::poll_fn(|cx| {
        if !closing && stop.as_mut().poll(cx).is_ready() {
            closing = true;
            connection.as_mut().graceful_shutdown();
        }
        connection.as_mut().poll(cx)
    })
    .await;
}

type ReplyBody = BoxBody<Bytes, Infallible>;

/// What a request asks for, known from its method and path alone.
#[derive(Debug, Clone, Copy)]
enum Route {
    Health,
    Models,
    Generate(Endpoint),
    Load,
    Unload,
    ReloadBase,
}

impl Route {
    /// Whether the route changes what the server serves.
    fn is_admin(self) -> bool {
        matches!(self, Route::Load | Route::Unload | Route::ReloadBase)
    }
}

/// How a request is answered.
enum Reply {
    Json(u16, Value),
    /// A valid generation request that streams, with its place in the queue.
    Stream(Box<GenerationRequest>, Arc<LocalPolicy>, Vec<u32>, Ticket),
}

async fn handle(state: Arc<State>, request: hyper::Request<Incoming>) -> Result<Response<ReplyBody>, Infallible> {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    Ok(match reply(&state, &parts, body).await {
        Ok(Reply::Json(status, body)) => json_response(status, &body),
        Ok(Reply::Stream(generation, policy, prompt, ticket)) => stream_response(*generation, policy, prompt, ticket),
        Err(error) => error_response(&error),
    })
}

/// The request checked (key, route, runtime loading, body size) and answered on the blocking
/// pool; a request without the key is refused before anything else, its body unread.
async fn reply(state: &Arc<State>, parts: &hyper::http::request::Parts, body: Incoming) -> Result<Reply, ApiError> {
    auth::authorize(state.api_key.as_ref(), &parts.headers)?;
    let route = route(&parts.method, parts.uri.path())?;
    if route.is_admin() {
        state.admin.check_enabled()?;
    }
    let ticket = match route {
        Route::Generate(_) => match Ticket::take(state) {
            Ok(ticket) => Some(ticket),
            Err(full) => {
                discard_small_body(&parts.headers, body).await;
                return Err(full);
            }
        },
        _ => None,
    };
    // After the ticket: a stop that did not count it has raised this flag already.
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::stopping());
    }
    let body = read_body(&parts.headers, body, state.max_body_bytes, state.body_read_timeout).await?;
    let worker_state = Arc::clone(state);
    let client_gone = Arc::new(AtomicBool::new(false));
    let _raised_when_dropped = RaisedOnDrop(Arc::clone(&client_gone));
    tokio::task::spawn_blocking(move || answer(&worker_state, route, &body, &client_gone, ticket))
        .await
        .unwrap_or_else(|_| Err(ApiError::internal("the request handler panicked")))
}

/// Raises its flag when dropped. hyper drops a request's future when the client hangs up
/// before the reply is written, and the blocking work it waited for would otherwise run to
/// its end for nobody; the flag tells a whole-reply generation to stop at its next token.
/// (Raised too when the future ends normally, once the blocking work is done.)
struct RaisedOnDrop(Arc<AtomicBool>);

impl Drop for RaisedOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn error_response(error: &ApiError) -> Response<ReplyBody> {
    let mut response = json_response(error.status, &error.body());
    if let Some((name, value)) = error.header {
        response.headers_mut().insert(HeaderName::from_static(name), HeaderValue::from_static(value));
    }
    response
}

fn route(method: &Method, path: &str) -> Result<Route, ApiError> {
    let (route, allowed) = match path {
        "/health" => (Route::Health, "GET"),
        "/v1/models" => (Route::Models, "GET"),
        "/v1/chat/completions" => (Route::Generate(Endpoint::Chat), "POST"),
        "/v1/completions" => (Route::Generate(Endpoint::Text), "POST"),
        "/v1/load_lora_adapter" | "/load_lora_adapter" => (Route::Load, "POST"),
        "/v1/unload_lora_adapter" | "/unload_lora_adapter" => (Route::Unload, "POST"),
        "/update_weights_from_disk" => (Route::ReloadBase, "POST"),
        _ => return Err(ApiError::no_route(method.as_str(), path)),
    };
    if method.as_str() != allowed {
        return Err(ApiError::method_not_allowed(method.as_str(), path, allowed));
    }
    Ok(route)
}

/// Bodies up to this size are read and dropped before a 429 goes out.
const DISCARDED_BODY_BYTES: usize = 64 << 10;

/// Reads and drops a body of at most [`DISCARDED_BODY_BYTES`] that is all but sent (within a
/// moment), so that the refusal is not lost: a connection closed with unread data is reset,
/// and the reset may reach the client before the reply. A longer or slower body is left.
async fn discard_small_body(headers: &HeaderMap, body: Incoming) {
    let declared = headers.get(CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|length| length <= DISCARDED_BODY_BYTES) {
        let _ =
            tokio::time::timeout(Duration::from_millis(200), Limited::new(body, DISCARDED_BODY_BYTES).collect()).await;
    }
}

/// The whole body, refused with a 413 past `limit` bytes (before reading when the client
/// says its length), and with a 408 when it has not all arrived within `timeout`.
async fn read_body(headers: &HeaderMap, body: Incoming, limit: usize, timeout: Duration) -> Result<Bytes, ApiError> {
    let declared = headers.get(CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(ApiError::too_large(limit));
    }
    let collected = tokio::time::timeout(timeout, Limited::new(body, limit).collect())
        .await
        .map_err(|_| ApiError::timeout(format!("the request body did not arrive within {timeout:?}")))?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Err(error) => Err(ApiError::bad_request(format!("cannot read the request body: {error}"))),
    }
}

/// The blocking part of a request: everything after the body is read, until `client_gone`.
fn answer(
    state: &State,
    route: Route,
    body: &[u8],
    client_gone: &AtomicBool,
    ticket: Option<Ticket>,
) -> Result<Reply, ApiError> {
    match (route, ticket) {
        (Route::Generate(endpoint), Some(ticket)) => generation(state, body, endpoint, client_gone, ticket),
        (route, _) => other(state, route, body),
    }
}

/// Every route but generation.
fn other(state: &State, route: Route, body: &[u8]) -> Result<Reply, ApiError> {
    match route {
        Route::Health => health(state),
        Route::Models => Ok(Reply::Json(200, models(&state.registry.list()))),
        Route::Generate(_) => Err(ApiError::internal("a generation request without its place in the queue")),
        Route::Load => load(state, body),
        Route::Unload => unload(state, body),
        Route::ReloadBase => reload_base(state, body),
    }
}

/// 200 while the base model's engine runs; 503 once its scheduler thread has stopped or
/// panicked, since every generation would then fail.
fn health(state: &State) -> Result<Reply, ApiError> {
    match state.registry.get(state.registry.base_name()) {
        Some(policy) if policy.is_running() => Ok(Reply::Json(200, json!({}))),
        _ => Err(ApiError::unavailable("the engine has stopped")),
    }
}

fn generation(
    state: &State,
    body: &[u8],
    endpoint: Endpoint,
    client_gone: &AtomicBool,
    ticket: Ticket,
) -> Result<Reply, ApiError> {
    if state.faults.should_fail() {
        return Err(ApiError::unavailable(format!("injected fault (fail rate {})", state.faults.rate()))
            .with_code("injected_fault"));
    }
    let parsed = GenerationRequest::parse(body, endpoint)?;
    let policy = state.registry.get(&parsed.model).ok_or_else(|| ApiError::model_not_found(&parsed.model))?;
    let prompt = generate::prompt_ids(&policy, &parsed)?;
    if parsed.stream {
        return Ok(Reply::Stream(Box::new(parsed), policy, prompt, ticket));
    }
    let stop_now = || client_gone.load(Ordering::Relaxed) || ticket.cut_off();
    let completions = generate::complete(&policy, &parsed, &prompt, &stop_now);
    if completions.is_err() && ticket.cut_off() {
        return Err(ApiError::stopping());
    }
    if completions.is_err() && client_gone.load(Ordering::Relaxed) {
        state.abandoned.fetch_add(1, Ordering::Relaxed);
    }
    let completions = completions?;
    let header = ReplyHeader::new(endpoint, &parsed.model);
    let body = header.completion(&completions, policy.tokenizer(), parsed.logprobs, parsed.tools.as_ref());
    Ok(Reply::Json(200, body))
}

/// Events waiting to be written per streamed reply; a slower client holds the generation's
/// writer back, not the engine.
const STREAM_BUFFER: usize = 64;

/// A `text/event-stream` reply whose events are written by a blocking thread as the engine
/// samples.
fn stream_response(
    generation: GenerationRequest,
    policy: Arc<LocalPolicy>,
    prompt: Vec<u32>,
    ticket: Ticket,
) -> Response<ReplyBody> {
    let (frames, receiver) = tokio::sync::mpsc::channel(STREAM_BUFFER);
    tokio::task::spawn_blocking(move || {
        let header = ReplyHeader::new(generation.endpoint, &generation.model);
        let cut_off = || ticket.cut_off();
        generate::stream(&policy, &generation, &prompt, &header, EventSink::new(frames), &cut_off);
    });
    let mut response = Response::new(EventBody(receiver).boxed());
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A response body fed by a channel; it ends when the writer drops its sender.
struct EventBody(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|frame| frame.map(|bytes| Ok(Frame::data(bytes))))
    }
}

fn json_response(status: u16, body: &Value) -> Response<ReplyBody> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
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

fn load(state: &State, body: &[u8]) -> Result<Reply, ApiError> {
    let LoadAdapter { lora_name, lora_path } = json_body(body)?;
    if lora_name.is_empty() {
        return Err(ApiError::bad_request("`lora_name` must not be empty").with_param("lora_name"));
    }
    let lora_path = state.admin.resolve(&lora_path, "lora_path")?;
    let info = state.registry.load(&lora_name, &lora_path).map_err(|e| registry_error(e, "lora_path"))?;
    let message = format!("loaded `{}` from {}", info.name, info.root.display());
    Ok(Reply::Json(200, json!({"success": true, "message": message})))
}

fn unload(state: &State, body: &[u8]) -> Result<Reply, ApiError> {
    let UnloadAdapter { lora_name } = json_body(body)?;
    state.registry.unload(&lora_name).map_err(|e| registry_error(e, "lora_name"))?;
    Ok(Reply::Json(200, json!({"success": true, "message": format!("unloaded `{lora_name}`")})))
}

fn reload_base(state: &State, body: &[u8]) -> Result<Reply, ApiError> {
    let UpdateWeights { model_path } = json_body(body)?;
    let model_path = state.admin.resolve(&model_path, "model_path")?;
    let version = state.registry.reload_base(&model_path).map_err(|e| registry_error(e, "model_path"))?;
    let message =
        format!("`{}` now serves {} (weights version {version})", state.registry.base_name(), model_path.display());
    Ok(Reply::Json(200, json!({"success": true, "message": message, "weights_version": version})))
}

fn registry_error(error: RegistryError, param: &str) -> ApiError {
    let message = error.to_string();
    match error {
        RegistryError::Unknown(_) => ApiError::not_found(message).with_param(param),
        RegistryError::Duplicate(_)
        | RegistryError::Base(_)
        | RegistryError::NotAModel(_)
        | RegistryError::Adapter(_)
        | RegistryError::AdapterMismatch(_)
        | RegistryError::Engine(_)
        | RegistryError::Checkpoint(_) => ApiError::bad_request(message).with_param(param),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_count_as_loopback() {
        for address in ["127.0.0.1:0", "127.1.2.3:8000", "[::1]:0", "::1:0", "localhost:0"] {
            assert!(is_loopback(address), "{address}");
        }
        for address in
            ["0.0.0.0:0", "[::]:0", "10.1.2.3:8000", "192.168.0.1:80", "[::ffff:10.0.0.1]:0", "no such host:0"]
        {
            assert!(!is_loopback(address), "{address}");
        }
        assert!(is_loopback("[::ffff:127.0.0.1]:0"), "an IPv4 loopback address mapped into IPv6");
    }
}
