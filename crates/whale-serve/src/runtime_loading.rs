//! Whether clients may change what the server serves (load and unload adapters or checkpoints,
//! replace the base weights) and from which directories it then reads.
//!
//! Off by default, as vLLM's runtime LoRA loading is: the admin endpoints answer 403 naming
//! the flag. On, they read only under the allowed directories, each canonicalised when the
//! server starts. A requested path is first absolutised and its `..` removed without touching
//! the filesystem; one not under an allowed directory that way is refused at once. Otherwise it
//! is canonicalised (its deepest existing ancestor when it does not exist), so symlinks are
//! followed before the check, and the canonical path is what the server loads; a symlink in
//! the directory itself (a weights file linked from elsewhere) must lead inside too, and a
//! dangling one is refused. A refused path always gets the same reply whether or not it
//! exists, and nothing outside the allowed directories is read, so the endpoints cannot be
//! used to probe the filesystem.

use std::path::{Component, Path, PathBuf};

use crate::error::ApiError;

/// `--allow-runtime-loading` and its `--allowed-path`s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeLoading {
    /// The admin endpoints answer at all; off, each answers 403.
    pub enabled: bool,
    /// The directories loads may read under; none: every load is refused.
    pub allowed_paths: Vec<PathBuf>,
}

impl RuntimeLoading {
    /// Runtime loading on, reading under `allowed_paths`.
    pub fn allowed(allowed_paths: Vec<PathBuf>) -> Self {
        Self { enabled: true, allowed_paths }
    }
}

/// An allowed directory that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("allowed path {}: {reason}", path.display())]
pub struct AllowedPathError {
    pub path: PathBuf,
    pub reason: String,
}

/// One allowed directory: as given (absolute, `..` removed) and canonical.
#[derive(Debug, Clone)]
struct AllowedDir {
    given: PathBuf,
    canonical: PathBuf,
}

/// [`RuntimeLoading`] checked at start, consulted by every admin request.
#[derive(Debug, Clone)]
pub(crate) struct AdminAccess {
    enabled: bool,
    dirs: Vec<AllowedDir>,
}

impl AdminAccess {
    /// Canonicalises each allowed directory; one that does not exist or is not a directory is
    /// an error.
    pub(crate) fn new(settings: &RuntimeLoading) -> Result<Self, AllowedPathError> {
        let dirs = settings.allowed_paths.iter().map(|path| allowed_dir(path)).collect::<Result<_, _>>()?;
        Ok(Self { enabled: settings.enabled, dirs })
    }

    /// The 403 of every admin endpoint while runtime loading is off.
    pub(crate) fn check_enabled(&self) -> Result<(), ApiError> {
        if self.enabled {
            return Ok(());
        }
        Err(ApiError::forbidden(
            "loading, unloading and reloading models at run time is off: start the server with \
             --allow-runtime-loading and --allowed-path DIR to allow it",
        )
        .with_code("runtime_loading_disabled"))
    }

    /// The canonical form of `path` (the request's field `param`) when it lies under an allowed
    /// directory; otherwise a 403 that is the same whatever is or is not at `path`.
    pub(crate) fn resolve(&self, path: &Path, param: &str) -> Result<PathBuf, ApiError> {
        let lexical = lexically_absolute(path).ok_or_else(|| self.outside(param))?;
        if !self.dirs.iter().any(|dir| lexical.starts_with(&dir.given) || lexical.starts_with(&dir.canonical)) {
            return Err(self.outside(param));
        }
        let resolved = resolve_symlinks(&lexical).ok_or_else(|| self.outside(param))?;
        if !self.is_inside(&resolved) || !self.links_stay_inside(&resolved) {
            return Err(self.outside(param));
        }
        Ok(resolved)
    }

    /// Whether the canonical path `path` lies under an allowed directory.
    fn is_inside(&self, path: &Path) -> bool {
        self.dirs.iter().any(|dir| path.starts_with(&dir.canonical))
    }

    /// Whether every symlink directly in `dir` leads inside the allowed directories (true when
    /// `dir` is not a readable directory: the load then fails on its own).
    fn links_stay_inside(&self, dir: &Path) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else { return true };
        entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_symlink()))
            .all(|entry| entry.path().canonicalize().is_ok_and(|target| self.is_inside(&target)))
    }

    /// The one reply to a path outside the allowed directories; it names neither the path nor
    /// anything found there.
    fn outside(&self, param: &str) -> ApiError {
        let message = if self.dirs.is_empty() {
            format!("`{param}` cannot be read: the server was started without --allowed-path, so it loads nothing")
        } else {
            format!("`{param}` (or a file it links to) is not inside a directory the server may load from (its --allowed-path)")
        };
        ApiError::forbidden(message).with_param(param).with_code("path_not_allowed")
    }
}

fn allowed_dir(path: &Path) -> Result<AllowedDir, AllowedPathError> {
    let error = |reason: String| AllowedPathError { path: path.to_path_buf(), reason };
    let canonical = path.canonicalize().map_err(|e| error(format!("{e} (it must exist when the server starts)")))?;
    if !canonical.is_dir() {
        return Err(error("is not a directory".to_string()));
    }
    let given = lexically_absolute(path).ok_or_else(|| error("cannot be made absolute".to_string()))?;
    Ok(AllowedDir { given, canonical })
}

/// `path` made absolute against the working directory, `.` and `..` removed as text (no
/// symlink is followed); `None` for an empty path.
fn lexically_absolute(path: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(path).ok()?;
    let mut normal = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    Some(normal)
}

/// `path` (absolute, without `..`) with every symlink resolved: canonicalised when it exists,
/// otherwise its deepest existing ancestor canonicalised with the rest appended. `None` when
/// the first missing name is there after all: a dangling symlink (or a loop), which leads
/// nobody knows where.
fn resolve_symlinks(path: &Path) -> Option<PathBuf> {
    let (ancestor, canonical) =
        path.ancestors().find_map(|ancestor| ancestor.canonicalize().ok().map(|canonical| (ancestor, canonical)))?;
    let rest = path.strip_prefix(ancestor).ok()?;
    let Some(first_missing) = rest.components().next() else { return Some(canonical) };
    if ancestor.join(first_missing).symlink_metadata().is_ok() {
        return None;
    }
    Some(canonical.join(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_dot_and_dot_are_removed_as_text() {
        assert_eq!(lexically_absolute(Path::new("/a/b/../c/./d")), Some(PathBuf::from("/a/c/d")));
        assert_eq!(lexically_absolute(Path::new("/a/../../..")), Some(PathBuf::from("/")));
        assert_eq!(lexically_absolute(Path::new("")), None);
        let relative = lexically_absolute(Path::new("x/../y")).expect("absolute");
        assert_eq!(relative, std::env::current_dir().expect("cwd").join("y"));
    }

    #[test]
    fn a_missing_path_resolves_through_its_existing_ancestor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let canonical = dir.path().canonicalize().expect("canonical");
        assert_eq!(resolve_symlinks(&dir.path().join("no/such")), Some(canonical.join("no/such")));
        assert_eq!(resolve_symlinks(dir.path()), Some(canonical));
        std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join("dangling")).expect("a symlink");
        assert_eq!(resolve_symlinks(&dir.path().join("dangling/x")), None);
    }

    #[test]
    fn allowed_paths_must_be_existing_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = RuntimeLoading::allowed(vec![dir.path().join("missing")]);
        assert!(AdminAccess::new(&missing).expect_err("missing").to_string().contains("missing"));
        std::fs::write(dir.path().join("file"), "").expect("written");
        let file = RuntimeLoading::allowed(vec![dir.path().join("file")]);
        assert!(AdminAccess::new(&file).expect_err("a file").to_string().contains("not a directory"));
    }

    #[test]
    fn runtime_loading_is_off_unless_enabled_and_reads_only_under_allowed_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let allowed = dir.path().join("runs");
        std::fs::create_dir_all(allowed.join("r/adapter")).expect("dirs");
        let off = AdminAccess::new(&RuntimeLoading::default()).expect("valid");
        assert_eq!(off.check_enabled().expect_err("off").status, 403);
        let access = AdminAccess::new(&RuntimeLoading::allowed(vec![allowed.clone()])).expect("valid");
        assert_eq!(access.check_enabled(), Ok(()));
        let canonical = allowed.canonicalize().expect("canonical");
        assert_eq!(access.resolve(&allowed.join("r/adapter"), "p"), Ok(canonical.join("r/adapter")));
        assert_eq!(access.resolve(&allowed.join("r/missing"), "p"), Ok(canonical.join("r/missing")));
        let refused = access.resolve(&dir.path().join("elsewhere"), "p").expect_err("outside");
        assert_eq!(
            (refused.status, refused.code, refused.param.as_deref()),
            (403, Some("path_not_allowed"), Some("p"))
        );
        assert_eq!(access.resolve(&allowed.join("../elsewhere"), "p"), Err(refused.clone()));
        assert_eq!(access.resolve(&allowed.join("r/../../runs-not"), "p"), Err(refused));
    }
}
