//! Two runs of the same tiny WHALE config that differ only in how the weights are trained or
//! served, and the comparison of everything they record.

use super::{read_json, untimed_json};
use serde_json::Value;
use std::path::{Path, PathBuf};
use whale_loop::config::RunConfig;
use whale_loop::experiment::{Experiment, ExperimentError, Verbosity};

pub const SEED: u64 = 9;

/// A WHALE run of two weight phases around a search phase on the tiny model in `model`, with
/// the optimizer settings of `whale lm train` (warm-up 1, micro-batch 8, sequences up to the
/// model's 2048 positions) and `extra` appended (the trainer's and server's tables).
pub fn config(model: &Path, extra: &str) -> String {
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
[search]
candidates = 1
[schedule]
budget = 24
weight_steps = 2
search_iterations = 2
[eval]
k = 2
every_steps = 2
{extra}"#,
        model = model.display()
    )
}

/// [`config`] on chess mates in one under `chess/legal-moves` with a policy gradient
/// (`algorithm`), four rollouts per task: the untrained model names no legal move, so the
/// harness plays seeded random ones and a puzzle's rollouts differ often enough for updates.
pub fn policy_gradient_config(model: &Path, algorithm: &str, extra: &str) -> String {
    config(model, extra)
        .replace("[tasks]\n", "[tasks]\ndomain = \"chess\"\ndifficulties = [1]\n")
        .replace("[sampling]\n", "[harness]\ninitial = \"chess/legal-moves\"\n[sampling]\n")
        .replace("[weights]\n", &format!("[weights]\nalgorithm = \"{algorithm}\"\n"))
        .replace("tasks_per_step = 2\nrollouts_per_task = 2", "tasks_per_step = 3\nrollouts_per_task = 4")
        .replace("budget = 24", "budget = 60")
}

/// Whale's own trainer on a LoRA adapter.
pub fn in_process_lora() -> String {
    "[weights.lora]\nrank = 4\nalpha = 8.0\n".to_string()
}

/// `whale lm train` as the external trainer, with the same LoRA and optimizer settings.
pub fn whale_lm_train(learning_rate: &str) -> String {
    trainer_table(&whale_lm_train_command(learning_rate))
}

/// The command line of [`whale_lm_train`].
pub fn whale_lm_train_command(learning_rate: &str) -> Vec<String> {
    let seed = SEED.to_string();
    let command = [
        env!("CARGO_BIN_EXE_whale"),
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
        &seed,
        "--metrics",
        "{metrics}",
    ];
    command.iter().map(|a| a.to_string()).collect()
}

/// A `[weights.trainer]` table running `command` for an adapter.
pub fn trainer_table(command: &[String]) -> String {
    let command: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
    format!("[weights.trainer]\ncommand = [{}]\noutput = \"adapter\"\noutput_wait_s = 0\n", command.join(", "))
}

/// Runs `text` as `root/runs/<name>` to its end.
pub fn run(root: &Path, name: &str, text: &str) -> PathBuf {
    let dir = root.join("runs").join(name);
    start(root, name, text).unwrap_or_else(|e| panic!("{name}: {e}"));
    dir
}

/// Runs `text` as `root/runs/<name>` until it ends or fails.
pub fn start(root: &Path, name: &str, text: &str) -> Result<(), ExperimentError> {
    let file = root.join(format!("{name}.toml"));
    std::fs::write(&file, text).expect("config");
    let config = RunConfig::load(&file).expect("a valid config");
    let mut experiment = Experiment::create(config, &root.join("runs").join(name), Verbosity::default())?;
    experiment.run().map(|_| ())
}

/// The rows of `metrics.jsonl` of one kind, untimed.
pub fn rows(dir: &Path, kind: &str) -> Vec<Value> {
    let rows = untimed_json(read_json(&dir.join("metrics.jsonl")));
    rows.as_array().expect("rows").iter().filter(|row| row["kind"] == kind).cloned().collect()
}

/// Every rollout trace the search archived (the model's completions under the weights of the
/// time), by path, and the kept rollouts of the last weight step, untimed.
pub fn traces(dir: &Path) -> Vec<(PathBuf, Value)> {
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
        .map(|file| (file.strip_prefix(dir).expect("inside").to_path_buf(), untimed_json(read_json(&file))))
        .collect()
}

/// Asserts that two finished runs recorded the same: weights versions, ledger, every test
/// evaluation, every weight step's rollouts and kept set, every search iteration, and every
/// archived completion. Only what the trainers report of themselves (updates, loss, trained
/// tokens, a policy gradient's clipping, KL and ratios) may differ.
pub fn assert_same_run(own: &Path, other: &Path) {
    let state = read_json(&other.join("state.json"));
    assert!(state["weights_version"].as_u64().unwrap_or(0) >= 2, "the weights were updated: {state}");
    assert!(state["search_iterations"].as_u64().unwrap_or(0) >= 1, "a search phase ran: {state}");
    assert_eq!(state["weights_version"], read_json(&own.join("state.json"))["weights_version"]);
    assert_eq!(untimed_json(read_json(&own.join("ledger.json"))), untimed_json(read_json(&other.join("ledger.json"))));
    let evaluations = rows(own, "evaluation");
    assert!(evaluations.len() >= 3);
    assert_eq!(evaluations, rows(other, "evaluation"), "every test evaluation, the final mean@k included");
    let without_training = |rows: Vec<Value>| -> Vec<Value> {
        rows.into_iter()
            .map(|mut row| {
                for key in ["updates", "loss", "trained_tokens"] {
                    row[key] = Value::Null;
                }
                if let Some(pg) = row.get_mut("policy_gradient").and_then(Value::as_object_mut) {
                    for key in ["clip_fraction", "kl", "ratio_deviation", "sampler_deviation"] {
                        pg.remove(key);
                    }
                }
                row
            })
            .collect()
    };
    assert_eq!(
        without_training(rows(own, "weight_step")),
        without_training(rows(other, "weight_step")),
        "the same rollouts and kept sets at every step"
    );
    assert_eq!(rows(own, "search_iteration"), rows(other, "search_iteration"));
    let own_traces = traces(own);
    assert!(own_traces.len() >= 3, "search traces under trained weights: {}", own_traces.len());
    assert_eq!(own_traces, traces(other), "every archived completion is the same");
}
