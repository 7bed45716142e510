//! `whale compare` hands the evaluation of the base weights a finished condition took to the
//! next one, also across invocations in one comparison directory, and only between runs of the
//! same config: a run left there by a comparison of another config lends nothing. Each
//! comparison draws its curves into `curves.png`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

fn compare(root: &Path, config: &str, runs: &str, condition: &str) {
    let status = Command::new(env!("CARGO_BIN_EXE_whale"))
        .args(["compare", "--quiet", "--conditions", condition, "--runs"])
        .arg(root.join(runs))
        .arg(root.join(config))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("whale runs");
    assert!(status.success(), "whale compare {config} --conditions {condition} into {runs}");
}

/// The test rollouts the run of `condition` in `runs` took.
fn test_rollouts(root: &Path, runs: &str, condition: &str) -> u64 {
    let ledger = common::read_json(&root.join(runs).join("tiny").join(condition).join("ledger.json"));
    ledger["by_purpose"]["test_eval"]["rollouts"].as_u64().expect("test rollouts")
}

#[test]
fn the_base_evaluation_is_shared_across_invocations_within_one_config_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let model = common::tiny_model_in(root);
    let b = common::tiny_comparison_config(&model);
    let a = b.replacen("\nseed = 0\n", "\nseed = 1\n", 1);
    assert_ne!(a, b, "config a has another seed");
    std::fs::write(root.join("a.toml"), a).expect("config a");
    std::fs::write(root.join("b.toml"), b).expect("config b");
    let one_evaluation = 6 * 2;

    compare(root, "b.toml", "alone", "weight-only");
    let alone = test_rollouts(root, "alone", "weight-only");

    compare(root, "b.toml", "same", "harness-only");
    compare(root, "b.toml", "same", "weight-only");
    assert_eq!(
        test_rollouts(root, "same", "weight-only"),
        alone - one_evaluation,
        "harness-only's start was handed on"
    );
    let curves = std::fs::read(root.join("same/tiny/curves.png")).expect("the comparison's picture");
    assert!(curves.starts_with(b"\x89PNG\r\n\x1a\n") && curves.len() > 1000, "{} bytes", curves.len());

    compare(root, "a.toml", "other", "harness-only");
    compare(root, "b.toml", "other", "weight-only");
    assert_eq!(test_rollouts(root, "other", "weight-only"), alone, "a run of another config lends nothing");
    let metrics = |runs: &str| {
        let rows = common::read_json(&root.join(runs).join("tiny/weight-only/metrics.jsonl"));
        common::untimed_json(rows[0].clone())
    };
    assert_eq!(metrics("other"), metrics("alone"), "the start is config b's own evaluation");
}
