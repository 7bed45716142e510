//! The hot-load calls whale makes after a weight step, against a loopback HTTP recorder that
//! answers as scripted: the endpoint and JSON of each server kind, the replacement of a stale
//! adapter, an unload of what is not there, SGLang's `{"success": false}`, retries of a
//! transient failure, and the API key.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use whale_loop::scale_out::server::{ServerAdmin, ServerConfig, ServerError, ServerKind};

/// One request as the recorder saw it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    path: String,
    body: Value,
    authorization: Option<String>,
}

/// A server on 127.0.0.1 that answers each request with the next scripted (status, body) and
/// records it; past the script it answers 200 `{}`.
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn start(script: Vec<(u16, Value)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            let mut replies = script.into_iter();
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let reply = replies.next().unwrap_or((200, json!({})));
                answer(stream, reply, &log);
            }
        });
        Self { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log").clone()
    }

    fn config(&self, kind: ServerKind) -> ServerConfig {
        ServerConfig {
            base_url: format!("{}/v1", self.url),
            model: "base".to_string(),
            kind,
            backoff_initial_ms: 1,
            backoff_max_ms: 4,
            ..ServerConfig::default()
        }
    }

    fn admin(&self, kind: ServerKind) -> ServerAdmin {
        ServerAdmin::new(&self.config(kind)).expect("admin client")
    }
}

/// Reads one HTTP/1.1 request, records it and only then writes the reply (so a client that has
/// its answer finds its request in the log), closing the connection.
fn answer(stream: TcpStream, (status, body): (u16, Value), log: &Mutex<Vec<Seen>>) -> Option<()> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let (mut length, mut authorization) = (0, None);
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "authorization" => authorization = Some(value.trim().to_string()),
            _ => {}
        }
    }
    let mut bytes = vec![0; length];
    reader.read_exact(&mut bytes).ok()?;
    let request = Seen { path, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null), authorization };
    log.lock().expect("log").push(request);
    let text = body.to_string();
    let reply = format!(
        "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    let mut stream = stream;
    stream.write_all(reply.as_bytes()).ok()
}

fn paths(seen: &[Seen]) -> Vec<&str> {
    seen.iter().map(|s| s.path.as_str()).collect()
}

#[test]
fn vllm_and_whale_serve_take_adapters_at_the_v1_endpoints() {
    for kind in [ServerKind::Vllm, ServerKind::Whale] {
        let recorder = Recorder::start(vec![]);
        let admin = recorder.admin(kind);
        admin.load_adapter("math-whale-step-2", Path::new("/runs/math/weights/step-000002/adapter")).expect("load");
        admin.unload_adapter("math-whale-step-1").expect("unload");
        let seen = recorder.seen();
        assert_eq!(paths(&seen), ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"], "{kind:?}");
        assert_eq!(
            seen[0].body,
            json!({"lora_name": "math-whale-step-2", "lora_path": "/runs/math/weights/step-000002/adapter"})
        );
        assert_eq!(seen[1].body, json!({"lora_name": "math-whale-step-1"}));
        if kind == ServerKind::Whale {
            admin.load_checkpoint(Path::new("/c")).expect("whale serve takes SGLang's checkpoint call");
            assert_eq!(recorder.seen()[2].path, "/update_weights_from_disk");
            assert_eq!(recorder.seen()[2].body, json!({"model_path": "/c"}));
        }
    }
}

/// A checkpoint directory with `config` and a one-file safetensors holding tensors `names`.
fn checkpoint(dir: &Path, config: Value, names: &[&str]) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let mut header = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        header.insert(name.to_string(), json!({"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}));
    }
    let header = Value::Object(header).to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(vec![0u8; 4 * names.len()]);
    std::fs::write(dir.join("model.safetensors"), bytes).expect("weights");
    dir.to_path_buf()
}

#[test]
fn vllm_reloads_an_untied_checkpoint_in_place_and_empties_its_prefix_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let untied = checkpoint(
        &dir.path().join("untied"),
        json!({"tie_word_embeddings": false}),
        &["model.embed_tokens.weight", "lm_head.weight"],
    );
    let recorder = Recorder::start(vec![(200, json!({"results": [null]})), (200, json!({"success": true}))]);
    let admin = recorder.admin(ServerKind::Vllm);
    admin.load_checkpoint(&untied).expect("an untied checkpoint reloads");
    let seen = recorder.seen();
    assert_eq!(paths(&seen), ["/collective_rpc", "/reset_prefix_cache"]);
    let path = untied.display().to_string();
    assert_eq!(seen[0].body, json!({"method": "reload_weights", "kwargs": {"weights_path": path}}));

    // Tied by its config, or by an lm_head missing from its weights, one file or the shards an
    // index names (a multimodal wrapper's text_config counts): refused before anything is sent.
    let tied = [
        checkpoint(&dir.path().join("a"), json!({"tie_word_embeddings": true}), &["lm_head.weight"]),
        checkpoint(&dir.path().join("b"), json!({"text_config": {"tie_word_embeddings": true}}), &["lm_head.weight"]),
        checkpoint(&dir.path().join("c"), json!({}), &["model.embed_tokens.weight"]),
    ];
    let sharded = dir.path().join("sharded");
    std::fs::create_dir_all(&sharded).expect("dir");
    std::fs::write(sharded.join("config.json"), "{}").expect("config");
    let index = json!({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}});
    std::fs::write(sharded.join("model.safetensors.index.json"), index.to_string()).expect("index");
    for checkpoint in tied.into_iter().chain([sharded]) {
        let error = admin.load_checkpoint(&checkpoint).expect_err("tied");
        assert!(matches!(error, ServerError::TiedCheckpoint { .. }), "{error}");
        assert!(error.to_string().contains("lm_head"), "{error}");
    }
    assert_eq!(recorder.seen().len(), 2, "a refused checkpoint sends nothing");

    // A checkpoint whose tensor names cannot be read is unreadable, not tied; nothing is sent.
    let unreadable = dir.path().join("unreadable");
    std::fs::create_dir_all(&unreadable).expect("dir");
    std::fs::write(unreadable.join("config.json"), "{}").expect("config");
    std::fs::write(unreadable.join("model.safetensors"), u64::MAX.to_le_bytes()).expect("a hostile header length");
    let error = admin.load_checkpoint(&unreadable).expect_err("unreadable");
    assert!(matches!(error, ServerError::UnreadableCheckpoint { .. }), "{error}");
    assert!(error.to_string().contains("past the format's limit"), "{error}");
    let error = admin.load_checkpoint(&dir.path().join("missing")).expect_err("no such checkpoint");
    assert!(matches!(error, ServerError::UnreadableCheckpoint { .. }), "{error}");
    assert_eq!(recorder.seen().len(), 2, "an unreadable checkpoint sends nothing");

    // A server without VLLM_SERVER_DEV_MODE answers 404; the error says how to start it.
    let recorder = Recorder::start(vec![(404, json!({"detail": "Not Found"}))]);
    let error = recorder.admin(ServerKind::Vllm).load_checkpoint(&untied).expect_err("no dev mode");
    assert!(error.to_string().contains("VLLM_SERVER_DEV_MODE=1"), "{error}");
    // A cache that cannot be emptied (blocks still held) is a refusal, not a success.
    let recorder = Recorder::start(vec![(200, json!({"results": [null]})), (200, json!({"success": false}))]);
    let error = recorder.admin(ServerKind::Vllm).load_checkpoint(&untied).expect_err("cache kept");
    assert!(matches!(error, ServerError::Refused { .. }), "{error}");
}

#[test]
fn sglang_takes_adapters_and_checkpoints_at_its_root_endpoints() {
    let recorder = Recorder::start(vec![
        (200, json!({"success": true})),
        (200, json!({"success": true})),
        (200, json!({"success": true, "message": "Succeeded to update model weights."})),
        (200, json!({"success": false, "message": "Failed to get weights iterator: no such file"})),
    ]);
    let admin = recorder.admin(ServerKind::Sglang);
    admin.load_adapter("qa-step-3", Path::new("/r/adapter")).expect("load");
    admin.unload_adapter("qa-step-2").expect("unload");
    admin.load_checkpoint(Path::new("/r/weights/step-000003/checkpoint")).expect("checkpoint");
    let error = admin.load_checkpoint(Path::new("/missing")).expect_err("refused");
    assert!(matches!(error, ServerError::Refused { .. }), "{error}");
    assert!(error.to_string().contains("no such file"), "the server's message is shown: {error}");
    let seen = recorder.seen();
    assert_eq!(
        paths(&seen),
        ["/load_lora_adapter", "/unload_lora_adapter", "/update_weights_from_disk", "/update_weights_from_disk"]
    );
    assert_eq!(seen[0].body, json!({"lora_name": "qa-step-3", "lora_path": "/r/adapter"}));
    assert_eq!(seen[1].body, json!({"lora_name": "qa-step-2"}));
    assert_eq!(seen[2].body, json!({"model_path": "/r/weights/step-000003/checkpoint"}));
}

#[test]
fn a_stale_adapter_of_the_same_name_is_replaced_and_a_missing_one_needs_no_unload() {
    let already = json!({"object": "error", "message": "The lora adapter 'r-step-1' has already been loaded."});
    let recorder = Recorder::start(vec![(400, already), (200, json!({})), (200, json!({})), (404, json!({}))]);
    let admin = recorder.admin(ServerKind::Vllm);
    admin.load_adapter("r-step-1", Path::new("/a")).expect("replaced");
    admin.unload_adapter("r-step-0").expect("a 404 means it is gone already");
    let seen = recorder.seen();
    assert_eq!(
        paths(&seen),
        ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    );
    assert_eq!(seen[1].body, json!({"lora_name": "r-step-1"}));
}

#[test]
fn transient_failures_are_retried_and_permanent_ones_reported_with_the_servers_words() {
    let recorder = Recorder::start(vec![
        (503, json!({"error": {"message": "busy"}})),
        (500, json!({})),
        (200, json!({})),
        (400, json!({"error": {"message": "bad lora_path"}})),
        (404, json!({"error": {"message": "no adapter b"}})),
        (400, json!({"error": {"message": "bad lora_path"}})),
    ]);
    let admin = recorder.admin(ServerKind::Whale);
    admin.load_adapter("a", Path::new("/a")).expect("third attempt");
    assert_eq!(recorder.seen().len(), 3);
    let error = admin.load_adapter("b", Path::new("/nope")).expect_err("permanent");
    let text = error.to_string();
    assert!(text.contains("HTTP 400") && text.contains("bad lora_path"), "{text}");
    assert!(text.contains("/v1/load_lora_adapter"), "the URL is named: {text}");
    let paths: Vec<String> = recorder.seen()[3..].iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter"], "tried once more");
}

#[test]
fn the_api_key_comes_from_the_named_environment_variable() {
    let recorder = Recorder::start(vec![]);
    let variable = "WHALE_TEST_SERVER_ADMIN_KEY";
    std::env::set_var(variable, "sk-test");
    let config = ServerConfig { api_key_env: variable.to_string(), ..recorder.config(ServerKind::Vllm) };
    ServerAdmin::new(&config).expect("admin").unload_adapter("x").expect("unload");
    assert_eq!(recorder.seen()[0].authorization.as_deref(), Some("Bearer sk-test"));
}

#[test]
fn a_server_that_is_not_there_is_reported_after_the_retries() {
    // Port 1 is below the ephemeral range: no test's recorder can be there. (A port freed by a
    // listener of this test could be handed to another test's recorder, running in parallel.)
    let config = ServerConfig {
        base_url: "http://127.0.0.1:1/v1".to_string(),
        model: "base".to_string(),
        max_retries: 2,
        backoff_initial_ms: 1,
        backoff_max_ms: 2,
        ..ServerConfig::default()
    };
    let error = ServerAdmin::new(&config).expect("admin").load_adapter("a", Path::new("/a")).expect_err("refused");
    assert!(matches!(error, ServerError::Transport { .. }), "{error}");
}
