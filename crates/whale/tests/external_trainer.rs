//! The weight phase with an external trainer command (`[weights.trainer]`) on the in-process
//! engine: what the command receives (samples.jsonl with its trainable-turn mask), how its
//! failures stop a step (with the log named) and how a resumed run retries the step without
//! rolling out or counting it again, and that an empty kept set runs nothing.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use whale_core::Trajectory;
use whale_loop::config::RunConfig;
use whale_loop::experiment::{Experiment, ExperimentError, Verbosity};
use whale_loop::scale_out::external_weights::Sample;
use whale_loop::scale_out::trainer_command::{TrainerCommandConfig, TrainerOutput};

/// Two calls per rollout: an untrained note, then the answer after the note as an earlier
/// assistant turn.
const HARNESS: &str = r#"
export const meta = { name: "note-then-answer", description: "a note (not trained on), then the answer" };
export function solve(task, ctx) {
  const question = ctx.env.observation;
  const note = ctx.llm.chat([{ role: "system", content: "Take notes." }, { role: "user", content: question }],
                            { max_tokens: 4, trainable: false });
  const answer = ctx.llm.chat([{ role: "system", content: "Answer." }, { role: "user", content: question },
                               { role: "assistant", content: note.text }, { role: "user", content: "The answer?" }],
                              { max_tokens: 6 });
  return answer.text;
}
"#;

/// A "trainer" that hands back the base checkpoint as its output, keeping a copy of the samples
/// it was given; it fails once while `{run_dir}/fail-once` exists.
const COPY_TRAINER: &str = r#"set -e
if [ -f "$4/fail-once" ]; then rm "$4/fail-once"; echo "out of memory (scripted)" >&2; exit 3; fi
echo "training on $(wc -l < "$1") samples"
mkdir -p "$3"
cp "$1" "$3/received.jsonl"
cp "$2/config.json" "$2/model.safetensors" "$3/""#;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: RunConfig,
}

fn fixture(trainer: &[&str]) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let model = common::tiny_model_in(&root);
    let harness = root.join("note.js");
    std::fs::write(&harness, HARNESS).expect("harness");
    let text = common::weight_only_config("x", 5, &model, &format!("[harness]\ninitial = \"{}\"\n", harness.display()));
    let mut config = RunConfig::parse(&text, Path::new("x.toml"), &root).expect("config");
    config.weights.trainer = Some(TrainerCommandConfig {
        command: trainer.iter().map(|a| a.to_string()).collect(),
        output: TrainerOutput::Checkpoint,
        timeout_s: 60.0,
        output_wait_s: 0.0,
        base: None,
        env: BTreeMap::new(),
        workdir: Some(root.clone()),
    });
    config.validate().expect("a valid config");
    Fixture { _dir: dir, root, config }
}

/// The lines of a JSON-lines file.
fn rows_of(path: &Path) -> Vec<Value> {
    match common::read_json(path) {
        Value::Array(rows) => rows,
        other => panic!("{}: not JSON lines: {other}", path.display()),
    }
}

fn copy_trainer() -> Vec<&'static str> {
    vec!["sh", "-c", COPY_TRAINER, "trainer", "{data}", "{base}", "{output}", "{run_dir}"]
}

#[test]
fn the_trainer_gets_each_trained_call_as_a_chat_with_its_completion_as_the_trainable_last_turn() {
    let fixture = fixture(&copy_trainer());
    let run = fixture.root.join("runs/x");
    let mut experiment = Experiment::create(fixture.config.clone(), &run, Verbosity::default()).expect("created");
    experiment.run().expect("the run finishes");
    let state = experiment.state().clone();
    assert_eq!(state.weight_steps, 2, "the budget of 8 rollouts is two steps of 2 x 2");
    assert_eq!(state.weights_version, 2, "each step installed its trainer's output");
    let served = state.served.expect("the last update is recorded");
    assert_eq!(served.name, "x-weight-only-step-2");
    assert_eq!(served.path, run.join("weights/step-000002/checkpoint"));
    assert!(!run.join("weights/step-000001/checkpoint").exists(), "a replaced checkpoint is removed");

    let step = run.join("weights/step-000002");
    let samples = rows_of(&step.join("samples.jsonl"));
    assert_eq!(samples, rows_of(&step.join("checkpoint/received.jsonl")), "{{data}} is the samples file");
    assert_eq!(samples.len(), 4, "one trained call (the answer) per kept rollout");
    for sample in &samples {
        let roles: Vec<&str> =
            sample["messages"].as_array().expect("messages").iter().map(|m| m["role"].as_str().unwrap_or("")).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
        assert_eq!(sample["messages"][0]["content"], "Answer.", "the untrained note call is left out");
        assert_eq!(sample["trainable"], serde_json::json!([false, false, false, false, true]));
        assert_eq!(sample["finish_reason"], "length", "the tiny model rambles to max_tokens");
    }
    // The samples are exactly the trainable calls of the kept rollouts, as chats.
    let kept: Vec<Trajectory> = std::fs::read_to_string(run.join("examples.jsonl"))
        .expect("examples")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a trajectory"))
        .collect();
    let mut expected: Vec<Value> = kept
        .iter()
        .flat_map(|t| t.model_calls.iter().filter(|c| c.trainable))
        .map(|call| serde_json::to_value(Sample::from_call(call)).expect("json"))
        .collect();
    let mut written = samples.clone();
    let key = |v: &Value| v.to_string();
    expected.sort_by_key(key);
    written.sort_by_key(key);
    assert_eq!(written, expected);
    let log = std::fs::read_to_string(step.join("train.log")).expect("train.log");
    assert!(log.contains("training on 4 samples"), "the command's output is logged: {log}");

    let rows = rows_of(&run.join("metrics.jsonl"));
    let steps: Vec<&Value> = rows.iter().filter(|r| r["kind"] == "weight_step").collect();
    assert_eq!(steps.len(), 2);
    assert!(steps.iter().all(|r| r["updates"] == 1 && r["examples"] == 4 && r["loss"].is_null()));
}

#[test]
fn a_failing_trainer_stops_its_step_naming_the_log_and_a_resumed_run_retries_it_without_new_rollouts() {
    let fixture = fixture(&copy_trainer());
    let straight = fixture.root.join("runs/straight");
    Experiment::create(fixture.config.clone(), &straight, Verbosity::default())
        .and_then(|mut e| e.run())
        .expect("the uninterrupted run");

    let run = fixture.root.join("runs/x");
    std::fs::create_dir_all(&run).expect("run dir");
    std::fs::write(run.join("fail-once"), "").expect("the trainer fails once");
    let error = Experiment::create(fixture.config.clone(), &run, Verbosity::default())
        .and_then(|mut e| e.run())
        .expect_err("the trainer fails");
    let text = error.to_string();
    assert!(matches!(error, ExperimentError::Trainer { .. }), "{text}");
    let log = run.join("weights/step-000001/train.log");
    assert!(text.contains("weight step 1") && text.contains(&log.display().to_string()), "{text}");
    assert!(text.contains("--resume"), "the way on is shown: {text}");
    assert!(std::fs::read_to_string(&log).expect("log").contains("out of memory (scripted)"));
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("state.json")).expect("state")).expect("json");
    assert_eq!(state["weight_steps"], 0, "the failed step is not committed");
    let record_file = run.join("weights/step-000001/rollouts.json");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&record_file).expect("record")).expect("json");

    let mut resumed = Experiment::resume(&run, Verbosity::default()).expect("resumes");
    resumed.run().expect("the retried step succeeds");
    let rows = rows_of(&run.join("metrics.jsonl"));
    let first = rows.iter().find(|r| r["kind"] == "weight_step").expect("step 1 row");
    assert_eq!(first["rollout_seconds"], record["report"]["rollout_seconds"], "the retry reused the recorded rollouts");
    for file in ["ledger.json", "metrics.jsonl", "state.json"] {
        let (mut a, mut b) = (common::untimed_file(&straight.join(file)), common::untimed_file(&run.join(file)));
        for value in [&mut a, &mut b] {
            if let Some(served) = value.get_mut("served") {
                served["path"] = Value::Null;
            }
        }
        assert_eq!(a, b, "{file}: nothing counted twice");
    }
}

#[test]
fn a_trainer_that_writes_nothing_or_runs_too_long_is_reported() {
    let fixture = fixture(&["sh", "-c", "echo \"would train on $0 into $1\"", "{data}", "{output}"]);
    let run = fixture.root.join("runs/x");
    let error = Experiment::create(fixture.config.clone(), &run, Verbosity::default())
        .and_then(|mut e| e.run())
        .expect_err("no output");
    let text = error.to_string();
    assert!(text.contains("weight step 1: the trainer wrote no checkpoint"), "{text}");
    assert!(text.contains("config.json") && text.contains("*.safetensors"), "the missing files are named: {text}");
    assert!(text.contains("train.log"), "{text}");

    let mut config = fixture.config.clone();
    config.name = "slow".to_string();
    let trainer = config.weights.trainer.as_mut().expect("trainer");
    trainer.command = ["sh", "-c", "sleep 30", "{data}", "{output}"].map(String::from).to_vec();
    trainer.timeout_s = 0.5;
    let started = std::time::Instant::now();
    let error = Experiment::create(config, &fixture.root.join("runs/slow"), Verbosity::default())
        .and_then(|mut e| e.run())
        .expect_err("too slow");
    assert!(error.to_string().contains("ran past its 0.5 s and was stopped"), "{error}");
    assert!(started.elapsed().as_secs() < 20, "the command was stopped, not waited for");
}

#[test]
fn an_empty_kept_set_runs_no_command_and_keeps_the_weights() {
    let mut fixture = fixture(&["sh", "-c", "exit 7", "{data}", "{output}"]);
    fixture.config.weights.reward_threshold = 1.0;
    let run = fixture.root.join("runs/x");
    let mut experiment = Experiment::create(fixture.config.clone(), &run, Verbosity::default()).expect("created");
    experiment.run().expect("no command ran, so none failed");
    let state = experiment.state();
    assert_eq!((state.weight_steps, state.weights_version), (2, 0));
    assert!(state.served.is_none());
    let step = run.join("weights/step-000001");
    assert_eq!(std::fs::read_to_string(step.join("samples.jsonl")).expect("samples"), "");
    assert!(!step.join("train.log").exists(), "the command never ran");
}
