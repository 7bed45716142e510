//! Loading records from files: every rejection names the file, the line, the field and the reason.

use std::fmt;
use std::path::{Path, PathBuf};
use whale_core::Task;

/// One record that could not be loaded (or whose gold answer does not verify).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct RecordError {
    pub file: PathBuf,
    /// 1-based line number; 0 when the problem concerns the whole file.
    pub line: usize,
    /// The field at fault, when one is.
    pub field: Option<String>,
    pub reason: String,
}

impl RecordError {
    pub fn new(file: &Path, line: usize, field: Option<&str>, reason: impl Into<String>) -> Self {
        Self { file: file.to_path_buf(), line, field: field.map(str::to_string), reason: reason.into() }
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if let Some(field) = &self.field {
            write!(f, "field `{field}`: ")?;
        }
        f.write_str(&self.reason)
    }
}

/// What a loader made of a file: the tasks (with their 1-based source line) and every rejection.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    pub tasks: Vec<(usize, Task)>,
    pub rejected: Vec<RecordError>,
}

impl LoadReport {
    pub fn into_tasks(self) -> Vec<Task> {
        self.tasks.into_iter().map(|(_, t)| t).collect()
    }
}

/// How error messages name the type of a JSON value ("a string", "an array", ...).
pub fn json_kind(value: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads a JSONL file into (1-based line, JSON value) pairs. Blank lines are skipped; a line
/// that is not UTF-8 or not JSON becomes a [`RecordError`]; an unreadable or empty file is a
/// single error at line 0.
pub fn read_jsonl(path: &Path) -> (Vec<(usize, serde_json::Value)>, Vec<RecordError>) {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return (vec![], vec![RecordError::new(path, 0, None, format!("cannot read the file: {e}"))]),
    };
    let mut values = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let Ok(text) = std::str::from_utf8(raw) else {
            errors.push(RecordError::new(path, line, None, "line is not valid UTF-8"));
            continue;
        };
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        match serde_json::from_str(text) {
            Ok(v) => values.push((line, v)),
            Err(e) => errors.push(RecordError::new(path, line, None, format!("malformed JSON: {e}"))),
        }
    }
    if values.is_empty() && errors.is_empty() {
        errors.push(RecordError::new(path, 0, None, "file is empty: expected one JSON record per line"));
    }
    (values, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn jsonl_lines_keep_their_numbers_and_bad_lines_are_reported() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"{\"a\":1}\n\n{oops\n\xff\xfe\n[2]\n").unwrap();
        let (values, errors) = read_jsonl(f.path());
        assert_eq!(values.iter().map(|(l, _)| *l).collect::<Vec<_>>(), vec![1, 5]);
        assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), vec![3, 4]);
        assert!(errors[0].reason.starts_with("malformed JSON"));
        assert!(errors[1].to_string().contains(":4: line is not valid UTF-8"));
    }

    #[test]
    fn empty_and_missing_files_are_one_error_at_line_zero() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let (v, e) = read_jsonl(f.path());
        assert!(v.is_empty() && e.len() == 1 && e[0].line == 0 && e[0].reason.contains("empty"));
        let (_, e) = read_jsonl(Path::new("/nonexistent/whale.jsonl"));
        assert!(e[0].reason.contains("cannot read"));
    }
}
