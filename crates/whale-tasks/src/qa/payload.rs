//! The QA payload inside a [`Task`]: one typed shape for every source, so that the episode,
//! the verifier and the writer never guess at JSON. Harnesses see it as plain JSON.

use serde::{Deserialize, Serialize};
use whale_core::{Domain, Task};

/// Where a QA task came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Hotpotqa,
    NqOpen,
    Flashrag,
    Generated,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Hotpotqa => "hotpotqa",
            Source::NqOpen => "nq_open",
            Source::Flashrag => "flashrag",
            Source::Generated => "generated",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Source::Hotpotqa, Source::NqOpen, Source::Flashrag, Source::Generated]
            .into_iter()
            .find(|source| source.as_str() == name)
    }
}

/// One paragraph given with a question (HotpotQA's distractor setting).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextParagraph {
    pub title: String,
    pub text: String,
}

/// The fields of a QA task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QaPayload {
    pub question: String,
    /// Every accepted answer; the first is the canonical one.
    pub answers: Vec<String>,
    pub source: Source,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextParagraph>,
    /// Titles of the context paragraphs that hold the supporting facts, in order of first mention.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supporting_titles: Vec<String>,
}

impl QaPayload {
    /// Reads the payload of a task, which must be a QA task.
    pub fn from_task(task: &Task) -> Result<Self, String> {
        if task.domain != Domain::Qa {
            return Err(format!("task {} belongs to the {} domain, not qa", task.id, task.domain));
        }
        serde_json::from_value(task.payload.clone())
            .map_err(|e| format!("task {}: payload is not a QA payload: {e}", task.id))
    }

    pub fn into_task(self, id: String) -> Task {
        let payload = serde_json::to_value(&self)
            .unwrap_or_else(|e| unreachable!("a QaPayload holds only strings and lists, so it always serializes: {e}"));
        Task { id, domain: Domain::Qa, payload, split: None }
    }
}
