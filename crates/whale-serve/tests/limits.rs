//! What a careless or hostile client cannot do to `whale serve`: stop the engine with a huge
//! `top_k`, slow every step with stop strings, or hold connections with headers or a body that
//! never finish, or make it generate for clients that have hung up; and `/health` telling when
//! the engine has stopped.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{get, post, start, write_model};
use serde_json::{json, Value};
use whale_serve::{ServeConfig, Server};

const CHAT: &str = "/v1/chat/completions";

fn chat_body(extra: Value) -> String {
    common::chat_body_with(json!({"temperature": 1.0, "max_tokens": 12, "seed": 5}), extra)
}

#[test]
fn a_top_k_past_the_vocabulary_samples_the_whole_vocabulary_and_the_engine_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 1);
    let server = start(dir.path(), ServeConfig::default());
    let vocab = server.registry().get("base").expect("the base model").decoder().vocab_size();
    let token_ids = |top_k: Value| {
        let (status, body) = post(&server, CHAT, &chat_body(json!({"top_k": top_k})));
        assert_eq!(status, 200, "top_k {top_k}: {body}");
        body["choices"][0]["token_ids"].clone()
    };
    let whole = token_ids(json!(vocab));
    assert_eq!(token_ids(json!(i64::MAX)), whole);
    assert_eq!(token_ids(json!(1_000_000_000_000u64)), whole);
    assert_eq!(post(&server, CHAT, &chat_body(json!({}))).0, 200, "the engine still serves");
    assert_eq!(get(&server, "/health").0, 200);
}

#[test]
fn too_many_or_too_long_stop_strings_are_refused_naming_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 2);
    let server = start(dir.path(), ServeConfig::default());
    for stop in [json!(vec!["x"; 17]), json!("x".repeat(1025))] {
        let (status, body) = post(&server, CHAT, &chat_body(json!({"stop": stop})));
        assert_eq!((status, &body["error"]["param"]), (400, &json!("stop")), "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    assert_eq!(post(&server, CHAT, &chat_body(json!({"stop": vec!["x"; 16]}))).0, 200);
}

/// A server whose clients get `timeout` for their headers and for their bodies.
fn impatient(dir: &std::path::Path, timeout: Duration) -> Server {
    start(dir, ServeConfig { header_read_timeout: timeout, body_read_timeout: timeout, ..ServeConfig::default() })
}

/// Sends `bytes` and then nothing; what the server sends back before it closes the
/// connection, and how long that took (the read gives up after 10 s).
fn send_and_stall(server: &Server, bytes: &[u8]) -> (String, Duration) {
    // The clock starts before the connection does, so it measures at least the server's wait.
    let start = Instant::now();
    let mut stream = TcpStream::connect(server.addr()).expect("connected");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    stream.write_all(bytes).expect("sent");
    let mut reply = Vec::new();
    // A reset ends the connection too; what arrived before it is in `reply`.
    let _ = stream.read_to_end(&mut reply);
    (String::from_utf8_lossy(&reply).into_owned(), start.elapsed())
}

#[test]
fn a_client_that_stops_sending_its_headers_is_disconnected() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 3);
    let server = impatient(dir.path(), Duration::from_millis(500));
    let (reply, took) = send_and_stall(&server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Len");
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(5), "closed after {took:?}: {reply}");
    assert!(reply.is_empty(), "{reply}");
}

#[test]
fn a_client_that_stops_sending_its_body_gets_a_408() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 4);
    let server = impatient(dir.path(), Duration::from_millis(500));
    let request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                    Content-Length: 100\r\n\r\n{\"model\": ";
    let (reply, took) = send_and_stall(&server, request);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("did not arrive within 500ms"), "{reply}");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(post(&server, CHAT, &chat_body(json!({}))).0, 200, "the server still serves");
}

#[test]
fn health_is_503_once_the_engine_has_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 5);
    let server = start(dir.path(), ServeConfig::default());
    assert_eq!(get(&server, "/health"), (200, json!({})));
    server.registry().get("base").expect("the base model").shutdown();
    let (status, body) = get(&server, "/health");
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|message| message.contains("stopped")), "{body}");
}

/// A client that hangs up before its whole reply is ready stops that reply's generation at
/// the next token: sending requests and hanging up at once costs the engine almost nothing.
/// The same request with its client waiting generates every token, so the count measures it.
#[test]
fn a_whole_reply_stops_generating_when_its_client_hangs_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 6);
    let server = start(dir.path(), ServeConfig::default());
    let policy = server.registry().get("base").expect("the base model");
    // Many choices make each step long beside the moment it takes to see the hang-up.
    let (choices, tokens) = (64, 200);
    let body = chat_body(json!({"n": choices, "max_tokens": tokens, "ignore_eos": true}));
    let (status, reply) = post(&server, CHAT, &body);
    assert_eq!(status, 200, "{reply}");
    let whole = policy.stats();
    assert_eq!(whole.tokens_generated, (choices * tokens) as u64, "{whole:?}");

    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    TcpStream::connect(server.addr()).expect("connected").write_all(request.as_bytes()).expect("sent");
    // hyper may see the hang-up before it hands the request on (then it costs nothing), before
    // the request reaches the engine, or while it generates: wait until the request has arrived
    // (or 5 s have passed) and the engine has then taken no step for half a second.
    let arrival = Instant::now() + Duration::from_secs(5);
    while server.stats().requests < 2 && Instant::now() < arrival {
        std::thread::sleep(Duration::from_millis(10));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let before = policy.stats();
        std::thread::sleep(Duration::from_millis(500));
        if policy.stats() == before {
            break;
        }
        assert!(Instant::now() < deadline, "the engine never went quiet: {:?}", policy.stats());
    }
    assert!(server.stats().abandoned <= 1);
    let after = policy.stats().tokens_generated - whole.tokens_generated;
    assert!(after < (choices * tokens / 2) as u64, "{after} tokens generated for a client that hung up");
}
