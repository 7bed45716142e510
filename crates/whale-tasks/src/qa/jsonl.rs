//! Typed field access for the QA loaders (lines come from [`read_jsonl`]): every failure
//! is a [`RecordError`] naming the file, the line and the field.

pub use crate::record::read_jsonl;
use crate::record::{json_kind, RecordError};
use serde_json::{Map, Value};
use std::path::Path;

/// The fields of one record, with the location to blame when one is wrong.
pub struct RecordFields<'a> {
    object: &'a Map<String, Value>,
    file: &'a Path,
    line: usize,
}

impl<'a> RecordFields<'a> {
    pub fn new(value: &'a Value, file: &'a Path, line: usize) -> Result<Self, RecordError> {
        match value.as_object() {
            Some(object) => Ok(Self { object, file, line }),
            None => Err(RecordError::new(file, line, None, "expected a JSON object")),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.object.contains_key(name)
    }

    pub fn error(&self, field: &str, reason: impl Into<String>) -> RecordError {
        RecordError::new(self.file, self.line, Some(field), reason)
    }

    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.object.get(name)
    }

    pub fn required(&self, name: &str) -> Result<&'a Value, RecordError> {
        self.get(name).ok_or_else(|| self.error(name, "missing"))
    }

    /// A string field that must be present and not blank.
    pub fn text(&self, name: &str) -> Result<String, RecordError> {
        self.text_at(self.required(name)?, name)
    }

    /// A value that must be a non-blank string; `path` names it in errors.
    pub fn text_at(&self, value: &Value, path: &str) -> Result<String, RecordError> {
        match value.as_str() {
            Some(s) if !s.trim().is_empty() => Ok(s.to_string()),
            Some(_) => Err(self.error(path, "expected a non-empty string, got a blank one")),
            None => Err(self.error(path, format!("expected a string, got {}", json_kind(value)))),
        }
    }

    /// An optional string field (absent or null means none).
    pub fn optional_text(&self, name: &str) -> Result<Option<String>, RecordError> {
        match self.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => self.text_at(value, name).map(Some),
        }
    }

    /// A list of non-blank strings with at least one element.
    pub fn text_list(&self, name: &str) -> Result<Vec<String>, RecordError> {
        let items = self.list_at(self.required(name)?, name)?;
        if items.is_empty() {
            return Err(self.error(name, "expected at least one string, got an empty list"));
        }
        items.iter().enumerate().map(|(i, item)| self.text_at(item, &format!("{name}[{i}]"))).collect()
    }

    pub fn list_at(&self, value: &'a Value, path: &str) -> Result<&'a Vec<Value>, RecordError> {
        value.as_array().ok_or_else(|| self.error(path, format!("expected a list, got {}", json_kind(value))))
    }

    /// A record id: a non-blank string or a non-negative integer, if the field is present.
    pub fn optional_id(&self, name: &str) -> Result<Option<String>, RecordError> {
        match self.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.is_u64() => Ok(Some(n.to_string())),
            Some(value) => self.text_at(value, name).map(Some),
        }
    }
}
