//! `whale harness ...` end to end through the binary, with a tiny random model written to a
//! temporary directory in the Hugging Face layout.

mod common;

use common::{untimed, write_tiny_model};
use std::path::Path;
use std::process::{Command, Output};
use whale_core::Trajectory;
use whale_harness::STOCK_HARNESSES;

fn whale(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_whale")).args(args).output().expect("the whale binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// The trajectories of a `--out` file, without timings, in task and seed order (the file is in
/// completion order).
fn trajectories(path: &Path) -> Vec<serde_json::Value> {
    let content = std::fs::read_to_string(path).expect("a trajectory file");
    let mut all: Vec<Trajectory> =
        content.lines().map(|line| serde_json::from_str(line).expect("a trajectory line")).collect();
    all.sort_by(|a, b| (&a.task_id, a.seed).cmp(&(&b.task_id, b.seed)));
    all.iter().map(untimed).collect()
}

#[test]
fn list_shows_every_stock_harness_with_its_description() {
    let o = whale(&["harness", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), STOCK_HARNESSES.len());
    for stock in &STOCK_HARNESSES {
        let line = out.lines().find(|l| l.starts_with(stock.name)).unwrap_or_else(|| panic!("{}: {out}", stock.name));
        assert!(line.len() > stock.name.len() + 10, "{line}");
    }
    let chess = stdout(&whale(&["harness", "list", "--domain", "chess"]));
    assert!(chess.lines().count() >= 3 && chess.lines().all(|l| l.starts_with("chess/")), "{chess}");
    let shown = whale(&["harness", "show", "math/plain"]);
    assert_eq!(stdout(&shown), STOCK_HARNESSES[0].source);
}

#[test]
fn check_reports_a_syntax_error_at_its_line_and_column_and_exits_1() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("broken.js");
    std::fs::write(&file, "export function solve(task, ctx) {\n  const x = 1;\n  return x +* 2;\n}\n")
        .expect("written");
    let o = whale(&["harness", "check", text(&file), "--domain", "math", "--model", "/nonexistent"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(&format!("{}:3:", file.display())), "{out}");
    assert!(out.contains("SyntaxError"), "{out}");
}

#[test]
fn check_runs_a_smoke_rollout_and_reports_a_runtime_error_at_its_line() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let model = dir.path().join("model");
    write_tiny_model(&model);
    let file = dir.path().join("throws.js");
    let source = "export function solve(task, ctx) {\n  const reply = ctx.llm.chat(ctx.env.observation, { max_tokens: 4 });\n  return reply.missing.text;\n}\n";
    std::fs::write(&file, source).expect("written");
    let o = whale(&["harness", "check", text(&file), "--domain", "qa", "--model", text(&model)]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.matches("exception").count(), 3, "{out}");
    assert!(out.contains(&format!("{}:3:", file.display())), "{out}");

    let good = whale(&["harness", "check", "chess/legal-moves", "--model", text(&model)]);
    assert!(good.status.success(), "{}{}", stdout(&good), stderr(&good));
    assert_eq!(stdout(&good).matches(": ok, reward").count(), 3, "{}", stdout(&good));
}

#[test]
fn run_prints_the_scores_and_the_same_seed_writes_the_same_trajectories() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let model = dir.path().join("model");
    write_tiny_model(&model);
    let run = |seed: &str, out: &Path| {
        let task_args = ["--gen", "3", "--difficulty", "3", "--k", "2", "--seed", seed];
        let mut args = vec!["harness", "run", "qa/two-hop", "--model", text(&model), "--out", text(out)];
        args.extend(task_args);
        let o = whale(&args);
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        stdout(&o)
    };
    let (first, again, other) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"), dir.path().join("c.jsonl"));
    let printed = run("3", &first);
    for line in ["qa 3 tasks x 2 rollouts", "mean@2 ", "pass@2 ", "maj@2 ", "tokens ", "calls ", "errors  none"] {
        assert!(printed.contains(line), "{line}: {printed}");
    }
    run("3", &again);
    run("4", &other);
    let same = trajectories(&first);
    assert_eq!(same.len(), 6);
    assert_eq!(same, trajectories(&again));
    assert_ne!(same, trajectories(&other));
}

#[test]
fn run_refuses_a_file_without_a_domain_an_unknown_name_and_a_mismatched_option() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("h.js");
    std::fs::write(&file, "export function solve() {}").expect("written");
    let o = whale(&["harness", "run", text(&file), "--gen", "2", "--model", "/nonexistent"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--domain"), "{}", stderr(&o));
    let o = whale(&["harness", "run", "math/nonexistent", "--gen", "2", "--model", "/nonexistent"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not a stock harness"), "{}", stderr(&o));
    let o = whale(&["harness", "run", "chess/plain", "--domain", "math", "--gen", "2", "--model", "/nonexistent"]);
    assert!(stderr(&o).contains("is a chess harness, not math"), "{}", stderr(&o));
    let o = whale(&["harness", "run", "math/plain", "--gen", "2", "--corpus", "c.jsonl", "--model", "/nonexistent"]);
    assert!(stderr(&o).contains("--corpus and --index are for qa"), "{}", stderr(&o));
}
