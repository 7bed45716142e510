//! The whole scale-out loop over HTTP: `whale serve` (the binary) serves a tiny model on
//! 127.0.0.1, and a tiny WHALE run sends every rollout (weight steps, search, test evaluation)
//! to it through `[server]`, trains with `whale lm train` as its `[weights.trainer]`, and
//! hot-loads each step's adapter (`/v1/load_lora_adapter`, the previous one unloaded). It must
//! record what the same run trained in-process with `[weights.lora]` records.
//!
//! Why the equality is exact, completions included, although the server batches requests
//! differently (one engine per loaded adapter, requests arriving over HTTP in their own order):
//! whale's engine computes each sequence's logits without reference to the others in its batch
//! (matrix products whose every output row is reduced in the same order whatever the batch's
//! size, attention over the sequence's own cache), every request samples from its own seeded
//! generator (the seed travels in the request), the adapter crosses the filesystem as f32 bit for
//! bit, and the trainer reproduces whale's own update exactly (see `trainer_parity.rs`). A GPU
//! server (vLLM, SGLang) makes no such promise about batch composition, so runs there agree in
//! distribution, not bit for bit.

mod common;

use common::parity::{
    assert_same_run, config, in_process_lora, run, start, trainer_table, whale_lm_train, whale_lm_train_command,
};
use common::read_json as read;
use common::serve::Serve;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use whale_loop::experiment::{Experiment, ExperimentError, Verbosity};

#[test]
fn a_run_on_whale_serve_with_hot_loaded_adapters_ends_where_the_in_process_one_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let serve = Serve::for_runs_in(dir.path(), &model, "base");
    let server = format!("[server]\nbase_url = \"{}\"\nmodel = \"base\"\nkind = \"whale\"\n", serve.base_url);
    let served = run(dir.path(), "served", &config(&model, &format!("{server}{}", whale_lm_train("0.002"))));
    let state = read(&served.join("state.json"));
    let last = format!("p-whale-step-{}", state["weight_steps"]);
    assert_eq!(state["served"]["name"], last.as_str(), "{state}");
    let models: Value = reqwest::blocking::get(format!("{}/models", serve.base_url))
        .and_then(|reply| reply.json())
        .expect("GET /v1/models");
    let names: Vec<&str> = models["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(names, ["base", last.as_str()], "the last adapter is loaded, every earlier one unloaded");
    let steps = common::parity::rows(&served, "weight_step");
    assert!(steps.iter().all(|row| row["loss"].as_f64().is_some_and(|l| l > 0.0)), "the trainer's loss: {steps:?}");
    let own = run(dir.path(), "own", &config(&model, &in_process_lora()));
    assert_same_run(&own, &served);

    // The same run again, its trainer failing once at step 3: the run stops there, and resumed it
    // loads step 2's adapter into the server again (replacing the copy still loaded) and ends
    // exactly as the others did. Its adapter names are those of the first served run, so its
    // last load also replaces a stale adapter the server still holds.
    let failing_once = [
        "sh",
        "-c",
        r#"if [ "$1" = 3 ] && [ -f "$2/fail-once" ]; then rm "$2/fail-once"; echo "scripted failure" >&2; exit 1; fi
shift 2; exec "$@""#,
        "trainer",
        "{step}",
        "{run_dir}",
    ];
    let mut command: Vec<String> = failing_once.iter().map(|a| a.to_string()).collect();
    command.extend(whale_lm_train_command("0.002"));
    let resumed = dir.path().join("runs/resumed");
    std::fs::create_dir_all(&resumed).expect("run dir");
    std::fs::write(resumed.join("fail-once"), "").expect("marker");
    let error = start(dir.path(), "resumed", &config(&model, &format!("{server}{}", trainer_table(&command))))
        .expect_err("the trainer fails at step 3");
    assert!(matches!(error, ExperimentError::Trainer { .. }), "{error}");
    assert!(error.to_string().contains("weight step 3"), "{error}");
    let log = std::fs::read_to_string(resumed.join("weights/step-000003/train.log")).expect("train.log");
    assert!(log.contains("scripted failure"), "{log}");
    Experiment::resume(&resumed, Verbosity::default()).and_then(|mut e| e.run()).expect("the resumed run ends");
    assert_same_run(&own, &resumed);
}

#[test]
fn an_rloo_run_on_whale_serve_learns_from_the_served_tokens_as_the_in_process_one_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let serve = Serve::for_runs_in(dir.path(), &model, "base");
    let server = format!("[server]\nbase_url = \"{}\"\nmodel = \"base\"\nkind = \"whale\"\n", serve.base_url);
    let trainer = format!("{server}{}", whale_lm_train("0.002"));
    let served = run(dir.path(), "served", &common::parity::policy_gradient_config(&model, "rloo", &trainer));
    let own = run(dir.path(), "own", &common::parity::policy_gradient_config(&model, "rloo", &in_process_lora()));
    assert_same_run(&own, &served);
}

/// `whale run --quiet --runs RUNS FILE` with `WHALE_SERVER_API_KEY` (the default
/// `[server] api_key_env`) set to `key`, or unset.
fn whale_run(runs: &Path, file: &Path, key: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command.env_remove("WHALE_SERVER_API_KEY").args(["run", "--quiet", "--runs"]).arg(runs).arg(file);
    if let Some(key) = key {
        command.env("WHALE_SERVER_API_KEY", key);
    }
    command.output().expect("whale runs")
}

/// `whale serve` set up for a cluster as the README says (its key in WHALE_API_KEY, runtime
/// loading from `runs/` only) and `whale run` against it: with the key in `[server]
/// api_key_env` every rollout and every adapter load and unload gets through, and the run ends
/// where the in-process one does; without it the run stops at its first call with the 401.
#[test]
fn a_run_against_a_keyed_whale_serve_sends_its_key_and_ends_where_the_in_process_one_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let runs = dir.path().join("runs");
    std::fs::create_dir_all(&runs).expect("runs");
    let key = "sk-whale-served-run-7";
    let allowed = runs.to_str().expect("a UTF-8 path");
    let serve = Serve::start_keyed(&model, "base", key, &["--allow-runtime-loading", "--allowed-path", allowed]);
    let server = format!("[server]\nbase_url = \"{}\"\nmodel = \"base\"\nkind = \"whale\"\n", serve.base_url);
    let file = dir.path().join("keyed.toml");
    std::fs::write(&file, config(&model, &format!("{server}{}", whale_lm_train("0.002")))).expect("config");

    let refused = whale_run(&runs.join("keyless"), &file, None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a run without the key ran: {stderr}");
    assert!(stderr.contains("401") && stderr.contains("API key"), "the server's refusal is shown: {stderr}");

    let keyed = whale_run(&runs.join("keyed"), &file, Some(key));
    assert!(keyed.status.success(), "{}", String::from_utf8_lossy(&keyed.stderr));
    let served = runs.join("keyed/p");
    let state = read(&served.join("state.json"));
    let last = format!("p-whale-step-{}", state["weight_steps"]);
    assert_eq!(state["served"]["name"], last.as_str(), "{state}");
    let models: Value = reqwest::blocking::Client::new()
        .get(format!("{}/models", serve.base_url))
        .bearer_auth(key)
        .send()
        .and_then(|reply| reply.json())
        .expect("GET /v1/models");
    let names: Vec<&str> = models["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(names, ["base", last.as_str()], "the last adapter is loaded, every earlier one unloaded");
    let own = run(dir.path(), "own", &config(&model, &in_process_lora()));
    assert_same_run(&own, &served);
}
