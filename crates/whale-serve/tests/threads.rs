//! A request's choices do not cost a thread each: `n` is up to 128 and the server has up to
//! `workers` requests in flight, so a thread per choice would let a few clients make the
//! server start thousands. Alone in its test binary, so that the process's thread count is
//! this test's. Linux only: it counts threads in `/proc/self/status`.
#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::{chat_body_with, http, start, write_model};
use serde_json::json;
use whale_serve::ServeConfig;

/// The process's threads, from `/proc/self/status`.
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|line| line.starts_with("Threads:")).expect("a Threads line");
    line["Threads:".len()..].trim().parse().expect("a count")
}

#[test]
fn requests_of_many_choices_hold_a_thread_each_not_one_per_choice() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 6);
    let server = start(dir.path(), ServeConfig::default());
    let url = format!("http://{}/v1/chat/completions", server.addr());
    let (requests, choices) = (4, 64);
    let body = |stream: bool| {
        let sampling = json!({"temperature": 1.0, "max_tokens": 200, "seed": 5});
        chat_body_with(sampling, json!({"n": choices, "ignore_eos": true, "stream": stream}))
    };
    let warm = http().post(&url).body(body(false)).send().expect("a warm-up reply");
    assert_eq!(warm.status().as_u16(), 200);
    let before = threads();
    let clients: Vec<_> = (0..requests)
        .map(|index| {
            let (url, body) = (url.clone(), body(index % 2 == 1));
            std::thread::spawn(move || {
                let response = http().post(&url).body(body).send().expect("a reply");
                (response.status().as_u16(), response.text().expect("a body"))
            })
        })
        .collect();
    let mut peak = before;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !clients.iter().all(|client| client.is_finished()) && Instant::now() < deadline {
        peak = peak.max(threads());
        std::thread::sleep(Duration::from_millis(2));
    }
    for client in clients {
        let (status, text) = client.join().expect("a client thread");
        assert_eq!(status, 200, "{text}");
        assert!(!text.contains("\"error\""), "{text}");
    }
    let stats = server.registry().get("base").expect("the base model").stats();
    assert_eq!(stats.tokens_generated, ((requests + 1) * choices * 200) as u64, "{stats:?}");
    // Each client thread, and the request's worker: a few threads a request, not 64.
    assert!(
        peak - before < 8 * requests,
        "{} threads more during {requests} requests of {choices} choices",
        peak - before
    );
}
