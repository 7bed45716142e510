//! A run whose `[model] path` is a Qwen3.5 checkpoint: rollouts on the in-process engine, and
//! weight steps through an external trainer whose Qwen3.5 checkpoints the engine installs;
//! without one, the in-process trainer (Qwen3 only) refuses with an error saying so.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use whale_loop::config::RunConfig;
use whale_loop::experiment::{Experiment, Verbosity};
use whale_loop::scale_out::trainer_command::{TrainerCommandConfig, TrainerOutput};

/// Hands the base checkpoint back as the step's output.
const COPY_TRAINER: &str = r#"set -e
echo "training on $(wc -l < "$1") samples"
mkdir -p "$3"
cp "$2/config.json" "$2/model.safetensors" "$3/""#;

fn config(root: &Path, trainer: bool) -> RunConfig {
    let model = common::tiny_qwen35_in(root);
    let text = common::weight_only_config("q", 2, &model, "");
    let mut config = RunConfig::parse(&text, Path::new("q.toml"), root).expect("config");
    if trainer {
        config.weights.trainer = Some(TrainerCommandConfig {
            command: ["sh", "-c", COPY_TRAINER, "trainer", "{data}", "{base}", "{output}"].map(String::from).to_vec(),
            output: TrainerOutput::Checkpoint,
            timeout_s: 60.0,
            output_wait_s: 0.0,
            base: None,
            env: BTreeMap::new(),
            workdir: Some(root.to_path_buf()),
        });
    }
    config.validate().expect("a valid config");
    config
}

#[test]
fn a_qwen3_5_run_rolls_out_in_process_and_installs_an_external_trainers_checkpoints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("runs/q");
    let mut experiment = Experiment::create(config(dir.path(), true), &run, Verbosity::default()).expect("created");
    experiment.run().expect("the run finishes");
    let state = experiment.state().clone();
    assert_eq!((state.weight_steps, state.weights_version), (2, 2), "two steps, each installed");
    let served = state.served.expect("the last update is recorded");
    assert_eq!(served.path, run.join("weights/step-000002/checkpoint"));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).expect("metrics");
    assert!(metrics.lines().any(|line| line.contains("\"kind\":\"evaluation\"")), "{metrics}");
}

#[test]
fn the_in_process_trainer_refuses_a_qwen3_5_model_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("runs/q");
    let error = Experiment::create(config(dir.path(), false), &run, Verbosity::default())
        .and_then(|mut experiment| experiment.run().map(|_| ()))
        .expect_err("no trainer for Qwen3.5")
        .to_string();
    assert!(error.contains("Qwen3.5") && error.contains("[weights.trainer]"), "{error}");
}
