//! A soak: mixed load over loopback, bounded in time, against a server with a small queue.
//! Clients send whole and streamed requests with `n` from 1 to 4, hang up at random (streamed
//! after the first event, whole right after sending), and fire bursts past the queue bound.
//! Every request must get an answer (200, or 429 from the full queue) or be one the client
//! abandoned; nothing may hang; and once the load stops, the server's admitted requests and
//! connections return to zero and the process's threads and memory to within a stated margin
//! of where they started. p50/p99 latency and the 429 share are printed.
//!
//! It runs for 15 s in the test command; `WHALE_SOAK_SECONDS=600 cargo test --release -p
//! whale-serve --test soak -- --nocapture` is the longer version. Alone in its test binary, so
//! that the process's threads are this test's. Linux only (`/proc/self/status`).
#![cfg(target_os = "linux")]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{chat_body_with, start, write_model};
use rand::{Rng, SeedableRng};
use serde_json::json;
use whale_serve::{ServeConfig, Server};

const CHAT: &str = "/v1/chat/completions";
const CLIENTS: usize = 12;
const BURST: usize = 24;
/// How much the process's resident memory may grow over the soak (the allocator keeps some of
/// what the engine's batches used).
const RSS_MARGIN_MB: f64 = 96.0;
/// Threads the process may keep beyond those it had before the load.
const THREAD_MARGIN: usize = 4;

fn status_field(name: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|line| line.starts_with(name)).expect("the field");
    line[name.len()..].trim().trim_end_matches(" kB").trim().parse().expect("a number")
}

fn threads() -> usize {
    status_field("Threads:") as usize
}

fn rss_mb() -> f64 {
    status_field("VmRSS:") / 1024.0
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    latencies: Mutex<Vec<Duration>>,
    ok: AtomicU64,
    queue_full: AtomicU64,
    abandoned: AtomicU64,
}

impl Tally {
    fn answered(&self, status: u16, body: &str, started: Instant) {
        match status {
            200 => self.ok.fetch_add(1, Ordering::Relaxed),
            429 => self.queue_full.fetch_add(1, Ordering::Relaxed),
            other => panic!("HTTP {other}: {body}"),
        };
        self.latencies.lock().expect("latencies").push(started.elapsed());
    }
}

fn body(rng: &mut impl Rng, stream: bool) -> String {
    let sampling = json!({"temperature": 1.0, "max_tokens": rng.gen_range(1..=48), "seed": rng.gen::<u32>()});
    chat_body_with(sampling, json!({"n": rng.gen_range(1..=4), "stream": stream}))
}

fn client() -> reqwest::blocking::Client {
    // A request that takes this long has hung: the soak fails on it.
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(90)).build().expect("a client")
}

fn whole_or_streamed(url: &str, body: String, tally: &Tally) {
    let started = Instant::now();
    let response = client().post(url).header("Content-Type", "application/json").body(body).send().expect("answered");
    let status = response.status().as_u16();
    let text = response.text().expect("the whole body");
    if status == 200 && text.starts_with("data:") {
        assert!(text.trim_end().ends_with("data: [DONE]"), "a stream ends with [DONE]: {text}");
    }
    tally.answered(status, &text, started);
    if status == 429 {
        // A client backs off (less than the `Retry-After: 1` asked for, to keep the load up).
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `body` on a raw connection and hangs up: at once, or after the first bytes of the reply.
fn hang_up(addr: SocketAddr, body: &str, after_first_bytes: bool, tally: &Tally) {
    let mut stream = TcpStream::connect(addr).expect("connected");
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("sent");
    if after_first_bytes {
        stream.set_read_timeout(Some(Duration::from_secs(90))).expect("a timeout");
        let mut first = [0u8; 64];
        assert!(stream.read(&mut first).expect("the reply starts") > 0);
    }
    tally.abandoned.fetch_add(1, Ordering::Relaxed);
}

fn burst(url: &str, rng: &mut impl Rng, tally: &Arc<Tally>) {
    let senders: Vec<_> = (0..BURST)
        .map(|_| {
            let (url, body, tally) = (url.to_string(), body(rng, false), Arc::clone(tally));
            std::thread::spawn(move || whole_or_streamed(&url, body, &tally))
        })
        .collect();
    for sender in senders {
        sender.join().expect("a burst client");
    }
}

fn load(server: &Server, until: Instant, seed: u64, tally: &Arc<Tally>) {
    let url = format!("http://{}{CHAT}", server.addr());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    while Instant::now() < until {
        match rng.gen_range(0..10) {
            0..=3 => whole_or_streamed(&url, body(&mut rng, false), tally),
            4..=6 => whole_or_streamed(&url, body(&mut rng, true), tally),
            7 => hang_up(server.addr(), &body(&mut rng, true), true, tally),
            8 => hang_up(server.addr(), &body(&mut rng, false), false, tally),
            _ => burst(&url, &mut rng, tally),
        }
    }
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "still not {what} after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn mixed_load_is_answered_and_the_server_returns_to_where_it_started() {
    let seconds: u64 = std::env::var("WHALE_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 8);
    let server =
        Arc::new(start(dir.path(), ServeConfig { workers: 8, max_queued_requests: 8, ..ServeConfig::default() }));
    let warm = Arc::new(Tally::default());
    load(&server, Instant::now() + Duration::from_secs(2), 99, &warm);
    wait_until("idle after the warm-up", || server.stats().admitted == 0 && server.stats().connections == 0);
    std::thread::sleep(Duration::from_secs(11)); // tokio's idle blocking threads last 10 s
    let (threads_before, rss_before) = (threads(), rss_mb());

    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(seconds);
    let clients: Vec<_> = (0..CLIENTS as u64)
        .map(|seed| {
            let (server, tally) = (Arc::clone(&server), Arc::clone(&tally));
            std::thread::spawn(move || load(&server, until, seed, &tally))
        })
        .collect();
    for client in clients {
        client.join().expect("a client thread");
    }

    wait_until("idle", || server.stats().admitted == 0 && server.stats().connections == 0);
    wait_until("back to its threads", || threads() <= threads_before + THREAD_MARGIN);
    let (threads_after, rss_after) = (threads(), rss_mb());
    let mut latencies = tally.latencies.lock().expect("latencies").clone();
    latencies.sort();
    let (ok, full, abandoned) = (
        tally.ok.load(Ordering::Relaxed),
        tally.queue_full.load(Ordering::Relaxed),
        tally.abandoned.load(Ordering::Relaxed),
    );
    println!(
        "soak {seconds} s: {} answered ({ok} 200, {full} 429 = {:.1}%), {abandoned} abandoned; latency p50 {:?} p99 {:?}; \
         threads {threads_before} -> {threads_after}; RSS {rss_before:.0} -> {rss_after:.0} MB",
        ok + full,
        100.0 * full as f64 / (ok + full) as f64,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    );
    assert!(ok > 0 && full > 0 && abandoned > 0, "the load mixed answers, 429s and hang-ups");
    assert!(rss_after <= rss_before + RSS_MARGIN_MB, "RSS {rss_before:.0} -> {rss_after:.0} MB");
}
