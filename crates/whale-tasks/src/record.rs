//! Loading records from files: every rejection names the file, the line, the field and the reason.

use std::collections::HashMap;
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

    /// Rejects each task whose id an earlier line used (naming `field`); rejections end in line order.
    pub fn reject_duplicate_ids(&mut self, file: &Path, field: &str) {
        let mut first_line_of: HashMap<String, usize> = HashMap::new();
        for (line, task) in std::mem::take(&mut self.tasks) {
            match first_line_of.get(&task.id) {
                Some(first) => {
                    let reason = format!("duplicate id `{}` (first used on line {first})", task.id);
                    self.rejected.push(RecordError::new(file, line, Some(field), reason));
                }
                None => {
                    first_line_of.insert(task.id.clone(), line);
                    self.tasks.push((line, task));
                }
            }
        }
        self.rejected.sort_by_key(|error| error.line);
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

/// A UTF-8 byte-order mark, which some editors and exporters put before the first record.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
/// The first bytes of a gzip file.
const GZIP_MAGIC: &[u8] = b"\x1F\x8B";

/// The bytes of a data file, without a leading UTF-8 byte-order mark. An unreadable or
/// gzip-compressed file is an error at line 0.
pub fn read_data_file(path: &Path) -> Result<Vec<u8>, RecordError> {
    let mut bytes =
        std::fs::read(path).map_err(|e| RecordError::new(path, 0, None, format!("cannot read the file: {e}")))?;
    if bytes.starts_with(GZIP_MAGIC) {
        return Err(RecordError::new(path, 0, None, "the file is gzip-compressed: decompress it first (gunzip)"));
    }
    if bytes.starts_with(UTF8_BOM) {
        bytes.drain(..UTF8_BOM.len());
    }
    Ok(bytes)
}

/// Reads a JSONL file (or a JSON array of records) into (1-based line, JSON value) pairs; see
/// [`parse_json_records`]. An unreadable, compressed or empty file is a single error at line 0.
pub fn read_jsonl(path: &Path) -> (Vec<(usize, serde_json::Value)>, Vec<RecordError>) {
    match read_data_file(path) {
        Ok(bytes) => parse_json_records(path, &bytes),
        Err(error) => (vec![], vec![error]),
    }
}

/// The records of a file's bytes: JSON lines, or one JSON array when the first non-blank byte
/// is `[` (each element numbered by the line it starts on). Blank lines are skipped; a line that
/// is not UTF-8 or not JSON becomes a [`RecordError`], as does a malformed array (once, at the
/// line of the error); a file without records is a single error at line 0.
pub fn parse_json_records(path: &Path, bytes: &[u8]) -> (Vec<(usize, serde_json::Value)>, Vec<RecordError>) {
    let first_byte = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let (values, mut errors) =
        if first_byte == Some(&b'[') { json_array(path, bytes) } else { json_lines(path, bytes) };
    if values.is_empty() && errors.is_empty() {
        let reason = "file is empty: expected one JSON record per line (or a JSON array of records)";
        errors.push(RecordError::new(path, 0, None, reason));
    }
    (values, errors)
}

fn json_lines(path: &Path, bytes: &[u8]) -> (Vec<(usize, serde_json::Value)>, Vec<RecordError>) {
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
    (values, errors)
}

/// A file holding one JSON array of records. A syntax error spoils the whole array (past it the
/// elements cannot be told apart), so it is one error at its line. Each element is numbered by
/// the line it starts on, or, when elements share a line (Python's `json.dump` writes the whole
/// array on one), by its 1-based position: the number stands for the record in errors and in ids
/// made from it, so it must tell the records apart.
fn json_array(path: &Path, bytes: &[u8]) -> (Vec<(usize, serde_json::Value)>, Vec<RecordError>) {
    match serde_json::from_slice::<Vec<serde_json::Value>>(bytes) {
        Ok(elements) => {
            let lines = element_lines(bytes);
            let numbers =
                if lines.windows(2).all(|pair| pair[0] < pair[1]) { lines } else { (1..=elements.len()).collect() };
            (numbers.into_iter().zip(elements).collect(), vec![])
        }
        Err(e) => (vec![], vec![RecordError::new(path, e.line(), None, format!("malformed JSON array: {e}"))]),
    }
}

/// The 1-based line on which each element of the (valid) top-level JSON array in `bytes` starts.
fn element_lines(bytes: &[u8]) -> Vec<usize> {
    let (mut line, mut depth, mut in_string, mut escaped, mut expecting) = (1, 0usize, false, false, false);
    let mut lines = Vec::new();
    for &byte in bytes {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if depth == 1 && expecting && !byte.is_ascii_whitespace() && byte != b']' {
            lines.push(line);
            expecting = false;
        }
        match byte {
            b'\n' => line += 1,
            b'"' => in_string = true,
            b'[' | b'{' => (depth, expecting) = (depth + 1, depth == 0),
            b']' | b'}' => depth -= 1,
            b',' => expecting = depth == 1,
            _ => {}
        }
    }
    lines
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

    fn read(bytes: &[u8]) -> (Vec<(usize, serde_json::Value)>, Vec<RecordError>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        read_jsonl(f.path())
    }

    #[test]
    fn a_byte_order_mark_and_crlf_endings_cost_no_record() {
        let (values, errors) = read(b"\xEF\xBB\xBF{\"a\":1}\r\n\r\n{\"a\":2}\r\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(values, vec![(1, serde_json::json!({"a": 1})), (3, serde_json::json!({"a": 2}))]);
    }

    #[test]
    fn a_json_array_file_gives_each_element_its_line_or_its_position_when_lines_are_shared() {
        let (values, errors) = read(b"\xEF\xBB\xBF[\n  {\"a\": \"x,]}\\\"[{\"},\n  {\"a\":\n 2}, [3]\n]\n");
        assert!(errors.is_empty(), "{errors:?}");
        let lines: Vec<usize> = values.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, vec![2, 3, 4]);
        assert_eq!(values[0].1["a"], "x,]}\"[{");
        let (values, _) = read(br#"[{"a":1}, {"a":2}]"#);
        assert_eq!(values.iter().map(|(number, _)| *number).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn a_malformed_json_array_is_one_error_at_its_line() {
        let (values, errors) = read(b"[\n{\"a\":1},\n{oops}\n]");
        assert!(values.is_empty());
        assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), vec![3]);
        assert!(errors[0].reason.starts_with("malformed JSON array"), "{}", errors[0]);
        let (_, errors) = read(b" [ ]\n");
        assert!(errors[0].line == 0 && errors[0].reason.starts_with("file is empty"), "{errors:?}");
    }

    #[test]
    fn a_gzip_file_is_one_error_that_says_so() {
        let (values, errors) = read(b"\x1F\x8B\x08\x00\x00\x00\x00\x00\x00\x03\n\xff");
        assert!(values.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].line == 0 && errors[0].reason.contains("gzip"), "{}", errors[0]);
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
