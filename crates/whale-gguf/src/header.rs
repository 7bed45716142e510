//! A second, minimal walk over a GGUF header, beside candle's reader: before candle reads, it finds
//! `general.alignment` (candle divides by it unchecked, so 0 panics, and silently ignores one of a
//! type it does not read); after candle has stopped at
//! a tensor type it does not know ("unknown dtype for tensor 20"), it finds that tensor's name, so
//! that the refusal names the tensor as every other refusal does. It reads nothing else and
//! trusts nothing: it is bounded as candle is (nesting depth, dimensions, bytes left in the file),
//! and any surprise just ends the walk.

use std::io::{BufReader, Read, Seek};
use std::path::Path;

pub const ALIGNMENT_KEY: &str = "general.alignment";

/// ggml type ids candle reads from a file (see `GgmlDType::from_u32`).
const CANDLE_TYPE_IDS: [u32; 15] = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];
/// Far above any real key, name or array, so that a corrupt length ends the walk.
const MAX_LENGTH: u64 = 1 << 32;
/// candle's limits (`GGUF_MAX_TENSOR_DIMS`, `GGUF_MAX_VALUE_DEPTH`): a file past them is one
/// candle refuses, and the depth bound keeps a chain of nested arrays from overflowing the stack.
const MAX_DIMENSIONS: u32 = 4;
const MAX_DEPTH: usize = 64;
const STRING_TYPE: u32 = 8;
const ARRAY_TYPE: u32 = 9;
const U64_TYPE: u32 = 10;
const I64_TYPE: u32 = 11;

/// Bytes of a scalar of a GGUF value type: u8, i8, u16, i16, u32, i32, f32, bool, then (after
/// string and array) u64, i64, f64.
fn scalar_size(value_type: u32) -> Option<u64> {
    match value_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// The last `general.alignment` entry of a file (the one candle keeps).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeclaredAlignment {
    /// One of the integer types candle takes it from (u8, i8, u16, i16, u32, i32): what candle
    /// will divide by.
    Value(i64),
    /// A value of any other GGUF type: candle ignores it and reads the tensors at its default of
    /// 32 bytes, whatever the writer aligned them to. `integer` is the value of a u64 or i64.
    IgnoredType { id: u32, integer: Option<i128> },
}

impl DeclaredAlignment {
    /// A u64 or i64 (type `id`) of value `integer`.
    fn ignored_integer(id: u32, integer: i128) -> Self {
        Self::IgnoredType { id, integer: Some(integer) }
    }
}

/// The file's `general.alignment`; `None` when there is none or the walk fails (and then
/// candle's own reader fails too, its limits being the walk's or tighter).
pub fn declared_alignment(file: &Path) -> Option<DeclaredAlignment> {
    HeaderReader::open(file)?.metadata()?.alignment
}

/// The GGUF spec's name of value type `id`.
pub fn value_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 13] =
        ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

/// The first tensor whose type id candle does not know, with that id.
pub fn first_unknown_tensor_type(file: &Path) -> Option<(String, u32)> {
    let mut reader = HeaderReader::open(file)?;
    let tensors = reader.metadata()?.tensors;
    for _ in 0..tensors {
        let name = reader.string()?;
        let dimensions = reader.u32()?;
        if dimensions > MAX_DIMENSIONS {
            return None;
        }
        for _ in 0..dimensions {
            reader.length()?;
        }
        let type_id = reader.u32()?;
        reader.u64()?;
        if !CANDLE_TYPE_IDS.contains(&type_id) {
            return Some((name, type_id));
        }
    }
    None
}

/// What the walk over the metadata keeps.
struct MetadataSummary {
    tensors: u64,
    alignment: Option<DeclaredAlignment>,
}

struct HeaderReader {
    reader: BufReader<std::fs::File>,
    file_length: u64,
    /// Version 1 wrote lengths and counts as u32, later versions as u64.
    wide_lengths: bool,
}

impl HeaderReader {
    fn open(file: &Path) -> Option<Self> {
        let file = std::fs::File::open(file).ok()?;
        let file_length = file.metadata().ok()?.len();
        let mut reader = BufReader::new(file);
        let mut magic = [0u8; 4];
        reader.read_exact(&mut magic).ok()?;
        let mut header = Self { reader, file_length, wide_lengths: true };
        let version = header.u32()?;
        header.wide_lengths = version >= 2;
        (&magic == b"GGUF").then_some(header)
    }

    /// Reads the tensor and metadata counts and walks the metadata, keeping `general.alignment`.
    fn metadata(&mut self) -> Option<MetadataSummary> {
        let tensors = self.length()?;
        let entries = self.length()?;
        let mut alignment = None;
        for _ in 0..entries {
            let key = self.string()?;
            let value_type = self.u32()?;
            if key == ALIGNMENT_KEY {
                alignment = Some(self.alignment_value(value_type)?);
            } else {
                self.skip_value(value_type, 0)?;
            }
        }
        Some(MetadataSummary { tensors, alignment })
    }

    /// An alignment entry of type `value_type`.
    fn alignment_value(&mut self, value_type: u32) -> Option<DeclaredAlignment> {
        let value = match value_type {
            0 => i64::from(u8::from_le_bytes(self.bytes()?)),
            1 => i64::from(i8::from_le_bytes(self.bytes()?)),
            2 => i64::from(u16::from_le_bytes(self.bytes()?)),
            3 => i64::from(i16::from_le_bytes(self.bytes()?)),
            4 => i64::from(self.u32()?),
            5 => i64::from(i32::from_le_bytes(self.bytes()?)),
            U64_TYPE => {
                return Some(DeclaredAlignment::ignored_integer(value_type, u64::from_le_bytes(self.bytes()?).into()))
            }
            I64_TYPE => {
                return Some(DeclaredAlignment::ignored_integer(value_type, i64::from_le_bytes(self.bytes()?).into()))
            }
            other => {
                self.skip_value(other, 0)?;
                return Some(DeclaredAlignment::IgnoredType { id: other, integer: None });
            }
        };
        Some(DeclaredAlignment::Value(value))
    }

    /// Skips one value of GGUF value type `value_type` (0..=12, see the GGUF spec), `depth`
    /// arrays deep.
    fn skip_value(&mut self, value_type: u32, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match value_type {
            STRING_TYPE => {
                let length = self.length()?;
                self.skip(length)
            }
            ARRAY_TYPE => {
                let item_type = self.u32()?;
                let items = self.length()?;
                (0..items).try_for_each(|_| self.skip_value(item_type, depth + 1))
            }
            scalar => self.skip(scalar_size(scalar)?),
        }
    }

    /// A key or tensor name as candle reads it (trailing NULs dropped, so that
    /// "general.alignment\0" is the same key); a length past the file's end ends the walk before
    /// any allocation.
    fn string(&mut self) -> Option<String> {
        let length = self.length()?;
        let left = self.file_length.checked_sub(self.reader.stream_position().ok()?)?;
        if length > left {
            return None;
        }
        let mut bytes = vec![0u8; usize::try_from(length).ok()?];
        self.reader.read_exact(&mut bytes).ok()?;
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn length(&mut self) -> Option<u64> {
        let length = if self.wide_lengths { self.u64()? } else { u64::from(self.u32()?) };
        (length < MAX_LENGTH).then_some(length)
    }

    fn skip(&mut self, bytes: u64) -> Option<()> {
        let copied = std::io::copy(&mut (&mut self.reader).take(bytes), &mut std::io::sink()).ok()?;
        (copied == bytes).then_some(())
    }

    fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_le_bytes)
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut bytes = [0u8; N];
        self.reader.read_exact(&mut bytes).ok()?;
        Some(bytes)
    }
}
