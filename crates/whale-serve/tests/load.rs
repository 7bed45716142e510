//! `whale serve` under pressure: a full queue answers 429 with `Retry-After` at once, which
//! whale's own client waits out instead of scoring; and a graceful stop refuses new connections,
//! lets the requests in flight finish within the grace period and cuts off, with a 503, those
//! that do not.

mod common;

use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{chat_body_with, http, remote, request, start, write_model};
use serde_json::{json, Value};
use whale_policy::Policy;
use whale_serve::{ServeConfig, Server, ServerStats};

const CHAT: &str = "/v1/chat/completions";

/// A request that keeps the engine busy for a while: many choices, every token generated.
/// A request of the most choices a request may ask for (128), so that it keeps the server busy
/// long enough for a test's next step, on a loaded machine too.
fn long_body(tokens: usize) -> String {
    long_body_of(128, tokens, false)
}

fn long_body_of(n: usize, tokens: usize, stream: bool) -> String {
    let sampling = json!({"temperature": 1.0, "max_tokens": tokens, "seed": 3});
    chat_body_with(sampling, json!({"n": n, "ignore_eos": true, "stream": stream}))
}

/// `(status, retry-after header, body)` of a POST.
fn post(url: &str, body: String) -> (u16, Option<String>, Value) {
    let response = http().post(url).header("Content-Type", "application/json").body(body).send().expect("an answer");
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = response.text().expect("a body");
    (status, retry_after, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn in_background(url: &str, body: String) -> JoinHandle<(u16, Option<String>, Value)> {
    let url = url.to_string();
    std::thread::spawn(move || post(&url, body))
}

/// A server of a tiny model with `config`, and its chat completions URL.
fn serving(config: ServeConfig) -> (tempfile::TempDir, Server, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 4);
    let server = start(dir.path(), config);
    let url = format!("http://{}{CHAT}", server.addr());
    (dir, server, url)
}

/// Waits (at most 30 s) until `server`'s counters say `reached`.
fn wait_for(server: &Server, reached: impl Fn(&ServerStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reached(&server.stats()) {
        assert!(Instant::now() < deadline, "{:?}", server.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `server` has `admitted` generation requests running or queued.
fn wait_for_admitted(server: &Server, admitted: usize) {
    wait_for(server, |stats| stats.admitted >= admitted);
}

#[test]
fn past_the_queue_bound_a_request_gets_429_with_retry_after_at_once() {
    let (_dir, server, url) = serving(ServeConfig { workers: 1, max_queued_requests: 1, ..ServeConfig::default() });
    let running: Vec<_> = (0..2).map(|_| in_background(&url, long_body(400))).collect();
    wait_for_admitted(&server, 2);

    let asked = Instant::now();
    let (status, retry_after, body) = post(&url, long_body(8));
    assert_eq!(status, 429, "{body}");
    assert!(asked.elapsed() < Duration::from_secs(2), "answered at once, not after the queue: {:?}", asked.elapsed());
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("--max-queued-requests")), "{body}");
    assert_eq!(server.stats().queue_full, 1);

    for client in running {
        let (status, _, body) = client.join().expect("a client");
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(server.stats().admitted, 0, "every place is given back");
    assert_eq!(post(&url, long_body(8)).0, 200, "served again once the queue has room");
}

#[test]
fn whales_client_waits_out_a_429_and_its_request_is_answered_not_scored() {
    let (_dir, server, url) = serving(ServeConfig { workers: 1, max_queued_requests: 0, ..ServeConfig::default() });
    let busy = in_background(&url, long_body(300));
    wait_for_admitted(&server, 1);

    let client = remote(&server, "base", 1000);
    let completion = client.chat(request("How many cups?", 0.0, 1, 8)).expect("answered once the queue had room");
    assert!(completion.completion_tokens > 0);
    assert!(client.stats().retries >= 1, "{:?}", client.stats());
    assert!(server.stats().queue_full >= 1, "{:?}", server.stats());
    assert_eq!(busy.join().expect("the busy client").0, 200);
}

#[test]
fn a_graceful_stop_lets_requests_in_flight_finish_and_refuses_new_connections() {
    let (_dir, mut server, url) = serving(ServeConfig::default());
    let addr = server.addr();
    let in_flight = in_background(&url, long_body(100));
    wait_for_admitted(&server, 1);

    let report = server.stop(Duration::from_secs(60));
    assert_eq!((report.in_flight, report.cut_off), (1, 0), "{report:?}");
    let (status, _, body) = in_flight.join().expect("the client");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"].as_array().map(Vec::len), Some(128), "{body}");
    assert!(TcpStream::connect(addr).is_err(), "new connections are refused");
}

#[test]
fn past_the_grace_period_requests_in_flight_get_503_whole_or_streamed() {
    let (_dir, mut server, url) = serving(ServeConfig::default());
    let whole = in_background(&url, long_body_of(128, 200, false));
    let streamed = in_background(&url, long_body_of(1, 200, true));
    wait_for_admitted(&server, 2);

    let stopping = Instant::now();
    let report = server.stop(Duration::from_millis(1));
    assert_eq!((report.in_flight, report.cut_off), (2, 2), "{report:?}");
    assert!(stopping.elapsed() < Duration::from_secs(10), "{:?}", stopping.elapsed());
    let (status, retry_after, body) = whole.join().expect("the whole-reply client");
    assert_eq!((status, retry_after.as_deref()), (503, Some("1")), "{body}");
    assert_eq!(body["error"]["code"], "server_stopping", "{body}");
    let (status, _, events) = streamed.join().expect("the streaming client");
    assert_eq!(status, 200);
    let events = events.as_str().expect("an event stream").to_string();
    assert!(
        events.contains("server_stopping"),
        "the stream ends with the stop's error: {}",
        &events[events.len().saturating_sub(400)..]
    );
}

#[test]
fn past_the_connection_cap_a_new_connection_waits_until_one_closes() {
    let (_dir, server, _) = serving(ServeConfig { max_connections: 2, ..ServeConfig::default() });
    let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(server.addr()).expect("connected")).collect();
    wait_for(&server, |stats| stats.connections >= 2);
    let url = format!("http://{}/health", server.addr());
    let asked = Instant::now();
    let waiting = std::thread::spawn(move || {
        let status = http().get(&url).send().expect("an answer").status().as_u16();
        (status, asked.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "a third connection is not served while two are open");
    assert_eq!(server.stats().connections, 2);
    drop(held);
    let (status, waited) = waiting.join().expect("the third client");
    assert_eq!(status, 200);
    assert!(waited >= Duration::from_millis(500), "{waited:?}");
}
