//! `whale serve` as a user runs it: the binary on a free loopback port, driven by the official
//! `openai` Python client from PyPI (tool calling too, on a tiny Qwen2 trained to call a tool).
//!
//! Python comes from `WHALE_PYTHON` when set, else from a virtual environment made (once) at
//! `target/py-openai` with `python3 -m venv` and `pip install openai`. When neither works the
//! test fails and says how to fix it: it is never skipped.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use candle_core::{DType, Device};
use common::serve::Serve;
use serde_json::Value;
use whale_core::ChatMessage;
use whale_engine::{EngineConfig, LocalPolicy};
use whale_policy::{ChatRequest, Policy, SamplingParams};

fn has_openai(python: &Path) -> bool {
    Command::new(python).args(["-c", "import openai"]).output().is_ok_and(|output| output.status.success())
}

/// A Python interpreter with the `openai` package, made once per test binary: the tests that
/// use it run in parallel, and two pip installs into one venv would clash.
fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(find_or_make_python).clone()
}

fn find_or_make_python() -> PathBuf {
    if let Some(python) = std::env::var_os("WHALE_PYTHON").filter(|value| !value.is_empty()) {
        let python = PathBuf::from(python);
        assert!(
            has_openai(&python),
            "WHALE_PYTHON={} cannot `import openai`; `pip install openai` there",
            python.display()
        );
        return python;
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py-openai");
    let python = venv.join("bin").join("python");
    if has_openai(&python) {
        return python;
    }
    let run = |command: &mut Command| match command.output() {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
        Err(error) => Err(error.to_string()),
    };
    let made = run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .and_then(|()| run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "openai"])));
    if let Err(reason) = made {
        panic!(
            "the openai-client test needs Python 3 with the `openai` package. Making {} failed: {reason}\n\
             Fix: set WHALE_PYTHON to a python that can `import openai`, or install python3 with venv \
             (Debian: apt-get install python3-venv) and allow pip to reach PyPI.",
            venv.display()
        );
    }
    python
}

/// What `tests/openai_client.py` saw of `server` (with `key`, its extra checks of a keyed one).
fn drive_with_openai_client(server: &Serve, key: Option<&str>) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output =
        Command::new(python()).arg(&script).args([&server.base_url, "tiny"]).args(key).output().expect("python runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client script failed:\n{stderr}");
    serde_json::from_slice(&output.stdout).expect("a JSON summary")
}

/// A Hermes-style chat template with a tools part, as Qwen2.5's has one: the tool schemas in a
/// system turn, the assistant's calls as `<tool_call>` blocks, a tool's result in its own turn.
const TOOLS_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// Writes to `dir` a tiny Qwen2 with [`TOOLS_TEMPLATE`], trained until it answers the apple
/// question with a call of `add` and, given the call's result, with the answer: what
/// `tests/openai_tools.py` asks of it. Returns the directory.
fn tool_calling_model(dir: &Path) -> PathBuf {
    use whale_lm::{ModelSize, Qwen2Config, Qwen2Model, TrainableModel};
    use whale_text::{ChatTemplate, RenderOptions, Tokenizer, TOKENIZER_FILE};
    use whale_train::{SftExample, SftTrainer, TrainerConfig};
    let tools: Value = serde_json::json!([{"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}]);
    let question = ChatMessage::new("user", "Kalo has 12 apples and buys 5 more. How many apples?");
    let mut called = ChatMessage::new("assistant", "");
    called.tool_calls = Some(
        serde_json::json!([{"id": "c", "type": "function", "function": {"name": "add", "arguments": {"a": 12, "b": 5}}}]),
    );
    let mut result = ChatMessage::new("tool", "17");
    result.tool_call_id = Some("c".to_string());
    let template = ChatTemplate::new("tools", TOOLS_TEMPLATE).expect("the template compiles");
    let options =
        RenderOptions { add_generation_prompt: true, tools: tools.as_array().cloned(), ..RenderOptions::default() };
    let turns = [
        (
            vec![question.clone()],
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 12, \"b\": 5}}\n</tool_call>",
        ),
        (vec![question, called, result], "Kalo has 17 apples."),
    ];
    let rendered: Vec<(String, &str)> =
        turns.iter().map(|(chat, reply)| (template.render(chat, &options).expect("renders"), *reply)).collect();
    let texts: Vec<String> = rendered.iter().map(|(prompt, reply)| format!("{prompt}{reply}")).collect();
    let tokenizer = Tokenizer::train_bpe(texts.iter().chain(&texts).map(String::as_str), 400).expect("a tokenizer");
    let im_end = tokenizer.specials().im_end;
    let examples: Vec<SftExample> = rendered
        .iter()
        .map(|(prompt, reply)| SftExample {
            prompt: tokenizer.encode(prompt).expect("ids"),
            completion: [tokenizer.encode(reply).expect("ids"), vec![im_end]].concat(),
        })
        .collect();
    let mut config = Qwen2Config::with_size(tokenizer.vocab_size(), ModelSize::TINY);
    config.eos_token_id = vec![im_end];
    let model = Qwen2Model::new_random(&config, 3, DType::F32, &Device::Cpu).expect("a model");
    let settings = TrainerConfig {
        learning_rate: 1e-2,
        warmup_steps: 5,
        micro_batch_size: 2,
        max_seq_len: 1024,
        ..TrainerConfig::default()
    };
    let mut trainer = SftTrainer::new(model, settings).expect("a trainer");
    let mut loss = f64::INFINITY;
    for _ in 0..300 {
        loss = trainer.step(&examples).expect("a step").loss;
        if loss < 1e-3 {
            break;
        }
    }
    assert!(loss < 1e-2, "the tiny model did not learn its two replies: loss {loss}");
    let model_dir = dir.join("qwen2-tools");
    trainer.model().save(&model_dir).expect("weights written");
    tokenizer.save(model_dir.join(TOKENIZER_FILE)).expect("tokenizer written");
    whale_text::write_tokenizer_config(&model_dir, TOOLS_TEMPLATE, &tokenizer.specials(), 1024).expect("config");
    model_dir
}

/// A full tool-calling round trip with the official client: the call (whole and streamed as
/// deltas), then the answer once the call's result comes back in a `tool` message.
#[test]
fn the_official_openai_client_calls_tools_through_whale_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tool_calling_model(dir.path());
    let server = Serve::start(&model, "tools", &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_tools.py");
    let output = Command::new(python()).arg(&script).args([&server.base_url, "tools"]).output().expect("python runs");
    assert!(output.status.success(), "the client script failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let seen: Value = serde_json::from_slice(&output.stdout).expect("a JSON summary");
    assert_eq!(seen["call"], serde_json::json!({"name": "add", "arguments": {"a": 12, "b": 5}}), "{seen}");
    assert_eq!(seen["content_with_call"], Value::Null, "{seen}");
    assert_eq!(seen["streamed"][0]["name"], "add", "{seen}");
    let streamed: Value = serde_json::from_str(seen["streamed"][0]["arguments"].as_str().unwrap_or("")).expect("JSON");
    assert_eq!(streamed, serde_json::json!({"a": 12, "b": 5}), "{seen}");
    assert_eq!(seen["stream_finishes"], serde_json::json!(["tool_calls"]), "{seen}");
    assert_eq!((seen["answer"].as_str(), seen["answer_finish"].as_str()), (Some("Kalo has 17 apples."), Some("stop")));
    assert!(seen["bad_choice"].as_str().is_some_and(|m| m.contains("tool_choice")), "{seen}");
}

#[test]
fn the_official_openai_client_talks_to_whale_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_tiny_model(dir.path());
    let server = Serve::start(dir.path(), "tiny", &[]);
    let seen = drive_with_openai_client(&server, None);
    assert_same_as_in_process(&seen, dir.path());
}

/// A keyed `whale serve` (its key from WHALE_API_KEY) through the official client: everything
/// works with the key; a wrong key and one off by its last byte get `AuthenticationError`, and
/// an adapter load `PermissionDeniedError` (runtime loading is off by default).
#[test]
fn the_official_openai_client_needs_the_key_of_a_keyed_whale_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_tiny_model(dir.path());
    let key = "sk-whale-cluster-key-42";
    let server = Serve::start_keyed(dir.path(), "tiny", key, &[]);
    let seen = drive_with_openai_client(&server, Some(key));
    assert_same_as_in_process(&seen, dir.path());
    let unauthorized = seen["unauthorized"].as_array().expect("the refusals");
    assert_eq!(unauthorized.len(), 4, "{seen}");
    assert!(unauthorized.iter().all(|m| m.as_str().is_some_and(|m| m.contains("incorrect API key"))), "{seen}");
    assert!(!seen.to_string().contains(key), "no reply echoes the key");
    assert!(seen["forbidden"].as_str().is_some_and(|m| m.contains("--allow-runtime-loading")), "{seen}");
}

/// `seen` (from the client script) is what the engine gives in-process on the model in `dir`.
fn assert_same_as_in_process(seen: &Value, dir: &Path) {
    let local = LocalPolicy::load(dir, DType::F32, &Device::Cpu, EngineConfig::default()).expect("loads");
    let question = "Kalo has 12 apples and buys 5 more. How many apples?";
    let params = SamplingParams { temperature: 0.0, seed: 1, max_tokens: 24, ..SamplingParams::default() };
    let request = ChatRequest { messages: vec![ChatMessage::new("user", question)], params: params.clone() };
    let expected = local.chat(request).expect("in-process");
    assert_eq!(seen["chat"], expected.text.as_str());
    assert_eq!(seen["chat_finish"], expected.finish_reason.as_str());
    assert_eq!(seen["chat_usage"], expected.completion_tokens);
    assert_eq!(seen["streamed"], seen["chat"]);
    assert_eq!(seen["stream_finish"], serde_json::json!([expected.finish_reason.as_str()]));
    assert_eq!(seen["stream_usage"], seen["chat_usage"]);
    let text_params = SamplingParams { temperature: 0.0, max_tokens: 8, ..SamplingParams::default() };
    assert_eq!(seen["text"], local.generate_text("Kalo has 12", &text_params).expect("in-process").text.as_str());
    assert_eq!(seen["models"], serde_json::json!(["tiny"]));
    assert!(seen["not_found"].as_str().is_some_and(|m| m.contains("no-such-model")), "{seen}");
    assert!(seen["bad_request"].as_str().is_some_and(|m| m.contains("temperature")), "{seen}");
}

/// `whale serve ARGS` on a free port: its stderr when it exits by itself, or, once it says
/// where it listens, that line and what it wrote to stderr by then (it is stopped).
fn serve_and_stop(model: &Path, args: &[&str], key: Option<&str>) -> (Option<String>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command.env_remove("WHALE_API_KEY").args(["serve", "--port", "0", "--model"]).arg(model).args(args);
    if let Some(key) = key {
        command.env("WHALE_API_KEY", key);
    }
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("whale runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("stdout is readable");
    let listening = line.strip_prefix("listening on ").map(|url| url.trim().to_string());
    if listening.is_some() {
        // Its start-up notes went to stderr before the address, so they are there already.
        child.kill().expect("stopped");
    }
    child.wait().expect("it ends");
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr is readable");
    (listening, stderr)
}

#[test]
fn a_server_others_can_reach_needs_a_key_or_says_it_has_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_tiny_model(dir.path());
    let (listening, stderr) = serve_and_stop(dir.path(), &["--host", "0.0.0.0"], None);
    assert_eq!(listening, None, "started open on 0.0.0.0: {stderr}");
    assert!(stderr.contains("without an API key") && stderr.contains("--insecure-no-auth"), "{stderr}");
    let (listening, stderr) = serve_and_stop(dir.path(), &["--host", "0.0.0.0", "--insecure-no-auth"], None);
    assert!(listening.is_some(), "{stderr}");
    assert!(stderr.contains("warning: --insecure-no-auth") && stderr.contains("without an API key"), "{stderr}");
    for (args, key) in [(vec!["--host", "0.0.0.0", "--api-key", "k3y"], None), (vec!["--host", "0.0.0.0"], Some("k3y"))]
    {
        let (listening, stderr) = serve_and_stop(dir.path(), &args, key);
        assert!(listening.is_some() && !stderr.contains("warning"), "{args:?} {key:?}: {stderr}");
    }
    let (listening, stderr) = serve_and_stop(dir.path(), &["--host", "localhost"], None);
    assert!(listening.is_some() && !stderr.contains("warning"), "{stderr}");
}

#[test]
fn the_api_key_flag_guards_every_request_and_bad_access_options_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_tiny_model(dir.path());
    let server = Serve::start(dir.path(), "tiny", &["--api-key", "flag-key"]);
    let models = format!("{}/models", server.base_url);
    let http = reqwest::blocking::Client::new();
    assert_eq!(http.get(&models).send().expect("answered").status().as_u16(), 401);
    assert_eq!(http.get(&models).bearer_auth("flag-kez").send().expect("answered").status().as_u16(), 401);
    assert_eq!(http.get(&models).bearer_auth("flag-key").send().expect("answered").status().as_u16(), 200);

    let refused = |args: &[&str]| {
        let (listening, stderr) = serve_and_stop(dir.path(), args, None);
        assert_eq!(listening, None, "{args:?} started: {stderr}");
        stderr
    };
    let stderr = refused(&["--allowed-path", "/tmp"]);
    assert!(stderr.contains("--allow-runtime-loading"), "an allowed path alone is refused: {stderr}");
    let missing = dir.path().join("no-such-runs");
    let stderr = refused(&["--allow-runtime-loading", "--allowed-path", missing.to_str().expect("UTF-8")]);
    assert!(stderr.contains("no-such-runs"), "{stderr}");
    let stderr = refused(&["--api-key", ""]);
    assert!(stderr.contains("must not be empty"), "{stderr}");
    let (listening, stderr) = serve_and_stop(dir.path(), &["--allow-runtime-loading"], None);
    assert!(listening.is_some() && stderr.contains("nothing can be loaded"), "{stderr}");
}

#[test]
fn bad_serve_options_are_refused_before_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_tiny_model(dir.path());
    let output = Command::new(env!("CARGO_BIN_EXE_whale"))
        .arg("serve")
        .arg("--model")
        .arg(dir.path())
        .args(["--port", "0", "--fail-rate", "1.5"])
        .output()
        .expect("whale runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("fail_rate"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = Command::new(env!("CARGO_BIN_EXE_whale"))
        .args(["serve", "--model"])
        .arg(dir.path().join("missing"))
        .output()
        .expect("whale runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("missing"));
}

#[test]
fn serve_bench_measures_whale_serve_beside_a_peer_server_token_for_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_tiny_model(dir.path());
    let peer = Serve::start(dir.path(), "the-peer", &[]);
    let output = Command::new(env!("CARGO_BIN_EXE_whale"))
        .args(["serve", "bench", "--model"])
        .arg(dir.path())
        .args(["--peer", &peer.base_url, "--peer-model", "the-peer", "--ignore-eos"])
        .args(["--requests", "3", "--rounds", "2", "--max-tokens", "7", "--prompt-words", "20"])
        .output()
        .expect("whale runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("exactly 7 tokens each") && text.contains("whale serve / peer:"), "{text}");
    let rows: Vec<&str> =
        text.lines().filter(|line| line.starts_with("| `whale serve`") || line.starts_with("| peer:")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    let mut prompt_tokens = Vec::new();
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!((cells[2], cells[4]), ("6", "42"), "6 requests of exactly 7 tokens: {row}");
        prompt_tokens.push(cells[3].parse::<f64>().expect("the mean prompt tokens"));
    }
    assert_eq!(prompt_tokens[0], prompt_tokens[1], "the same prompts on both paths: {text}");
    assert!(prompt_tokens[0] > 20.0, "20 words of context and a question: {text}");
    assert!(text.contains(&peer.base_url), "the peer is named: {text}");
}

/// SIGTERM: the request in flight (a stream, seen under way before the signal) is answered in
/// full, the listening socket closes, and the process exits 0 (docs/serving.md, "Limits under load").
#[test]
fn sigterm_lets_the_request_in_flight_finish_refuses_new_connections_and_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let mut server = Serve::start(&model, "tiny", &["--shutdown-grace", "60"]);
    let url = format!("{}/chat/completions", server.base_url);
    let address = server.base_url.trim_start_matches("http://").trim_end_matches("/v1").to_string();
    let body = serde_json::json!({
        "model": "tiny", "messages": [{"role": "user", "content": "Count."}], "stream": true,
        "n": 64, "max_tokens": 150, "ignore_eos": true, "seed": 1,
    });
    let mut response = reqwest::blocking::Client::new().post(url).json(&body).send().expect("an answer");
    assert_eq!(response.status().as_u16(), 200);
    let mut events = vec![0u8; 256];
    let first = response.read(&mut events).expect("the first events");
    assert!(String::from_utf8_lossy(&events[..first]).contains("data:"), "the stream is under way");

    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        response.read_to_string(&mut rest).expect("the rest of the stream");
        rest
    });
    let status = server.terminate();
    let rest = reader.join().expect("the reader");
    assert!(status.success(), "{status}");
    assert!(
        rest.trim_end().ends_with("data: [DONE]"),
        "the stream ends whole: ...{}",
        &rest[rest.len().saturating_sub(300)..]
    );
    assert!(!rest.contains("server_stopping"), "nothing was cut off");
    assert_eq!(rest.matches("\"finish_reason\":\"length\"").count(), 64, "every choice ran to max_tokens");
    assert!(std::net::TcpStream::connect(&address).is_err(), "{address} refuses connections");
}
