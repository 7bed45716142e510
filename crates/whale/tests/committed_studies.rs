//! The study results committed under `docs/results/` stay readable: `whale study --report-only`
//! on each committed results directory, with the command its docs name, accepts every file and
//! prints the tables of the committed `study.txt` again. A change to the result file's format,
//! to a config's hash or to the statistics that broke or moved them fails here, not in a
//! reader's checkout.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `whale study CONFIG --report-only --results RESULTS ARGS...` run from the repository root,
/// writing its study directory under a fresh temporary `--runs`; its stdout.
fn report_only(config: &str, results: &str, args: &[&str]) -> String {
    let runs = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(env!("CARGO_BIN_EXE_whale"))
        .current_dir(repo())
        .args(["study", config, "--report-only", "--results", results, "--runs"])
        .arg(runs.path())
        .args(args)
        .output()
        .expect("whale runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "whale study {config} --report-only --results {results}: {stderr}");
    String::from_utf8(output.stdout).expect("utf-8")
}

/// The tables of a study's text: without the `cpu:` line the study printed first (the machine
/// it ran on; `--report-only` lists each seed's CPU in the tables instead) and the lines from
/// `results:` on (paths and the wall time of the invocation).
fn tables(text: &str) -> Vec<&str> {
    text.lines().filter(|line| !line.starts_with("cpu: ")).take_while(|line| !line.starts_with("results: ")).collect()
}

#[test]
fn the_committed_studies_report_their_committed_tables_from_their_result_files() {
    let studies = [
        ("examples/math.toml", "docs/results/study-math-amd-epyc", &["--seeds", "3"][..]),
        (
            "docs/results/study-smollm2-quick/qa-smollm2.toml",
            "docs/results/study-smollm2-quick",
            &["--quick", "--seeds", "4"],
        ),
        ("examples/qa-smollm2.toml", "docs/results/study-smollm2", &["--seeds", "3", "--name", "study-smollm2"]),
    ];
    for (config, dir, args) in studies {
        let printed = report_only(config, &format!("{dir}/results"), args);
        let committed = std::fs::read_to_string(repo().join(dir).join("study.txt")).expect("study.txt");
        assert_eq!(tables(&printed), tables(&committed), "{dir}: the tables differ from study.txt");
    }
}
