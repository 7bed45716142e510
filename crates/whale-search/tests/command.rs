//! The command proposer: a shell command in a scratch copy of the archive, answering with
//! `pending.json`; every way it can fail is an error the search records.

mod common;

use common::{tasks, SumEvaluator, PARSED, PLAIN};
use serde_json::json;
use std::fs;
use std::path::Path;
use std::time::Instant;
use whale_core::Domain;
use whale_harness::Limits;
use whale_search::{
    Archive, CandidateResult, CommandConfig, CommandProposer, HarnessSearch, ProposalContext, Proposer, ProposerError,
    SearchConfig, SearchError,
};

fn seeded(dir: &Path) -> Archive {
    let mut archive = Archive::open(dir).expect("archive");
    archive.seed(PLAIN, "start").expect("seed");
    archive
}

fn command(line: &str, timeout_s: u64) -> CommandProposer {
    CommandProposer::new(CommandConfig { command: line.to_string(), timeout_s })
}

/// Runs `line` as the proposer of iteration 1 of a seeded archive.
fn propose(line: &str, timeout_s: u64) -> (Result<Vec<whale_search::Proposal>, ProposerError>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = seeded(dir.path());
    let limits = Limits::default();
    let incumbent = archive.incumbent().expect("incumbent").clone();
    let ctx = ProposalContext {
        archive: archive.root(),
        incumbent: &incumbent,
        domain: Domain::Math,
        candidates: 3,
        iteration: 1,
        weights_version: 0,
        seed: 0,
        examples: &[],
        limits: &limits,
        prompt_only: false,
        failures: &[],
    };
    (command(line, timeout_s).propose(&ctx), dir)
}

#[test]
fn a_command_edits_a_scratch_copy_and_its_pending_candidates_are_scored() {
    let outside = tempfile::tempdir().expect("tempdir");
    let pending = json!([
        {"file": "edited/harness.js", "hypothesis": "ask for the sum only"},
        {"source": PARSED, "hypothesis": "parse the last number", "parent": "c0000"},
    ]);
    fs::write(outside.path().join("pending.json"), pending.to_string()).expect("pending");
    let script = format!(
        "test -f request.json && test -f harness-api.md || exit 3\n\
         grep -q '\"candidates\":2' request.json || exit 4\n\
         mkdir edited\n\
         sed 's/Reply with the sum./Reply with the sum only./' \"candidates/$WHALE_INCUMBENT/harness.js\" > edited/harness.js\n\
         cp '{}' pending.json\n\
         rm -rf candidates results summary.jsonl\n\
         echo \"proposed for iteration $WHALE_ITERATION\"\n",
        outside.path().join("pending.json").display()
    );
    fs::write(outside.path().join("propose.sh"), script).expect("script");
    let dir = tempfile::tempdir().expect("tempdir");
    let proposer = command(&format!("sh '{}'", outside.path().join("propose.sh").display()), 30);
    let config = SearchConfig { candidates: 2, ..SearchConfig::default() };
    let mut search =
        HarnessSearch::new(seeded(dir.path()), Domain::Math, tasks(4), Box::new(proposer), config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    assert_eq!(report.proposer_error, None);
    let hypotheses: Vec<&str> = report.candidates.iter().map(|c| c.hypothesis.as_str()).collect();
    assert_eq!(hypotheses, ["ask for the sum only", "parse the last number"]);
    assert!(report.candidates.iter().all(|c| matches!(c.result, CandidateResult::Scored { .. })));
    let edited = search.archive().candidate(&report.candidates[0].candidate.id).expect("edited");
    assert!(edited.source.contains("Reply with the sum only.") && edited.meta.parent.as_deref() == Some("c0000"));
    assert!(dir.path().join("candidates/c0000/harness.js").exists(), "the archive itself is untouched");
    assert!(dir.path().join("summary.jsonl").exists());
    let session = fs::read_to_string(dir.path().join("sessions/1.json")).expect("session");
    assert!(session.contains("proposed for iteration 1") && session.contains("\"status\":0"), "{session}");
}

#[test]
fn a_failing_command_is_recorded_and_stops_the_search() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proposer = command("echo 'the agent crashed' >&2; exit 7", 30);
    let mut search =
        HarnessSearch::new(seeded(dir.path()), Domain::Math, tasks(4), Box::new(proposer), SearchConfig::default())
            .expect("search");
    let error = search.iterate(&SumEvaluator::new(1)).expect_err("a failed proposer command stops the search");
    let SearchError::Proposer { iteration: 1, error, .. } = &error else { panic!("{error}") };
    assert!(error.contains("exit status: 7") && error.contains("the agent crashed"), "{error}");
    assert!(fs::read_to_string(dir.path().join("summary.jsonl")).expect("summary").contains("proposer_failed"));
    assert!(fs::read_to_string(dir.path().join("sessions/1.json")).expect("session").contains("the agent crashed"));
    assert_eq!(search.archive().next_iteration(), 1, "the iteration is not concluded: a resumed run repeats it");
}

#[test]
fn a_command_that_runs_too_long_is_stopped_with_everything_it_started() {
    let started = Instant::now();
    let pids = tempfile::tempdir().expect("tempdir");
    let pid_file = pids.path().join("grandchild");
    let (outcome, _dir) = propose(&format!("sleep 30 & echo $! > '{}'; sleep 30", pid_file.display()), 1);
    assert!(matches!(outcome, Err(ProposerError::Command(ref m)) if m.contains("timed out after 1 s")), "{outcome:?}");
    assert!(started.elapsed().as_secs() < 10, "the command was killed, not waited for");
    if !cfg!(target_os = "linux") {
        return;
    }
    let grandchild = fs::read_to_string(&pid_file).expect("the pid the command wrote");
    let stat = Path::new("/proc").join(grandchild.trim()).join("stat");
    let gone = |stat: &Path| {
        fs::read_to_string(stat).map_or(true, |s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    while !gone(&stat) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(gone(&stat), "the command's background child was killed with it");
}

#[test]
fn a_missing_malformed_or_escaping_pending_file_is_an_error() {
    let cases = [
        ("true", "cannot read it"),
        ("echo '{\"not\": \"a list\"}' > pending.json", "not a list of candidates"),
        ("echo '[{\"hypothesis\": \"h\"}]' > pending.json", "exactly one of `file` and `source`"),
        ("echo '[{\"file\": \"../../etc/passwd\", \"hypothesis\": \"h\"}]' > pending.json", "climbs out"),
        ("echo '[{\"file\": \"/etc/passwd\", \"hypothesis\": \"h\"}]' > pending.json", "is absolute"),
        ("ln -s /etc/passwd p.js; echo '[{\"file\": \"p.js\", \"hypothesis\": \"h\"}]' > pending.json", "outside"),
    ];
    for (line, expected) in cases {
        let (outcome, _dir) = propose(line, 30);
        match outcome {
            Err(ProposerError::Pending(message)) => assert!(message.contains(expected), "{line}: {message}"),
            other => panic!("{line}: {other:?}"),
        }
    }
}
