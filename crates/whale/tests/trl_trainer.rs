//! `examples/trainers/trl_sft.py` as the `[weights.trainer]` of a real run: TRL trains a LoRA
//! adapter on each step's samples.jsonl (continuing the previous one), and whale loads it into
//! its in-process engine; and `examples/trainers/pg_transformers.py` does the same for a GRPO
//! step. Each then runs `scripts/trainer_agreement.py` on the run's first weight step: the
//! script trains the same tokens as `whale lm train`, and its first-step loss agrees within 1%.
//! Ignored by default, since they need Python with torch, transformers, peft and trl:
//! `WHALE_HF_PYTHON=/path/to/python cargo test --release -p whale --test trl_trainer --
//! --ignored`.

mod common;

use common::parity::{policy_gradient_config, run};
use common::read_json as read;
use std::path::Path;
use std::process::Command;

/// `scripts/trainer_agreement.py` on a weight step's samples: exits 0 only when the external
/// trainer trains the same token ids as `whale lm train` and its first-step loss agrees.
fn assert_trainers_agree(python: &str, samples: &Path, base: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/trainer_agreement.py");
    let output = Command::new(python)
        .arg(script)
        .args(["--samples".as_ref(), samples.as_os_str(), "--base".as_ref(), base.as_os_str()])
        .args(["--whale", env!("CARGO_BIN_EXE_whale")])
        .output()
        .expect("python runs");
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the trainers disagree on {}:\n{printed}", samples.display());
    assert!(printed.contains("token ids equal"), "{printed}");
}

#[test]
#[ignore = "needs WHALE_HF_PYTHON, a Python with torch, transformers, peft and trl"]
fn the_shipped_trl_script_trains_adapters_that_whale_serves() {
    let python = std::env::var("WHALE_HF_PYTHON").expect("WHALE_HF_PYTHON names a Python with TRL");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/trainers/trl_sft.py");
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let trainer = format!(
        r#"[sampling]
max_tokens = 8
[weights.trainer]
command = ["{python}", "{script}", "--data", "{{data}}", "--base", "{{base}}", "--previous", "{{previous}}",
           "--output", "{{output}}", "--lr", "1e-3", "--lora-rank", "4", "--batch-size", "4"]
output = "adapter"
timeout_s = 600
"#,
        script = script.display()
    );
    let config = common::weight_only_config("t", 3, &model, &trainer);
    let run_dir = run(dir.path(), "t", &config);
    let state = read(&run_dir.join("state.json"));
    assert_eq!((state["weight_steps"].as_u64(), state["weights_version"].as_u64()), (Some(2), Some(2)), "{state}");
    for step in ["step-000001", "step-000002"] {
        let log = std::fs::read_to_string(run_dir.join("weights").join(step).join("train.log")).expect("train.log");
        assert!(log.contains("trained on 4 samples from "), "{step}: {log}");
        let adapter = run_dir.join("weights").join(step).join("adapter");
        assert!(adapter.join("adapter_config.json").is_file() && adapter.join("adapter_model.safetensors").is_file());
    }
    let second = std::fs::read_to_string(run_dir.join("weights/step-000002/train.log")).expect("train.log");
    let first_adapter = run_dir.join("weights/step-000001/adapter");
    assert!(second.contains(&format!("from {}", first_adapter.display())), "{{previous}} is step 1's: {second}");
    let adapter: serde_json::Value = read(&run_dir.join("weights/step-000002/adapter/adapter_config.json"));
    assert_eq!(adapter["r"], 4, "step 2 continued the rank-4 adapter of step 1");
    assert_trainers_agree(&python, &run_dir.join("weights/step-000001/samples.jsonl"), &model);
}

#[test]
#[ignore = "needs WHALE_HF_PYTHON, a Python with torch, transformers and peft"]
fn the_shipped_policy_gradient_script_trains_adapters_that_whale_serves() {
    let python = std::env::var("WHALE_HF_PYTHON").expect("WHALE_HF_PYTHON names a Python with transformers");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/trainers/pg_transformers.py");
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let trainer = format!(
        r#"[weights.trainer]
command = ["{python}", "{script}", "--data", "{{data}}", "--base", "{{base}}", "--previous", "{{previous}}",
           "--output", "{{output}}", "--metrics", "{{metrics}}", "--lr", "1e-3", "--lora-rank", "4"]
output = "adapter"
timeout_s = 600
"#,
        script = script.display()
    );
    let config = policy_gradient_config(&model, "grpo", &trainer)
        .replace("condition = \"whale\"", "condition = \"weight-only\"");
    let run_dir = run(dir.path(), "g", &config);
    let state = read(&run_dir.join("state.json"));
    assert!(state["weights_version"].as_u64().unwrap_or(0) >= 2, "adapters were trained and installed: {state}");
    let mut logs = 0;
    for step in std::fs::read_dir(run_dir.join("weights")).expect("steps").map(|e| e.expect("entry").path()) {
        let Ok(log) = std::fs::read_to_string(step.join("train.log")) else { continue };
        logs += 1;
        let gap = log
            .split("largest |p_trainer / p_sampler - 1| before training: ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{}: no sampler gap in {log}", step.display()));
        assert!(gap < 1e-3, "transformers and whale's sampler agree on the tokens' probabilities: {gap}");
    }
    assert!(logs >= 2, "the script ran at each step with a signal");
    let first = std::fs::read_dir(run_dir.join("weights"))
        .expect("steps")
        .map(|e| e.expect("entry").path().join("samples.jsonl"))
        .filter(|samples| samples.is_file())
        .min()
        .expect("a step with samples");
    assert_trainers_agree(&python, &first, &model);
}
