//! The passages a retriever searches: either a corpus file (FlashRAG / DPR style JSONL) or the
//! context paragraphs of HotpotQA-form tasks, which together make a natural corpus for them.

use super::jsonl::{read_jsonl, RecordFields};
use super::payload::QaPayload;
use crate::record::RecordError;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use whale_core::Task;

/// One retrievable passage.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Passage {
    pub id: String,
    pub title: String,
    pub text: String,
}

/// The distinct (title, text) context paragraphs of the tasks, in order of first appearance;
/// ids are their positions. Tasks whose payload is not a QA payload contribute nothing.
pub fn corpus_from_tasks(tasks: &[Task]) -> Vec<Passage> {
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut passages = Vec::new();
    for payload in tasks.iter().filter_map(|task| QaPayload::from_task(task).ok()) {
        for paragraph in payload.context {
            let key = (paragraph.title, paragraph.text);
            if seen.insert(key.clone()) {
                let (title, text) = key;
                passages.push(Passage { id: passages.len().to_string(), title, text });
            }
        }
    }
    passages
}

/// Loads a corpus file: one passage per line, `{id, contents}` where the first line of
/// `contents` is the title (possibly in double quotes), or `{id, title, text}`.
pub fn load_corpus(path: &Path) -> (Vec<Passage>, Vec<RecordError>) {
    let (values, mut errors) = read_jsonl(path);
    let mut passages = Vec::new();
    let mut first_line_of_id: HashMap<String, usize> = HashMap::new();
    for (line, value) in values {
        match parse_passage(&value, path, line) {
            Ok(passage) => match first_line_of_id.get(&passage.id) {
                Some(first) => errors.push(RecordError::new(
                    path,
                    line,
                    Some("id"),
                    format!("duplicate id {:?} (first on line {first})", passage.id),
                )),
                None => {
                    first_line_of_id.insert(passage.id.clone(), line);
                    passages.push(passage);
                }
            },
            Err(e) => errors.push(e),
        }
    }
    errors.sort_by_key(|e| e.line);
    (passages, errors)
}

fn parse_passage(value: &Value, file: &Path, line: usize) -> Result<Passage, RecordError> {
    let fields = RecordFields::new(value, file, line)?;
    let id = fields.optional_id("id")?.ok_or_else(|| fields.error("id", "missing: expected a string or integer id"))?;
    let (title, text) = if fields.has("contents") {
        split_contents(&fields, &fields.text("contents")?)?
    } else if fields.has("text") {
        (fields.optional_text("title")?.unwrap_or_default(), fields.text("text")?)
    } else {
        return Err(fields.error("contents", "missing: expected `contents` or `title` and `text`"));
    };
    Ok(Passage { id, title, text })
}

/// `"Title"\ntext` -> (Title, text).
fn split_contents(fields: &RecordFields, contents: &str) -> Result<(String, String), RecordError> {
    let Some((first_line, rest)) = contents.split_once('\n') else {
        return Err(fields.error("contents", "expected the title on the first line and the text after it"));
    };
    let first_line = first_line.trim();
    let title = first_line.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(first_line);
    let text = rest.trim();
    if text.is_empty() {
        return Err(fields.error("contents", "passage has a title but no text"));
    }
    Ok((title.to_string(), text.to_string()))
}
