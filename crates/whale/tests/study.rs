//! `whale study` on the tiny model: every arm under every seed in its own compare directory,
//! `study.json` with the paired differences pooled over seeds, and a study killed with SIGKILL
//! at seeded random moments ends with the same `study.json` as one never interrupted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn config(model: &Path) -> String {
    format!(
        r#"name = "tiny"
seed = 0
threads = 8
[model]
path = "{model}"
[tasks]
generate = 60
train = 30
search = 4
test = 6
[sampling]
max_tokens = 12
[weights]
tasks_per_step = 2
rollouts_per_task = 2
reward_threshold = -1.0
skip_truncated = false
mini_batch = 4
learning_rate = 0.001
[search]
candidates = 2
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

fn study(root: &Path, runs: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command
        .args(["study", "--quiet", "--seeds", "3,5", "--conditions", "whale,weight-only,harness-only", "--runs"])
        .arg(root.join(runs))
        .arg(root.join("tiny.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let model = common::tiny_model_in(&root);
    std::fs::write(root.join("tiny.toml"), config(&model)).expect("config");
    (dir, root)
}

#[test]
fn a_study_pairs_each_condition_with_whale_and_resumes_after_kills() {
    let (_dir, root) = fixture();
    let started = Instant::now();
    assert!(study(&root, "straight").status().expect("whale runs").success());
    let typical = started.elapsed();
    let study_dir = root.join("straight/study");
    for seed in ["seed-3", "seed-5"] {
        for arm in ["whale", "weight-only", "harness-only"] {
            assert!(study_dir.join("tiny").join(seed).join(arm).join("state.json").is_file(), "{seed}/{arm}");
        }
    }
    let json = common::read_json(&study_dir.join("study.json"));
    assert_eq!(json["seeds"], serde_json::json!([3, 5]));
    let domain = &json["domains"][0];
    assert_eq!(domain["name"], "tiny");
    let arms: Vec<(&str, &str)> = domain["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .map(|d| (d["arm"].as_str().unwrap_or(""), d["metric"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        arms,
        [("weight-only", "best"), ("weight-only", "final"), ("harness-only", "best"), ("harness-only", "final")]
    );
    for difference in domain["differences"].as_array().expect("differences") {
        let (lo, value, hi) = (
            difference["estimate"]["lo"].as_f64(),
            difference["estimate"]["value"].as_f64(),
            difference["estimate"]["hi"].as_f64(),
        );
        assert!(lo <= value && value <= hi, "{difference}");
        assert_eq!(difference["seeds"], 2);
    }
    assert_eq!(domain["verdicts"][0]["status"], "inconclusive", "two baselines of four cannot support finding (a)");
    assert!(study_dir.join("report.html").is_file());

    let landed = common::kill_and_resume(3, typical, 0.1..0.6, 41, |_| study(&root, "killed"));
    assert!(landed >= 1, "no kill landed before the study ended");
    assert_eq!(
        common::untimed_file(&root.join("killed/study/study.json")),
        common::untimed_file(&study_dir.join("study.json")),
        "study.json after kills"
    );
}
