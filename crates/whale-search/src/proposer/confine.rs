//! Paths a proposer names, confined to one directory. An LLM proposer reads the archive
//! through tools and a command proposer names its candidate files in `pending.json`; neither
//! may reach outside its directory, whether by an absolute path, a `..` component or a
//! symbolic link that points out.

use std::io;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("`{0}` is absolute; name paths relative to the directory")]
    Absolute(String),
    #[error("`{0}` climbs out with `..`")]
    Climbs(String),
    #[error("`{0}` leads outside the directory")]
    Escapes(String),
    #[error("`{path}`: {source}")]
    Io { path: String, source: io::Error },
}

/// A directory, and the paths inside it.
#[derive(Debug, Clone)]
pub struct ConfinedDir {
    root: PathBuf,
}

impl ConfinedDir {
    pub fn new(root: &Path) -> io::Result<Self> {
        Ok(Self { root: root.canonicalize()? })
    }

    /// The existing file or directory `relative` names, after every symbolic link is followed;
    /// refused unless it lies inside the directory. An empty path or `.` is the directory.
    pub fn resolve(&self, relative: &str) -> Result<PathBuf, ConfineError> {
        let path = Path::new(relative);
        if path.has_root() || path.components().any(|c| matches!(c, Component::Prefix(_))) {
            return Err(ConfineError::Absolute(relative.to_string()));
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(ConfineError::Climbs(relative.to_string()));
        }
        let real = self
            .root
            .join(path)
            .canonicalize()
            .map_err(|source| ConfineError::Io { path: relative.to_string(), source })?;
        if !real.starts_with(&self.root) {
            return Err(ConfineError::Escapes(relative.to_string()));
        }
        Ok(real)
    }

    /// `path` (inside the directory) relative to it, with `/` separators.
    pub fn display(&self, path: &Path) -> String {
        let relative = path.strip_prefix(&self.root).unwrap_or(path);
        let text = relative.to_string_lossy().replace('\\', "/");
        if text.is_empty() {
            ".".to_string()
        } else {
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn paths_inside_resolve_and_every_way_out_is_refused() {
        let outside = tempfile::tempdir().expect("tempdir");
        fs::write(outside.path().join("secret.txt"), "s").expect("secret");
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dir.path().join("sub")).expect("sub");
        fs::write(dir.path().join("sub/a.txt"), "a").expect("a");
        let confined = ConfinedDir::new(dir.path()).expect("confined");
        let inside = confined.resolve("sub/a.txt").expect("inside");
        assert_eq!(confined.display(&inside), "sub/a.txt");
        assert_eq!(confined.display(&confined.resolve("").expect("root")), ".");
        assert!(matches!(confined.resolve("sub/../sub/a.txt"), Err(ConfineError::Climbs(_))));
        let absolute = outside.path().join("secret.txt");
        assert!(matches!(confined.resolve(&absolute.to_string_lossy()), Err(ConfineError::Absolute(_))));
        std::os::unix::fs::symlink(outside.path(), dir.path().join("door")).expect("symlink");
        assert!(matches!(confined.resolve("door/secret.txt"), Err(ConfineError::Escapes(_))));
        std::os::unix::fs::symlink(dir.path().join("sub/a.txt"), dir.path().join("alias")).expect("symlink");
        assert!(confined.resolve("alias").is_ok());
        assert!(matches!(confined.resolve("missing.txt"), Err(ConfineError::Io { .. })));
    }
}
