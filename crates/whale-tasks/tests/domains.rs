//! Every registered domain, through the one trait the layers above use: the answer keys that
//! majority voting compares, on the real files in shared/data.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use whale_core::{Domain, Task};
use whale_tasks::{task_domain, TaskDomain};

fn data_path(relative: &str) -> PathBuf {
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data").join(relative);
    if beside_repo.exists() {
        return beside_repo;
    }
    let root = std::env::var("WHALE_SHARED_DATA").expect("shared data not found: set WHALE_SHARED_DATA");
    Path::new(&root).join(relative)
}

fn load(domain: Domain, relative: &str) -> (&'static dyn TaskDomain, Vec<Task>) {
    let registered = task_domain(domain);
    let report = registered.load(&data_path(relative));
    assert!(report.rejected.is_empty(), "{relative}: {:?}", report.rejected.first());
    (registered, report.into_tasks())
}

/// `1234567` as `1,234,567`.
fn with_thousands_separators(digits: &str) -> String {
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    grouped
}

#[test]
fn gsm8k_answers_in_any_spelling_share_one_key() {
    let (math, tasks) = load(Domain::Math, "math/gsm8k/test.jsonl");
    let mut separated = 0;
    for task in &tasks {
        let gold = task.payload["answer"].as_str().expect("a string answer");
        let key = math.answer_key(&json!(gold));
        assert!(!key.is_empty(), "{}", task.id);
        let grouped = with_thousands_separators(gold.trim_start_matches('-'));
        let grouped = if gold.starts_with('-') { format!("-{grouped}") } else { grouped };
        separated += usize::from(grouped.contains(','));
        for spelling in [format!("So the total is {grouped}.\n#### {grouped}"), format!(r"$\boxed{{{gold}.0}}$")] {
            assert_eq!(math.answer_key(&json!(spelling)), key, "{}: {spelling:?}", task.id);
        }
        assert_ne!(math.answer_key(&json!(format!("#### {gold}1"))), key, "{}", task.id);
    }
    assert!(separated > 50, "the file has answers of a thousand and more: {separated}");
}

#[test]
fn hotpotqa_answers_vote_together_whatever_their_case_article_and_punctuation() {
    let (qa, tasks) = load(Domain::Qa, "qa/hotpotqa_distractor_dev/rpt_dev_300.jsonl");
    for task in &tasks {
        let gold = task.payload["answers"][0].as_str().expect("an answer");
        let key = qa.answer_key(&json!(gold));
        assert!(!key.is_empty(), "{}: {gold:?}", task.id);
        assert_eq!(qa.answer_key(&json!(format!("  The {}.", gold.to_uppercase()))), key, "{}", task.id);
        let score = qa.score(task, gold);
        assert_eq!((score.em, score.f1), (Some(1.0), Some(1.0)), "{}", task.id);
    }
    assert!(qa.scores_em_f1());
}

#[test]
fn a_chess_answer_is_keyed_by_the_moves_played() {
    let (chess, tasks) = load(Domain::Chess, "chess/kagi_llm_chess_puzzles.csv");
    for task in &tasks {
        let gold = chess.gold_actions(task);
        assert_eq!(chess.answer_key(&json!(gold)), gold.join(" "), "{}", task.id);
        assert!(chess.score(task, &gold.join(" ")).verdict.success, "{}", task.id);
    }
    assert_eq!(chess.answer_key(&Value::Array(vec![])), "", "no moves, no vote");
    assert!(!chess.scores_em_f1());
}

#[test]
fn a_math500_answer_boxed_in_prose_votes_with_the_bare_answer() {
    let (math, tasks) = load(Domain::Math, "math/math500/test.jsonl");
    let mut differ = Vec::new();
    for task in &tasks {
        let gold = task.payload["answer"].as_str().expect("a string answer");
        let boxed = math.answer_key(&json!(format!("Working through it, the answer is $\\boxed{{{gold}}}$.")));
        if boxed != math.answer_key(&json!(gold)) {
            differ.push((gold.to_string(), boxed));
        }
    }
    assert!(differ.is_empty(), "{} differ: {:?}", differ.len(), &differ[..differ.len().min(10)]);
}
