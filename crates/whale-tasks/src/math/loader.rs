//! Reading math tasks from JSONL: GSM8K, MATH-500, MATH, plain question/answer, and whale's
//! native form.
//!
//! One loader accepts every form and tells them apart per record by their fields, so any of
//! these files can be pointed at directly. Lines come from [`read_jsonl`] (one line of invalid
//! UTF-8 or bad JSON spoils only itself), and every bad record becomes a [`RecordError`] naming
//! the line, the field and what was expected — loading never stops at the first problem.

use super::SOURCES;
use crate::record::{json_kind, read_jsonl, LoadReport, RecordError};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::Path;
use whale_core::{Domain, Split, Task};
use whale_math_answer::{is_thousands_grouped, last_boxed};

/// Loads every record of a JSONL file; blank lines are skipped. Rejections come in line order.
pub fn load(path: &Path) -> LoadReport {
    let (values, unreadable) = read_jsonl(path);
    let mut report = LoadReport { tasks: Vec::new(), rejected: unreadable };
    for (line, value) in values {
        match parse_record(&value, path, line) {
            Ok(task) => report.tasks.push((line, task)),
            Err(error) => report.rejected.push(error),
        }
    }
    report.reject_duplicate_ids(path, "id");
    report
}

/// Reads one record in any accepted form (see the module documentation of `math`).
pub fn parse_record(value: &Value, file: &Path, line: usize) -> Result<Task, RecordError> {
    let Value::Object(fields) = value else {
        let reason = format!("expected a JSON object, found {}", json_kind(value));
        return Err(RecordError::new(file, line, None, reason));
    };
    let record = Record { fields, file, line, prefix: "" };
    if fields.contains_key("payload") {
        return native_task(&record);
    }
    let payload = if fields.contains_key("problem") { math_payload(&record)? } else { question_payload(&record)? };
    Ok(Task { id: record.id()?, domain: Domain::Math, payload, split: None })
}

/// Writes tasks as native JSONL (one serialized [`Task`] per line), which [`load`] reads back.
pub fn write_native(tasks: &[Task], out: &mut dyn Write) -> std::io::Result<()> {
    for task in tasks {
        serde_json::to_writer(&mut *out, task)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// The fields of one JSON object, with the error messages of a loader.
struct Record<'a> {
    fields: &'a Map<String, Value>,
    file: &'a Path,
    line: usize,
    /// Prefix of field names in errors (`payload.` inside a native record).
    prefix: &'static str,
}

impl Record<'_> {
    fn error(&self, field: &str, reason: impl Into<String>) -> RecordError {
        let field = format!("{}{field}", self.prefix);
        RecordError::new(self.file, self.line, Some(&field), reason)
    }

    fn string(&self, field: &str) -> Result<&str, RecordError> {
        match self.fields.get(field) {
            None => Err(self.error(field, "missing (expected a string)")),
            Some(Value::String(s)) if s.trim().is_empty() => Err(self.error(field, "is empty (expected text)")),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(self.error(field, format!("expected a string, found {}", json_kind(other)))),
        }
    }

    fn optional_string(&self, field: &str) -> Result<Option<&str>, RecordError> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.string(field).map(Some),
        }
    }

    fn optional_integer(&self, field: &str) -> Result<Option<i64>, RecordError> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
            Some(other) => Err(self.error(field, format!("expected an integer, found {}", json_kind(other)))),
        }
    }

    /// `level` as an integer; MATH's `"Level 3"` becomes 3, other text is kept as given.
    fn level(&self) -> Result<Option<Value>, RecordError> {
        match self.fields.get("level") {
            Some(Value::String(text)) => {
                let number = text.strip_prefix("Level ").and_then(|n| n.trim().parse::<i64>().ok());
                Ok(Some(number.map_or_else(|| json!(text), |n| json!(n))))
            }
            _ => Ok(self.optional_integer("level")?.map(|n| json!(n))),
        }
    }

    /// The record's own `id` or `unique_id` (absent or null: none), else `<file stem>-<line>`.
    fn id(&self) -> Result<String, RecordError> {
        for field in ["id", "unique_id"] {
            if let Some(id) = self.optional_id(field)? {
                return Ok(id);
            }
        }
        let stem = self.file.file_stem().map_or("math".into(), |s| s.to_string_lossy());
        Ok(format!("{stem}-{}", self.line))
    }

    fn optional_id(&self, field: &str) -> Result<Option<String>, RecordError> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(id)) if !id.trim().is_empty() => Ok(Some(id.clone())),
            Some(Value::Number(n)) if n.is_u64() => Ok(Some(n.to_string())),
            Some(other) => {
                let reason = format!("expected a non-empty string or an integer, found {}", json_kind(other));
                Err(self.error(field, reason))
            }
        }
    }
}

/// MATH-style `{problem, [solution], [answer], [subject|type], [level]}`: the answer is
/// `answer` (text, or a number as AIME sets give it), else the last `\boxed{}` of `solution`.
fn math_payload(record: &Record) -> Result<Value, RecordError> {
    let question = record.string("problem")?;
    let solution = record.optional_string("solution")?;
    let (answer, source) = match record.fields.get("answer") {
        Some(Value::Number(n)) => (n.to_string(), "math500"),
        Some(Value::Null) | None => (boxed_answer(record, solution)?, "math"),
        Some(_) => (record.string("answer")?.trim().to_string(), "math500"),
    };
    let mut payload = json!({"question": question, "answer": answer, "source": source});
    if let Some(solution) = solution {
        payload["solution"] = json!(solution);
    }
    let subject = match record.optional_string("subject")? {
        Some(subject) => Some(subject),
        None => record.optional_string("type")?,
    };
    if let Some(subject) = subject {
        payload["subject"] = json!(subject);
    }
    if let Some(level) = record.level()? {
        payload["level"] = level;
    }
    Ok(payload)
}

/// The last `\boxed{}` of the solution, for a MATH record without an `answer` field.
fn boxed_answer(record: &Record, solution: Option<&str>) -> Result<String, RecordError> {
    let Some(solution) = solution else {
        return Err(record.error("answer", "missing, and there is no `solution` to read a \\boxed{} answer from"));
    };
    let boxed = last_boxed(solution).map(str::trim).filter(|a| !a.is_empty());
    boxed
        .map(str::to_string)
        .ok_or_else(|| record.error("solution", "has no \\boxed{...} answer (and no `answer` field)"))
}

/// `{question, answer}`: GSM8K when the answer is a worked solution ending in `#### x`,
/// otherwise a plain answer (a string or a number).
fn question_payload(record: &Record) -> Result<Value, RecordError> {
    let question = record.string("question")?;
    let answer = match record.fields.get("answer") {
        Some(Value::Number(n)) => return Ok(json!({"question": question, "answer": n.to_string(), "source": "plain"})),
        Some(Value::String(_)) => record.string("answer")?,
        Some(other) => {
            return Err(record.error("answer", format!("expected a string or a number, found {}", json_kind(other))))
        }
        None => return Err(record.error("answer", "missing (expected a string or a number)")),
    };
    let Some((_, last)) = answer.rsplit_once("####") else {
        let mut payload = json!({"question": question, "answer": answer.trim(), "source": "plain"});
        if let Some(solution) = record.optional_string("solution")? {
            payload["solution"] = json!(solution);
        }
        return Ok(payload);
    };
    let final_answer = last.trim();
    if final_answer.is_empty() {
        return Err(record.error("answer", "nothing follows `####` (expected the final answer)"));
    }
    let final_answer =
        if is_thousands_grouped(final_answer) { final_answer.replace(',', "") } else { final_answer.to_string() };
    Ok(json!({"question": question, "answer": final_answer, "source": "gsm8k", "solution": answer}))
}

/// `{"id", "domain": "math", "payload": {...}, "split"?}` as written by [`write_native`].
fn native_task(record: &Record) -> Result<Task, RecordError> {
    let id = record.string("id")?.to_string();
    match record.fields.get("domain") {
        Some(Value::String(domain)) if domain == Domain::Math.as_str() => {}
        Some(other) => return Err(record.error("domain", format!("expected \"math\", found {other}"))),
        None => return Err(record.error("domain", "missing (expected \"math\")")),
    }
    let split = match record.fields.get("split") {
        None | Some(Value::Null) => None,
        Some(value) => Some(serde_json::from_value::<Split>(value.clone()).map_err(|_| {
            record.error("split", format!("expected \"train\", \"search\" or \"test\", found {value}"))
        })?),
    };
    let payload = record.fields.get("payload").unwrap_or(&Value::Null);
    let Value::Object(fields) = payload else {
        return Err(record.error("payload", format!("expected an object, found {}", json_kind(payload))));
    };
    validate_payload(&Record { fields, file: record.file, line: record.line, prefix: "payload." })?;
    Ok(Task { id, domain: Domain::Math, payload: payload.clone(), split })
}

fn validate_payload(payload: &Record) -> Result<(), RecordError> {
    payload.string("question")?;
    payload.string("answer")?;
    let source = payload.string("source")?;
    if !SOURCES.contains(&source) {
        return Err(payload.error("source", format!("expected one of {}, found \"{source}\"", SOURCES.join(", "))));
    }
    payload.optional_string("solution")?;
    payload.optional_string("subject")?;
    payload.optional_integer("difficulty")?;
    payload.level()?;
    Ok(())
}
