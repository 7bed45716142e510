//! The harness search end to end, with real rollouts of the `Sum` world.

mod common;

use common::{tasks, Script, ScriptedProposer, SumEvaluator, COSTLIER, PARSED, PARSED_SMALL, PLAIN, WRONG};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use whale_core::{Domain, Split, Task};
use whale_harness::{content_hash, Limits};
use whale_search::{
    Acceptance, Archive, ArchiveError, CandidateResult, Evaluator, HarnessSearch, MutateProposer, Mutation, Proposal,
    ProposalRecord, Proposer, ScoreCard, SearchConfig, SearchError, SummaryEvent,
};

const N: usize = 8;

fn seeded(dir: &Path) -> Archive {
    let mut archive = Archive::open(dir).expect("archive");
    archive.seed(PLAIN, "the starting harness").expect("seed");
    archive
}

fn search(dir: &Path, proposer: Box<dyn Proposer>, acceptance: Acceptance) -> HarnessSearch {
    let config = SearchConfig { acceptance, ..SearchConfig::default() };
    HarnessSearch::new(seeded(dir), Domain::Math, tasks(N), proposer, config).expect("search")
}

fn scripted(steps: Vec<Script>) -> Box<dyn Proposer> {
    Box::new(ScriptedProposer::new(steps))
}

fn summed_rollouts(archive: &Archive) -> usize {
    archive.events().iter().map(SummaryEvent::rollouts).sum()
}

#[test]
fn pareto_keeps_the_incumbent_when_no_candidate_is_better() {
    let dir = tempfile::tempdir().expect("tempdir");
    let same_behaviour = "// a comment changes the hash, not the behaviour\n".to_string() + PLAIN;
    let same: &'static str = Box::leak(same_behaviour.into_boxed_str());
    let proposer = scripted(vec![Script::Propose(vec![(COSTLIER, "an extra call"), (same, "a comment")])]);
    let mut search = search(dir.path(), proposer, Acceptance::Pareto);
    let evaluator = SumEvaluator::new(1);
    let rescore = search.rescore_incumbent(&evaluator).expect("rescore");
    assert_eq!(rescore.card.objectives.success, 0.0, "the prose answers fail the verifier");
    assert_eq!(rescore.rollouts, N);
    let report = search.iterate(&evaluator).expect("iterate");
    assert_eq!(report.iteration, 1);
    assert_eq!(report.accepted, None);
    assert!(!report.new_best);
    assert_eq!(report.candidates.len(), 2);
    assert!(report.candidates.iter().all(|c| matches!(c.result, CandidateResult::Scored { .. })));
    assert_eq!(search.incumbent().meta.hash, content_hash(PLAIN));
    assert_eq!(report.rollouts, 2 * (1 + N), "a smoke rollout and N scoring rollouts per candidate");
    assert_eq!(evaluator.rollouts(), N + 2 * (1 + N));
    assert_eq!(summed_rollouts(search.archive()), evaluator.rollouts());
}

#[test]
fn a_better_candidate_is_accepted_and_the_next_iteration_starts_from_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proposer = scripted(vec![
        Script::Propose(vec![(WRONG, "constant"), (PARSED, "parse the last number")]),
        Script::Propose(vec![(WRONG, "constant")]),
    ]);
    let mut search = search(dir.path(), proposer, Acceptance::Pareto);
    let evaluator = SumEvaluator::new(1);
    search.rescore_incumbent(&evaluator).expect("rescore");
    let first = search.iterate(&evaluator).expect("iterate");
    let accepted = first.accepted.clone().expect("the parsing candidate wins");
    assert_eq!(accepted.hash, content_hash(PARSED));
    assert!(first.new_best);
    assert_eq!(search.incumbent().meta.id, accepted.id);
    let second = search.iterate(&evaluator).expect("iterate");
    assert_eq!(second.incumbent, accepted);
    assert_eq!(second.incumbent_objectives.success, 1.0);
    assert_eq!(second.accepted, None);
    let frontier: whale_search::Frontier =
        serde_json::from_str(&fs::read_to_string(dir.path().join("frontier.json")).expect("frontier")).expect("json");
    assert_eq!(frontier.incumbent, accepted);
    assert!(frontier.front.iter().any(|e| e.hash == accepted.hash));
    assert!(frontier.front.iter().all(|e| e.hash != content_hash(WRONG)), "a dominated candidate is off the front");
}

#[test]
fn a_margin_ignores_a_small_gain_that_pareto_takes() {
    let run = |acceptance| {
        let dir = tempfile::tempdir().expect("tempdir");
        let proposer = scripted(vec![Script::Propose(vec![(PARSED_SMALL, "parse on small tasks")])]);
        let mut search = search(dir.path(), proposer, acceptance);
        let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
        let CandidateResult::Scored { objectives, .. } = report.candidates[0].result else { panic!("scored") };
        (objectives.success, report.accepted.is_some())
    };
    let (success, accepted) = run(Acceptance::Pareto);
    assert_eq!(success, 0.25, "tasks 0 and 4 have a = 0");
    assert!(accepted);
    assert_eq!(run(Acceptance::Margin(0.3)), (0.25, false));
    assert_eq!(run(Acceptance::Margin(0.2)), (0.25, true));
    let bootstrap = Acceptance::PairedBootstrap { resamples: 1000, confidence: 0.99 };
    assert_eq!(run(bootstrap), (0.25, false), "a gain on 2 of 8 tasks is not 99% sure");
    let lenient = Acceptance::PairedBootstrap { resamples: 1000, confidence: 0.8 };
    assert_eq!(run(lenient), (0.25, true), "but it is 80% sure (1 - (6/8)^8 = 0.90)");
}

#[test]
fn a_crashing_proposer_is_recorded_and_the_run_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proposer = scripted(vec![
        Script::Panic,
        Script::Fail("the model server is down"),
        Script::Propose(vec![(PARSED, "parse")]),
    ]);
    let mut search = search(dir.path(), proposer, Acceptance::Pareto);
    let evaluator = SumEvaluator::new(1);
    let panicked = search.iterate(&evaluator).expect("a panic does not stop the run");
    assert!(panicked.proposer_error.as_deref().is_some_and(|e| e.contains("scripted proposer crash")));
    assert!(panicked.candidates.is_empty() && panicked.accepted.is_none());
    let failed = search.iterate(&evaluator).expect("an error does not stop the run");
    assert!(failed.proposer_error.as_deref().is_some_and(|e| e.contains("the model server is down")));
    let third = search.iterate(&evaluator).expect("iterate");
    assert_eq!(third.iteration, 3);
    assert!(third.accepted.is_some());
    let failures: Vec<u64> = search
        .archive()
        .events()
        .iter()
        .filter_map(|e| match e {
            SummaryEvent::ProposerFailed { iteration, proposer, .. } if proposer == "scripted" => Some(*iteration),
            _ => None,
        })
        .collect();
    assert_eq!(failures, [1, 2]);
}

const UNTERMINATED: &str = "export function solve(task, ctx) { return ctx.llm.chat(\"x\").text;\n";
const NO_SOLVE: &str = "export const meta = { name: \"no solve\" };\n";
const SPINS: &str = "while (true) {}\nexport function solve() {}\n";
const THROWS: &str = "export function solve(task, ctx) { return ctx.env.missing.field; }\n";

#[test]
fn invalid_candidates_are_recorded_with_their_reason_and_valid_ones_are_scored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proposer = scripted(vec![Script::Propose(vec![
        (UNTERMINATED, "syntax"),
        (NO_SOLVE, "no export"),
        (SPINS, "top level loops"),
        (THROWS, "throws in solve"),
        (PARSED, "parse"),
    ])]);
    let limits = Limits { compute_ms: 200, ..Limits::default() };
    let config = SearchConfig { candidates: 5, limits, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(seeded(dir.path()), Domain::Math, tasks(N), proposer, config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    let reasons: Vec<String> = report
        .candidates
        .iter()
        .filter_map(|c| match &c.result {
            CandidateResult::Rejected { reason } => Some(reason.clone()),
            CandidateResult::Scored { .. } => None,
        })
        .collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert!(reasons[0].contains("does not compile"), "{}", reasons[0]);
    assert!(reasons[1].contains("does not export a `solve` function"), "{}", reasons[1]);
    assert!(reasons[2].contains("Timeout"), "{}", reasons[2]);
    assert!(reasons[3].contains("smoke rollout failed (Exception)"), "{}", reasons[3]);
    assert_eq!(report.rollouts, N + 1 + (1 + N), "the incumbent, then only the smoke-tested and the scored candidate");
    assert_eq!(report.accepted.as_ref().map(|a| a.hash.as_str()), Some(content_hash(PARSED).as_str()));
    let rejected = &report.candidates[3].candidate;
    let meta = fs::read_to_string(dir.path().join("candidates").join(&rejected.id).join("meta.json")).expect("meta");
    assert!(meta.contains("smoke rollout failed"), "{meta}");
    assert!(!dir.path().join("results").join(&rejected.hash).exists(), "a rejected candidate has no results");
}

/// PARSED with the first search task's question written into it, as a small proposer model
/// wrote one of the question it was shown failing.
const COPIES_A_QUESTION: &str = r#"const SEEN = "What is the SUM of 0 and 3,\n  written in digits?";
export function solve(task, ctx) {
  const reply = ctx.llm.chat(ctx.env.observation, { max_tokens: 32 });
  const numbers = reply.text.match(/-?\d+/g);
  return numbers ? numbers[numbers.length - 1] : undefined;
}
"#;

#[test]
fn a_candidate_that_copies_a_search_task_s_question_is_rejected_before_any_rollout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut asked = tasks(N);
    for task in &mut asked {
        let question =
            format!("What is the sum of {} and {}, written in digits?", task.payload["a"], task.payload["b"]);
        task.payload["question"] = serde_json::json!(question);
    }
    let proposer = scripted(vec![Script::Propose(vec![(COPIES_A_QUESTION, "copy"), (PARSED, "parse")])]);
    let config = SearchConfig { candidates: 2, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(seeded(dir.path()), Domain::Math, asked, proposer, config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    match &report.candidates[0].result {
        CandidateResult::Rejected { reason } => assert_eq!(
            reason,
            "copies a search task's question: task sum-0 asks \"What is the sum of 0 and 3, written in digits?\""
        ),
        other => panic!("the copy was not rejected: {other:?}"),
    }
    assert_eq!(report.rollouts, N + 1 + N, "the incumbent, then the honest candidate's smoke and scoring only");
    assert_eq!(report.accepted.as_ref().map(|a| a.hash.as_str()), Some(content_hash(PARSED).as_str()));
    let record = ProposalRecord::from_events(search.archive().events());
    assert_eq!(record.rejected.get("copies a search task's question"), Some(&1), "{:?}", record.rejected);
}

/// Proposes one source, naming a given candidate as its parent.
struct NamingParent {
    source: &'static str,
    parent: String,
}

impl Proposer for NamingParent {
    fn name(&self) -> &str {
        "scripted"
    }

    fn propose(&mut self, _: &whale_search::ProposalContext<'_>) -> Result<Vec<Proposal>, whale_search::ProposerError> {
        Ok(vec![Proposal { source: self.source.into(), hypothesis: "again".into(), parent: Some(self.parent.clone()) }])
    }
}

#[test]
fn naming_a_rejected_copy_as_parent_does_not_make_its_question_inherited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut asked = tasks(N);
    asked[0].payload["question"] = serde_json::json!("What is the sum of 0 and 3, written in digits?");
    let proposer = scripted(vec![Script::Propose(vec![(COPIES_A_QUESTION, "copy")])]);
    let config = SearchConfig { candidates: 1, ..SearchConfig::default() };
    let mut search =
        HarnessSearch::new(seeded(dir.path()), Domain::Math, asked.clone(), proposer, config.clone()).expect("search");
    let first = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    let rejected = first.candidates[0].candidate.id.clone();
    let archive = search.into_archive();
    let again = Box::new(NamingParent { source: COPIES_A_QUESTION, parent: rejected });
    let mut search = HarnessSearch::new(archive, Domain::Math, asked, again, config).expect("search");
    let second = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    assert!(
        matches!(&second.candidates[0].result, CandidateResult::Rejected { reason } if reason.starts_with("copies a search task's question")),
        "{:?}",
        second.candidates[0].result
    );
}

#[test]
fn results_are_keyed_by_content_hash_and_weights_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proposer = scripted(vec![Script::Propose(vec![(PARSED, "parse")]), Script::Propose(vec![(PLAIN, "back")])]);
    let mut search = search(dir.path(), proposer, Acceptance::Pareto);
    let evaluator = SumEvaluator::new(1);
    search.iterate(&evaluator).expect("iterate");
    let accepted = search.incumbent().clone();
    assert_eq!(accepted.meta.hash, content_hash(PARSED));
    let spent = evaluator.rollouts();

    // The same source as an earlier candidate, under a new id: its scores are reused.
    let again = search.iterate(&evaluator).expect("iterate");
    assert_eq!(evaluator.rollouts(), spent, "no rollout for a source already scored under these weights");
    assert_eq!(again.rollouts, 0);
    assert!(matches!(again.candidates[0].result, CandidateResult::Scored { reused: true, .. }));
    assert_ne!(again.candidates[0].candidate.id, "c0000", "a new candidate id");
    assert_eq!(again.candidates[0].candidate.hash, content_hash(PLAIN));
    drop(search);

    // Renaming the incumbent's directory loses nothing: it is found, and scored, by hash.
    let candidates = dir.path().join("candidates");
    fs::rename(candidates.join(&accepted.meta.id), candidates.join("renamed")).expect("rename");
    let archive = Archive::open(dir.path()).expect("reopen");
    assert_eq!(archive.incumbent().map(|c| c.meta.id.as_str()), Some("renamed"));
    let mut search =
        HarnessSearch::new(archive, Domain::Math, tasks(N), scripted(vec![]), SearchConfig::default()).expect("search");
    let rescore = search.rescore_incumbent(&evaluator).expect("rescore");
    assert_eq!((rescore.rollouts, evaluator.rollouts()), (0, spent));
    assert_eq!(rescore.card.objectives.success, 1.0);

    // New weights: the incumbent is scored again, into a results directory of its own.
    let newer = SumEvaluator::new(2);
    let rescore = search.rescore_incumbent(&newer).expect("rescore");
    assert_eq!((rescore.rollouts, newer.rollouts()), (N, N));
    let results = dir.path().join("results").join(&accepted.meta.hash);
    assert!(results.join("w1/scores.json").exists() && results.join("w2/traces.jsonl").exists());
    assert_eq!(search.archive().traces(&accepted.meta.hash, 2).expect("traces").len(), N);
}

#[test]
fn the_archive_never_holds_a_test_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let test_task = Task { id: "sum-test-0".into(), split: Some(Split::Test), ..tasks(1).remove(0) };
    let mut with_test = tasks(N);
    with_test.push(test_task.clone());
    let refused =
        HarnessSearch::new(seeded(dir.path()), Domain::Math, with_test, scripted(vec![]), SearchConfig::default());
    assert!(
        matches!(refused, Err(SearchError::Archive(ArchiveError::TestTask { task_id })) if task_id == "sum-test-0")
    );

    let mut archive = seeded(dir.path());
    archive.forbid_task_ids(["sum-3".to_string()]);
    let refused = HarnessSearch::new(archive, Domain::Math, tasks(N), scripted(vec![]), SearchConfig::default());
    assert!(matches!(refused, Err(SearchError::Archive(ArchiveError::TestTask { task_id })) if task_id == "sum-3"));

    let mut archive = Archive::open(dir.path()).expect("reopen");
    archive.forbid_task_ids(["sum-test-0".to_string()]);
    let disguised = Task { split: Some(Split::Search), ..test_task.clone() };
    let card = ScoreCard::from_trajectories("h", 1, &[]);
    assert!(matches!(archive.record_results(&[disguised], &card, &[]), Err(ArchiveError::TestTask { .. })));

    // Test trajectories handed over as few-shot material never reach the proposer, while
    // training ones become examples inside a candidate.
    let evaluator = SumEvaluator::new(1);
    let train = Task { id: "sum-train-0".into(), split: Some(Split::Train), ..tasks(1).remove(0) };
    let test = Task { payload: serde_json::json!({"a": 100, "b": 200}), ..test_task };
    let examples = evaluator.score(&whale_harness::Harness::from_source(PARSED), &[train, test]).expect("examples");
    assert!(examples.iter().all(|t| t.success));
    let proposer = MutateProposer::with_mutations(vec![Mutation::FewShot]);
    let mut search = HarnessSearch::new(archive, Domain::Math, tasks(N), Box::new(proposer), SearchConfig::default())
        .expect("search");
    search.set_examples(examples);
    search.rescore_incumbent(&evaluator).expect("rescore");
    let report = search.iterate(&evaluator).expect("iterate");
    let shot = search.archive().candidate(&report.candidates[0].candidate.id).expect("few-shot candidate");
    assert!(shot.source.contains("whale:layer few-shot") && shot.source.contains("What is 0 + 3?"));
    assert!(!tree_contains(dir.path(), "100 + 200"), "no file of the archive holds the test task");
    assert!(!tree_contains(dir.path(), "sum-test-0"));
    assert!(tree_contains(dir.path(), "sum-3"));
}

fn tree_contains(dir: &Path, needle: &str) -> bool {
    fs::read_dir(dir).expect("dir").filter_map(Result::ok).any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            tree_contains(&path, needle)
        } else {
            fs::read_to_string(&path).is_ok_and(|text| text.contains(needle))
        }
    })
}

/// The state a reopened archive restores.
fn state(dir: &Path) -> (u64, String, BTreeSet<String>) {
    let archive = Archive::open(dir).expect("reopen");
    let incumbent = archive.incumbent().expect("incumbent").meta.hash.clone();
    let candidates = archive.candidates().map(|c| format!("{}:{}", c.meta.id, c.meta.hash)).collect();
    (archive.next_iteration(), incumbent, candidates)
}

#[test]
fn a_killed_iteration_resumes_with_nothing_lost_and_nothing_counted_twice() {
    let script = || {
        vec![
            Script::Propose(vec![(WRONG, "constant"), (PARSED_SMALL, "small"), (PARSED, "parse")]),
            Script::Propose(vec![(PLAIN, "back")]),
        ]
    };
    let whole = tempfile::tempdir().expect("tempdir");
    let mut uninterrupted = search(whole.path(), scripted(script()), Acceptance::Pareto);
    let evaluator = SumEvaluator::new(1);
    uninterrupted.rescore_incumbent(&evaluator).expect("rescore");
    let expected = uninterrupted.iterate(&evaluator).expect("iterate");
    let expected_rollouts = evaluator.rollouts();

    let dir = tempfile::tempdir().expect("tempdir");
    let mut killed = search(dir.path(), scripted(script()), Acceptance::Pareto);
    let mut dying = SumEvaluator::new(1);
    killed.rescore_incumbent(&dying).expect("rescore");
    let before = state(dir.path());
    // Calls: rescore, then smoke + score for WRONG, smoke for PARSED_SMALL; its scoring dies.
    dying.fail_after = Some(4);
    assert!(matches!(killed.iterate(&dying), Err(SearchError::Evaluator(_))));
    drop(killed);
    let after_kill = state(dir.path());
    assert_eq!((after_kill.0, &after_kill.1), (before.0, &before.1), "the iteration did not conclude");
    assert_eq!(after_kill.2.len(), 3, "the seed and the two candidates written before the kill are kept");

    let resumed_evaluator = SumEvaluator::new(1);
    let archive = Archive::open(dir.path()).expect("reopen");
    let mut resumed = HarnessSearch::new(archive, Domain::Math, tasks(N), scripted(script()), SearchConfig::default())
        .expect("search");
    let report = resumed.iterate(&resumed_evaluator).expect("resume");
    assert_eq!(report.iteration, expected.iteration);
    assert_eq!(report.accepted.as_ref().map(|a| &a.hash), expected.accepted.as_ref().map(|a| &a.hash));
    let objectives = |r: &whale_search::IterationReport| {
        r.candidates.iter().map(|c| (c.candidate.clone(), format!("{:?}", c.result))).collect::<Vec<_>>()
    };
    let (mut got, mut want) = (objectives(&report), objectives(&expected));
    for entry in got.iter_mut().chain(want.iter_mut()) {
        entry.1 = entry.1.replace("reused: true", "reused: false");
    }
    assert_eq!(got, want, "the same candidates, ids and scores as a run that was never killed");
    assert_eq!(state(dir.path()), state(whole.path()));
    assert_eq!(
        dying.rollouts() + resumed_evaluator.rollouts(),
        expected_rollouts,
        "no rollout ran twice: the resumed iteration reused what the killed one recorded"
    );
    assert_eq!(summed_rollouts(resumed.archive()), summed_rollouts(uninterrupted.archive()));
    let lines = |d: &Path| fs::read_to_string(d.join("summary.jsonl")).expect("summary").lines().count();
    assert_eq!(lines(dir.path()), lines(whole.path()), "no event logged twice");
}

#[test]
fn the_mutation_proposer_finds_and_keeps_an_answer_parsing_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = SearchConfig { seed: 11, ..SearchConfig::default() };
    let proposer = Box::new(MutateProposer::default());
    let mut search = HarnessSearch::new(seeded(dir.path()), Domain::Math, tasks(N), proposer, config).expect("search");
    let evaluator = SumEvaluator::new(1);
    search.rescore_incumbent(&evaluator).expect("rescore");
    let mut accepted = Vec::new();
    for _ in 0..6 {
        let report = search.iterate(&evaluator).expect("iterate");
        assert_eq!(report.proposer_error, None);
        assert_eq!(report.candidates.len(), 3, "M candidates, all valid");
        for candidate in &report.candidates {
            assert!(matches!(candidate.result, CandidateResult::Scored { .. }), "{:?}", candidate.result);
        }
        if let Some(winner) = report.accepted {
            let hypothesis = search.archive().candidate(&winner.id).expect("candidate").meta.hypothesis.clone();
            accepted.push(hypothesis);
        }
    }
    let success = search.rescore_incumbent(&evaluator).expect("rescore").card.objectives.success;
    assert_eq!(success, 1.0, "accepted: {accepted:?}");
    assert!(accepted.iter().any(|h| h.starts_with("Answer parsing")), "{accepted:?}");
    assert!(search.incumbent().source.contains("// whale:layer parse-"));
}

#[test]
fn a_prompt_only_search_rejects_code_changes_unscored_and_scores_prompt_rewrites() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reworded = PLAIN.replace("Read the question carefully.", "Answer with the number only.");
    let reworded: &'static str = Box::leak(reworded.into_boxed_str());
    let proposer = scripted(vec![Script::Propose(vec![(PARSED, "parse the last number"), (reworded, "reword")])]);
    let config = SearchConfig { prompt_only: true, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(seeded(dir.path()), Domain::Math, tasks(N), proposer, config).expect("search");
    let evaluator = SumEvaluator::new(1);
    search.rescore_incumbent(&evaluator).expect("rescore");
    let report = search.iterate(&evaluator).expect("iterate");
    let CandidateResult::Rejected { reason } = &report.candidates[0].result else {
        panic!("the parsing change is code: {:?}", report.candidates[0].result)
    };
    assert!(reason.contains("only its prompt text may change"), "{reason}");
    assert!(matches!(report.candidates[1].result, CandidateResult::Scored { .. }), "{:?}", report.candidates[1]);
    assert_eq!(report.rollouts, 1 + N, "the rejected candidate cost no rollout");
}
