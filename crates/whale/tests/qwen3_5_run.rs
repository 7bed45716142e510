//! A run whose `[model] path` is a Qwen3.5 checkpoint: rollouts on the in-process engine, weight
//! steps by the in-process trainer (killed and resumed, it ends as if never interrupted) or by
//! an external trainer whose Qwen3.5 checkpoints the engine installs; with `[weights.lora]` only
//! a PEFT adapter trains and is checkpointed; `whale lm generate --adapter` applies one.

mod common;

use candle_core::{DType, Device};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;
use whale_lm::Qwen35Lora;
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
fn a_lora_run_on_qwen3_5_trains_and_checkpoints_the_adapter_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("runs/q");
    let mut config = config(dir.path(), false);
    let targets = ["q_proj", "in_proj_qkv", "down_proj"].map(String::from).to_vec();
    config.weights.lora = Some(whale_lm::LoraConfig { rank: 4, target_modules: targets, ..Default::default() });
    config.weights.checkpoint_every = 1;
    let weights = std::fs::read(dir.path().join("qwen3_5/model.safetensors")).expect("base weights");
    let mut experiment = Experiment::create(config, &run, Verbosity::default()).expect("created");
    experiment.run().expect("the run finishes");
    let state = experiment.state().clone();
    assert_eq!((state.weight_steps, state.weights_version), (2, 2));
    let checkpoint = run.join("checkpoints/step-000002");
    for file in ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"] {
        assert!(checkpoint.join(file).is_file(), "{file} is missing from the checkpoint");
    }
    assert!(!checkpoint.join("model.safetensors").exists(), "a LoRA checkpoint holds no base weights");
    assert_eq!(std::fs::read(dir.path().join("qwen3_5/model.safetensors")).expect("base"), weights);
}

fn whale() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command.stdout(Stdio::null()).stderr(Stdio::null());
    command
}

#[test]
fn an_in_process_qwen3_5_run_killed_at_random_moments_ends_as_if_never_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let model = common::tiny_qwen35_in(root);
    let file = root.join("q.toml");
    std::fs::write(
        &file,
        common::weight_only_config("q", 4, &model, "")
            .replace("[weights]\n", "[weights]\ncheckpoint_every = 1\n")
            .replace("budget = 8", "budget = 12"),
    )
    .expect("config");
    let started = Instant::now();
    assert!(whale()
        .args(["run", "--quiet", "--runs"])
        .arg(root.join("straight"))
        .arg(&file)
        .status()
        .expect("whale")
        .success());
    let typical = started.elapsed();
    let killed = root.join("killed/q");
    let total_units = common::completed_units(&root.join("straight/q")).expect("the uninterrupted run");
    let landed = common::kill_between_units(3, &killed, total_units, typical, 8, |attempt| {
        let mut command = whale();
        match attempt {
            0 => command.args(["run", "--quiet", "--runs"]).arg(root.join("killed")).arg(&file),
            _ => command.args(["run", "--quiet", "--resume"]).arg(&killed),
        };
        command
    });
    assert!(landed > 0, "no kill landed before the run finished");
    for name in ["metrics.jsonl", "state.json", "ledger.json"] {
        let straight = common::untimed_file(&root.join("straight/q").join(name));
        assert_eq!(straight, common::untimed_file(&killed.join(name)), "{name} differs after kills");
    }
    let state = common::untimed_file(&killed.join("state.json"));
    assert_eq!((state["finished"].clone(), state["weight_steps"].clone()), (true.into(), 3.into()));
}

#[test]
fn whale_lm_generate_applies_a_qwen3_5_adapter_as_its_merged_model_samples() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model_dir = common::tiny_qwen35_in(dir.path());
    let base = whale_lm::load_qwen35(&model_dir, DType::F32, &Device::Cpu).expect("the model loads");
    let lora = whale_lm::LoraConfig {
        rank: 4,
        target_modules: vec!["in_proj_qkv".into(), "o_proj".into()],
        ..Default::default()
    };
    let adapter = Qwen35Lora::new(lora, base.config(), 1, DType::F32, &Device::Cpu).expect("an adapter");
    for (name, var) in adapter.named_parameters().into_iter().filter(|(name, _)| name.contains("lora_B")) {
        let moved = (var.as_tensor().ones_like().expect("ones") * 0.5).expect("scaled");
        var.set(&moved).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let adapter_dir = dir.path().join("adapter");
    adapter.save_peft(&adapter_dir, "tiny").expect("adapter saved");
    let merged_dir = dir.path().join("merged");
    whale_lm::save_qwen35(&base.with_adapter(&adapter).and_then(|m| m.merged()).expect("merged"), &merged_dir)
        .expect("merged saved");
    whale_train::ChatCodec::copy_files(&model_dir, &merged_dir).expect("tokenizer files");
    let generate = |model: &Path, extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
        command.args(["lm", "generate", "--model"]).arg(model);
        command.args(["--prompt", "What is 3 + 3?", "--max-tokens", "12", "--temperature", "0"]).args(extra);
        let output = command.env("WHALE_HOME", dir.path()).output().expect("whale runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let adapted = generate(&model_dir, &["--adapter", adapter_dir.to_str().expect("utf-8")]);
    assert_eq!(generate(&merged_dir, &[]), adapted, "the merged model decodes what the adapter does");
    assert_ne!(generate(&model_dir, &[]), adapted, "the adapter changes what the base decodes");
}
