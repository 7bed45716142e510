//! An external trainer gives the same run as whale's own: a tiny WHALE run (weight steps and a
//! search phase) whose weight steps run `whale lm train --lora-rank ... --resume-adapter
//! {previous} --keep-order` as their `[weights.trainer]` ends with the same test evaluations
//! and the same ledger as the same run trained in-process with `[weights.lora]` of the same
//! settings.
//!
//! Why equality is exact: the command trains the same examples (samples.jsonl re-tokenized with
//! the same tokenizer and chat template, the end-of-turn token only after replies that ended
//! their turn) in the same mini-batches (the file is written in whale's training order and
//! `--keep-order` keeps it), from the same adapter (initial matrices drawn from the same seed,
//! then the previous step's matrices and AdamW state, saved as f32 and read back bit for bit),
//! with the same optimizer settings (the run config below uses `whale lm train`'s own: warm-up
//! 1, micro-batch 8, sequences up to the model's 2048 positions); and rollouts before the first
//! update see the base model either way, since a fresh adapter's B matrices are zero.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use whale::config::RunConfig;
use whale::experiment::{Experiment, Verbosity};

const SEED: u64 = 9;

fn config(model: &Path, trainer: &str) -> String {
    format!(
        r#"name = "p"
seed = {SEED}
condition = "whale"
threads = 4
[model]
path = "{model}"
[tasks]
generate = 40
train = 20
search = 3
test = 3
[sampling]
max_tokens = 8
[weights]
tasks_per_step = 2
rollouts_per_task = 2
reward_threshold = -1.0
skip_truncated = false
mini_batch = 4
micro_batch = 8
learning_rate = 0.002
warmup_steps = 1
max_seq_len = 2048
{trainer}
[search]
candidates = 1
[schedule]
budget = 24
weight_steps = 2
search_iterations = 2
[eval]
k = 2
every_steps = 2
"#,
        model = model.display()
    )
}

fn in_process_lora() -> String {
    "[weights.lora]\nrank = 4\nalpha = 8.0\n".to_string()
}

fn external_trainer(learning_rate: &str) -> String {
    let whale = env!("CARGO_BIN_EXE_whale");
    let command = [
        whale,
        "lm",
        "train",
        "--model",
        "{base}",
        "--data",
        "{data}",
        "-o",
        "{output}",
        "--lora-rank",
        "4",
        "--lora-alpha",
        "8",
        "--resume-adapter",
        "{previous}",
        "--keep-order",
        "--batch",
        "4",
        "--lr",
        learning_rate,
        "--seed",
        &SEED.to_string(),
    ];
    let command: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
    format!("[weights.trainer]\ncommand = [{}]\noutput = \"adapter\"\noutput_wait_s = 0\n", command.join(", "))
}

fn run(root: &Path, name: &str, text: &str) -> PathBuf {
    let file = root.join(format!("{name}.toml"));
    std::fs::write(&file, text).expect("config");
    let config = RunConfig::load(&file).expect("a valid config");
    let dir = root.join("runs").join(name);
    let mut experiment = Experiment::create(config, &dir, Verbosity::default()).expect("created");
    experiment.run().expect("the run finishes");
    dir
}

fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "jsonl") {
        Value::Array(text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect())
    } else {
        serde_json::from_str(&text).expect("JSON")
    }
}

/// Removes every timing field (they differ between any two runs).
fn untimed(mut value: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(fields) => {
                fields.retain(|key, _| {
                    !key.contains("seconds") && !["wall_s", "wall", "latency_ms"].contains(&key.as_str())
                });
                fields.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

/// The rows of `metrics.jsonl` of one kind, untimed.
fn rows(dir: &Path, kind: &str) -> Vec<Value> {
    let rows = untimed(read(&dir.join("metrics.jsonl")));
    rows.as_array().expect("rows").iter().filter(|row| row["kind"] == kind).cloned().collect()
}

/// Every rollout trace the search archived (the model's completions under the weights of the
/// time), by path, and the kept rollouts of the last weight step, untimed.
fn traces(dir: &Path) -> Vec<(PathBuf, Value)> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a directory").map(|e| e.expect("an entry").path()) {
            if entry.is_dir() {
                walk(&entry, found);
            } else if entry.file_name().is_some_and(|n| n == "traces.jsonl") {
                found.push(entry);
            }
        }
    }
    let mut files = Vec::new();
    walk(&dir.join("archive"), &mut files);
    files.push(dir.join("examples.jsonl"));
    files.sort();
    files
        .into_iter()
        .map(|file| (file.strip_prefix(dir).expect("inside").to_path_buf(), untimed(read(&file))))
        .collect()
}

#[test]
fn an_external_lora_trainer_ends_where_the_in_process_one_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("model");
    std::fs::create_dir_all(&model).expect("model dir");
    common::write_tiny_model(&model);
    let own = run(dir.path(), "own", &config(&model, &in_process_lora()));
    let external = run(dir.path(), "external", &config(&model, &external_trainer("0.002")));
    let control = run(dir.path(), "control", &config(&model, &external_trainer("0.004")));

    let state = read(&external.join("state.json"));
    assert!(state["weights_version"].as_u64().unwrap_or(0) >= 2, "the trainer updated the weights: {state}");
    assert!(state["search_iterations"].as_u64().unwrap_or(0) >= 1, "a search phase ran: {state}");
    assert_eq!(state["weights_version"], read(&own.join("state.json"))["weights_version"]);
    assert_eq!(untimed(read(&own.join("ledger.json"))), untimed(read(&external.join("ledger.json"))));
    let (own_evals, external_evals) = (rows(&own, "evaluation"), rows(&external, "evaluation"));
    assert!(own_evals.len() >= 3);
    assert_eq!(own_evals, external_evals, "every test evaluation, the final mean@k included");
    let without_training = |rows: Vec<Value>| -> Vec<Value> {
        rows.into_iter()
            .map(|mut row| {
                for key in ["updates", "loss", "trained_tokens"] {
                    row[key] = Value::Null;
                }
                row
            })
            .collect()
    };
    assert_eq!(
        without_training(rows(&own, "weight_step")),
        without_training(rows(&external, "weight_step")),
        "the same rollouts and kept sets at every step"
    );
    assert_eq!(rows(&own, "search_iteration"), rows(&external, "search_iteration"));
    let own_traces = traces(&own);
    assert!(own_traces.len() >= 3, "search traces under trained weights: {}", own_traces.len());
    assert_eq!(own_traces, traces(&external), "every archived completion is the same");
    assert_ne!(own_traces, traces(&control), "a trainer with another learning rate samples other completions");
}
