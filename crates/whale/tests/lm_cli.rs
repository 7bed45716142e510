//! `whale lm ...` end to end, with a tiny model pretrained for a few steps into a temporary
//! `WHALE_HOME`: the cached model is in the Hugging Face layout, is reused, resumes after an
//! interruption exactly where it stopped, fine-tunes (fully or a LoRA adapter, which resumes,
//! merges and applies when sampling) and samples; `whale lm bench` and `whale lm random` on
//! random models.

use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use whale_lm::{load_model, LoraAdapter, Qwen3Model};
use whale_pretrain::{self as pretrain, PretrainSummary};
use whale_train::ChatCodec;
use whale_train::{SftExample, SftTrainer, TrainerConfig};

/// The hidden flags that make pretraining take seconds.
const TINY: [&str; 10] =
    ["--size", "tiny", "--conversations", "240", "--eval-tasks", "2", "--eval-samples", "2", "--seed", "3"];

fn whale(home: &Path, args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_whale"))
        .args(args)
        .env("WHALE_HOME", home)
        .output()
        .expect("the whale binary runs");
    output
}

fn succeed(home: &Path, args: &[&str]) -> String {
    let output = whale(home, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "whale {args:?} failed:\n{stderr}");
    String::from_utf8(output.stdout).expect("utf-8 output")
}

fn pretrain_tiny(home: &Path, extra: &[&str]) -> String {
    let mut args = vec!["lm", "pretrain"];
    args.extend(TINY);
    args.extend(extra);
    succeed(home, &args)
}

/// The only finished model directory under `home`.
fn model_dir(home: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(home.join("models"))
        .expect("a models directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| pretrain::is_complete(path))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let model = load_model(dir, DType::F32, &Device::Cpu).expect("the checkpoint loads");
    let mut named: Vec<(String, Vec<f32>)> = model
        .named_parameters()
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().flatten_all().and_then(|t| t.to_vec1()).expect("f32 weights")))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

#[test]
fn pretrain_writes_a_hugging_face_model_and_reuses_it() {
    let home = tempfile::tempdir().expect("tempdir");
    let first = pretrain_tiny(home.path(), &["--steps", "4"]);
    assert!(first.contains("mean@2 on 2 math tasks"), "{first}");
    let dir = model_dir(home.path());
    let name = dir.file_name().and_then(|n| n.to_str()).expect("a name");
    assert!(name.starts_with("base-v1-seed3-"), "{name}");
    for file in [
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        pretrain::EVAL_FILE,
        pretrain::DONE_MARKER,
    ] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let summary = pretrain::read_summary(&dir).expect("summary");
    assert_eq!(summary.steps, 4);
    assert_eq!(summary.eval.per_task.len(), 2);
    assert!(summary.eval.per_task.iter().all(|t| t.rewards.len() == 2));
    let codec = ChatCodec::load(&dir).expect("tokenizer and template");
    let model = load_model(&dir, DType::F32, &Device::Cpu).expect("weights");
    assert_eq!(model.config().vocab_size, codec.tokenizer.vocab_size());
    assert_eq!(model.config().eos_token_id, vec![codec.tokenizer.specials().im_end]);
    let prompt = codec.prompt_ids(&[whale_core::ChatMessage::new("user", "2 + 2?")]).expect("prompt");
    assert_eq!(
        codec.tokenizer.decode(&prompt, false).expect("text"),
        "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    );

    let marker = std::fs::read(dir.join(pretrain::DONE_MARKER)).expect("marker");
    let second = pretrain_tiny(home.path(), &["--steps", "4"]);
    assert!(second.contains("already trained"), "{second}");
    assert_eq!(std::fs::read(dir.join(pretrain::DONE_MARKER)).expect("marker"), marker, "retrained");
    assert!(!home.path().join("pretrain").join(name).join("checkpoints").exists());
}

#[test]
fn an_interrupted_pretrain_resumes_and_ends_where_an_uninterrupted_one_does() {
    let interrupted = tempfile::tempdir().expect("tempdir");
    let stopped = pretrain_tiny(interrupted.path(), &["--steps", "6", "--stop-after", "3"]);
    assert!(stopped.contains("stopped after step 3"), "{stopped}");
    assert!(std::fs::read_dir(interrupted.path().join("models")).map_or(true, |mut d| d.next().is_none()));
    pretrain_tiny(interrupted.path(), &["--steps", "6"]);
    let resumed_dir = model_dir(interrupted.path());
    let summary: PretrainSummary = pretrain::read_summary(&resumed_dir).expect("summary");
    assert_eq!((summary.resumed_from, summary.steps), (3, 6));

    let straight = tempfile::tempdir().expect("tempdir");
    pretrain_tiny(straight.path(), &["--steps", "6"]);
    let straight_dir = model_dir(straight.path());
    assert_eq!(straight_dir.file_name(), resumed_dir.file_name());
    assert_eq!(
        std::fs::read(straight_dir.join("tokenizer.json")).expect("tokenizer"),
        std::fs::read(resumed_dir.join("tokenizer.json")).expect("tokenizer")
    );
    for ((name, a), (_, b)) in weights(&straight_dir).iter().zip(weights(&resumed_dir)) {
        let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "{name} differs by {diff}");
    }
}

#[test]
fn chess_and_qa_pretrain_their_own_models_and_print_their_evaluation() {
    let home = tempfile::tempdir().expect("tempdir");
    for (domain, harness, version) in [("chess", "chess/legal-moves", "v1"), ("qa", "qa/search", "v2")] {
        let out = pretrain_tiny(home.path(), &["--steps", "2", "--domain", domain]);
        let line = format!(
            "mean@2 on 2 {domain} tasks (difficulty {}, harness {harness})",
            if domain == "qa" { 2 } else { 1 }
        );
        assert!(out.contains(&line), "{out}");
        let dir = std::fs::read_dir(home.path().join("models"))
            .expect("models")
            .map(|entry| entry.expect("entry").path())
            .find(|path| {
                path.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("base-{version}-{domain}-seed3-")))
            })
            .expect("the domain's model directory");
        let summary = pretrain::read_summary(&dir).expect("summary");
        assert_eq!(summary.eval.prompt, format!("harness {harness}"));
        assert!(summary.eval.per_task.iter().all(|task| task.rewards.len() == 2 && !task.gold.is_empty()));
    }
}

fn sft_line(question: &str, answer: &str) -> String {
    serde_json::json!({"messages": [{"role": "user", "content": question}], "completion": answer}).to_string()
}

fn mean_loss(model_dir: &Path, examples: &[SftExample]) -> f64 {
    loss_of(load_model(model_dir, DType::F32, &Device::Cpu).expect("weights"), examples)
}

fn loss_of(model: Qwen3Model, examples: &[SftExample]) -> f64 {
    let trainer = SftTrainer::new(model, TrainerConfig::default()).expect("trainer");
    trainer.evaluate(examples).expect("loss").0
}

/// A pretrained tiny base model and an sft.jsonl of eight arithmetic replies.
fn base_and_data(home: &Path) -> (PathBuf, PathBuf) {
    pretrain_tiny(home, &["--steps", "2"]);
    let lines: Vec<String> = (1..=8)
        .map(|i| sft_line(&format!("What is {i} + {i}?"), &format!("{i} + {i} = {}.\n#### {}", 2 * i, 2 * i)))
        .collect();
    let data = home.join("sft.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").expect("write");
    (model_dir(home), data)
}

fn examples_of(data: &Path, model_dir: &Path) -> Vec<SftExample> {
    let codec = ChatCodec::load(model_dir).expect("codec");
    whale::lm::read_sft_file(data)
        .expect("valid")
        .iter()
        .map(|r| codec.example(&r.messages, &r.completion).expect("example"))
        .collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

#[test]
fn lm_train_fine_tunes_on_an_sft_file_and_names_bad_lines() {
    let home = tempfile::tempdir().expect("tempdir");
    pretrain_tiny(home.path(), &["--steps", "2"]);
    let base = model_dir(home.path());
    let lines: Vec<String> = (1..=8)
        .map(|i| sft_line(&format!("What is {i} + {i}?"), &format!("{i} + {i} = {}.\n#### {}", 2 * i, 2 * i)))
        .collect();
    let data = home.path().join("sft.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").expect("write");
    let out = home.path().join("tuned");
    let args = ["lm", "train", "--model", base.to_str().expect("utf-8"), "--data", data.to_str().expect("utf-8")];
    let printed = succeed(
        home.path(),
        &[&args[..], &["-o", out.to_str().expect("utf-8"), "--epochs", "4", "--lr", "3e-3", "--batch", "4"]].concat(),
    );
    assert!(printed.contains("parameters on 8 examples, 8 steps in all"), "{printed}");
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let codec = ChatCodec::load(&out).expect("codec");
    let examples: Vec<SftExample> = whale::lm::read_sft_file(&data)
        .expect("valid")
        .iter()
        .map(|r| codec.example(&r.messages, &r.completion).expect("example"))
        .collect();
    let (before, after) = (mean_loss(&base, &examples), mean_loss(&out, &examples));
    assert!(after < before - 0.1, "loss {before} -> {after}");

    std::fs::write(&data, format!("{}\n{{\"messages\": []}}\n", lines[0])).expect("write");
    let failed = whale(home.path(), &[&args[..], &["-o", out.to_str().expect("utf-8")]].concat());
    assert_eq!(failed.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(stderr.contains("sft.jsonl:2: field `messages`"), "{stderr}");
}

#[test]
fn lm_generate_prints_n_completions_and_lm_eval_scores_the_model() {
    let home = tempfile::tempdir().expect("tempdir");
    pretrain_tiny(home.path(), &["--steps", "2"]);
    let dir = model_dir(home.path());
    let generate = [
        "lm",
        "generate",
        "--model",
        dir.to_str().expect("utf-8"),
        "--prompt",
        "What is 2 + 3?",
        "--n",
        "3",
        "--max-tokens",
        "6",
    ];
    let printed = succeed(home.path(), &generate);
    let headers: Vec<&str> = printed.lines().filter(|l| l.starts_with("--- completion ")).collect();
    assert_eq!(headers.len(), 3, "{printed}");
    assert!(headers.iter().all(|h| h.contains("tokens,")), "{printed}");
    let again = succeed(home.path(), &generate);
    assert_eq!(printed, again, "the same seeds sample the same completions");

    let scored = succeed(
        home.path(),
        &["lm", "eval", "--model", dir.to_str().expect("utf-8"), "--tasks", "3", "--samples", "2"],
    );
    assert!(scored.contains("3 math tasks (difficulty 1) x 2 samples"), "{scored}");
    assert!(scored.contains("mean@2 "), "{scored}");
}

#[test]
fn lm_train_with_lora_writes_a_peft_adapter_that_resumes_merges_and_samples() {
    let home = tempfile::tempdir().expect("tempdir");
    let (base, data) = base_and_data(home.path());
    let base_weights = std::fs::read(base.join("model.safetensors")).expect("base weights");
    let train = |out: &Path, extra: &[&str]| {
        let args = ["lm", "train", "--model", path(&base), "--data", path(&data), "-o", path(out)];
        let common = ["--lr", "1e-2", "--batch", "4", "--seed", "5"];
        succeed(home.path(), &[&args[..], &common, extra].concat())
    };
    let lora = ["--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj,down_proj"];

    let straight = home.path().join("straight");
    let printed = train(&straight, &[&lora[..], &["--epochs", "2"]].concat());
    assert!(printed.contains("adapter parameters on 8 examples, 4 steps in all"), "{printed}");
    for file in ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"] {
        assert!(straight.join(file).is_file(), "{file} missing");
    }
    assert!(!straight.join("model.safetensors").exists(), "a LoRA run writes no full checkpoint");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(straight.join("adapter_config.json")).expect("config"))
            .expect("json");
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!((config["r"].as_u64(), config["lora_alpha"].as_f64()), (Some(4), Some(8.0)));
    assert_eq!(config["target_modules"], serde_json::json!(["q_proj", "v_proj", "down_proj"]));
    assert_eq!(std::fs::read(base.join("model.safetensors")).expect("base weights"), base_weights);

    // One epoch, then one more from the saved adapter: the same adapter as two epochs at once.
    let first = home.path().join("first");
    train(&first, &[&lora[..], &["--epochs", "1"]].concat());
    let second = home.path().join("second");
    let printed = train(&second, &["--resume-adapter", path(&first), "--epochs", "1"]);
    assert!(printed.contains("4 steps in all"), "{printed}");
    let tensors = |dir: &Path| {
        let mut named: Vec<(String, Vec<f32>)> =
            candle_core::safetensors::load(dir.join("adapter_model.safetensors"), &Device::Cpu)
                .expect("adapter weights")
                .into_iter()
                .map(|(name, t)| (name, t.flatten_all().and_then(|t| t.to_vec1()).expect("f32")))
                .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    };
    assert_eq!(tensors(&second), tensors(&straight), "the resumed run ends where the straight one does");

    // --micro-batch-tokens 1 gives every example a pass of its own: the same update to float
    // rounding; with adapter dropout, whose masks are drawn per pass, another one.
    let largest_gap = |a: &Path, b: &Path| {
        let pairs = tensors(a).into_iter().zip(tensors(b));
        pairs.flat_map(|((_, x), (_, y))| x.into_iter().zip(y).map(|(x, y)| (x - y).abs())).fold(0.0f32, f32::max)
    };
    let two_epochs = [&lora[..], &["--epochs", "2"]].concat();
    let capped = home.path().join("capped");
    train(&capped, &[&two_epochs[..], &["--micro-batch-tokens", "1"]].concat());
    assert!(largest_gap(&capped, &straight) < 1e-5, "capped passes moved the adapter");
    let dropout = ["--lora-dropout", "0.3"];
    let (whole, split) = (home.path().join("dropout"), home.path().join("dropout-capped"));
    train(&whole, &[&two_epochs[..], &dropout].concat());
    train(&split, &[&two_epochs[..], &dropout, &["--micro-batch-tokens", "1"]].concat());
    assert!(largest_gap(&whole, &split) > 1e-4, "the cap did not reach the passes");

    let examples = examples_of(&data, &base);
    let base_model = load_model(&base, DType::F32, &Device::Cpu).expect("base");
    let adapter = LoraAdapter::load_peft(&straight, base_model.config(), DType::F32, &Device::Cpu).expect("adapter");
    let adapted_loss = loss_of(base_model.with_adapter(&adapter).expect("fits"), &examples);
    let base_loss = loss_of(base_model, &examples);
    assert!(adapted_loss < base_loss - 0.1, "loss {base_loss} -> {adapted_loss}");

    let merged = home.path().join("merged");
    let printed = succeed(
        home.path(),
        &["lm", "merge", "--model", path(&base), "--adapter", path(&straight), "-o", path(&merged)],
    );
    assert!(printed.contains("merged the adapter into"), "{printed}");
    for file in
        ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    {
        assert!(merged.join(file).is_file(), "{file} missing");
    }
    let merged_loss = mean_loss(&merged, &examples);
    assert!((merged_loss - adapted_loss).abs() < 1e-4, "merged {merged_loss} vs adapted {adapted_loss}");

    let generate = |model: &Path, extra: &[&str]| {
        let args = ["lm", "generate", "--model", path(model), "--prompt", "What is 3 + 3?", "--max-tokens", "10"];
        succeed(home.path(), &[&args[..], &["--n", "3"], extra].concat())
    };
    let with_adapter = generate(&base, &["--adapter", path(&straight)]);
    assert!(with_adapter.contains("--- completion 3 ("), "{with_adapter}");
    assert_eq!(generate(&merged, &[]), with_adapter, "the merged model samples what the adapter does");
    assert_ne!(generate(&base, &[]), with_adapter, "the adapter changes what the base samples");

    let bad = whale(
        home.path(),
        &[
            "lm",
            "train",
            "--model",
            path(&base),
            "--data",
            path(&data),
            "-o",
            path(&home.path().join("bad")),
            "--lora-rank",
            "4",
            "--lora-targets",
            "q_proj,lm_head",
        ],
    );
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("target_modules") && stderr.contains("lm_head"), "{stderr}");
}

#[test]
fn lm_random_writes_the_serve_bench_model_as_a_loadable_checkpoint_the_same_each_time() {
    let home = tempfile::tempdir().expect("tempdir");
    let (first, second) = (home.path().join("a"), home.path().join("b"));
    for dir in [&first, &second] {
        let printed = succeed(home.path(), &["lm", "random", "-o", path(dir)]);
        assert!(printed.contains("vocabulary 8192"), "{printed}");
    }
    let parameters: usize = weights(&first).iter().map(|(_, values)| values.len()).sum();
    assert!((5_000_000..5_500_000).contains(&parameters), "{parameters} parameters");
    assert!(weights(&first) == weights(&second), "the same seed writes the same weights");
    let codec = ChatCodec::load(&first).expect("its tokenizer and chat template load");
    let prompt = codec.prompt_ids(&[whale_core::ChatMessage::new("user", "What is 2 + 3?")]).expect("a prompt");
    assert!(!prompt.is_empty() && prompt.iter().all(|&id| id < 8192), "{prompt:?}");
}

#[test]
fn lm_random_writes_a_tiny_qwen3_5_on_the_same_tokenizer_that_the_engine_loads() {
    let home = tempfile::tempdir().expect("tempdir");
    let dir = home.path().join("q");
    let printed = succeed(home.path(), &["lm", "random", "--shape", "qwen3.5-tiny", "-o", path(&dir)]);
    assert!(printed.contains("random Qwen3.5 (64 wide, 4 layers), vocabulary 8192"), "{printed}");
    let decoder = whale_lm::Decoder::load(&dir, DType::F32, &Device::Cpu).expect("a Qwen3.5 checkpoint loads");
    assert_eq!((decoder.architecture(), decoder.vocab_size()), ("Qwen3.5", 8192));
    let codec = ChatCodec::load(&dir).expect("its tokenizer and chat template load");
    assert!(!codec.prompt_ids(&[whale_core::ChatMessage::new("user", "What is 2 + 3?")]).expect("a prompt").is_empty());
}

/// The `| workload | tokens | seconds | tokens/s | ...` rows of a bench table: workload and
/// tokens/s, as scripts/gpu-check.sh reads them.
fn bench_rows(table: &str) -> Vec<(String, f64)> {
    table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let tokens_per_second = cells.get(4)?.parse().ok()?;
            Some((cells[1].to_string(), tokens_per_second))
        })
        .collect()
}

/// The number a bench table prints between `label` and `unit` (a line under the table).
fn number_after(table: &str, label: &str, unit: &str) -> f64 {
    let text = table.split(label).nth(1).and_then(|rest| rest.split(unit).next());
    text.unwrap_or_else(|| panic!("no {label:?} line: {table}")).parse().expect("a number")
}

#[test]
fn lm_bench_measures_a_random_qwen3_5_of_the_shape_asked_at_each_concurrency() {
    let home = tempfile::tempdir().expect("tempdir");
    let args = [
        &["lm", "bench", "--random", "--shape", "qwen3.5-tiny", "--batch-sizes", "1,3", "--new-tokens", "4"][..],
        &["--prefill-tokens", "48", "--prefill-requests", "3", "--max-prefill-tokens", "96"],
    ]
    .concat();
    let table = succeed(home.path(), &[&args[..], &["--train-steps", "1", "--lora-rank", "4"]].concat());
    assert!(table.contains("model: random Qwen3.5 (64 wide, 4 layers), vocabulary 8192"), "{table}");
    let rows = bench_rows(&table);
    let workloads: Vec<&str> = rows.iter().map(|(workload, _)| workload.as_str()).collect();
    let expected = [
        "prefill, 3 requests",
        "generate, 1 concurrent",
        "generate, 3 concurrent",
        "SFT step (full weights), 16 examples",
        "SFT step (LoRA rank 4), 16 examples",
    ];
    assert_eq!(workloads, expected, "{table}");
    assert!(rows.iter().all(|(_, tokens_per_second)| *tokens_per_second > 0.0), "{table}");
    assert!(table.contains("| prefill, 3 requests | 144 |"), "3 x 48 prompt tokens: {table}");
    // The requests of a row reach the engine together, so these batches do not depend on timing.
    assert!(table.contains("2 prefill calls of 1.5 rows on average"), "96 tokens a pass: {table}");
    assert!(table.contains("3 decode steps of 3.0 rows on average"), "3 requests at once: {table}");
    assert!(table.contains("1 steps of 16 x (32 prompt + 96 completion) tokens"), "{table}");
    let losses: Vec<f64> = table
        .split("loss ")
        .skip(1)
        .map(|rest| rest.split(' ').next().expect("a loss").parse().expect("a number"))
        .collect();
    // A fresh model spreads its probability about evenly: ln 8192 = 9.01; a fresh adapter
    // starts where the weights it adapts are.
    assert_eq!(losses.len(), 2, "{table}");
    assert!(losses.iter().all(|loss| (8.5..9.5).contains(loss)), "{table}");
    let peak_mib = number_after(&table, "peak RSS (VmHWM): ", " MiB");
    assert!(peak_mib > 1.0, "{table}");

    let untrained = succeed(home.path(), &[&args[..], &["--train-steps", "0"]].concat());
    let workloads: Vec<String> = bench_rows(&untrained).into_iter().map(|(workload, _)| workload).collect();
    assert_eq!(workloads, &expected[..3], "{untrained}");
    let full_only = succeed(home.path(), &[&args[..], &["--train-steps", "1", "--lora-rank", "0"]].concat());
    let workloads: Vec<String> = bench_rows(&full_only).into_iter().map(|(workload, _)| workload).collect();
    assert_eq!(workloads, &expected[..4], "{full_only}");
}

#[test]
fn lm_bench_quantized_decodes_from_8_bit_copies_and_times_a_weight_update() {
    let home = tempfile::tempdir().expect("tempdir");
    let args = ["lm", "bench", "--random", "--batch-sizes", "1,3", "--new-tokens", "4", "--train-steps", "0"];
    let output = whale(home.path(), &[&args[..], &["--quantized"]].concat());
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        assert!(stderr.contains("VNNI"), "only a CPU without VNNI refuses: {stderr}");
        return;
    }
    assert!(stdout.contains("decoding from Q8_0 copies"), "{stdout}");
    let seconds = number_after(&stdout, "a weight update to its first token (new Q8_0 copies of the weights): ", " s");
    assert!(seconds > 0.0, "{stdout}");
    assert_eq!(bench_rows(&stdout).len(), 3, "{stdout}");
    let qwen35 = whale(home.path(), &[&args[..], &["--shape", "qwen3.5-tiny", "--quantized"]].concat());
    let stderr = String::from_utf8_lossy(&qwen35.stderr);
    assert!(!qwen35.status.success() && stderr.contains("quantized"), "{stderr}");
}

#[test]
fn lm_bench_refuses_flags_that_do_not_go_together() {
    let home = tempfile::tempdir().expect("tempdir");
    let cases: [(&[&str], &str); 8] = [
        (&["--shape", "qwen3.5-tiny"], "--random"),
        (&["--random", "--model", "dir"], "cannot be used with"),
        (&["--random", "--batch-sizes", "1,0"], "must be at least 1"),
        (&["--random", "--new-tokens", "0"], "must be at least 1"),
        (&["--random", "--prefill-tokens", "0"], "--prefill-tokens"),
        (&["--random", "--prompt-tokens", "0"], "--prompt-tokens"),
        (&["--random", "--max-prefill-tokens", "0"], "--max-prefill-tokens"),
        (&["--random", "--shape", "qwen3.5-2b"], "qwen3.5-0.8b"),
    ];
    for (flags, said) in cases {
        let output = whale(home.path(), &[&["lm", "bench"], flags].concat());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(said), "{flags:?} should say {said:?}: {stderr}");
    }
}
