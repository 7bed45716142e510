//! Fixtures for the harness tests: a tiny random model with a tokenizer trained on the
//! domains' generated tasks (every reply is gibberish, which the stock harnesses must survive),
//! and samples of the shared real data.
#![allow(dead_code)]

pub mod parity;
pub mod serve;

use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
use whale_core::{Domain, Task, Trajectory};
use whale_engine::{EngineConfig, LocalPolicy};
use whale_lm::qwen3_5::Qwen35Size;
use whale_lm::{
    save_model, save_qwen35, GenerationConfig, LlamaConfig, ModelSize, Qwen35Config, Qwen35Model, Qwen3Config,
    Qwen3Model, TrainableModel,
};
use whale_tasks::{task_domain, Environment};
use whale_text::{write_tokenizer_config, ChatTemplate, Tokenizer, CHATML_TEMPLATE, TOKENIZER_FILE};

/// The tiny model's context window (that of the default base model).
pub const CONTEXT: usize = 2048;

pub fn data_dir() -> PathBuf {
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if beside_repo.is_dir() {
        return beside_repo;
    }
    PathBuf::from(std::env::var("WHALE_SHARED_DATA").expect("shared data not found; set WHALE_SHARED_DATA"))
}

/// The first `n` tasks of the shared real data of `domain`: GSM8K test, the Kagi Lichess
/// puzzles, HotpotQA distractor dev.
pub fn real_sample(domain: Domain, n: usize) -> Vec<Task> {
    let file = match domain {
        Domain::Math => "math/gsm8k/test.jsonl",
        Domain::Chess => "chess/kagi_llm_chess_puzzles.csv",
        Domain::Qa => "qa/hotpotqa_distractor_dev/rpt_dev_300.jsonl",
    };
    let mut tasks = task_domain(domain).load(&data_dir().join(file)).into_tasks();
    tasks.truncate(n);
    assert_eq!(tasks.len(), n, "{file}");
    tasks
}

/// A byte-level BPE trained on generated tasks of every domain: questions, worked solutions,
/// puzzle positions and passages.
fn tokenizer() -> Tokenizer {
    let mut texts: Vec<String> = Vec::new();
    for domain in Domain::ALL {
        let tasks = task_domain(domain).generate(120, 1, 2);
        let environment = Environment::for_tasks(domain, &tasks).expect("an environment");
        for task in &tasks {
            texts.push(environment.episode(task).expect("an episode").observation());
            texts.push(task.payload.to_string());
        }
    }
    Tokenizer::train_bpe(texts.iter().map(String::as_str), 512).expect("a tokenizer")
}

fn model(tokenizer: &Tokenizer) -> Qwen3Model {
    let mut config = Qwen3Config::tiny(tokenizer.vocab_size());
    config.max_position_embeddings = CONTEXT;
    Qwen3Model::new_random(&config, 7, DType::F32, &Device::Cpu).expect("a model")
}

/// A tiny random model served in-process.
pub fn tiny_policy() -> LocalPolicy {
    let tokenizer = tokenizer();
    LocalPolicy::new(model(&tokenizer), tokenizer, ChatTemplate::chatml(), EngineConfig::default()).expect("an engine")
}

/// Writes a tiny random model in the Hugging Face layout to `dir`.
pub fn write_tiny_model(dir: &Path) {
    let tokenizer = tokenizer();
    let model = model(&tokenizer);
    save_model(&model, &GenerationConfig::for_model(model.config()), dir).expect("weights written");
    tokenizer.save(dir.join(TOKENIZER_FILE)).expect("tokenizer written");
    write_tokenizer_config(dir, CHATML_TEMPLATE, &tokenizer.specials(), CONTEXT).expect("tokenizer config written");
}

/// Writes a tiny random Qwen3.5 model (three Gated DeltaNet layers, one full attention) in
/// the Hugging Face layout to `dir/qwen3_5` and returns that directory.
pub fn tiny_qwen35_in(dir: &Path) -> PathBuf {
    let model_dir = dir.join("qwen3_5");
    let tokenizer = tokenizer();
    let mut config = Qwen35Config::text(tokenizer.vocab_size(), Qwen35Size::TINY);
    config.max_position_embeddings = CONTEXT;
    let model = Qwen35Model::new_random(&config, 7, DType::F32, &Device::Cpu).expect("a model");
    save_qwen35(&model, &model_dir).expect("weights written");
    tokenizer.save(model_dir.join(TOKENIZER_FILE)).expect("tokenizer written");
    write_tokenizer_config(&model_dir, CHATML_TEMPLATE, &tokenizer.specials(), CONTEXT).expect("tokenizer config");
    model_dir
}

/// Writes a tiny random Llama model (Qwen3's tiny shape, no query and key norms) in the Hugging
/// Face layout to `dir/llama` and returns that directory.
pub fn tiny_llama_in(dir: &Path) -> PathBuf {
    let model_dir = dir.join("llama");
    let tokenizer = tokenizer();
    let mut config = LlamaConfig::with_size(tokenizer.vocab_size(), ModelSize::TINY);
    config.max_position_embeddings = CONTEXT;
    let model = whale_lm::LlamaModel::new_random(&config, 7, DType::F32, &Device::Cpu).expect("a model");
    model.save(&model_dir).expect("weights written");
    tokenizer.save(model_dir.join(TOKENIZER_FILE)).expect("tokenizer written");
    write_tokenizer_config(&model_dir, CHATML_TEMPLATE, &tokenizer.specials(), CONTEXT).expect("tokenizer config");
    model_dir
}

/// Writes the tiny model to `dir/model` and returns that directory.
pub fn tiny_model_in(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).expect("model dir");
    write_tiny_model(&model);
    model
}

/// A comparison on the tiny model in `model`, named `tiny`, seed 0: weight steps of 2 tasks x 2
/// rollouts, searches of 2 candidates on 4 tasks, a budget of 24 rollouts, mean@2 on 6 test
/// tasks (what `whale study` and `whale compare` tests run).
pub fn tiny_comparison_config(model: &Path) -> String {
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

/// A weight-only run on the tiny model in `model`: two weight steps of 2 tasks x 2 rollouts, every
/// rollout kept, one sample per test task; `extra` is appended (`[harness]`, `[sampling]`,
/// `[weights.trainer]` tables).
pub fn weight_only_config(name: &str, seed: u64, model: &Path, extra: &str) -> String {
    format!(
        r#"name = "{name}"
seed = {seed}
condition = "weight-only"
threads = 4
[model]
path = "{model}"
[tasks]
generate = 40
train = 20
search = 2
test = 2
[weights]
tasks_per_step = 2
rollouts_per_task = 2
reward_threshold = -1.0
skip_truncated = false
[schedule]
budget = 8
[eval]
k = 1
{extra}"#,
        model = model.display()
    )
}

/// A trajectory without its timings, which differ between runs of the same rollout.
pub fn untimed(trajectory: &Trajectory) -> serde_json::Value {
    let mut value = serde_json::to_value(trajectory).expect("a trajectory serialises");
    value["wall"] = serde_json::Value::Null;
    for list in ["model_calls", "tool_calls"] {
        if let Some(calls) = value[list].as_array_mut() {
            for call in calls {
                call["latency_ms"] = serde_json::Value::Null;
            }
        }
    }
    value
}

/// Without its timing fields, which differ between any two runs, and the measured gap between
/// the engine's and the trainer's log-probabilities (its last bits depend on how the engine
/// happened to batch).
pub fn untimed_json(mut value: serde_json::Value) -> serde_json::Value {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(fields) => {
                let timing = |key: &str| {
                    key.contains("seconds") || ["wall_s", "wall", "latency_ms", "sampler_deviation"].contains(&key)
                };
                fields.retain(|key, _| !timing(key));
                fields.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

/// A JSON file, or a JSON-lines file as an array of its lines.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "jsonl") {
        serde_json::Value::Array(text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect())
    } else {
        serde_json::from_str(&text).expect("JSON")
    }
}

/// [`read_json`] without the timing fields.
pub fn untimed_file(path: &Path) -> serde_json::Value {
    untimed_json(read_json(path))
}

/// Starts `command(attempt)` for attempts 0 to `kills`: each but the last is killed with
/// SIGKILL once the run's `state.json` in `run_dir` exists and counts a seeded number of
/// completed units, plus a random part of a typical unit (`typical` over `total_units`), so
/// kills fall anywhere in a unit, its checkpoint and commit included. The targets rise and stay
/// two units short of `total_units`, so a kill lands before the run ends however fast or loaded
/// the machine is, which a moment drawn from the wall time alone cannot promise. An attempt
/// still short of its target after ten typical runs fails the test. The last attempt runs to
/// its end and must succeed. Returns how many kills landed.
pub fn kill_between_units(
    kills: usize,
    run_dir: &Path,
    total_units: u64,
    typical: std::time::Duration,
    seed: u64,
    command: impl FnMut(usize) -> std::process::Command,
) -> usize {
    use rand::{seq::index::sample, Rng, SeedableRng};
    assert!(total_units >= kills as u64 + 2, "{total_units} units are too few for {kills} kills");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut targets: Vec<u64> =
        sample(&mut rng, total_units as usize - 1, kills).into_iter().map(|unit| unit as u64).collect();
    targets.sort_unstable();
    let unit = typical.div_f64(total_units as f64);
    kill_at_moments(kills, command, |attempt, child| {
        let target = targets[attempt];
        let deadline = std::time::Instant::now() + typical * 10;
        while completed_units(run_dir).is_none_or(|units| units < target) && child.try_wait().expect("poll").is_none() {
            assert!(std::time::Instant::now() < deadline, "attempt {attempt} never reached unit {target}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::thread::sleep(unit.mul_f64(rng.gen_range(0.0..1.0)));
    })
}

/// The units `run_dir/state.json` counts as completed; none before it is first written.
pub fn completed_units(run_dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(run_dir.join("state.json")).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["units"].as_u64()
}

/// Starts `command(attempt)` for attempts 0 to `kills`: each but the last is killed with
/// SIGKILL at a seeded random moment (a fraction in `window` of `typical`) unless it ends
/// first; the last runs to its end and must succeed. Returns how many kills landed. For a
/// command with no single `state.json` to watch (a study's many runs); a run's tests use
/// [`kill_between_units`].
pub fn kill_and_resume(
    kills: usize,
    typical: std::time::Duration,
    window: std::ops::Range<f64>,
    seed: u64,
    command: impl FnMut(usize) -> std::process::Command,
) -> usize {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    kill_at_moments(kills, command, |_, child| {
        let deadline = std::time::Instant::now() + typical.mul_f64(rng.gen_range(window.clone()));
        while std::time::Instant::now() < deadline && child.try_wait().expect("poll").is_none() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    })
}

/// The loop of both kill helpers: starts `command(attempt)` for attempts 0 to `kills`; each but
/// the last is killed with SIGKILL when `moment(attempt, child)` returns, unless it ended
/// first; the last runs to its end and must succeed. Returns how many kills landed.
fn kill_at_moments(
    kills: usize,
    mut command: impl FnMut(usize) -> std::process::Command,
    mut moment: impl FnMut(usize, &mut std::process::Child),
) -> usize {
    let mut landed = 0;
    for attempt in 0..=kills {
        let mut child = command(attempt).spawn().expect("whale starts");
        if attempt == kills {
            assert!(child.wait().expect("whale ends").success(), "the final resume failed");
            break;
        }
        moment(attempt, &mut child);
        if child.try_wait().expect("poll").is_none() {
            child.kill().expect("SIGKILL");
            landed += 1;
        }
        child.wait().expect("reaped");
    }
    landed
}
