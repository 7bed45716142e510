//! A second, minimal walk over a GGUF header, run only after candle's reader has failed on a
//! tensor type it does not know. candle stops at that tensor without naming it ("unknown dtype for
//! tensor 20"); this walk finds the tensor's name, so that the refusal names the tensor as every
//! other refusal does. It reads nothing else and trusts nothing: any surprise just ends the walk.

use std::io::{BufReader, Read};
use std::path::Path;

/// ggml type ids candle reads from a file (see `GgmlDType::from_u32`).
const CANDLE_TYPE_IDS: [u32; 15] = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];
/// Far above any real key, name or array, so that a corrupt length ends the walk.
const MAX_LENGTH: u64 = 1 << 32;
const MAX_DIMENSIONS: u32 = 8;
const STRING_TYPE: u32 = 8;
const ARRAY_TYPE: u32 = 9;

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

/// The first tensor whose type id candle does not know, with that id.
pub fn first_unknown_tensor_type(file: &Path) -> Option<(String, u32)> {
    let mut reader = HeaderReader::open(file)?;
    let tensors = reader.counts()?;
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

struct HeaderReader {
    reader: BufReader<std::fs::File>,
    /// Version 1 wrote lengths and counts as u32, later versions as u64.
    wide_lengths: bool,
}

impl HeaderReader {
    fn open(file: &Path) -> Option<Self> {
        let mut reader = BufReader::new(std::fs::File::open(file).ok()?);
        let mut magic = [0u8; 4];
        reader.read_exact(&mut magic).ok()?;
        let mut header = Self { reader, wide_lengths: true };
        let version = header.u32()?;
        header.wide_lengths = version >= 2;
        (&magic == b"GGUF").then_some(header)
    }

    /// Reads the tensor and metadata counts, skips the metadata and returns the tensor count.
    fn counts(&mut self) -> Option<u64> {
        let tensors = self.length()?;
        let entries = self.length()?;
        for _ in 0..entries {
            self.string()?;
            let value_type = self.u32()?;
            self.skip_value(value_type)?;
        }
        Some(tensors)
    }

    /// Skips one value of GGUF value type `value_type` (0..=12, see the GGUF spec).
    fn skip_value(&mut self, value_type: u32) -> Option<()> {
        match value_type {
            STRING_TYPE => self.string().map(drop),
            ARRAY_TYPE => {
                let item_type = self.u32()?;
                let items = self.length()?;
                (0..items).try_for_each(|_| self.skip_value(item_type))
            }
            scalar => self.skip(scalar_size(scalar)?),
        }
    }

    fn string(&mut self) -> Option<String> {
        let length = self.length()?;
        let mut bytes = vec![0u8; usize::try_from(length).ok()?];
        self.reader.read_exact(&mut bytes).ok()?;
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
        let mut bytes = [0u8; 4];
        self.reader.read_exact(&mut bytes).ok()?;
        Some(u32::from_le_bytes(bytes))
    }

    fn u64(&mut self) -> Option<u64> {
        let mut bytes = [0u8; 8];
        self.reader.read_exact(&mut bytes).ok()?;
        Some(u64::from_le_bytes(bytes))
    }
}
