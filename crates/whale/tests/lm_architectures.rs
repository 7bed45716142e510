//! `whale lm train` and `whale lm merge` take a checkpoint of any architecture whale-lm registers,
//! here a tiny random Llama and Qwen3.5 (Qwen3's runs are in `lm_cli.rs`): a full fine-tune
//! lowers the loss and writes a checkpoint of the same architecture, and a LoRA adapter merges
//! into a model that computes what the base with the adapter does.

mod common;

use candle_core::{DType, Device};
use std::path::Path;
use whale_lm::checkpoint::CONFIG_FILE;
use whale_lm::{Decoder, DecoderStep};

fn succeed(args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_whale")).args(args).output().expect("whale runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "whale {args:?} failed:\n{stderr}");
    String::from_utf8(output.stdout).expect("utf-8 output")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

fn model_type(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).expect("config.json");
    let config: serde_json::Value = serde_json::from_str(&text).expect("json");
    config["model_type"].as_str().expect("a model_type").to_string()
}

/// The next-token logits of a fixed prompt.
fn logits(decoder: &Decoder) -> Vec<f32> {
    let tokens = [5, 9, 14, 3, 27];
    let mut cache = decoder.new_cache().expect("a cache");
    let logits = decoder.forward_step(&mut [DecoderStep { tokens: &tokens, cache: &mut cache }]).expect("a step");
    logits.flatten_all().and_then(|t| t.to_vec1()).expect("f32 logits")
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The losses `whale lm train` prints: `loss BEFORE -> AFTER`.
fn losses(printed: &str) -> (f64, f64) {
    let after_loss = printed.split("loss ").last().expect("a loss");
    let (before, after) = after_loss.split_once(" -> ").expect("before -> after");
    let after = after.split(';').next().expect("after");
    (before.trim().parse().expect("a number"), after.trim().parse().expect("a number"))
}

#[test]
fn lm_train_and_merge_take_a_llama_and_a_qwen3_5_checkpoint() {
    let root = tempfile::tempdir().expect("tempdir");
    let lines: Vec<String> = (1..=8)
        .map(|i| {
            let completion = format!("{i} + {i} = {}.", 2 * i);
            serde_json::json!({"messages": [{"role": "user", "content": format!("What is {i} + {i}?")}],
                               "completion": completion})
            .to_string()
        })
        .collect();
    let data = root.path().join("sft.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").expect("write");
    for (base, projections) in
        [(common::tiny_llama_in(root.path()), Some(2 * 7)), (common::tiny_qwen35_in(root.path()), None)]
    {
        let architecture = model_type(&base);
        let train = |out: &Path, extra: &[&str]| {
            let args = ["lm", "train", "--model", path(&base), "--data", path(&data), "-o", path(out)];
            succeed(&[&args[..], &["--epochs", "2", "--batch", "4", "--lr", "1e-2"], extra].concat())
        };

        let full = root.path().join(format!("{architecture}-full"));
        let printed = train(&full, &[]);
        assert!(printed.contains("parameters on 8 examples, 4 steps in all"), "{architecture}: {printed}");
        let (before, after) = losses(&printed);
        assert!(after < before, "{architecture}: loss {before} -> {after}");
        assert_eq!(model_type(&full), architecture, "the checkpoint is written as its architecture");
        let tuned = Decoder::load(&full, DType::F32, &Device::Cpu).expect("the checkpoint loads");
        let original = Decoder::load(&base, DType::F32, &Device::Cpu).expect("the base loads");
        assert_eq!(tuned.architecture(), original.architecture());
        assert!(max_difference(&logits(&tuned), &logits(&original)) > 1e-4, "{architecture}: training moved nothing");

        let adapter = root.path().join(format!("{architecture}-adapter"));
        let printed = train(&adapter, &["--lora-rank", "2"]);
        assert!(printed.contains("adapter parameters on 8 examples, 4 steps in all"), "{architecture}: {printed}");
        let merged = root.path().join(format!("{architecture}-merged"));
        let printed =
            succeed(&["lm", "merge", "--model", path(&base), "--adapter", path(&adapter), "-o", path(&merged)]);
        assert!(printed.contains("merged the adapter into"), "{architecture}: {printed}");
        if let Some(projections) = projections {
            assert!(printed.contains(&format!("into {projections} projections")), "{architecture}: {printed}");
        }
        assert_eq!(model_type(&merged), architecture);
        let adapted = original.with_peft_adapter(&adapter).expect("the adapter applies");
        let merged = Decoder::load(&merged, DType::F32, &Device::Cpu).expect("the merged checkpoint loads");
        let (adapted, merged, plain) = (logits(&adapted), logits(&merged), logits(&original));
        assert!(max_difference(&merged, &adapted) < 1e-4, "{architecture}: merged and adapted differ");
        assert!(max_difference(&adapted, &plain) > 1e-4, "{architecture}: the adapter changes nothing");
    }
}
