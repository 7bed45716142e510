//! Kill-and-resume: `whale run` on a tiny config is killed with SIGKILL at seeded random
//! moments, resumed with `whale run --resume` each time, and must end with the same ledger,
//! the same metrics rows and the same final evaluation as a run that was never interrupted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A harness that asks for short replies (the tiny model writes gibberish until max_tokens).
const HARNESS: &str = r#"
export const meta = { name: "short", description: "one short call" };
export function solve(task, ctx) {
  const reply = ctx.llm.chat(`${ctx.env.observation}\nGive the final answer after ####.`, { max_tokens: 12 });
  const lines = reply.text.trim().split("\n");
  return lines[lines.length - 1];
}
"#;

fn config(model: &Path, harness: &Path, condition: &str) -> String {
    format!(
        r#"name = "r"
seed = 4
condition = "{condition}"
threads = 8
[model]
path = "{model}"
[tasks]
generate = 60
train = 30
search = 4
test = 4
[sampling]
max_tokens = 12
[harness]
initial = "{harness}"
[weights]
tasks_per_step = 3
rollouts_per_task = 2
reward_threshold = -1.0
skip_truncated = false
mini_batch = 4
micro_batch = 4
learning_rate = 0.001
checkpoint_every = 3
[search]
candidates = 2
population = 2
[schedule]
budget = 64
weight_steps = 2
search_iterations = 2
[eval]
k = 2
every_steps = 2
every_iterations = 2
"#,
        model = model.display(),
        harness = harness.display()
    )
}

fn whale() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command.stdout(Stdio::null()).stderr(Stdio::null());
    command
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

fn fixture(condition: &str) -> Fixture {
    fixture_with(condition, "")
}

/// A fixture whose config ends with `extra` TOML.
fn fixture_with(condition: &str, extra: &str) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let model = common::tiny_model_in(&root);
    let harness = root.join("short.js");
    std::fs::write(&harness, HARNESS).expect("harness");
    let config = root.join("r.toml");
    std::fs::write(&config, self::config(&model, &harness, condition) + extra).expect("config");
    Fixture { _dir: dir, root, config }
}

fn run_to_end(fixture: &Fixture, runs: &str) -> Duration {
    let started = Instant::now();
    let status = whale()
        .args(["run", "--quiet", "--runs"])
        .arg(fixture.root.join(runs))
        .arg(&fixture.config)
        .status()
        .expect("whale runs");
    assert!(status.success(), "the uninterrupted run failed");
    started.elapsed()
}

/// Starts the run, then kills and resumes it at `kills` seeded random moments among the units
/// of the uninterrupted run in `straight`, then lets it finish; returns how many kills landed
/// before the run had finished.
fn run_with_kills(fixture: &Fixture, runs: &str, kills: usize, typical: Duration, seed: u64) -> usize {
    let dir = fixture.root.join(runs).join("r");
    let total_units = common::completed_units(&fixture.root.join("straight/r")).expect("the uninterrupted run");
    common::kill_between_units(kills, &dir, total_units, typical, seed, |attempt| {
        let mut command = whale();
        if attempt == 0 {
            command.args(["run", "--quiet", "--runs"]).arg(fixture.root.join(runs)).arg(&fixture.config);
        } else {
            command.args(["run", "--quiet", "--resume"]).arg(&dir);
        }
        command
    })
}

fn assert_same_result(fixture: &Fixture, a: &str, b: &str) {
    let (a, b) = (fixture.root.join(a).join("r"), fixture.root.join(b).join("r"));
    for file in ["ledger.json", "metrics.jsonl", "state.json"] {
        assert_eq!(
            common::untimed_file(&a.join(file)),
            common::untimed_file(&b.join(file)),
            "{file} differs after kills"
        );
    }
    let state = common::untimed_file(&b.join("state.json"));
    assert_eq!(state["finished"], true);
    let rows = common::untimed_file(&b.join("metrics.jsonl"));
    let evals = rows.as_array().expect("rows").iter().filter(|r| r["kind"] == "evaluation").count();
    assert!(evals >= 3, "start, boundaries and end were evaluated");
    assert!(b.join("report.html").is_file());
}

#[test]
fn a_whale_run_killed_at_random_moments_ends_as_if_never_interrupted() {
    let fixture = fixture("whale");
    let typical = run_to_end(&fixture, "straight");
    let state = common::untimed_file(&fixture.root.join("straight/r/state.json"));
    assert!(state["weights_version"].as_u64().unwrap_or(0) >= 4, "weights were updated: {state}");
    assert!(state["search_iterations"].as_u64().unwrap_or(0) >= 1, "the search iterated: {state}");
    let landed = run_with_kills(&fixture, "killed", 4, typical, 11);
    assert!(landed >= 2, "only {landed} kills landed before the run ended");
    assert_same_result(&fixture, "straight", "killed");
}

/// Whether an archive's summary records a search iteration that replaced the incumbent.
fn accepted_a_harness(run: &Path) -> bool {
    let summary = std::fs::read_to_string(run.join("archive/summary.jsonl")).unwrap_or_default();
    summary.lines().any(|line| line.contains("\"new_best\":true"))
}

/// A whale fixture whose proposer is a command that always proposes the starting harness
/// without its instruction line: as successful (never, on the tiny model) and shorter, so the
/// Pareto rule accepts it at the first search iteration.
fn accepting_fixture() -> Fixture {
    let fixture = fixture("whale");
    let shorter = HARNESS.replace("\\nGive the final answer after ####.", "");
    let pending = serde_json::json!([{ "source": shorter, "hypothesis": "a shorter prompt" }]);
    let proposal = fixture.root.join("proposal.json");
    std::fs::write(&proposal, pending.to_string()).expect("proposal");
    let config = std::fs::read_to_string(&fixture.config).expect("config").replace(
        "[search]\n",
        &format!(
            "[search]\nproposer = \"command\"\ncommand = {{ command = \"cp '{}' pending.json\" }}\n",
            proposal.display()
        ),
    );
    std::fs::write(&fixture.config, config).expect("config");
    fixture
}

/// Killed the moment its archive records an accepted harness, then resumed: the resumed search
/// is seeded with the harness the run started from, not the one it has accepted since.
#[test]
fn a_whale_run_killed_after_its_search_accepted_a_harness_ends_as_if_never_interrupted() {
    let fixture = accepting_fixture();
    run_to_end(&fixture, "straight");
    let straight = fixture.root.join("straight/r");
    let summary = std::fs::read_to_string(straight.join("archive/summary.jsonl")).expect("summary");
    assert!(accepted_a_harness(&straight), "the fixture's search accepts a harness:\n{summary}");
    let run = fixture.root.join("killed/r");
    let mut child = whale()
        .args(["run", "--quiet", "--runs"])
        .arg(fixture.root.join("killed"))
        .arg(&fixture.config)
        .spawn()
        .expect("whale starts");
    while !accepted_a_harness(&run) && child.try_wait().expect("poll").is_none() {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(child.try_wait().expect("poll").is_none(), "the run ended before the kill");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let resumed =
        whale().args(["run", "--quiet", "--resume"]).arg(&run).stderr(Stdio::piped()).output().expect("whale resumes");
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "the resumed run failed: {stderr}");
    assert!(stderr.contains("did not end normally"), "the resume says the last writer was killed: {stderr}");
    assert_same_result(&fixture, "straight", "killed");
}

fn whale_output(args: &[&str], dir: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_whale")).args(args).arg(dir).output().expect("whale runs");
    assert!(output.status.success(), "whale {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_archive_and_report_commands_read_a_finished_run() {
    let fixture = fixture("whale");
    run_to_end(&fixture, "runs");
    let run = fixture.root.join("runs/r");
    let archive = |args: &[&str]| {
        let output =
            Command::new(env!("CARGO_BIN_EXE_whale")).arg("archive").arg(&run).args(args).output().expect("archive");
        assert!(output.status.success(), "archive {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let top = archive(&["top"]);
    assert!(top.contains("c0000") && top.contains("success"), "{top}");
    assert!(archive(&["frontier"]).contains("incumbent"));
    let traces = archive(&["traces", "c0000"]);
    assert_eq!(traces.lines().count(), 4, "one line per search task: {traces}");
    let diff = archive(&["diff", "c0000", "c0001"]);
    assert!(diff.starts_with("--- c0000") && diff.lines().any(|l| l.starts_with('+')), "{diff}");
    let proposals = archive(&["proposals"]);
    let summary = std::fs::read_to_string(run.join("archive/summary.jsonl")).expect("summary");
    let made = summary.lines().filter(|l| l.contains("\"event\":\"proposed\"")).count();
    assert!(made > 0 && proposals.contains(&format!("proposals: {made} made")), "{proposals}");
    assert!(proposals.contains("proposer: mutate") && proposals.contains("proposer spend: 0 prompt"), "{proposals}");
    let report = whale_output(&["report"], &run);
    assert!(report.contains("whale") && report.contains("report.html"), "{report}");
    let page = std::fs::read_to_string(run.join("report.html")).expect("report.html");
    assert!(page.contains("<svg") && page.contains("Best and final"));
}

/// whale-adaptive picks each phase from what the last ones moved; a resumed run must pick the
/// same phases from its stored outcomes.
#[test]
fn a_whale_adaptive_run_killed_at_random_moments_ends_as_if_never_interrupted() {
    let fixture = fixture("whale-adaptive");
    let typical = run_to_end(&fixture, "straight");
    let state = common::untimed_file(&fixture.root.join("straight/r/state.json"));
    let phases: Vec<&str> =
        state["outcomes"].as_array().expect("outcomes").iter().flat_map(|o| o["phase"].as_str()).collect();
    assert!(phases.contains(&"weights") && phases.contains(&"search"), "the run chose both phases: {phases:?}");
    let landed = run_with_kills(&fixture, "killed", 4, typical, 41);
    assert!(landed >= 1, "no kill landed before the run ended");
    assert_same_result(&fixture, "straight", "killed");
}

#[test]
fn a_fast_slow_run_killed_at_random_moments_ends_as_if_never_interrupted() {
    let fixture = fixture("fast-slow");
    let typical = run_to_end(&fixture, "straight");
    let run = fixture.root.join("straight/r");
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config.toml");
    assert!(config.contains("algorithm = \"grpo\""), "fast-slow's slow weights learn by GRPO:\n{config}");
    let state = common::read_json(&run.join("state.json"));
    let population: Vec<&str> =
        state["population"].as_array().expect("a population").iter().flat_map(|h| h.as_str()).collect();
    assert!(!population.is_empty());
    let archive = whale_search::Archive::open(run.join("archive")).expect("archive");
    let mut candidates = archive.candidates().filter(|c| c.meta.rejection.is_none());
    let initial = candidates.next().expect("the initial harness").source.clone();
    for member in population {
        let source = &archive.candidates().find(|c| c.meta.hash == member).expect("a member in the archive").source;
        assert!(whale_search::only_prompt_text_differs(&initial, source), "a member changed code:\n{source}");
    }
    let landed = run_with_kills(&fixture, "killed", 3, typical, 23);
    assert!(landed >= 1, "no kill landed before the run ended");
    assert_same_result(&fixture, "straight", "killed");
}

#[test]
fn a_lora_run_killed_at_random_moments_ends_as_if_never_interrupted() {
    let fixture = fixture_with("weight-only", "[weights.lora]\nrank = 4\ndropout = 0.1\n");
    let typical = run_to_end(&fixture, "straight");
    let run = fixture.root.join("straight/r");
    let state = common::untimed_file(&run.join("state.json"));
    assert!(state["weights_version"].as_u64().unwrap_or(0) >= 4, "weights were updated: {state}");
    let checkpoint = run.join(format!("checkpoints/step-{:06}", state["checkpoint_step"].as_u64().expect("a step")));
    for file in ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors"] {
        assert!(checkpoint.join(file).is_file(), "{file} missing from {}", checkpoint.display());
    }
    assert!(!checkpoint.join("model.safetensors").exists(), "a LoRA checkpoint holds the adapter only");
    let landed = run_with_kills(&fixture, "killed", 4, typical, 31);
    assert!(landed >= 2, "only {landed} kills landed before the run ended");
    assert_same_result(&fixture, "straight", "killed");
}

/// Weight-only GRPO with a KL penalty and two passes per step, on chess mates in one: the
/// untrained model names no legal move, so `chess/legal-moves` plays seeded random ones and a
/// puzzle's rollouts differ often enough for updates.
fn grpo_config(model: &Path) -> String {
    format!(
        r#"name = "r"
seed = 4
condition = "weight-only"
threads = 8
[model]
path = "{model}"
[tasks]
domain = "chess"
generate = 60
difficulties = [1]
train = 30
search = 4
test = 4
[sampling]
max_tokens = 8
[harness]
initial = "chess/legal-moves"
[weights]
algorithm = "grpo"
tasks_per_step = 4
rollouts_per_task = 4
mini_batch = 8
micro_batch = 4
learning_rate = 0.001
checkpoint_every = 3
[weights.policy_gradient]
epochs = 2
kl_coef = 0.05
[schedule]
budget = 112
[eval]
k = 2
every_steps = 2
"#,
        model = model.display()
    )
}

#[test]
fn a_grpo_run_killed_at_random_moments_ends_as_if_never_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let model = common::tiny_model_in(&root);
    let config = root.join("r.toml");
    std::fs::write(&config, grpo_config(&model)).expect("config");
    let fixture = Fixture { _dir: dir, root, config };
    let typical = run_to_end(&fixture, "straight");
    let run = fixture.root.join("straight/r");
    let state = common::untimed_file(&run.join("state.json"));
    assert!(state["weights_version"].as_u64().unwrap_or(0) >= 2, "weights were updated: {state}");
    let rows = common::untimed_file(&run.join("metrics.jsonl"));
    let steps: Vec<_> = rows.as_array().expect("rows").iter().filter(|r| r["policy_gradient"].is_object()).collect();
    assert_eq!(steps.len(), 7, "every weight step reports its policy gradient");
    assert!(steps.iter().any(|r| r["policy_gradient"]["kl"].as_f64().is_some_and(|kl| kl > 0.0)), "{steps:?}");
    let landed = run_with_kills(&fixture, "killed", 4, typical, 37);
    assert!(landed >= 2, "only {landed} kills landed before the run ended");
    assert_same_result(&fixture, "straight", "killed");
}
