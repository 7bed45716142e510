//! Hostile input to `whale serve`, generated: arbitrary JSON bodies (mostly objects with the
//! fields the endpoints read, holding values of every type and size) through the request
//! parser of both generation endpoints and, over HTTP, through every endpoint; arbitrary bytes
//! as bodies; and arbitrary request lines and headers on a raw connection. Nothing panics, every
//! malformed body gets a 4xx that names the field at fault, and the server keeps serving.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{get, loading_from, start, write_model};
use proptest::prelude::*;
use serde_json::{Map, Value};
use whale_serve::{Endpoint, GenerationRequest, Server};

/// The fields the endpoints read, and a few they do not.
const FIELDS: [&str; 28] = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "echo",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "ignore_eos",
    "role",
    "content",
    "lora_name",
    "lora_path",
    "model_path",
    "unknown_field",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        Just(Value::from(f64::MAX)),
        "[a-z ]{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
        Just(Value::String("user".into())),
        Just(Value::String("base".into())),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS.to_vec()), inner), 0..5)
                .prop_map(|pairs| Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// A body: an object of known fields most of the time, anything else otherwise.
fn body() -> impl Strategy<Value = Value> {
    let object = prop::collection::vec((prop::sample::select(FIELDS.to_vec()), json_value()), 0..8)
        .prop_map(|pairs| Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Map<_, _>>()));
    prop_oneof![4 => object, 1 => json_value()]
}

/// A 4xx that, for an object body, names a field: in backticks in its message.
fn names_its_field(status: u16, message: &str, body: &Value) -> Result<(), TestCaseError> {
    prop_assert!((400..500).contains(&status), "HTTP {status}: {message}");
    if body.is_object() {
        prop_assert!(message.contains('`'), "no field named in {message:?} for {body}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_json_body_is_parsed_or_refused_with_a_4xx_naming_the_field(body in body()) {
        let bytes = body.to_string();
        for endpoint in [Endpoint::Chat, Endpoint::Text] {
            if let Err(error) = GenerationRequest::parse(bytes.as_bytes(), endpoint) {
                names_its_field(error.status, &error.message, &body)?;
            }
        }
    }

    #[test]
    fn any_bytes_are_parsed_or_refused_with_a_400(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        for endpoint in [Endpoint::Chat, Endpoint::Text] {
            if let Err(error) = GenerationRequest::parse(&bytes, endpoint) {
                prop_assert_eq!(error.status, 400, "{}", error.message);
            }
        }
    }
}

const ROUTES: [(&str, &str); 7] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/update_weights_from_disk"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
];

fn serving() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 2);
    // Runtime loading on, reading only under an empty directory: the admin endpoints parse
    // their bodies, and no load succeeds.
    let empty = dir.path().join("nothing-here");
    std::fs::create_dir(&empty).expect("a directory");
    let server = start(dir.path(), loading_from(&[&empty]));
    (dir, server)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_endpoint_answers_any_json_body_with_a_reply_or_a_4xx_naming_the_field(
        bodies in prop::collection::vec(body(), 7),
    ) {
        let (_dir, server) = serving();
        let client = common::http();
        for ((method, path), body) in ROUTES.iter().zip(&bodies) {
            let url = format!("http://{}{path}", server.addr());
            let request = if *method == "GET" { client.get(&url) } else { client.post(&url) };
            // Short replies: a valid generation request is answered, not fuzzed for long.
            let mut sent = body.clone();
            if let Some(object) = sent.as_object_mut() {
                object.insert("max_tokens".into(), Value::from(2));
            }
            let response = request.body(sent.to_string()).send().expect("an answer");
            let status = response.status().as_u16();
            let reply: Value = response.json().unwrap_or(Value::Null);
            if status >= 400 {
                let message = reply["error"]["message"].as_str().unwrap_or_default().to_string();
                names_its_field(status, &message, &sent)?;
            }
        }
        prop_assert_eq!(get(&server, "/health").0, 200);
    }

    #[test]
    fn arbitrary_request_lines_and_headers_leave_the_server_serving(
        line in prop::collection::vec(any::<u8>(), 0..80),
        headers in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..60), 0..6),
    ) {
        let (_dir, server) = serving();
        let mut stream = TcpStream::connect(server.addr()).expect("connected");
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a timeout");
        let mut request = line;
        for header in headers {
            request.extend_from_slice(b"\r\n");
            request.extend_from_slice(&header);
        }
        request.extend_from_slice(b"\r\n\r\n");
        // The server may close the connection before it has read all of it.
        let _ = stream.write_all(&request);
        // The end of what the client sends: the server answers what it read and closes.
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        let text = String::from_utf8_lossy(&reply);
        prop_assert!(reply.is_empty() || text.starts_with("HTTP/1.1 "), "{text}");
        prop_assert_eq!(get(&server, "/health").0, 200);
    }
}
