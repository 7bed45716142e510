//! Who writes a run directory, and what a failed write leaves: one process at a time
//! (`whale_loop::lock::DirLock`), so two resumes of one run or two compares of one config
//! started at random moments end with one of them run and the other refused, and files equal
//! to an uninterrupted run's; a second writer writes nothing (a second study of one results
//! directory included), readers still read; and a run stopped by a full disk resumes, once
//! space is freed, to the same result.

mod common;

use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use whale_loop::lock::DirLock;

/// Six weight steps of 2 tasks x 2 rollouts, a checkpoint every 2 steps, an evaluation every 2.
fn config(model: &Path) -> String {
    format!(
        r#"name = "w"
seed = 3
condition = "weight-only"
threads = 4
[model]
path = "{model}"
[tasks]
generate = 40
train = 20
search = 2
test = 2
[sampling]
max_tokens = 12
[weights]
tasks_per_step = 2
rollouts_per_task = 2
reward_threshold = -1.0
skip_truncated = false
checkpoint_every = 2
[search]
candidates = 2
[schedule]
budget = 24
[eval]
k = 1
every_steps = 2
"#,
        model = model.display()
    )
}

/// The arms `whale compare` runs here.
const ARMS: [&str; 2] = ["weight-only", "harness-only"];

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let model = common::tiny_model_in(&root);
        let config = root.join("w.toml");
        std::fs::write(&config, self::config(&model)).expect("config");
        Self { _dir: dir, root, config }
    }

    /// The run directory of the config under `runs`.
    fn run_dir(&self, runs: &str) -> PathBuf {
        self.root.join(runs).join("w")
    }

    fn run(&self, runs: &str) -> Command {
        whale(&["run", "--quiet", "--runs", &text(&self.root.join(runs)), &text(&self.config)])
    }

    fn compare(&self, runs: &str) -> Command {
        let arms = ARMS.join(",");
        whale(&[
            "compare",
            "--quiet",
            "--conditions",
            &arms,
            "--runs",
            &text(&self.root.join(runs)),
            &text(&self.config),
        ])
    }
}

fn whale(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
    command.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    command
}

fn resume(dir: &Path) -> Command {
    whale(&["run", "--quiet", "--resume", &text(dir)])
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// Runs `command` to its end, timed.
fn timed(mut command: Command) -> (Output, Duration) {
    let started = Instant::now();
    let output = command.output().expect("whale starts");
    (output, started.elapsed())
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_success(output: &Output, what: &str) {
    assert!(output.status.success(), "{what} failed: {}", stderr(output));
}

/// Asserts that `output` is a refusal because `dir` is locked by the process `holder`.
fn assert_refused(output: &Output, dir: &Path, holder: u32, what: &str) {
    let message = stderr(output);
    assert!(!output.status.success(), "{what} was not refused: {message}");
    let expected = format!("{} is being written by another process (pid {holder}: ", dir.display());
    assert!(message.contains(&expected), "{what}: expected `{expected}` in: {message}");
}

/// The ledger, metrics rows and state of two runs are equal but for timings.
fn assert_same_run(expected: &Path, actual: &Path) {
    for file in ["ledger.json", "metrics.jsonl", "state.json"] {
        assert_eq!(
            common::untimed_file(&expected.join(file)),
            common::untimed_file(&actual.join(file)),
            "{file} of {} differs from the uninterrupted run's",
            actual.display()
        );
    }
    assert_eq!(common::read_json(&actual.join("state.json"))["finished"], true);
    assert!(actual.join("report.html").is_file());
}

/// One process of a race, once ended.
struct Ended {
    pid: u32,
    output: Output,
    at: Instant,
}

/// Starts `first`, then `second` after `delay`, and waits for both.
fn race(mut first: Command, mut second: Command, delay: Duration) -> [Ended; 2] {
    let wait = |child: std::process::Child| {
        std::thread::spawn(move || {
            let pid = child.id();
            let output = child.wait_with_output().expect("whale ends");
            Ended { pid, output, at: Instant::now() }
        })
    };
    let first = wait(first.spawn().expect("whale starts"));
    std::thread::sleep(delay);
    let second = wait(second.spawn().expect("whale starts"));
    [first.join().expect("the first"), second.join().expect("the second")]
}

/// Exactly one of a race ran to its end; the other failed at once, naming `dir` and the
/// winner's pid.
fn assert_one_ran(ended: [Ended; 2], dir: &Path) {
    let [a, b] = ended;
    let (winner, loser) = if a.output.status.success() { (a, b) } else { (b, a) };
    assert_success(&winner.output, "the winner of the race");
    assert_refused(&loser.output, dir, winner.pid, "the loser of the race");
    assert!(loser.at < winner.at, "the loser did not fail at once");
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("a directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).expect("a file"));
            }
        }
    }
    files
}

fn state(dir: &Path) -> Option<serde_json::Value> {
    let path = dir.join("state.json");
    path.is_file().then(|| common::read_json(&path))
}

/// Starts the run in `runs` and kills it with SIGKILL a random few milliseconds after its
/// `units`-th unit was committed.
fn kill_after(fixture: &Fixture, runs: &str, units: u64, rng: &mut impl Rng) {
    let dir = fixture.run_dir(runs);
    let mut child = fixture.run(runs).stderr(Stdio::null()).spawn().expect("whale starts");
    while state(&dir).is_none_or(|s| s["units"].as_u64() < Some(units)) {
        assert!(child.try_wait().expect("poll").is_none(), "the run ended before its unit {units}");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(rng.gen_range(0..40)));
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    assert_eq!(state(&dir).expect("a state")["finished"], false, "killed too late");
}

#[test]
fn of_two_resumes_of_one_run_started_at_random_moments_one_runs_and_the_other_is_refused() {
    let fixture = Fixture::new();
    let (output, typical) = timed(fixture.run("straight"));
    assert_success(&output, "the uninterrupted run");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(34);
    kill_after(&fixture, "raced", rng.gen_range(1..=4), &mut rng);
    let dir = fixture.run_dir("raced");
    let delay = typical.mul_f64(rng.gen_range(0.0..0.2));
    assert_one_ran(race(resume(&dir), resume(&dir), delay), &dir);
    assert_same_run(&fixture.run_dir("straight"), &dir);
}

#[test]
fn of_two_compares_of_one_config_started_at_random_moments_one_runs_and_the_other_is_refused() {
    let fixture = Fixture::new();
    let (output, typical) = timed(fixture.compare("straight"));
    assert_success(&output, "the uninterrupted comparison");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(35);
    let delay = typical.mul_f64(rng.gen_range(0.0..0.3));
    assert_one_ran(race(fixture.compare("raced"), fixture.compare("raced"), delay), &fixture.run_dir("raced"));
    for arm in ARMS {
        assert_same_run(&fixture.run_dir("straight").join(arm), &fixture.run_dir("raced").join(arm));
    }
    assert!(fixture.run_dir("raced").join("report.html").is_file());
}

#[test]
fn while_a_directory_is_locked_writers_are_refused_and_write_nothing_and_readers_still_read() {
    let fixture = Fixture::new();
    let runs = text(&fixture.root.join("runs"));
    let args =
        ["run", "--quiet", "--condition", "harness-only", "--name", "w", "--runs", &runs, &text(&fixture.config)];
    assert_success(&whale(&args).output().expect("whale runs"), "the run");
    let run = fixture.run_dir("runs");
    let me = std::process::id();
    let lock = DirLock::acquire(&run).expect("the run's lock");
    let before = snapshot(&run);
    assert_refused(&resume(&run).output().expect("whale"), &run, me, "whale run --resume");
    assert_refused(&fixture.run("runs").output().expect("whale"), &run, me, "whale run into it");
    assert_refused(&whale(&["report", &text(&run)]).output().expect("whale"), &run, me, "whale report into it");
    assert_refused(&whale(&["coupling", "--quiet", &text(&run)]).output().expect("whale"), &run, me, "whale coupling");
    let elsewhere = fixture.root.join("elsewhere.html");
    let report = whale(&["report", &text(&run), "--out", &text(&elsewhere)]).output().expect("whale");
    assert_success(&report, "whale report --out elsewhere");
    assert!(elsewhere.is_file());
    assert_success(&whale(&["archive", &text(&run), "top"]).output().expect("whale"), "whale archive");
    assert_eq!(snapshot(&run), before, "a refused writer or a reader wrote into the run");
    drop(lock);
    assert_success(&whale(&["report", &text(&run)]).output().expect("whale"), "whale report once unlocked");

    for (runs, command) in [("fresh", fixture.run("fresh")), ("compare", fixture.compare("compare"))] {
        let dir = fixture.run_dir(runs);
        let _lock = DirLock::create(&dir).expect("a lock");
        assert_refused(&timed(command).0, &dir, me, runs);
        assert_eq!(snapshot(&dir).into_keys().collect::<Vec<_>>(), [dir.join(".lock")], "{runs} wrote");
    }
    let study = fixture.root.join("studies/study");
    let _lock = DirLock::create(&study).expect("a lock");
    let (studies, config) = (text(&fixture.root.join("studies")), text(&fixture.config));
    for extra in ["--quiet", "--report-only"] {
        let args = ["study", extra, "--seeds", "1", "--runs", studies.as_str(), config.as_str()];
        assert_refused(&whale(&args).output().expect("whale"), &study, me, &format!("whale study {extra}"));
    }
    assert_eq!(snapshot(&study).len(), 1, "the study wrote");

    // Another study with its own runs but the locked study's results would run the same arms.
    let (elsewhere, results) = (fixture.root.join("elsewhere"), study.join("results"));
    let _results_lock = DirLock::create(&results).expect("a lock");
    let args = ["study", "--quiet", "--seeds", "1", "--runs", &text(&elsewhere), "--results", &text(&results), &config];
    assert_refused(&whale(&args).output().expect("whale"), &results, me, "whale study --results");
    let written: Vec<_> = snapshot(&elsewhere).into_keys().collect();
    assert_eq!(written, [elsewhere.join("study/.lock")], "the refused study wrote");
}

/// Makes `path` a link to `/dev/full`: every write to it fails with ENOSPC, as on a full disk.
fn full_disk_at(path: &Path) {
    std::os::unix::fs::symlink("/dev/full", path).expect("a link to /dev/full");
}

fn committed_steps(dir: &Path) -> u64 {
    state(dir).expect("a state")["weight_steps"].as_u64().expect("steps")
}

fn assert_stopped_by_full_disk(output: &Output) {
    let message = stderr(output);
    assert!(!output.status.success(), "the run did not stop: {message}");
    assert!(message.contains("No space left on device"), "{message}");
    assert!(message.contains("whale run --resume"), "{message}");
}

#[test]
fn a_run_stopped_by_a_full_disk_resumes_once_space_is_freed_and_counts_nothing_twice() {
    let fixture = Fixture::new();
    assert_success(&fixture.run("straight").output().expect("whale runs"), "the uninterrupted run");
    let dir = fixture.run_dir("full");
    std::fs::create_dir_all(dir.join("journal")).expect("journal dir");
    let journal = dir.join("journal/.step-000003.json.partial");
    full_disk_at(&journal);
    assert_stopped_by_full_disk(&fixture.run("full").output().expect("whale runs"));
    assert_eq!(committed_steps(&dir), 2, "stopped at the third step's journal");

    std::fs::remove_file(&journal).expect("space freed");
    let ledger = dir.join(".ledger.json.partial");
    full_disk_at(&ledger);
    assert_stopped_by_full_disk(&resume(&dir).output().expect("whale resumes"));
    assert_eq!(committed_steps(&dir), 2, "the third step's commit failed");
    let committed = state(&dir).expect("a state")["metrics_rows"].as_u64().expect("rows") as usize;
    let written = std::fs::read_to_string(dir.join("metrics.jsonl")).expect("metrics").lines().count();
    assert!(written > committed, "the failed step's rows were appended before its commit");

    std::fs::remove_file(&ledger).expect("space freed");
    assert_success(&resume(&dir).output().expect("whale resumes"), "the resume after space was freed");
    assert_same_run(&fixture.run_dir("straight"), &dir);
}
