//! Kill-and-resume with an external trainer: `whale run` on a tiny WHALE config whose weight
//! steps run `whale lm train` (deterministic) is killed with SIGKILL at seeded random moments —
//! during rollouts, during the trainer command, between installing an adapter and committing the
//! step — and resumed each time; it must end with the same ledger, metrics rows and state as a run
//! that was never interrupted.

mod common;

use common::parity::{config, whale_lm_train};
use common::untimed_json as untimed;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn whale(args: &[&str], path: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command.args(args).arg(path).stdout(Stdio::null()).stderr(Stdio::null());
    command
}

fn read(path: &Path) -> Value {
    let mut value = common::read_json(path);
    if let Some(served) = value.get_mut("served") {
        served["path"] = Value::Null;
    }
    untimed(value)
}

#[test]
fn a_run_with_an_external_trainer_killed_at_random_moments_ends_as_if_never_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let file = dir.path().join("p.toml");
    std::fs::write(&file, config(&model, &whale_lm_train("0.002"))).expect("config");

    let straight_runs = dir.path().join("straight");
    let started = Instant::now();
    let status = whale(&["run", "--quiet", "--runs"], &straight_runs).arg(&file).status().expect("whale runs");
    assert!(status.success(), "the uninterrupted run failed");
    let typical = started.elapsed();

    let killed_runs = dir.path().join("killed");
    let run = killed_runs.join("p");
    let total_units = common::completed_units(&straight_runs.join("p")).expect("the uninterrupted run");
    let landed = common::kill_between_units(4, &run, total_units, typical, 5, |attempt| {
        if attempt == 0 {
            let mut command = whale(&["run", "--quiet", "--runs"], &killed_runs);
            command.arg(&file);
            command
        } else {
            whale(&["run", "--quiet", "--resume"], &run)
        }
    });
    assert!(landed >= 2, "only {landed} kills landed before the run ended");
    let straight = straight_runs.join("p");
    for file in ["ledger.json", "metrics.jsonl", "state.json"] {
        assert_eq!(read(&straight.join(file)), read(&run.join(file)), "{file} differs after kills");
    }
    let state = read(&run.join("state.json"));
    assert_eq!(state["finished"], true);
    assert!(state["weights_version"].as_u64().unwrap_or(0) >= 2, "{state}");
}
