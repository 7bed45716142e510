//! whale's one HTTP client for the JSON APIs it talks to: the policy's chat server, the
//! proposer LLM, and the admin endpoints that load adapters and checkpoints.
//!
//! Why one: every caller needs the same care. A WHALE step launches hundreds of requests at one
//! server, and a request lost to a transient fault (a restart, an overloaded queue, a dropped
//! connection) must be retried, not turned into a result. So [`JsonClient::post`] retries 408,
//! 429, 5xx, connection failures and timeouts with exponential backoff and full jitter (a
//! uniform draw in `[0, min(max, initial * 2^attempt)]`, so that clients that failed together do
//! not come back together), honouring a `Retry-After` header up to the cap. Other 4xx statuses
//! are the request's own fault and are reported at once, with the server's own message
//! ([`server_message`]). An optional bound on requests in flight keeps a rollout pool of any
//! size within what the server batches well.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;

/// How often and how patiently a request is repeated after a transient fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Cap of the first backoff draw, doubled per retry up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// The policy of a config's `max_retries`, `backoff_initial_ms` and `backoff_max_ms`.
    pub fn from_millis(max_retries: u32, backoff_initial_ms: u64, backoff_max_ms: u64) -> Self {
        Self {
            max_retries,
            backoff_initial: Duration::from_millis(backoff_initial_ms),
            backoff_max: Duration::from_millis(backoff_max_ms),
        }
    }

    /// Full jitter: a uniform draw up to `min(max, initial * 2^attempt)`, but at least what the
    /// server asked for in `Retry-After` (itself capped at the maximum).
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self.backoff_initial.saturating_mul(1 << attempt.min(31)).min(self.backoff_max);
        let drawn = ceiling.mul_f64(rand::thread_rng().gen::<f64>());
        drawn.max(retry_after.unwrap_or_default().min(self.backoff_max))
    }
}

/// What a [`JsonClient`] is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// How long one attempt may take, from connecting to the last byte of the reply.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Sent as a bearer token.
    pub api_key: Option<String>,
    pub retry: RetryPolicy,
    /// Most requests in flight at once; more callers wait for a free slot. `None`: no bound.
    pub max_in_flight: Option<usize>,
}

/// How a transport-level attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFault {
    /// No connection could be made (refused, unreachable, connect timeout).
    Connect,
    /// The attempt ran past the request timeout.
    Timeout,
    /// The connection broke while sending or reading (reset, closed early).
    Connection,
}

impl std::fmt::Display for TransportFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportFault::Connect => "cannot connect",
            TransportFault::Timeout => "timed out",
            TransportFault::Connection => "connection failed",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A setting of the client is invalid.
    #[error("remote config `{key}`: {reason}")]
    Config { key: &'static str, reason: String },
    /// The server answered with an error status; its own message and error code (OpenAI's
    /// `error.code`) when it gave them.
    #[error("{url}: HTTP {status}: {message}")]
    Status { url: String, status: u16, message: String, code: Option<String>, retry_after: Option<Duration> },
    #[error("{url}: {fault}: {message}")]
    Transport { url: String, fault: TransportFault, message: String },
    /// A success status whose body is not what was asked for.
    #[error("{url}: the reply is not a valid {expected}: {reason}")]
    Reply { url: String, expected: &'static str, reason: String },
    #[error("gave up after {attempts} attempt(s); the last one failed: {last}")]
    GaveUp { attempts: u32, last: Box<HttpError> },
}

impl HttpError {
    /// Whether another attempt may succeed: 408, 429, 5xx and transport faults.
    pub fn is_transient(&self) -> bool {
        match self {
            HttpError::Status { status, .. } => matches!(status, 408 | 429) || *status >= 500,
            HttpError::Transport { .. } => true,
            HttpError::Config { .. } | HttpError::Reply { .. } | HttpError::GaveUp { .. } => false,
        }
    }

    /// The HTTP status of the (last) failed attempt, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            HttpError::GaveUp { last, .. } => last.status(),
            _ => None,
        }
    }

    /// The failure of the last attempt (the error itself unless retries ran out).
    pub fn last(&self) -> &HttpError {
        match self {
            HttpError::GaveUp { last, .. } => last.last(),
            other => other,
        }
    }
}

/// A blocking JSON-over-HTTP client with retries; see the module documentation.
pub struct JsonClient {
    http: reqwest::blocking::Client,
    api_key: Option<String>,
    retry: RetryPolicy,
    request_timeout: Duration,
    slots: Option<Slots>,
    retries: AtomicU64,
}

impl JsonClient {
    pub fn new(config: ClientConfig) -> Result<Self, HttpError> {
        if config.max_in_flight == Some(0) {
            return Err(HttpError::Config { key: "max_concurrency", reason: "must be positive".to_string() });
        }
        let http = reqwest::blocking::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| HttpError::Config { key: "client", reason: format!("cannot build the HTTP client: {e}") })?;
        Ok(Self {
            http,
            api_key: config.api_key,
            retry: config.retry,
            request_timeout: config.request_timeout,
            slots: config.max_in_flight.map(Slots::new),
            retries: AtomicU64::new(0),
        })
    }

    /// Attempts repeated after a transient fault since the client was made.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// POSTs `body` to `url` and returns the body of the first successful attempt, retrying
    /// transient faults under the client's [`RetryPolicy`].
    pub fn post(&self, url: &str, body: &Value) -> Result<String, HttpError> {
        let mut attempt = 0;
        loop {
            let error = match self.post_once(url, body) {
                Ok(text) => return Ok(text),
                Err(error) if !error.is_transient() => return Err(error),
                Err(error) => error,
            };
            if attempt >= self.retry.max_retries {
                return Err(HttpError::GaveUp { attempts: attempt + 1, last: Box::new(error) });
            }
            let retry_after = match &error {
                HttpError::Status { retry_after, .. } => *retry_after,
                _ => None,
            };
            std::thread::sleep(self.retry.backoff(attempt, retry_after));
            attempt += 1;
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One HTTP exchange, holding a slot when in-flight requests are bounded.
    pub fn post_once(&self, url: &str, body: &Value) -> Result<String, HttpError> {
        let _slot = self.slots.as_ref().map(Slots::acquire);
        let mut request = self.http.post(url).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let sent = Instant::now();
        let response = request.send().map_err(|e| self.transport_error(url, &e))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = Deadline { reply: response, until: sent + self.request_timeout };
        let text = read_reply(body, MAX_REPLY_BYTES).map_err(|fault| self.reply_error(url, fault))?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        Err(HttpError::Status {
            url: url.to_string(),
            status,
            message: server_message(&text),
            code: server_code(&text),
            retry_after,
        })
    }

    /// Why a reply's body could not be read, as the error of the request to `url`.
    fn reply_error(&self, url: &str, fault: ReplyFault) -> HttpError {
        let transport = |fault, message| HttpError::Transport { url: url.to_string(), fault, message };
        match fault {
            ReplyFault::Read(error) => match error.get_ref().and_then(|inner| inner.downcast_ref::<reqwest::Error>()) {
                Some(error) => self.transport_error(url, error),
                None if error.kind() == std::io::ErrorKind::TimedOut => transport(
                    TransportFault::Timeout,
                    format!("no complete reply within {} s", self.request_timeout.as_secs_f64()),
                ),
                None => transport(TransportFault::Connection, error.to_string()),
            },
            ReplyFault::TooLarge => HttpError::Reply {
                url: url.to_string(),
                expected: "reply",
                reason: format!("it is over {MAX_REPLY_BYTES} bytes"),
            },
        }
    }

    fn transport_error(&self, url: &str, error: &reqwest::Error) -> HttpError {
        let fault = if error.is_timeout() {
            TransportFault::Timeout
        } else if error.is_connect() {
            TransportFault::Connect
        } else {
            TransportFault::Connection
        };
        let message = match fault {
            TransportFault::Timeout => format!("no complete reply within {} s", self.request_timeout.as_secs_f64()),
            _ => error_chain(error),
        };
        HttpError::Transport { url: url.to_string(), fault, message }
    }
}

/// Most bytes of a reply read: far above any completion (128 choices of a long context with
/// logprobs), so that a broken or hostile server cannot make the client hold gigabytes.
pub const MAX_REPLY_BYTES: u64 = 256 << 20;

/// Why a reply's body was not read.
enum ReplyFault {
    Read(std::io::Error),
    TooLarge,
}

/// A reply's body that fails to read once `until` has passed: reqwest gives each read the whole
/// timeout, so a server sending a byte at a time could otherwise hold an attempt for ever.
struct Deadline<R> {
    reply: R,
    until: Instant,
}

impl<R: Read> Read for Deadline<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() > self.until {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request timeout passed"));
        }
        self.reply.read(buffer)
    }
}

/// The body from `reply`, as text (invalid UTF-8 replaced), refused past `limit` bytes.
fn read_reply(reply: impl Read, limit: u64) -> Result<String, ReplyFault> {
    let mut bytes = Vec::new();
    reply.take(limit + 1).read_to_end(&mut bytes).map_err(ReplyFault::Read)?;
    if bytes.len() as u64 > limit {
        return Err(ReplyFault::TooLarge);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A counting semaphore: at most `capacity` holders at once.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

struct Slot<'a>(&'a Slots);

impl Slots {
    fn new(capacity: usize) -> Self {
        Self { free: Mutex::new(capacity), freed: Condvar::new() }
    }

    fn acquire(&self) -> Slot<'_> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.freed.notify_one();
    }
}

/// An error and its causes, `: `-separated (reqwest's own message names only the URL).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The message of an error reply: OpenAI's `error.message`, FastAPI's `detail`, a plain
/// `message` (SGLang's), or the start of the body.
pub fn server_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let field = |pointer: &str| {
        parsed.as_ref().and_then(|v| v.pointer(pointer)).map(|v| v.as_str().map_or_else(|| v.to_string(), String::from))
    };
    let message = field("/error/message").or_else(|| field("/detail")).or_else(|| field("/message"));
    message.unwrap_or_else(|| body.to_string()).chars().take(MESSAGE_CHARS).collect()
}

/// An OpenAI-shaped error body's `error.code`, when it is a short string.
pub fn server_code(body: &str) -> Option<String> {
    let parsed: Value = serde_json::from_str(body).ok()?;
    let code = parsed.pointer("/error/code")?.as_str()?;
    (code.len() <= MAX_CODE_CHARS).then(|| code.to_string())
}

/// The longest error code kept.
const MAX_CODE_CHARS: usize = 64;

/// Most characters of a server's message kept in an error.
const MESSAGE_CHARS: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn server_messages_are_taken_from_the_usual_error_shapes() {
        assert_eq!(server_message(r#"{"error": {"message": "no such adapter"}}"#), "no such adapter");
        assert_eq!(server_message(r#"{"detail": "bad path"}"#), "bad path");
        assert_eq!(server_message(r#"{"success": false, "message": "bad path"}"#), "bad path");
        assert_eq!(server_message("plain text"), "plain text");
        assert_eq!(
            server_code(r#"{"error": {"message": "m", "code": "template_refused"}}"#).as_deref(),
            Some("template_refused")
        );
        assert_eq!(server_code(r#"{"error": {"message": "m", "code": null}}"#), None);
        assert_eq!(server_code(&format!(r#"{{"error": {{"code": "{}"}}}}"#, "x".repeat(65))), None);
        assert_eq!(server_code("plain text"), None);
    }

    #[test]
    fn replies_and_server_messages_are_bounded() {
        let read = |body: &[u8]| read_reply(std::io::Cursor::new(body.to_vec()), 10);
        assert_eq!(read(b"0123456789").ok().as_deref(), Some("0123456789"));
        assert!(matches!(read(b"0123456789a"), Err(ReplyFault::TooLarge)));
        let long = "x".repeat(10_000);
        assert_eq!(server_message(&serde_json::json!({"error": {"message": long}}).to_string()).len(), MESSAGE_CHARS);
        assert_eq!(server_message(&long).len(), MESSAGE_CHARS);
        let late =
            Deadline { reply: std::io::Cursor::new(b"{}".to_vec()), until: Instant::now() - Duration::from_secs(1) };
        assert!(matches!(read_reply(late, 10), Err(ReplyFault::Read(e)) if e.kind() == std::io::ErrorKind::TimedOut));
    }

    #[test]
    fn backoff_draws_are_jittered_under_the_doubling_ceiling_and_honour_retry_after() {
        let retry = RetryPolicy::from_millis(5, 100, 1000);
        for attempt in 0..40 {
            let ceiling = Duration::from_millis((100u64 << attempt.min(20)).min(1000));
            let draws: Vec<Duration> = (0..50).map(|_| retry.backoff(attempt, None)).collect();
            assert!(draws.iter().all(|draw| *draw <= ceiling), "attempt {attempt}: {draws:?}");
            assert!(draws.iter().any(|draw| *draw != draws[0]), "no jitter at attempt {attempt}");
        }
        assert_eq!(retry.backoff(0, Some(Duration::from_secs(60))), Duration::from_millis(1000));
        assert!(retry.backoff(0, Some(Duration::from_millis(500))) >= Duration::from_millis(500));
    }

    /// A loopback server that answers each connection with the next of `replies`.
    fn serve(replies: Vec<&'static str>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            for reply in replies {
                let (mut stream, _) = listener.accept().expect("accept");
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer);
                let response = format!(
                    "HTTP/1.1 {reply}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
                );
                stream.write_all(response.as_bytes()).expect("write");
            }
        });
        format!("http://{address}/x")
    }

    fn client(max_retries: u32) -> JsonClient {
        JsonClient::new(ClientConfig {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            api_key: None,
            retry: RetryPolicy {
                max_retries,
                backoff_initial: Duration::from_millis(1),
                backoff_max: Duration::from_millis(5),
            },
            max_in_flight: Some(2),
        })
        .expect("client")
    }

    #[test]
    fn transient_statuses_are_retried_and_client_errors_are_not() {
        let client = client(3);
        let url = serve(vec!["503 Service Unavailable", "429 Too Many Requests", "200 OK"]);
        assert_eq!(client.post(&url, &Value::Null).expect("third attempt"), "{}");
        assert_eq!(client.retries(), 2);
        let url = serve(vec!["400 Bad Request", "200 OK"]);
        let error = client.post(&url, &Value::Null).expect_err("400 is final");
        assert_eq!(error.status(), Some(400));
        assert_eq!(client.retries(), 2);
    }

    #[test]
    fn exhausted_retries_name_the_attempts_and_the_last_fault() {
        // Port 1 is below the ephemeral range: no server of a test running beside this one is there.
        let error = client(1).post("http://127.0.0.1:1/x", &Value::Null).expect_err("nothing listens");
        let HttpError::GaveUp { attempts: 2, last } = &error else { panic!("{error}") };
        assert!(matches!(**last, HttpError::Transport { fault: TransportFault::Connect, .. }), "{last}");
        assert!(matches!(error.last(), HttpError::Transport { .. }));
    }
}
