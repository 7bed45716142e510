//! `whale study` on the tiny model: every arm under every seed in its own compare directory,
//! `study.json` with the paired differences pooled over seeds, and a study killed with SIGKILL
//! at seeded random moments ends with the same `study.json` as one never interrupted. A study
//! split over two machines, its result files collected in one directory, reports exactly what
//! one uninterrupted study reports, and so does a seed whose arms finished on two machines; a
//! result file of another config is refused, named, and so is a seed or condition given twice.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The conditions of every study here.
const CONDITIONS: &str = "whale,weight-only,harness-only";

fn study(root: &Path, runs: &str) -> Command {
    study_of(root, runs, &["--seeds", "3,5", "--conditions", CONDITIONS])
}

/// `whale study ARGS` of `tiny.toml` into `root/runs`, its output discarded.
fn study_of(root: &Path, runs: &str, args: &[&str]) -> Command {
    let mut command = shown_study_of(root, runs, args);
    command.arg("--quiet");
    command
}

/// [`study_of`] without `--quiet`: with its progress on stderr.
fn shown_study_of(root: &Path, runs: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command
        .args(["study", "--runs"])
        .arg(root.join(runs))
        .args(args)
        .arg(root.join("tiny.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// The study's text as `whale study` prints it ([`text_of`]).
fn report_text(command: &mut Command) -> String {
    text_of(&succeeded(command))
}

/// Runs `command` with its output captured; it must succeed.
fn succeeded(command: &mut Command) -> std::process::Output {
    let output = command.stdout(Stdio::piped()).stderr(Stdio::piped()).output().expect("whale runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output
}

/// The study's text in a `whale study` output: without the CPU line a run starts with and the
/// paths and wall time it ends with.
fn text_of(output: &std::process::Output) -> String {
    let stdout = String::from_utf8(output.stdout.clone()).expect("utf-8");
    let lines = stdout.lines().skip_while(|line| line.starts_with("cpu: "));
    lines.take_while(|line| !line.starts_with("results: ")).map(|line| format!("{line}\n")).collect()
}

fn fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let model = common::tiny_model_in(&root);
    std::fs::write(root.join("tiny.toml"), common::tiny_comparison_config(&model)).expect("config");
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
    let couplings = domain["couplings"].as_array().expect("couplings");
    assert_eq!(couplings.iter().map(|c| c["seed"].as_u64()).collect::<Vec<_>>(), [Some(3), Some(5)]);
    for coupling in couplings {
        let matrix = &coupling["matrix"];
        let cells = matrix["cells"].as_array().expect("cells").len();
        assert_eq!(
            cells,
            matrix["harnesses"].as_array().map_or(0, Vec::len) * matrix["weights"].as_array().map_or(0, Vec::len)
        );
        assert!(cells >= 2, "the starting weights and a phase boundary: {matrix}");
    }
    let findings: Vec<&str> =
        domain["verdicts"].as_array().expect("verdicts").iter().filter_map(|v| v["finding"].as_str()).collect();
    assert_eq!(findings.len(), 3, "{findings:?}");
    assert!(findings[1].starts_with("(b) math") && findings[2].starts_with("(c)"), "{findings:?}");
    for figure in ["tiny-curves", "tiny-forest", "tiny-coupling-seed-3", "tiny-coupling-seed-5"] {
        let png = std::fs::read(study_dir.join("figures").join(format!("{figure}.png"))).expect(figure);
        assert_eq!(&png[..4], b"\x89PNG", "{figure}");
    }

    let landed = common::kill_and_resume(3, typical, 0.1..0.6, 41, |_| study(&root, "killed"));
    assert!(landed >= 1, "no kill landed before the study ended");
    assert_eq!(
        common::untimed_file(&root.join("killed/study/study.json")),
        common::untimed_file(&study_dir.join("study.json")),
        "study.json after kills"
    );
}

fn whale(args: &[&str]) -> std::process::Output {
    let output = Command::new(env!("CARGO_BIN_EXE_whale")).args(args).output().expect("whale runs");
    assert!(output.status.success(), "whale {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output
}

#[test]
fn each_coupling_cell_equals_a_direct_harness_run_of_its_harness_on_its_weights() {
    use whale_tasks::task_domain;
    let (_dir, root) = fixture();
    let runs = root.join("runs");
    let config = root.join("tiny.toml");
    let run_dir = runs.join("tiny-whale");
    let text = |p: &Path| p.display().to_string();
    whale(&["run", &text(&config), "--condition", "whale", "--quiet", "--runs", &text(&runs)]);
    let shown = whale(&["coupling", &text(&run_dir), "--quiet"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(run_dir.join("coupling.png").is_file() && run_dir.join("coupling.svg").is_file());
    let matrix = common::read_json(&run_dir.join("coupling.json"));

    let resolved = whale_loop::config::RunConfig::load(&run_dir.join("config.toml")).expect("config");
    let test = whale_loop::experiment::task_splits(&resolved).expect("splits").test;
    let tasks = root.join("test.jsonl");
    let mut file = std::fs::File::create(&tasks).expect("tasks file");
    task_domain(resolved.tasks.domain).write_native(&test, &mut file).expect("write tasks");

    let harnesses = matrix["harnesses"].as_array().expect("harnesses");
    let weights = matrix["weights"].as_array().expect("weights");
    assert!(weights.len() >= 2, "the start and at least one phase boundary: {matrix}");
    assert_eq!(weights[0]["version"], 0);
    let cells = matrix["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), harnesses.len() * weights.len(), "every cell is scored");
    let seed = matrix["eval_seed"].as_u64().expect("seed").to_string();
    for harness in harnesses {
        let source = run_dir.join("archive/candidates").join(harness["id"].as_str().expect("id")).join("harness.js");
        for column in weights {
            let model = run_dir.join(column["dir"].as_str().expect("dir"));
            let direct = whale(&[
                "harness",
                "run",
                &text(&source),
                "--domain",
                "math",
                "--data",
                &text(&tasks),
                "--k",
                "2",
                "--seed",
                &seed,
                "--threads",
                "8",
                "--max-tokens",
                "12",
                "--model",
                &text(&model),
                "--json",
            ]);
            let direct: serde_json::Value = serde_json::from_slice(&direct.stdout).expect("json");
            let cell = cells
                .iter()
                .find(|c| c["harness"] == harness["hash"] && c["weights_version"] == column["version"])
                .expect("the cell");
            assert_eq!(cell["mean"], direct["scores"]["mean"], "harness {} under {}", harness["id"], column["dir"]);
        }
    }
    assert!(shown.contains("w0 (start)") && shown.contains("h0 (initial)"), "{shown}");
    // The run's own evaluations (its start, at least) are cells it need not score again; the
    // loop above shows that they too equal direct runs.
    let counts = shown.lines().find_map(|line| line.strip_prefix("cells: ")).expect("the cells line");
    let numbers: Vec<usize> = counts.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
    assert!(numbers.len() == 3 && numbers[1] >= 1 && numbers[2] == 0, "{counts}");
    assert_eq!(numbers[0] + numbers[1], cells.len(), "{counts}");

    std::fs::remove_file(run_dir.join("coupling.json")).expect("rm");
    let state = std::fs::read(run_dir.join("state.json")).expect("state");
    whale(&["coupling", &text(&run_dir), "--quiet"]);
    assert_eq!(common::read_json(&run_dir.join("coupling.json")), matrix, "computed again, the same matrix");
    assert_eq!(std::fs::read(run_dir.join("state.json")).expect("state"), state, "the run is left as it was");
}

#[test]
fn a_study_split_over_two_machines_reports_what_one_uninterrupted_study_reports() {
    let (_dir, root) = fixture();
    let both = ["--seeds", "0,1", "--conditions", CONDITIONS];
    let whole_text = report_text(&mut study_of(&root, "whole", &both));
    let whole = root.join("whole/study");
    assert!(whole_text.contains("  cpu: ") && whole_text.contains(": seeds [0, 1]\n"), "{whole_text}");

    // Machine A runs seed 0 (`--seeds 1`: one seed); machine B is handed A's result file and
    // runs the study of both seeds, so that only seed 1 runs there.
    assert!(study_of(&root, "a", &["--seeds", "1", "--conditions", CONDITIONS]).status().expect("whale").success());
    let from_a = root.join("a/study/results/tiny-seed-0.json");
    let b_results = root.join("b/study/results");
    std::fs::create_dir_all(&b_results).expect("results dir");
    std::fs::copy(&from_a, b_results.join("tiny-seed-0.json")).expect("copied");
    let b_output = succeeded(&mut shown_study_of(&root, "b", &both));
    assert!(!root.join("b/study/tiny/seed-0").exists(), "seed 0 came from machine A's file");
    assert!(root.join("b/study/tiny/seed-1/whale/state.json").is_file(), "seed 1 ran on machine B");
    assert_eq!(text_of(&b_output), whole_text, "machine B's study of both seeds");
    // Its stderr is no terminal: the progress is a line per arm and matrix, seed 1's alone, and
    // each run's line per unit.
    let progress = String::from_utf8_lossy(&b_output.stderr);
    for line in [
        "] tiny seed 1: whale (1 of 3)\n",
        "] tiny seed 1: weight-only (2 of 3)\n",
        "] tiny seed 1: harness-only finished (",
        " min in this process)\n",
        "] tiny seed 1: coupling matrix\n",
    ] {
        assert!(progress.contains(line), "{line:?} in {progress}");
    }
    for (run, unit) in
        [("whale", "] weight step 2: "), ("weight-only", "] eval (End): "), ("harness-only", "] search iteration 1: ")]
    {
        let prefix = format!("[{run} ");
        assert!(progress.lines().any(|l| l.starts_with(&prefix) && l.contains(unit)), "{run}{unit} in {progress}");
    }
    assert!(progress.lines().all(|line| !line.contains("seed 0")), "{progress}");

    let file = common::read_json(&from_a);
    assert_eq!((file["config"].as_str(), file["seed"].as_u64()), (Some("tiny"), Some(0)));
    assert!(file["cpu"]["model"].as_str().is_some_and(|m| !m.is_empty()) && file["cpu"]["features"].is_array());
    assert!(file["whale"]["version"].is_string() && file["wall_s"].as_f64().is_some_and(|s| s > 0.0), "{file}");
    assert_eq!(file["arms"].as_array().map(Vec::len), Some(3));
    let digests: Vec<&str> =
        file["arms"].as_array().expect("arms").iter().filter_map(|arm| arm["test_split"].as_str()).collect();
    assert!(digests.len() == 3 && digests.iter().all(|d| d.len() == 64 && *d == digests[0]), "{file}");
    assert!(file["coupling"]["cells"].as_array().is_some_and(|cells| cells.len() >= 2));
    let size = std::fs::metadata(&from_a).expect("the file").len();
    assert!(size < 64 * 1024, "a result file holds no checkpoint: {size} bytes");

    // The two machines' files alone, in one directory, make the whole study's report.
    let collected = root.join("collected");
    std::fs::create_dir_all(&collected).expect("collected dir");
    std::fs::copy(&from_a, collected.join("tiny-seed-0.json")).expect("copied");
    std::fs::copy(b_results.join("tiny-seed-1.json"), collected.join("tiny-seed-1.json")).expect("copied");
    let collected = collected.display().to_string();
    let report_only = [&both[..], &["--report-only", "--results", &collected]].concat();
    assert_eq!(report_text(&mut study_of(&root, "report", &report_only)), whole_text);
    let report = root.join("report/study");
    assert!(!report.join("tiny").exists(), "--report-only runs nothing");
    assert_eq!(
        common::untimed_file(&report.join("study.json")),
        common::untimed_file(&whole.join("study.json")),
        "study.json from the files"
    );
    let bytes = |path: PathBuf| std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes(report.join("report.html")), bytes(whole.join("report.html")), "report.html");
    for figure in ["tiny-curves", "tiny-forest", "tiny-coupling-seed-0", "tiny-coupling-seed-1"] {
        let png = format!("figures/{figure}.png");
        assert_eq!(bytes(report.join(&png)), bytes(whole.join(&png)), "{png}");
    }

    let partial = report_text(&mut study_of(&root, "a", &[&both[..], &["--report-only"]].concat()));
    assert!(partial.contains("tiny (math), seeds [0]\n") && partial.contains("missing seeds [1]"), "{partial}");
}

#[test]
fn a_seed_split_by_arm_over_two_machines_runs_each_arm_once_and_reports_what_one_machine_does() {
    let (_dir, root) = fixture();
    let one = ["--seeds", "1", "--conditions", CONDITIONS];
    let whole_text = report_text(&mut study_of(&root, "whole", &one));
    let whole = root.join("whole/study");
    assert!(whole.join("results/tiny-seed-0.json").is_file());
    assert!(!whole.join("results/arms").exists(), "a seed's arm files are joined into its file and removed");

    // Machine A is taken away once its WHALE arm (and that arm's coupling matrix) has finished:
    // the arm's file is what it leaves.
    let mut a = study_of(&root, "a", &one).spawn().expect("whale starts");
    let whale_arm = root.join("a/study/results/arms/tiny-seed-0-whale.json");
    let left = loop {
        if let Ok(bytes) = std::fs::read(&whale_arm) {
            break bytes;
        }
        assert!(a.try_wait().expect("poll").is_none(), "machine A ended before its WHALE arm's file was seen");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    a.kill().expect("killed");
    a.wait().expect("reaped");
    let file: serde_json::Value = serde_json::from_slice(&left).expect("json");
    assert_eq!(file["arms"].as_array().map(Vec::len), Some(1), "{file}");
    assert!(file["arms"][0]["ran"]["cpu"]["model"].is_string(), "the arm says where it ran: {file}");
    assert!(file["arms"][0]["test_split"].as_str().is_some_and(|d| d.len() == 64), "its test split: {file}");
    assert!(file["coupling"]["cells"].as_array().is_some_and(|cells| cells.len() >= 2), "{file}");

    // Machine B is handed that file: it runs the two other arms only and joins the three.
    let b_arms = root.join("b/study/results/arms");
    std::fs::create_dir_all(&b_arms).expect("arms dir");
    std::fs::write(b_arms.join("tiny-seed-0-whale.json"), &left).expect("copied");
    let partial = report_text(&mut study_of(&root, "b", &[&one[..], &["--report-only"]].concat()));
    assert!(partial.contains("  seed 0, the arms finished so far (their files in arms/):\n    whale "), "{partial}");
    let evaluations = file["arms"][0]["evaluations"].as_array().expect("evaluations");
    let (first, last) = (&evaluations[0], &evaluations[evaluations.len() - 1]);
    let (start, end) = (&first["mean"], &last["mean"]);
    let so_far = format!(
        "{:.3} -> {:.3} [{:.3}, {:.3}] after {} training rollouts\n",
        start["value"].as_f64().unwrap_or(f64::NAN),
        end["value"].as_f64().unwrap_or(f64::NAN),
        end["lo"].as_f64().unwrap_or(f64::NAN),
        end["hi"].as_f64().unwrap_or(f64::NAN),
        last["training_rollouts"]
    );
    assert!(partial.contains(&so_far), "{so_far} in {partial}");
    assert!(partial.contains("  seed 0, the WHALE run's coupling matrix:\n"), "{partial}");
    let b_output = succeeded(&mut shown_study_of(&root, "b", &one));
    assert!(!root.join("b/study/tiny/seed-0/whale").exists(), "the WHALE arm came from machine A's file");
    assert!(root.join("b/study/tiny/seed-0/weight-only/state.json").is_file());
    let progress = String::from_utf8_lossy(&b_output.stderr);
    assert!(progress.contains("] tiny seed 0: weight-only (2 of 3)\n"), "{progress}");
    let written =
        format!("] tiny seed 0: harness-only's result in {}", b_arms.join("tiny-seed-0-harness-only.json").display());
    assert!(progress.contains(&written), "{written} in {progress}");
    assert!(!progress.contains("whale (1 of 3)") && !progress.contains("coupling matrix"), "{progress}");
    assert_eq!(text_of(&b_output), whole_text, "machine B's study of the seed");
    assert!(!b_arms.exists(), "the arm files are joined into the seed's file");
    assert_eq!(
        common::untimed_file(&root.join("b/study/study.json")),
        common::untimed_file(&whole.join("study.json")),
        "study.json"
    );
}

#[test]
fn a_result_file_of_another_config_is_refused_naming_the_file() {
    let (_dir, root) = fixture();
    let seed_0 = ["--seeds", "1", "--conditions", "weight-only"];
    assert!(study_of(&root, "runs", &seed_0).status().expect("whale runs").success());
    let file = root.join("runs/study/results/tiny-seed-0.json");
    let written = std::fs::read(&file).expect("the result file");

    let config = std::fs::read_to_string(root.join("tiny.toml")).expect("config");
    std::fs::write(root.join("tiny.toml"), config.replace("budget = 24", "budget = 32")).expect("changed");
    for report_only in [true, false] {
        let args = [&seed_0[..], if report_only { &["--report-only"] } else { &[] }].concat();
        let output = study_of(&root, "runs", &args).stderr(Stdio::piped()).output().expect("whale runs");
        assert!(!output.status.success(), "report only {report_only}: a file of another config counted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&file.display().to_string()), "report only {report_only}: {stderr}");
        assert!(stderr.contains("schedule.budget = 24 in the file, 32 here"), "report only {report_only}: {stderr}");
    }
    assert_eq!(std::fs::read(&file).expect("the result file"), written, "a refused file is left as it was");
}

#[test]
fn a_seed_or_a_condition_given_twice_is_refused_naming_it_before_anything_runs() {
    let (_dir, root) = fixture();
    let cases = [
        (["--seeds", "7,7", "--conditions", CONDITIONS], "seed 7 is given twice"),
        (["--seeds", "1", "--conditions", "whale,weight-only,whale"], "the condition `whale` is given twice"),
    ];
    for (args, named) in cases {
        for report_only in [false, true] {
            let args = [&args[..], if report_only { &["--report-only"] } else { &[] }].concat();
            let output = study_of(&root, "runs", &args).stderr(Stdio::piped()).output().expect("whale runs");
            assert!(!output.status.success(), "{args:?} was accepted");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains(named), "{args:?}: {stderr}");
        }
    }
    assert!(!root.join("runs/study/tiny").exists(), "nothing ran");
}

#[test]
fn a_study_that_would_lose_the_coupling_weights_stops_before_running_and_finished_runs_must_match_the_config() {
    let (_dir, root) = fixture();
    let config = std::fs::read_to_string(root.join("tiny.toml")).expect("config");
    let lean = config.replace("[weights]\n", "[weights]\nkeep_phase_weights = false\n");
    std::fs::write(root.join("tiny.toml"), &lean).expect("lean config");
    let both = ["--seeds", "1", "--conditions", "whale,weight-only"];
    let output = study_of(&root, "runs", &both).stderr(Stdio::piped()).output().expect("whale runs");
    assert!(!output.status.success(), "a study whose coupling matrix cannot be computed ran");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`tiny`") && stderr.contains("keep_phase_weights = false"), "{stderr}");
    assert!(!root.join("runs/study/tiny").exists(), "nothing runs before the check");

    let weight_only = ["--seeds", "1", "--conditions", "weight-only"];
    assert!(study_of(&root, "runs", &weight_only).status().expect("whale runs").success(), "no matrix, no check");
    let run = root.join("runs/study/tiny/seed-0/weight-only");
    let state = std::fs::read(run.join("state.json")).expect("state");

    std::fs::write(root.join("tiny.toml"), &config).expect("config keeping them");
    let elsewhere = root.join("results-both");
    let args = [&both[..], &["--results", elsewhere.to_str().expect("utf-8 path")]].concat();
    let output = study_of(&root, "runs", &args).stderr(Stdio::piped()).output().expect("whale runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(std::fs::read(run.join("state.json")).expect("state"), state, "the finished run is not run again");
    assert!(elsewhere.join("tiny-seed-0.json").is_file());

    let changed = config.replace("learning_rate = 0.001", "learning_rate = 0.002");
    std::fs::write(root.join("tiny.toml"), changed).expect("another learning rate");
    let fresh = root.join("results-changed");
    let args = [&both[..], &["--results", fresh.to_str().expect("utf-8 path")]].concat();
    let output = study_of(&root, "runs", &args).stderr(Stdio::piped()).output().expect("whale runs");
    assert!(!output.status.success(), "a finished run of another config was counted");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("config.toml differs") && stderr.contains("seed-0/whale"), "{stderr}");
}
