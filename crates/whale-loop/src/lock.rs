//! One writer per directory: [`DirLock`], an exclusive OS file lock on `<dir>/.lock`.
//!
//! Two processes writing the same run (a `whale run --resume` started while the run is still
//! going, two `whale compare` of one config) would both append their units, and every count
//! built on the directory would be doubled. So every command that writes into a run, compare
//! or study directory holds its lock while it writes, and a second one fails at once, before it
//! writes anything, naming the process that holds it. The lock is the kernel's (`flock`), not
//! the file's existence: a killed process, `kill -9` included, releases it, so nothing stale
//! is ever left to clean up. The file's text (the holder's pid and command line) serves the
//! error message, and, left behind by a holder that was killed, the next holder's note that
//! the last writer did not end normally ([`DirLock::interrupted`]). The descriptor is
//! close-on-exec, so a trainer or server a run starts does not inherit it. Readers (`whale
//! report --out`, `whale archive`) take no lock.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file inside a locked directory.
pub const LOCK_FILE: &str = ".lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{} is being written by {}; one process writes a directory at a time: wait for it to end, \
         or stop it and run the command again",
        dir.display(),
        holder.as_deref().map_or("another process".to_string(), |h| format!("another process ({h})"))
    )]
    Held { dir: PathBuf, holder: Option<String> },
    #[error("cannot lock {}: {source}", dir.display())]
    Io { dir: PathBuf, source: io::Error },
}

/// Exclusive write access to a directory for as long as the value lives.
#[derive(Debug)]
pub struct DirLock {
    dir: PathBuf,
    file: File,
    interrupted: Option<String>,
}

impl DirLock {
    /// Locks the existing directory `dir`; fails at once when another process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let failed = |source| LockError::Io { dir: dir.to_path_buf(), source };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(failed)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held { dir: dir.to_path_buf(), holder: holder(&mut file) })
            }
            Err(TryLockError::Error(source)) => return Err(failed(source)),
        }
        let interrupted = holder(&mut file);
        write_holder(&mut file).map_err(failed)?;
        Ok(Self { dir: dir.to_path_buf(), file, interrupted })
    }

    /// Creates `dir` (and its parents) if it is missing, then [`Self::acquire`]s it.
    pub fn create(dir: &Path) -> Result<Self, LockError> {
        fs::create_dir_all(dir).map_err(|source| LockError::Io { dir: dir.to_path_buf(), source })?;
        Self::acquire(dir)
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The line of the last process that wrote this directory, when it did not end normally: a
    /// lock dropped clears its line, so a line left behind means its holder was killed (SIGKILL,
    /// the kernel's out-of-memory killer, a machine that went down). `None` otherwise.
    pub fn interrupted(&self) -> Option<&str> {
        self.interrupted.as_deref()
    }
}

impl Drop for DirLock {
    /// Clears the holder's line; closing the file releases the lock.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// `pid N: COMMAND LINE`, as the holder wrote it (`None` while it has not yet).
fn holder(file: &mut File) -> Option<String> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_string())
}

fn write_holder(file: &mut File) -> io::Result<()> {
    let command: Vec<String> = std::env::args().collect();
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "pid {}: {}", std::process::id(), command.join(" "))?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_fails_naming_the_directory_and_the_holder_until_the_first_is_dropped() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("runs/r");
        assert!(matches!(DirLock::acquire(&dir), Err(LockError::Io { .. })), "a missing directory");
        let first = DirLock::create(&dir).expect("the first lock");
        assert_eq!(first.dir(), dir);
        let error = DirLock::acquire(&dir).expect_err("a second lock");
        let text = error.to_string();
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
        assert!(matches!(error, LockError::Held { holder: Some(_), .. }));
        drop(first);
        assert_eq!(fs::read_to_string(dir.join(LOCK_FILE)).expect("lock file"), "");
        DirLock::acquire(&dir).expect("the lock once released");
    }

    #[test]
    fn a_line_left_by_a_killed_holder_is_reported_once() {
        let root = tempfile::tempdir().expect("tempdir");
        drop(DirLock::acquire(root.path()).expect("a clean first holder"));
        assert_eq!(DirLock::acquire(root.path()).expect("again").interrupted(), None, "it ended normally");
        fs::write(root.path().join(LOCK_FILE), "pid 4242: whale study qa.toml\n").expect("a killed holder's line");
        let lock = DirLock::acquire(root.path()).expect("the lock");
        assert_eq!(lock.interrupted(), Some("pid 4242: whale study qa.toml"));
        drop(lock);
        assert_eq!(DirLock::acquire(root.path()).expect("again").interrupted(), None);
    }

    #[test]
    fn locks_of_different_directories_do_not_conflict() {
        let root = tempfile::tempdir().expect("tempdir");
        let _outer = DirLock::acquire(root.path()).expect("the outer directory");
        let _inner = DirLock::create(&root.path().join("inner")).expect("a directory inside it");
    }
}
