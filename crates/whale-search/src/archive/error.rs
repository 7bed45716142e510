//! Why an archive operation failed: a file it could not read or write, a record it could not
//! parse, or a request the archive refuses (a test task, a second seed).

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("summary.jsonl line {line}: {reason}")]
    Summary { line: usize, reason: String },
    #[error("the summary names incumbent {id} (hash {hash}) but no candidate has that source")]
    MissingIncumbent { id: String, hash: String },
    #[error("the archive has no incumbent yet; seed it first")]
    Unseeded,
    #[error("the archive already has an incumbent ({id}); a search is seeded once")]
    AlreadySeeded { id: String },
    #[error("task `{task_id}` is a test task; test tasks and their results never enter the archive")]
    TestTask { task_id: String },
    #[error("trajectory of task `{task_id}` is not one of the tasks being recorded")]
    UnknownTask { task_id: String },
}
