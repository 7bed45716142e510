//! The agentic proposer's tools: read-only access to the archive (list, read, grep) and two
//! tools for candidates (check one, write one). Every path goes through [`ConfinedDir`], so
//! the model sees the archive and nothing else; every failure is a reply the model can read,
//! never an error that ends the session.

use crate::proposer::confine::ConfinedDir;
use crate::proposer::Proposal;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use whale_harness::{validate, Limits};

/// How much one tool reply may show: every reply lands in the model's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplySizes {
    /// Characters `read_file` returns per call.
    pub read_chars: usize,
    /// Matches `grep` returns, and the characters of one matching line it shows.
    pub grep_matches: usize,
    pub grep_line_chars: usize,
    /// Entries `list_dir` shows.
    pub list_entries: usize,
}

impl ReplySizes {
    /// For a model with a long context.
    pub const FULL: ReplySizes =
        ReplySizes { read_chars: 20_000, grep_matches: 200, grep_line_chars: 300, list_entries: 500 };
    /// For a small model on a CPU: about 1,000 tokens a reply at most.
    pub const COMPACT: ReplySizes =
        ReplySizes { read_chars: 3_000, grep_matches: 20, grep_line_chars: 160, list_entries: 40 };
}

/// The tools of one session, and the candidates written so far.
pub(crate) struct ArchiveTools<'a> {
    dir: ConfinedDir,
    limits: &'a Limits,
    sizes: ReplySizes,
    wanted: usize,
    incumbent: String,
    pub written: Vec<Proposal>,
}

impl<'a> ArchiveTools<'a> {
    pub fn new(dir: ConfinedDir, limits: &'a Limits, sizes: ReplySizes, wanted: usize, incumbent: String) -> Self {
        Self { dir, limits, sizes, wanted, incumbent, written: Vec::new() }
    }

    /// Whether the session has written every candidate it was asked for.
    pub fn is_done(&self) -> bool {
        self.written.len() >= self.wanted
    }

    /// The `tools` array of a chat request.
    pub fn specs(&self) -> Value {
        let function = |name: &str, description: &str, properties: Value, required: &[&str]| {
            json!({"type": "function", "function": {"name": name, "description": description,
                "parameters": {"type": "object", "properties": properties, "required": required}}})
        };
        let path = json!({"type": "string", "description": "a path relative to the archive root"});
        json!([
            function("list_dir", "List a directory of the archive (name, kind, size).", json!({"path": path}), &[]),
            function(
                "read_file",
                &format!("Read a text file of the archive, {} characters from `offset`.", self.sizes.read_chars),
                json!({"path": path, "offset": {"type": "integer", "minimum": 0}}),
                &["path"]
            ),
            function(
                "grep",
                "Lines containing `pattern` (a literal string, case-insensitive) in a file or, recursively, a directory.",
                json!({"pattern": {"type": "string"}, "path": path}),
                &["pattern"]
            ),
            function(
                "check_candidate",
                "Compile a harness source and run its top level, as the search will; says why it is invalid.",
                json!({"source": {"type": "string"}}),
                &["source"]
            ),
            function(
                "write_candidate",
                "Submit one candidate harness: its complete source and its hypothesis (what changed, why it should help, what would refute it).",
                json!({"source": {"type": "string"}, "hypothesis": {"type": "string"},
                       "parent": {"type": "string", "description": "the candidate id it derives from; default the incumbent"}}),
                &["source", "hypothesis"]
            ),
        ])
    }

    /// Runs tool `name` with JSON `arguments` and returns its reply.
    pub fn call(&mut self, name: &str, arguments: &str) -> String {
        let args: Value = match serde_json::from_str(if arguments.trim().is_empty() { "{}" } else { arguments }) {
            Ok(args) => args,
            Err(error) => return format!("error: the arguments are not JSON: {error}"),
        };
        let text = |key: &str| args.get(key).and_then(Value::as_str);
        let outcome = match name {
            "list_dir" => self.list_dir(text("path").unwrap_or(".")),
            "read_file" => match text("path") {
                Some(path) => self.read_file(path, args.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize),
                None => Err("read_file needs `path`".to_string()),
            },
            "grep" => match text("pattern") {
                Some(pattern) => self.grep(pattern, text("path").unwrap_or(".")),
                None => Err("grep needs `pattern`".to_string()),
            },
            "check_candidate" => match text("source") {
                Some(source) => Ok(self.check(source)),
                None => Err("check_candidate needs `source`".to_string()),
            },
            "write_candidate" => match (text("source"), text("hypothesis")) {
                (Some(source), Some(hypothesis)) => self.write(source, hypothesis, text("parent")),
                _ => Err("write_candidate needs `source` and `hypothesis`".to_string()),
            },
            other => Err(format!("unknown tool `{other}`")),
        };
        outcome.unwrap_or_else(|error| format!("error: {error}"))
    }

    fn list_dir(&self, path: &str) -> Result<String, String> {
        let dir = self.dir.resolve(path).map_err(|e| e.to_string())?;
        let mut entries: Vec<String> = fs::read_dir(&dir)
            .map_err(|e| format!("{path}: {e}"))?
            .filter_map(Result::ok)
            .map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                match entry.file_type() {
                    Ok(kind) if kind.is_dir() => format!("{name}/"),
                    Ok(kind) if kind.is_symlink() => format!("{name} (link)"),
                    _ => format!("{name} ({} bytes)", entry.metadata().map(|m| m.len()).unwrap_or(0)),
                }
            })
            .collect();
        entries.sort();
        let total = entries.len();
        entries.truncate(self.sizes.list_entries);
        if total > self.sizes.list_entries {
            entries.push(format!("... {} more", total - self.sizes.list_entries));
        }
        Ok(format!("{}:\n{}", self.dir.display(&dir), entries.join("\n")))
    }

    fn read_file(&self, path: &str, offset: usize) -> Result<String, String> {
        let file = self.dir.resolve(path).map_err(|e| e.to_string())?;
        let text = fs::read_to_string(&file).map_err(|e| format!("{path}: {e}"))?;
        let total = text.chars().count();
        let chunk: String = text.chars().skip(offset).take(self.sizes.read_chars).collect();
        let end = offset + chunk.chars().count();
        let more = if end < total {
            format!("\n[... {} more characters; read from offset {end}]", total - end)
        } else {
            String::new()
        };
        Ok(format!("{chunk}{more}"))
    }

    fn grep(&self, pattern: &str, path: &str) -> Result<String, String> {
        if pattern.is_empty() {
            return Err("grep needs a non-empty pattern".to_string());
        }
        let start = self.dir.resolve(path).map_err(|e| e.to_string())?;
        let needle = pattern.to_lowercase();
        let mut matches = Vec::new();
        self.grep_in(&start, &needle, &mut matches);
        let total = matches.len();
        matches.truncate(self.sizes.grep_matches);
        if total > self.sizes.grep_matches {
            matches.push(format!("... {} more matches", total - self.sizes.grep_matches));
        }
        Ok(if matches.is_empty() { "no match".to_string() } else { matches.join("\n") })
    }

    /// Walks `path` without following symbolic links, so the walk stays inside the archive.
    fn grep_in(&self, path: &Path, needle: &str, matches: &mut Vec<String>) {
        let Ok(kind) = fs::symlink_metadata(path).map(|m| m.file_type()) else { return };
        if kind.is_dir() {
            let Ok(entries) = fs::read_dir(path) else { return };
            let mut children: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
            children.sort();
            for child in children {
                self.grep_in(&child, needle, matches);
            }
        } else if kind.is_file() {
            let Ok(text) = fs::read_to_string(path) else { return };
            let shown = self.dir.display(path);
            for (number, line) in text.lines().enumerate().filter(|(_, line)| line.to_lowercase().contains(needle)) {
                let clipped: String = line.chars().take(self.sizes.grep_line_chars).collect();
                matches.push(format!("{shown}:{}: {clipped}", number + 1));
            }
        }
    }

    fn check(&self, source: &str) -> String {
        match validate(source, self.limits) {
            Ok(info) => format!("valid (hash {}, meta {})", info.hash, info.meta.unwrap_or(Value::Null)),
            Err(error) => format!("invalid: {error}"),
        }
    }

    fn write(&mut self, source: &str, hypothesis: &str, parent: Option<&str>) -> Result<String, String> {
        if self.is_done() {
            return Err(format!("all {} candidates are written; stop here", self.wanted));
        }
        if hypothesis.trim().is_empty() {
            return Err("a candidate needs a hypothesis".to_string());
        }
        let check = self.check(source);
        self.written.push(Proposal {
            source: source.to_string(),
            hypothesis: hypothesis.trim().to_string(),
            parent: Some(parent.unwrap_or(&self.incumbent).to_string()),
        });
        Ok(format!("candidate {} of {} recorded; {check}", self.written.len(), self.wanted))
    }
}
