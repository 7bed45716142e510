//! RemotePolicy against `whale serve` on loopback: the same completions as in-process, retries
//! that lose nothing under injected faults, timeouts, permanent errors, adapter routing.

mod common;

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{local, remote, request, start, write_model, write_strict_model};
use whale_core::ChatMessage;
use whale_policy::remote::TransportFault;
use whale_policy::{ChatRequest, Policy, PolicyError, RemoteConfig, RemoteError, RemotePolicy};
use whale_serve::ServeConfig;

#[test]
fn a_completion_over_http_equals_the_in_process_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 1);
    let server = start(dir.path(), ServeConfig::default());
    let client = remote(&server, "base", 0);
    let in_process = local(dir.path());
    for (temperature, seed) in [(0.0, 0), (1.0, 7), (0.7, 8)] {
        let asked = request("Kalo has 12 apples. How many?", temperature, seed, 24);
        let over_http = client.chat(asked.clone()).expect("an HTTP completion");
        let expected = in_process.chat(asked).expect("an in-process completion");
        assert_eq!(over_http, expected, "temperature {temperature}, seed {seed}");
        assert!(!expected.token_ids.is_empty());
    }
    let asked = request("Kalo has 12 apples. How many?", 1.0, 3, 16);
    let choices = client.chat_n(&asked, 3).expect("three choices");
    for (index, choice) in choices.iter().enumerate() {
        let mut alone = asked.clone();
        alone.params.seed = 3 + index as u64;
        let expected = in_process.chat(alone).expect("a completion");
        // The server decodes the three choices in one batch, so the logprobs may differ in
        // the last float bits; the sampled tokens may not.
        assert_eq!((&choice.text, &choice.token_ids), (&expected.text, &expected.token_ids), "choice {index}");
        let drift = choice.logprobs.iter().zip(&expected.logprobs).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(drift < 1e-4, "choice {index}: logprobs differ by {drift}");
    }
    assert_eq!((client.stats().succeeded, client.stats().retries), (4, 0));
}

#[test]
fn retries_lose_no_request_when_a_third_of_them_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 2);
    let server = start(dir.path(), ServeConfig { fail_rate: 0.3, fail_seed: 11, ..ServeConfig::default() });
    let client = remote(&server, "base", 20);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..64)
            .map(|seed| {
                let client = &client;
                scope.spawn(move || client.chat(request("How many pears?", 1.0, seed, 8)))
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("no panic")).collect()
    });
    let failed: Vec<String> = outcomes.iter().filter_map(|o| o.as_ref().err().map(ToString::to_string)).collect();
    assert!(failed.is_empty(), "{failed:?}");
    let injected = server.stats().injected_faults;
    assert!(injected > 0, "no fault was injected");
    // Every injected fault cost exactly one retry, and nothing else did.
    assert_eq!(client.stats().retries, injected);
    assert_eq!(client.stats().succeeded, 64);
}

/// A TCP server that accepts connections and never answers, until dropped.
struct SilentServer {
    address: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl SilentServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        listener.set_nonblocking(true).expect("non-blocking");
        let address = listener.local_addr().expect("an address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut held = Vec::new();
            while !stopped.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((connection, _)) => held.push(connection),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            held.len()
        });
        Self { address, stop, thread: Some(thread) }
    }

    /// Stops accepting; returns how many connections were made.
    fn connections(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().map_or(0, |thread| thread.join().expect("no panic"))
    }
}

#[test]
fn a_server_that_never_answers_is_reported_after_the_timeout() {
    let silent = SilentServer::start();
    let client = RemotePolicy::new(RemoteConfig {
        base_url: format!("http://{}/v1", silent.address),
        model: "m".into(),
        request_timeout_s: 0.4,
        max_retries: 2,
        backoff_initial_ms: 10,
        backoff_max_ms: 20,
        ..RemoteConfig::default()
    })
    .expect("a valid client");
    let start = Instant::now();
    let error = client.chat(request("hello?", 0.0, 0, 4)).expect_err("no answer ever comes");
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(1200), "three attempts of 0.4 s took only {elapsed:?}");
    assert!(elapsed < Duration::from_millis(4000), "three attempts of 0.4 s took {elapsed:?}");
    let PolicyError::Remote(RemoteError::GaveUp { attempts, last }) = &error else { panic!("{error}") };
    assert_eq!(*attempts, 3);
    assert!(matches!(**last, RemoteError::Transport { fault: TransportFault::Timeout, .. }), "{last}");
    let shown = error.to_string();
    assert!(shown.contains("timed out") && shown.contains("3 attempt"), "{shown}");
    assert_eq!(silent.connections(), 3);
}

#[test]
fn a_refused_connection_is_retried_then_reported() {
    // Port 1 is below the ephemeral range: no test's server can be there. (A port freed by a
    // listener of this test could be handed to another test's server, running in parallel.)
    let client = RemotePolicy::new(RemoteConfig {
        base_url: "http://127.0.0.1:1/v1".to_string(),
        model: "m".into(),
        max_retries: 1,
        backoff_initial_ms: 1,
        backoff_max_ms: 1,
        ..RemoteConfig::default()
    })
    .expect("a valid client");
    let error = client.chat(request("hello?", 0.0, 0, 4)).expect_err("nobody listens");
    let PolicyError::Remote(RemoteError::GaveUp { attempts: 2, last }) = &error else { panic!("{error}") };
    assert!(matches!(**last, RemoteError::Transport { fault: TransportFault::Connect, .. }), "{last}");
    assert_eq!(client.stats().retries, 1);
}

#[test]
fn a_bad_request_is_reported_at_once_with_the_servers_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 3);
    let server = start(dir.path(), ServeConfig::default());
    let client = remote(&server, "base", 5);
    let error = client.chat(request("hi", -1.0, 0, 4)).expect_err("a negative temperature");
    let PolicyError::Remote(RemoteError::Status { status: 400, message, .. }) = &error else { panic!("{error}") };
    assert!(message.contains("temperature"), "{message}");
    let unknown = remote(&server, "no-such-model", 5);
    let error = unknown.chat(request("hi", 0.0, 0, 4)).expect_err("an unknown model");
    assert!(error.to_string().contains("no-such-model"), "{error}");
    assert!(matches!(error, PolicyError::Remote(RemoteError::Status { status: 404, .. })), "{error}");
    assert_eq!((client.stats().retries, unknown.stats().retries), (0, 0));
    assert_eq!(server.stats().requests, 2, "each request was sent once");
}

/// A chat template's own refusal is the same error served as in process, so a harness catches
/// it in both; any other request reaches the model.
#[test]
fn a_template_refusal_is_told_apart_served_and_in_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_strict_model(dir.path(), 5);
    let server = start(dir.path(), ServeConfig::default());
    let late_system = ChatRequest {
        messages: vec![ChatMessage::new("user", "hi"), ChatMessage::new("system", "late")],
        params: request("hi", 0.0, 0, 4).params,
    };
    let served = remote(&server, "base", 5).chat(late_system.clone()).expect_err("refused");
    let in_process = local(dir.path()).chat(late_system).expect_err("refused");
    for error in [&served, &in_process] {
        let PolicyError::TemplateRefused(message) = error else { panic!("{error}") };
        assert!(message.contains("refused the messages: System message must be at the beginning."), "{message}");
    }
    assert!(remote(&server, "base", 5).chat(request("hi", 0.0, 0, 4)).is_ok());
}

/// A prompt over the served model's context is refused with a 400 that the client tells apart
/// from other bad requests: the harness may catch it, as it may in process.
#[test]
fn a_prompt_over_the_context_is_refused_as_too_long() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 4);
    let server = start(dir.path(), ServeConfig::default());
    let client = remote(&server, "base", 5);
    let error = client.chat(request(&"hello ".repeat(400), 0.0, 0, 4)).expect_err("over the context");
    let PolicyError::ContextExceeded(message) = &error else { panic!("{error}") };
    assert!(message.contains("context window"), "{message}");
    assert_eq!(client.stats().retries, 0);
}

#[test]
fn set_model_routes_requests_to_loaded_checkpoints_and_adapters() {
    let (base_dir, other_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    write_model(base_dir.path(), 4);
    write_model(other_dir.path(), 5);
    let adapter_dir = tempfile::tempdir().expect("tempdir");
    let server = start(base_dir.path(), common::loading_from(&[other_dir.path(), adapter_dir.path()]));
    let client = remote(&server, "base", 0);
    let asked = request("Mira has 5 keys.", 0.0, 0, 16);
    let from_base = client.chat(asked.clone()).expect("the base answers");

    let load = format!(r#"{{"lora_name": "step-1", "lora_path": {:?}}}"#, other_dir.path());
    assert_eq!(common::post(&server, "/v1/load_lora_adapter", &load).0, 200);
    assert_eq!(client.set_model("step-1"), 1);
    assert_eq!((client.weights_version(), client.name()), (1, "step-1".to_string()));
    let from_checkpoint = client.chat(asked.clone()).expect("the checkpoint answers");
    assert_eq!(from_checkpoint, local(other_dir.path()).chat(asked.clone()).expect("in-process"));
    assert_ne!(from_checkpoint.token_ids, from_base.token_ids, "the two models should differ");

    assert_eq!(common::post(&server, "/v1/unload_lora_adapter", r#"{"lora_name": "step-1"}"#).0, 200);
    let error = client.chat(asked.clone()).expect_err("unloaded");
    assert!(matches!(error, PolicyError::Remote(RemoteError::Status { status: 404, .. })), "{error}");

    common::write_adapter(base_dir.path(), adapter_dir.path(), 9);
    let load = format!(r#"{{"lora_name": "lora-1", "lora_path": {:?}}}"#, adapter_dir.path());
    assert_eq!(common::post(&server, "/v1/load_lora_adapter", &load).0, 200);
    assert_eq!(client.set_model("lora-1"), 2);
    let from_adapter = client.chat(asked.clone()).expect("the adapter answers");
    let expected =
        common::local_with_adapter(base_dir.path(), adapter_dir.path()).chat(asked.clone()).expect("in-process");
    assert_eq!(from_adapter, expected);
    assert_ne!(from_adapter.token_ids, from_base.token_ids, "the adapter should change the outputs");

    assert_eq!(client.set_model("base"), 3);
    assert_eq!(client.chat(asked).expect("the base again"), from_base, "the adapter left the base weights alone");
}

/// A proxy to `target` that reads the first request of each of its first `drops` connections
/// and hangs up without answering, then forwards one connection and stops accepting.
fn dropping_proxy(target: std::net::SocketAddr, drops: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let address = listener.local_addr().expect("an address").to_string();
    std::thread::spawn(move || {
        for (index, connection) in listener.incoming().take(drops + 1).enumerate() {
            let Ok(mut client) = connection else { continue };
            if index < drops {
                let mut request = [0u8; 4096];
                let _ = std::io::Read::read(&mut client, &mut request);
                continue;
            }
            let Ok(mut server) = std::net::TcpStream::connect(target) else { return };
            let (Ok(mut client_reader), Ok(mut server_writer)) = (client.try_clone(), server.try_clone()) else {
                return;
            };
            std::thread::spawn(move || std::io::copy(&mut client_reader, &mut server_writer));
            let _ = std::io::copy(&mut server, &mut client);
        }
    });
    address
}

#[test]
fn connections_dropped_without_a_reply_are_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 6);
    let server = start(dir.path(), ServeConfig::default());
    let proxy = dropping_proxy(server.addr(), 2);
    let client = RemotePolicy::new(RemoteConfig {
        base_url: format!("http://{proxy}/v1"),
        model: "base".into(),
        max_retries: 3,
        backoff_initial_ms: 1,
        backoff_max_ms: 5,
        request_timeout_s: 30.0,
        ..RemoteConfig::default()
    })
    .expect("a valid client");
    let asked = request("Kalo has 2 pens.", 0.0, 0, 8);
    let completion = client.chat(asked.clone()).expect("the third attempt gets through");
    assert_eq!(completion, local(dir.path()).chat(asked).expect("in-process"));
    assert_eq!(client.stats().retries, 2);
}
