//! `examples/trainers/trl_sft.py` as the `[weights.trainer]` of a real run: TRL trains a LoRA
//! adapter on each step's samples.jsonl (continuing the previous one), and whale loads it into
//! its in-process engine. Ignored by default, since it needs Python with torch, transformers,
//! peft and trl: `WHALE_HF_PYTHON=/path/to/python cargo test --release -p whale --test
//! trl_trainer -- --ignored`.

mod common;

use common::parity::run;
use common::read_json as read;
use std::path::Path;

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
}
