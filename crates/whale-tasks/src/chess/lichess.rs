//! The Lichess puzzle formats: CSV with a header (columns in any order), headerless
//! `FEN,Moves,Rating` rows, and JSON lines (or a JSON array) keyed by the Lichess column names.
//! A puzzle id used twice is rejected at its second line.
//!
//! Every record is read on its own, so one bad row costs one [`RecordError`] naming its line and
//! column, never the file. Records are read as bytes so that invalid UTF-8 is such an error too.

use super::puzzle::{Puzzle, RawPuzzle};
use crate::record::{parse_json_records, read_data_file, LoadReport, RecordError};
use csv::ByteRecord;
use serde_json::Value;
use shakmaty::fen::Fen;
use std::io;
use std::path::Path;
use whale_core::Task;

const HEADERLESS_COLUMNS: [&str; 3] = ["FEN", "Moves", "Rating"];
const NATIVE_HEADER: [&str; 5] = ["PuzzleId", "FEN", "Moves", "Rating", "Themes"];

pub(crate) fn load(path: &Path) -> LoadReport {
    let mut report = LoadReport::default();
    let bytes = match read_data_file(path) {
        Ok(bytes) => bytes,
        Err(error) => {
            report.rejected.push(error);
            return report;
        }
    };
    let first_byte = bytes.iter().find(|b| !b.is_ascii_whitespace());
    match first_byte {
        None => report.rejected.push(RecordError::new(path, 0, None, "the file is empty")),
        Some(&b'{' | &b'[') => load_jsonl(path, &bytes, &mut report),
        Some(_) if has_json_extension(path) => load_jsonl(path, &bytes, &mut report),
        Some(_) => load_csv(path, &bytes, &mut report),
    }
    report.reject_duplicate_ids(path, "PuzzleId");
    report
}

fn has_json_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("json"))
}

fn push(report: &mut LoadReport, line: usize, result: Result<Task, RecordError>) {
    match result {
        Ok(task) => report.tasks.push((line, task)),
        Err(e) => report.rejected.push(e),
    }
}

/// JSON lines, or a JSON array of records.
fn load_jsonl(path: &Path, bytes: &[u8], report: &mut LoadReport) {
    let (values, unreadable) = parse_json_records(path, bytes);
    report.rejected.extend(unreadable);
    for (line, value) in values {
        push(report, line, parse_record(&value, path, line));
    }
}

/// Reads one JSON object keyed by the Lichess column names (matched ignoring case).
pub(crate) fn parse_record(value: &Value, file: &Path, line: usize) -> Result<Task, RecordError> {
    let object = value
        .as_object()
        .ok_or_else(|| RecordError::new(file, line, None, "expected a JSON object with Lichess keys"))?;
    let record = JsonRecord { object, file, line };
    let id = record.text("PuzzleId")?.unwrap_or_else(|| default_id(file, line));
    let fen = record.text("FEN")?.ok_or_else(|| record.error("FEN", "missing or empty; expected a FEN string"))?;
    let moves = record
        .words("Moves")?
        .ok_or_else(|| record.error("Moves", "missing; expected UCI moves (a space-separated string or an array)"))?;
    let rating = record.rating()?;
    let themes = record.words("Themes")?.unwrap_or_default();
    build_task(RawPuzzle { id, fen, moves, rating, themes }, file, line)
}

/// One JSON line's object, with errors that name the line and the key.
struct JsonRecord<'a> {
    object: &'a serde_json::Map<String, Value>,
    file: &'a Path,
    line: usize,
}

impl JsonRecord<'_> {
    /// The value under `key` (any case); `null` counts as absent.
    fn get(&self, key: &str) -> Option<&Value> {
        self.object.iter().find(|(k, v)| k.eq_ignore_ascii_case(key) && !v.is_null()).map(|(_, v)| v)
    }

    fn error(&self, field: &str, reason: &str) -> RecordError {
        RecordError::new(self.file, self.line, Some(field), reason)
    }

    /// A non-empty string.
    fn text(&self, key: &str) -> Result<Option<String>, RecordError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(non_empty(s)),
            Some(_) => Err(self.error(key, "expected a string")),
        }
    }

    fn words(&self, key: &str) -> Result<Option<Vec<String>>, RecordError> {
        self.get(key)
            .map(|value| {
                words(value).ok_or_else(|| self.error(key, "expected a space-separated string or an array of strings"))
            })
            .transpose()
    }

    /// A rating written as a JSON number or as a string of digits.
    fn rating(&self) -> Result<Option<u32>, RecordError> {
        let expected = |found: &Value| self.error("Rating", &format!("expected a non-negative integer, found {found}"));
        match self.get("Rating") {
            None => Ok(None),
            Some(Value::String(s)) => parse_rating(s).map_err(|reason| self.error("Rating", &reason)),
            Some(value) => {
                let rating = value.as_u64().and_then(|r| u32::try_from(r).ok());
                rating.map(Some).ok_or_else(|| expected(value))
            }
        }
    }
}

/// A space-separated string or an array of strings, as a list of words.
fn words(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::String(s) => Some(s.split_whitespace().map(str::to_string).collect()),
        Value::Array(items) => items.iter().map(|v| v.as_str().map(|s| s.trim().to_string())).collect(),
        _ => None,
    }
}

fn non_empty(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn parse_rating(text: &str) -> Result<Option<u32>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<u32>().map(Some).map_err(|_| format!("expected a non-negative integer rating, found `{text}`"))
}

/// `<file stem>-<line>`, the id of a record that has none.
fn default_id(file: &Path, line: usize) -> String {
    let stem = file.file_stem().map_or_else(|| "puzzle".into(), |s| s.to_string_lossy());
    format!("{stem}-{line}")
}

fn build_task(raw: RawPuzzle, file: &Path, line: usize) -> Result<Task, RecordError> {
    Puzzle::validate(raw).map(Puzzle::into_task).map_err(|e| RecordError::new(file, line, e.column(), e.to_string()))
}

/// Where each Lichess column sits in a CSV record.
struct Columns {
    /// The column names in file order, for messages.
    names: Vec<String>,
    /// Fields a record must have: all of them, except that headerless rows may omit the rating.
    required_width: usize,
    puzzle_id: Option<usize>,
    fen: usize,
    moves: usize,
    rating: Option<usize>,
    themes: Option<usize>,
}

impl Columns {
    fn headerless() -> Columns {
        Columns {
            names: HEADERLESS_COLUMNS.iter().map(|s| s.to_string()).collect(),
            required_width: 2,
            puzzle_id: None,
            fen: 0,
            moves: 1,
            rating: Some(2),
            themes: None,
        }
    }

    fn from_header(header: &ByteRecord, file: &Path, line: usize) -> Result<Columns, RecordError> {
        let names: Vec<String> = header.iter().map(|name| String::from_utf8_lossy(name).trim().to_string()).collect();
        let find = |wanted: &str| names.iter().position(|name| name.eq_ignore_ascii_case(wanted));
        let required = |wanted: &str| {
            find(wanted).ok_or_else(|| {
                let reason = format!("the header has no `{wanted}` column (and its first field is not a FEN)");
                RecordError::new(file, line, Some(wanted), reason)
            })
        };
        let (fen, moves) = (required("FEN")?, required("Moves")?);
        Ok(Columns {
            puzzle_id: find("PuzzleId"),
            rating: find("Rating"),
            themes: find("Themes"),
            fen,
            moves,
            required_width: names.len(),
            names,
        })
    }
}

fn load_csv(path: &Path, bytes: &[u8], report: &mut LoadReport) {
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(bytes);
    let mut records = reader.byte_records();
    let columns = match records.next() {
        None => return report.rejected.push(RecordError::new(path, 0, None, "the file is empty")),
        Some(Err(e)) => return report.rejected.push(unreadable(path, &e)),
        Some(Ok(first)) => match first_record_columns(&first, path, report) {
            Some(columns) => columns,
            None => return,
        },
    };
    for record in records {
        match record {
            Ok(record) => {
                let line = record_line(&record);
                push(report, line, csv_task(&record, &columns, path, line));
            }
            Err(e) => report.rejected.push(unreadable(path, &e)),
        }
    }
    if report.tasks.is_empty() && report.rejected.is_empty() {
        let reason = "the file has a header but no records";
        report.rejected.push(RecordError::new(path, 0, None, reason));
    }
}

/// The layout the first record announces: a header, or (when its first field is a FEN) the
/// headerless layout, in which case the first record is itself loaded. `None` for a header
/// that lacks a required column, which is then reported.
fn first_record_columns(first: &ByteRecord, path: &Path, report: &mut LoadReport) -> Option<Columns> {
    let line = record_line(first);
    let first_field = first.get(0).unwrap_or_default().trim_ascii();
    if Fen::from_ascii(first_field).is_ok() {
        let columns = Columns::headerless();
        push(report, line, csv_task(first, &columns, path, line));
        return Some(columns);
    }
    Columns::from_header(first, path, line).map_err(|e| report.rejected.push(e)).ok()
}

fn unreadable(path: &Path, error: &csv::Error) -> RecordError {
    let line = error.position().map_or(0, |p| p.line() as usize);
    RecordError::new(path, line, None, format!("unreadable CSV: {error}"))
}

fn record_line(record: &ByteRecord) -> usize {
    record.position().map_or(0, |p| p.line() as usize)
}

fn csv_task(record: &ByteRecord, columns: &Columns, file: &Path, line: usize) -> Result<Task, RecordError> {
    check_width(record, columns, file, line)?;
    let field = |index: usize| -> Result<String, RecordError> {
        let bytes = record.get(index).unwrap_or_default();
        std::str::from_utf8(bytes).map(|s| s.trim().to_string()).map_err(|e| {
            let reason = format!("invalid UTF-8 at byte {}", e.valid_up_to());
            RecordError::new(file, line, Some(&columns.names[index]), reason)
        })
    };
    let optional = |index: Option<usize>| index.map(field).transpose().map(|text| text.unwrap_or_default());
    let fen = field(columns.fen)?;
    if fen.is_empty() {
        return Err(RecordError::new(file, line, Some("FEN"), "empty; expected a FEN"));
    }
    let moves = field(columns.moves)?.split_whitespace().map(str::to_string).collect();
    let rating_text = optional(columns.rating)?;
    let rating = parse_rating(&rating_text).map_err(|reason| RecordError::new(file, line, Some("Rating"), reason))?;
    let themes = optional(columns.themes)?.split_whitespace().map(str::to_string).collect();
    let id = non_empty(&optional(columns.puzzle_id)?).unwrap_or_else(|| default_id(file, line));
    build_task(RawPuzzle { id, fen, moves, rating, themes }, file, line)
}

fn check_width(record: &ByteRecord, columns: &Columns, file: &Path, line: usize) -> Result<(), RecordError> {
    let width = columns.names.len();
    if record.len() > width {
        let reason = format!("the record has {} fields; expected {width} ({})", record.len(), columns.names.join(","));
        return Err(RecordError::new(file, line, None, reason));
    }
    if record.len() < columns.required_width {
        let missing = &columns.names[record.len()];
        let reason =
            format!("missing; the record has {} fields, expected {width} ({})", record.len(), columns.names.join(","));
        return Err(RecordError::new(file, line, Some(missing), reason));
    }
    Ok(())
}

/// Writes Lichess CSV (`PuzzleId,FEN,Moves,Rating,Themes`) that [`load`] reads back unchanged.
pub(crate) fn write_native(tasks: &[Task], out: &mut dyn io::Write) -> io::Result<()> {
    let mut writer = csv::Writer::from_writer(out);
    writer.write_record(NATIVE_HEADER)?;
    for task in tasks {
        let puzzle = Puzzle::from_task(task)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("task `{}`: {e}", task.id)))?;
        let rating = puzzle.rating.map(|r| r.to_string()).unwrap_or_default();
        writer.write_record([
            puzzle.id.as_str(),
            puzzle.fen.as_str(),
            &puzzle.uci_line().join(" "),
            &rating,
            &puzzle.themes.join(" "),
        ])?;
    }
    writer.flush()
}
