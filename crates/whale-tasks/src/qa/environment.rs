//! The QA episode: the harness sees the question, may search the corpus as often as its limits
//! allow, and ends the episode by submitting one answer.
//!
//! Search results are cut to a character budget so that a harness cannot flood the model's
//! context by asking for many long passages; the budget is the environment's, not the harness's.

use super::payload::QaPayload;
use super::retriever::{Hit, Retriever};
use super::verifier::{score_against, QaScore, RewardMetric};
use crate::episode::{Episode, StepOutcome, ToolError, ToolSpec};
use serde_json::{json, Value};
use std::sync::Arc;
use whale_core::{Task, Verdict};

const SEARCH_TOOL: &str = "search";
const ELLIPSIS: char = '…';

/// How QA episodes behave.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QaConfig {
    /// Passages returned when the harness does not say how many.
    pub default_k: usize,
    /// The most passages one search may ask for.
    pub max_k: usize,
    /// Characters of title and text, over all passages of one search result.
    pub search_budget_chars: usize,
    pub reward: RewardMetric,
}

impl Default for QaConfig {
    fn default() -> Self {
        Self { default_k: 3, max_k: 20, search_budget_chars: 2000, reward: RewardMetric::ExactMatch }
    }
}

/// One QA task being solved.
pub struct QaEpisode {
    question: String,
    answers: Vec<String>,
    retriever: Arc<Retriever>,
    config: QaConfig,
    /// Set when the payload is not a QA payload: the episode can only fail, and says why.
    broken_task: Option<String>,
    submitted: Option<QaScore>,
}

/// Starts an episode of the task over the retriever's corpus.
pub fn episode(task: &Task, retriever: Arc<Retriever>, config: &QaConfig) -> QaEpisode {
    let (question, answers, broken_task) = match QaPayload::from_task(task) {
        Ok(payload) => (payload.question, payload.answers, None),
        Err(reason) => (String::new(), Vec::new(), Some(reason)),
    };
    QaEpisode { question, answers, retriever, config: config.clone(), broken_task, submitted: None }
}

impl QaEpisode {
    fn search(&self, args: &[Value]) -> Result<Value, ToolError> {
        let (query, k) = self.search_args(args)?;
        let hits = self
            .retriever
            .search(&query, k)
            .map_err(|e| ToolError::Failed { tool: SEARCH_TOOL.into(), reason: e.to_string() })?;
        Ok(Value::Array(fit_to_budget(&hits, self.config.search_budget_chars)))
    }

    fn search_args(&self, args: &[Value]) -> Result<(String, usize), ToolError> {
        let bad = |reason: String| ToolError::BadArgs { tool: SEARCH_TOOL.into(), reason };
        let query = match args.first() {
            Some(Value::String(query)) => query.clone(),
            Some(other) => return Err(bad(format!("query must be a string, got {other}"))),
            None => return Err(bad("expected (query, k?)".into())),
        };
        let k = match args.get(1) {
            None | Some(Value::Null) => self.config.default_k,
            Some(value) => match value.as_u64() {
                Some(k) if (1..=self.config.max_k as u64).contains(&k) => k as usize,
                _ => return Err(bad(format!("k must be an integer from 1 to {}, got {value}", self.config.max_k))),
            },
        };
        if args.len() > 2 {
            return Err(bad(format!("expected at most 2 arguments (query, k), got {}", args.len())));
        }
        Ok((query, k))
    }
}

/// Passages in rank order as `{title, text}`, texts shortened (marked with an ellipsis) so that
/// all titles and texts together stay within `budget` characters; passages that would not fit
/// even a title are left out.
fn fit_to_budget(hits: &[Hit], budget: usize) -> Vec<Value> {
    let mut left = budget;
    let mut passages = Vec::new();
    for hit in hits {
        let title_chars = hit.title.chars().count();
        if title_chars >= left {
            break;
        }
        left -= title_chars;
        let text = cut_to_chars(&hit.text, left);
        left -= text.chars().count();
        passages.push(json!({ "title": hit.title, "text": text }));
    }
    passages
}

fn cut_to_chars(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(limit.saturating_sub(1)).collect();
    cut.push(ELLIPSIS);
    cut
}

impl Episode for QaEpisode {
    fn observation(&self) -> String {
        self.question.clone()
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: SEARCH_TOOL.into(),
            description: format!(
                "BM25 search over the passage corpus: returns the top k passages (default {}, at most {}) \
                 as [{{title, text}}], {} characters in all",
                self.config.default_k, self.config.max_k, self.config.search_budget_chars
            ),
            args: vec!["query".into(), "k".into()],
        }]
    }

    fn call_tool(&mut self, name: &str, args: &[Value]) -> Result<Value, ToolError> {
        if name != SEARCH_TOOL {
            return Err(ToolError::Unknown(name.to_string()));
        }
        if self.submitted.is_some() {
            return Err(ToolError::Failed { tool: SEARCH_TOOL.into(), reason: "the episode is over".into() });
        }
        self.search(args)
    }

    fn act(&mut self, action: &str) -> StepOutcome {
        if let Some(score) = &self.submitted {
            return StepOutcome {
                reply: "the episode is over: an answer was already submitted".into(),
                invalid: true,
                done: true,
                solved: score.verdict.success,
            };
        }
        let score = score_against(action, &self.answers, self.config.reward);
        let solved = score.verdict.success;
        self.submitted = Some(score);
        StepOutcome { reply: if solved { "correct" } else { "incorrect" }.into(), invalid: false, done: true, solved }
    }

    fn is_done(&self) -> bool {
        self.submitted.is_some()
    }

    fn verdict(&self) -> Verdict {
        if let Some(reason) = &self.broken_task {
            return Verdict::fail(reason.clone());
        }
        match &self.submitted {
            Some(score) => score.verdict.clone(),
            None => Verdict::fail("no answer submitted"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(title: &str, text: &str) -> Hit {
        Hit { id: title.into(), title: title.into(), text: text.into(), score: 1.0 }
    }

    #[test]
    fn budget_counts_titles_and_texts_and_marks_cuts() {
        let hits = [hit("Ab", "0123456789"), hit("Cd", "abcdefghij"), hit("Ef", "xyz")];
        let fitted = fit_to_budget(&hits, 20);
        assert_eq!(fitted.len(), 2);
        assert_eq!(fitted[0]["text"], "0123456789");
        assert_eq!(fitted[1]["text"], "abcde…");
        let chars: usize = fitted
            .iter()
            .map(|p| {
                p["title"].as_str().map_or(0, |s| s.chars().count())
                    + p["text"].as_str().map_or(0, |s| s.chars().count())
            })
            .sum();
        assert_eq!(chars, 20);
    }
}
