//! QA task records in and out: the three question formats found in the wild (HotpotQA, in
//! Hugging Face's shape or the official release's, NQ-open, FlashRAG), detected per record, and
//! the one whale writes (HotpotQA form, which keeps the context paragraphs a generated task
//! needs for its corpus).
//!
//! The HotpotQA form written here carries two extra keys, `answers` (every alias) and `source`,
//! so that any task reads back equal; sentence ids are not kept (a paragraph is written as one
//! sentence), because the payload keeps supporting *titles*, which is what retrieval is judged on.

use super::jsonl::{read_jsonl, RecordFields};
use super::payload::{ContextParagraph, QaPayload, Source};
use crate::record::{LoadReport, RecordError};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use whale_core::Task;

/// Loads every record of a JSONL file; record forms may mix within one file.
pub fn load(path: &Path) -> LoadReport {
    let (values, mut rejected) = read_jsonl(path);
    let mut tasks = Vec::new();
    let mut first_line_of_id: HashMap<String, usize> = HashMap::new();
    for (line, value) in values {
        match parse_record(&value, path, line) {
            Ok(task) => match first_line_of_id.get(&task.id) {
                Some(first) => rejected.push(RecordError::new(
                    path,
                    line,
                    Some("id"),
                    format!("duplicate id {:?} (first on line {first})", task.id),
                )),
                None => {
                    first_line_of_id.insert(task.id.clone(), line);
                    tasks.push((line, task));
                }
            },
            Err(e) => rejected.push(e),
        }
    }
    rejected.sort_by_key(|e| e.line);
    LoadReport { tasks, rejected }
}

/// Parses one record, recognising its form by its keys: `golden_answers` is FlashRAG,
/// `context` or `supporting_facts` is HotpotQA, `answer` alone is NQ-open.
pub fn parse_record(value: &Value, file: &Path, line: usize) -> Result<Task, RecordError> {
    let fields = RecordFields::new(value, file, line)?;
    let id = match fields.optional_id("id")? {
        Some(id) => id,
        // The official HotpotQA release names it `_id`.
        None => fields.optional_id("_id")?.unwrap_or_else(|| default_id(file, line)),
    };
    let payload = if fields.has("golden_answers") {
        simple_payload(&fields, "golden_answers", Source::Flashrag)?
    } else if fields.has("context") || fields.has("supporting_facts") {
        hotpot_payload(&fields)?
    } else if fields.has("answer") {
        simple_payload(&fields, "answer", Source::NqOpen)?
    } else {
        return Err(
            fields.error("answer", "missing: expected `answer` (HotpotQA, NQ-open) or `golden_answers` (FlashRAG)")
        );
    };
    Ok(payload.into_task(id))
}

fn default_id(file: &Path, line: usize) -> String {
    let stem = file.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default();
    format!("{stem}-{line}")
}

/// NQ-open and FlashRAG: a question and a list of answer aliases.
fn simple_payload(fields: &RecordFields, answers_key: &str, source: Source) -> Result<QaPayload, RecordError> {
    Ok(QaPayload {
        question: fields.text("question")?,
        answers: fields.text_list(answers_key)?,
        source,
        kind: None,
        level: None,
        context: Vec::new(),
        supporting_titles: Vec::new(),
    })
}

fn hotpot_payload(fields: &RecordFields) -> Result<QaPayload, RecordError> {
    let question = fields.text("question")?;
    let answers = hotpot_answers(fields)?;
    let source = match fields.optional_text("source")? {
        None => Source::Hotpotqa,
        Some(name) => Source::from_name(&name).ok_or_else(|| {
            fields.error("source", format!("expected hotpotqa, nq_open, flashrag or generated, got {name:?}"))
        })?,
    };
    let context = hotpot_context(fields)?;
    let supporting_titles = hotpot_supporting_titles(fields, &context)?;
    Ok(QaPayload {
        question,
        answers,
        source,
        kind: fields.optional_text("type")?,
        level: fields.optional_text("level")?,
        context,
        supporting_titles,
    })
}

/// `answer` is the canonical answer; whale's own files add `answers` with every alias.
fn hotpot_answers(fields: &RecordFields) -> Result<Vec<String>, RecordError> {
    let answer = fields.text("answer")?;
    if !fields.has("answers") {
        return Ok(vec![answer]);
    }
    let aliases = fields.text_list("answers")?;
    if aliases[0] != answer {
        return Err(fields.error("answers", format!("first alias {:?} differs from `answer` {answer:?}", aliases[0])));
    }
    Ok(aliases)
}

/// `context`, one paragraph per title, sentences joined: `{"title": [..], "sentences": [[..]]}`
/// (Hugging Face's datasets) or `[[title, [sentences]], ..]` (the official release).
fn hotpot_context(fields: &RecordFields) -> Result<Vec<ContextParagraph>, RecordError> {
    let Some(context) = fields.get("context") else {
        return Ok(Vec::new());
    };
    pairs(fields, context, "context", "title", "sentences")?
        .into_iter()
        .map(|pair| {
            let title = fields.text_at(pair.left, &pair.left_path)?;
            let text = paragraph_text(fields, pair.right, &pair.right_path)?;
            Ok(ContextParagraph { title, text })
        })
        .collect()
}

fn paragraph_text(fields: &RecordFields, paragraph: &Value, path: &str) -> Result<String, RecordError> {
    let mut pieces = Vec::new();
    for (j, sentence) in fields.list_at(paragraph, path)?.iter().enumerate() {
        let sentence = sentence.as_str().ok_or_else(|| fields.error(&format!("{path}[{j}]"), "expected a string"))?;
        let sentence = sentence.trim();
        if !sentence.is_empty() {
            pieces.push(sentence);
        }
    }
    if pieces.is_empty() {
        return Err(fields.error(path, "paragraph has no text"));
    }
    Ok(pieces.join(" "))
}

/// `supporting_facts`, `{"title": [..], "sent_id": [..]}` or `[[title, sent_id], ..]`; every
/// title must be a context title.
fn hotpot_supporting_titles(fields: &RecordFields, context: &[ContextParagraph]) -> Result<Vec<String>, RecordError> {
    let Some(facts) = fields.get("supporting_facts") else {
        return Ok(Vec::new());
    };
    let mut supporting: Vec<String> = Vec::new();
    for pair in pairs(fields, facts, "supporting_facts", "title", "sent_id")? {
        let title = fields.text_at(pair.left, &pair.left_path)?;
        if !pair.right.is_u64() {
            return Err(fields.error(&pair.right_path, "expected a non-negative integer sentence index"));
        }
        if !context.iter().any(|p| p.title == title) {
            return Err(fields.error(&pair.left_path, format!("{title:?} is not the title of any context paragraph")));
        }
        if !supporting.contains(&title) {
            supporting.push(title);
        }
    }
    Ok(supporting)
}

/// One entry of a two-part HotpotQA field, with the paths that name its halves in errors.
struct Pair<'a> {
    left: &'a Value,
    left_path: String,
    right: &'a Value,
    right_path: String,
}

/// The entries of a HotpotQA field in either of its shapes: an object holding two lists of
/// equal length under `left` and `right` (Hugging Face's datasets), or a list of two-element
/// lists (the official release).
fn pairs<'a>(
    fields: &RecordFields<'a>,
    value: &'a Value,
    name: &str,
    left: &str,
    right: &str,
) -> Result<Vec<Pair<'a>>, RecordError> {
    if let Value::Array(entries) = value {
        return entries
            .iter()
            .enumerate()
            .map(|(i, entry)| match entry.as_array().map(Vec::as_slice) {
                Some([first, second]) => Ok(Pair {
                    left: first,
                    left_path: format!("{name}[{i}][0]"),
                    right: second,
                    right_path: format!("{name}[{i}][1]"),
                }),
                _ => Err(fields.error(&format!("{name}[{i}]"), format!("expected a [{left}, {right}] pair"))),
            })
            .collect();
    }
    let list = |key: &str| {
        let path = format!("{name}.{key}");
        let value = value.get(key).ok_or_else(|| {
            fields.error(
                &path,
                format!("missing: expected an object with `{left}` and `{right}` lists, or a list of [{left}, {right}] pairs"),
            )
        })?;
        fields.list_at(value, &path)
    };
    let (left_items, right_items) = (list(left)?, list(right)?);
    if left_items.len() != right_items.len() {
        return Err(fields.error(
            name,
            format!("`{left}` has {} entries but `{right}` has {}", left_items.len(), right_items.len()),
        ));
    }
    Ok(left_items
        .iter()
        .zip(right_items)
        .enumerate()
        .map(|(i, (l, r))| Pair {
            left: l,
            left_path: format!("{name}.{left}[{i}]"),
            right: r,
            right_path: format!("{name}.{right}[{i}]"),
        })
        .collect())
}

/// Writes tasks as HotpotQA-form JSONL that [`load`] reads back to equal tasks.
pub fn write_native(tasks: &[Task], out: &mut dyn std::io::Write) -> std::io::Result<()> {
    for task in tasks {
        let payload =
            QaPayload::from_task(task).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let record =
            native_record(&task.id, &payload).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        serde_json::to_writer(&mut *out, &record)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn native_record(id: &str, payload: &QaPayload) -> Result<Value, String> {
    let first_answer = payload.answers.first().ok_or_else(|| format!("task {id} has no answers"))?;
    let mut record = json!({
        "id": id,
        "question": payload.question,
        "answer": first_answer,
        "answers": payload.answers,
        "source": payload.source.as_str(),
        "supporting_facts": {
            "title": payload.supporting_titles,
            "sent_id": vec![0; payload.supporting_titles.len()],
        },
        "context": {
            "title": payload.context.iter().map(|p| p.title.as_str()).collect::<Vec<_>>(),
            "sentences": payload.context.iter().map(|p| vec![p.text.as_str()]).collect::<Vec<_>>(),
        },
    });
    if let Some(kind) = &payload.kind {
        record["type"] = json!(kind);
    }
    if let Some(level) = &payload.level {
        record["level"] = json!(level);
    }
    Ok(record)
}
