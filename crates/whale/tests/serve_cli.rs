//! `whale serve` as a user runs it: the binary on a free loopback port, driven by the official
//! `openai` Python client from PyPI.
//!
//! Python comes from `WHALE_PYTHON` when set, else from a virtual environment made (once) at
//! `target/py-openai` with `python3 -m venv` and `pip install openai`. When neither works the
//! test fails and says how to fix it: it is never skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device};
use common::serve::Serve;
use serde_json::Value;
use whale_core::ChatMessage;
use whale_lm::{ChatRequest, EngineConfig, LocalPolicy, Policy, SamplingParams};

fn has_openai(python: &Path) -> bool {
    Command::new(python).args(["-c", "import openai"]).output().is_ok_and(|output| output.status.success())
}

/// A Python interpreter with the `openai` package.
fn python() -> PathBuf {
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

#[test]
fn the_official_openai_client_talks_to_whale_serve() {
    let python = python();
    let dir = tempfile::tempdir().expect("tempdir");
    common::write_tiny_model(dir.path());
    let server = Serve::start(dir.path(), "tiny", &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = Command::new(&python).arg(&script).args([&server.base_url, "tiny"]).output().expect("python runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client script failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).expect("a JSON summary");

    let local = LocalPolicy::load(dir.path(), DType::F32, &Device::Cpu, EngineConfig::default()).expect("loads");
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
        .args(["--requests", "3", "--rounds", "2", "--max-tokens", "7"])
        .output()
        .expect("whale runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("exactly 7 tokens each") && text.contains("whale serve / peer:"), "{text}");
    let rows: Vec<&str> =
        text.lines().filter(|line| line.starts_with("| `whale serve`") || line.starts_with("| peer:")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!((cells[2], cells[3]), ("6", "42"), "6 requests of exactly 7 tokens: {row}");
    }
    assert!(text.contains(&peer.base_url), "the peer is named: {text}");
}
