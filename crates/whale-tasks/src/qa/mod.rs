//! Search-based question answering: the agent gets a question, searches a passage corpus with
//! BM25, and submits a short answer judged by SQuAD exact match (or token F1) over all aliases.
//!
//! Real tasks come from HotpotQA (distractor setting), NQ-open and FlashRAG files; synthetic
//! ones from a fictional knowledge base whose facts no model can know in advance. HotpotQA-form
//! tasks carry their context paragraphs, and those paragraphs are the corpus they search.
//!
//! Payload of a QA [`Task`]: `{"question", "answers": [..], "source": "hotpotqa" | "nq_open" |
//! "flashrag" | "generated", "type"?, "level"?, "context"?: [{"title", "text"}],
//! "supporting_titles"?: [..]}`.

mod corpus;
mod domain;
mod environment;
mod generator;
mod jsonl;
mod payload;
mod records;
mod retriever;
mod verifier;

pub use corpus::{corpus_from_tasks, load_corpus, Passage};
pub use domain::{corpus_environment, QaCorpus, QaDomain};
pub use environment::{episode, QaConfig, QaEpisode};
pub use generator::generate;
pub use payload::{ContextParagraph, QaPayload, Source};
pub use records::{load, parse_record, write_native};
pub use retriever::{Hit, IndexOrigin, QaError, Retriever, FINGERPRINT_FILE};
pub use verifier::{exact_match, f1, normalize_answer, score_against, QaScore, RewardMetric};

use whale_core::{Task, Verdict};

/// The actions that solve the task when replayed: submitting its first answer alias.
pub fn gold_actions(task: &Task) -> Vec<String> {
    QaPayload::from_task(task).ok().and_then(|payload| payload.answers.into_iter().next()).into_iter().collect()
}

/// What a harness may see of the task: the payload without answers and supporting titles.
pub fn public_view(task: &Task) -> serde_json::Value {
    let mut view = task.payload.clone();
    if let Some(object) = view.as_object_mut() {
        object.remove("answers");
        object.remove("supporting_titles");
    }
    view
}

/// Scores a prediction for the task with exact match as the reward.
pub fn score(task: &Task, prediction: &str) -> QaScore {
    match QaPayload::from_task(task) {
        Ok(payload) => score_against(prediction, &payload.answers, RewardMetric::ExactMatch),
        Err(reason) => QaScore { em: 0.0, f1: 0.0, verdict: Verdict::fail(reason) },
    }
}
