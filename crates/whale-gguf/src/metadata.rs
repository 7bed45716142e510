//! Typed reads of a GGUF's metadata. GGUF writers differ in the integer and float widths they pick
//! for the same key (u32 or u64 counts, f32 or f64 epsilons), so every number is read by value,
//! not by width; a missing or mistyped key is an error naming it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use crate::error::GgufError;

/// How many array elements `describe` shows before "...".
const SHOWN_ELEMENTS: usize = 3;
/// How many characters of a string `describe` shows before "...".
const SHOWN_CHARS: usize = 80;

/// The metadata of one GGUF file, with the file's path for errors.
#[derive(Debug, Clone, Copy)]
pub struct Metadata<'a> {
    file: &'a Path,
    values: &'a HashMap<String, Value>,
}

impl<'a> Metadata<'a> {
    pub(crate) fn new(file: &'a Path, values: &'a HashMap<String, Value>) -> Self {
        Self { file, values }
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.values.get(key)
    }

    /// Every key with a one-line description of its value, sorted by key.
    pub fn entries(&self) -> Vec<(String, String)> {
        let mut entries: Vec<_> = self.values.iter().map(|(key, value)| (key.clone(), describe(value))).collect();
        entries.sort();
        entries
    }

    pub fn string(&self, key: &str) -> Result<&'a str, GgufError> {
        self.optional_string(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn optional_string(&self, key: &str) -> Result<Option<&'a str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(other) => Err(self.mistyped(key, "a string", other)),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize, GgufError> {
        self.optional_usize(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn optional_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        let Some(value) = self.get(key) else { return Ok(None) };
        match integer(value).map(usize::try_from) {
            Some(Ok(number)) => Ok(Some(number)),
            _ => Err(self.mistyped(key, "a non-negative integer", value)),
        }
    }

    pub fn optional_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        let Some(value) = self.get(key) else { return Ok(None) };
        match integer(value).map(u32::try_from) {
            Some(Ok(number)) => Ok(Some(number)),
            _ => Err(self.mistyped(key, "an integer in 0..2^32", value)),
        }
    }

    pub fn optional_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        let Some(value) = self.get(key) else { return Ok(None) };
        float(value).map(Some).ok_or_else(|| self.mistyped(key, "a number", value))
    }

    pub fn optional_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(other) => Err(self.mistyped(key, "a bool", other)),
        }
    }

    /// An array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&'a str>, GgufError> {
        let items = self.array(key)?.ok_or_else(|| self.missing(key))?;
        items
            .iter()
            .map(|item| match item {
                Value::String(text) => Ok(text.as_str()),
                other => Err(self.mistyped(key, "an array of strings", other)),
            })
            .collect()
    }

    /// An array of integers; `None` when the key is absent.
    pub fn optional_integers(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        let numbers =
            items.iter().map(|item| integer(item).ok_or_else(|| self.mistyped(key, "an array of integers", item)));
        numbers.collect::<Result<Vec<_>, _>>().map(Some)
    }

    fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.mistyped(key, "an array", other)),
        }
    }

    pub(crate) fn missing(&self, key: &str) -> GgufError {
        GgufError::MissingKey { file: self.file.to_path_buf(), key: key.to_string() }
    }

    pub(crate) fn invalid(&self, key: &str, reason: impl Into<String>) -> GgufError {
        GgufError::invalid_key(self.file, key, reason)
    }

    fn mistyped(&self, key: &str, expected: &str, found: &Value) -> GgufError {
        self.invalid(key, format!("expected {expected}, found {}", describe(found)))
    }
}

/// Any integer value, whatever its width.
fn integer(value: &Value) -> Option<i64> {
    match *value {
        Value::U8(v) => Some(v.into()),
        Value::I8(v) => Some(v.into()),
        Value::U16(v) => Some(v.into()),
        Value::I16(v) => Some(v.into()),
        Value::U32(v) => Some(v.into()),
        Value::I32(v) => Some(v.into()),
        Value::U64(v) => i64::try_from(v).ok(),
        Value::I64(v) => Some(v),
        _ => None,
    }
}

/// Any number; an f32 is widened through its shortest decimal spelling, so that 1e-5 stored as f32
/// reads as 1e-5 and not as 9.999999747378752e-6.
fn float(value: &Value) -> Option<f64> {
    match *value {
        Value::F32(v) => v.to_string().parse().ok(),
        Value::F64(v) => Some(v),
        _ => integer(value).map(|v| v as f64),
    }
}

/// A one-line description: scalars as they are, strings quoted and cut, arrays as their length
/// and first elements.
pub fn describe(value: &Value) -> String {
    match value {
        Value::String(text) => quoted_prefix(text),
        Value::Array(items) => {
            let shown: Vec<String> = items.iter().take(SHOWN_ELEMENTS).map(describe).collect();
            let more = if items.len() > SHOWN_ELEMENTS { ", ..." } else { "" };
            format!("[{} items: {}{more}]", items.len(), shown.join(", "))
        }
        Value::Bool(flag) => flag.to_string(),
        Value::F32(v) => v.to_string(),
        Value::F64(v) => v.to_string(),
        other => integer(other).map(|v| v.to_string()).unwrap_or_else(|| format!("{other:?}")),
    }
}

fn quoted_prefix(text: &str) -> String {
    let mut shown: String = text.chars().take(SHOWN_CHARS).collect();
    if shown.len() < text.len() {
        shown.push_str("...");
    }
    format!("{shown:?}")
}
