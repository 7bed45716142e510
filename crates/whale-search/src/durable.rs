//! Crash-safe file writes for the archive: a file or directory appears whole or not at all
//! (written beside its final name, synced, then renamed), and the summary grows by whole,
//! synced lines. A run killed at any instant therefore leaves nothing half-written behind
//! except, at worst, one torn last summary line, which [`read_lines`] drops.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Prefix of names still being written; readers skip them.
pub(crate) const PARTIAL_PREFIX: &str = ".partial-";

/// Writes `bytes` to `path` atomically.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let partial = partial_path(path)?;
    let mut file = File::create(&partial)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&partial, path)?;
    sync_parent(path)
}

/// Fills a fresh directory with `files` (name, bytes) and renames it into place as `path`, so
/// that readers see either all the files or no directory. A leftover partial directory from a
/// killed writer is replaced.
pub(crate) fn write_dir(path: &Path, files: &[(&str, &[u8])]) -> io::Result<()> {
    let partial = partial_path(path)?;
    if partial.exists() {
        fs::remove_dir_all(&partial)?;
    }
    fs::create_dir_all(&partial)?;
    for (name, bytes) in files {
        let mut file = File::create(partial.join(name))?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&partial, path)?;
    sync_parent(path)
}

/// Appends one line (a newline is added) and syncs it to disk before returning. A last line
/// torn by a kill is cut off first, so the new line starts a line of its own; only the writer
/// cuts, so that a reader (`whale archive` during a run) never shortens a line being written.
pub(crate) fn append_line(path: &Path, line: &str) -> io::Result<()> {
    cut_torn_line(path)?;
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    file.write_all(&bytes)?;
    file.sync_data()
}

/// The complete lines of an append-only file. A last line without its newline (torn by a kill,
/// or still being written) is not returned; the file is left as it is.
pub(crate) fn read_lines(path: &Path) -> io::Result<Vec<String>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let complete = text.rfind('\n').map_or(0, |end| end + 1);
    Ok(text[..complete].lines().filter(|line| !line.trim().is_empty()).map(str::to_string).collect())
}

/// Cuts a last line without its newline off an append-only file. Only the last byte is read
/// unless the line is torn (the usual case costs one byte, not the whole file per append).
fn cut_torn_line(path: &Path) -> io::Result<()> {
    let mut file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    let bytes = fs::read(path)?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |end| end + 1);
    file.set_len(complete as u64)?;
    file.sync_all()
}

fn partial_path(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{} has no file name", path.display())))?;
    Ok(path.with_file_name(format!("{PARTIAL_PREFIX}{}", name.to_string_lossy())))
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => File::open(parent)?.sync_all(),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_skipped_by_readers_and_cut_by_the_next_append() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("summary.jsonl");
        append_line(&path, r#"{"a":1}"#).expect("append");
        fs::OpenOptions::new().append(true).open(&path).expect("open").write_all(br#"{"a":"#).expect("torn");
        assert_eq!(read_lines(&path).expect("read"), vec![r#"{"a":1}"#.to_string()]);
        let torn = fs::read(&path).expect("bytes");
        assert!(torn.ends_with(br#"{"a":"#), "a reader leaves a line being written alone");
        append_line(&path, r#"{"a":2}"#).expect("append");
        assert_eq!(read_lines(&path).expect("read"), vec![r#"{"a":1}"#.to_string(), r#"{"a":2}"#.to_string()]);
    }

    #[test]
    fn a_directory_appears_whole_and_replaces_a_leftover_partial_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("w3");
        fs::create_dir_all(dir.path().join(".partial-w3")).expect("leftover");
        fs::write(dir.path().join(".partial-w3/stale"), "x").expect("stale");
        write_dir(&target, &[("a.json", b"1"), ("b.jsonl", b"2\n")]).expect("write");
        assert_eq!(fs::read_to_string(target.join("a.json")).expect("a"), "1");
        assert!(!target.join("stale").exists());
        assert!(!dir.path().join(".partial-w3").exists());
    }
}
