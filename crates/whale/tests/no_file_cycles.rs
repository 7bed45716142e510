//! No file imports a file that imports it back (ARCHITECTURE.md). For every crate under
//! crates/, this builds the graph of its src/ files from the paths in their code (`crate::…`,
//! `super::…`, `self::…`, and paths that start at a child module) and fails listing each cycle.
//!
//! A path leads to the file that defines the module it names (`name.rs`, `name/mod.rs`). A name
//! a file re-exports (`pub use`) is followed to the file that defines it, so a crate root that
//! re-exports its modules is no hub of cycles; a re-export is an edge of its own file only where
//! that file uses the name too. Code under `#[cfg(test)]` is left out: a unit test may exercise
//! its module together with the ones above it. Method calls and macros name no path, so they add
//! no edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module's path from its crate root: `["proposer", "mutate"]`.
type ModulePath = Vec<String>;

#[test]
fn no_crate_has_a_file_cycle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates");
    let mut cycles = Vec::new();
    let mut crate_dirs: Vec<PathBuf> = fs::read_dir(&crates).unwrap().map(|entry| entry.unwrap().path()).collect();
    crate_dirs.sort();
    for dir in crate_dirs.iter().filter(|dir| dir.join("src").is_dir()) {
        let name = dir.file_name().unwrap().to_string_lossy();
        cycles.extend(Crate::read(&dir.join("src")).cycles().into_iter().map(|cycle| format!("{name}: {cycle}")));
    }
    assert!(crate_dirs.len() >= 10, "read only {} crates under {}", crate_dirs.len(), crates.display());
    assert!(cycles.is_empty(), "file cycles:\n{}", cycles.join("\n"));
}

#[test]
fn a_cycle_is_found_through_super_crate_and_child_paths() {
    let src = tempfile::tempdir().unwrap();
    write(src.path(), "lib.rs", "pub mod a;\npub mod b;\npub use a::Alpha;\n");
    write(src.path(), "a.rs", "pub mod inner;\npub struct Alpha(crate::b::Beta);\n");
    write(src.path(), "a/inner.rs", "use super::super::Alpha;\n");
    write(src.path(), "b/mod.rs", "pub struct Beta;\nfn make() { let _ = crate::a::inner::run(); }\n");
    assert_eq!(
        Crate::read(src.path()).cycles(),
        ["a.rs -> b/mod.rs -> a/inner.rs -> a.rs"],
        "a.rs names b (crate::), b names a/inner.rs, inner names a.rs through the root's re-export"
    );
}

#[test]
fn re_exports_lead_on_and_comments_strings_and_tests_name_nothing() {
    let src = tempfile::tempdir().unwrap();
    write(src.path(), "lib.rs", "mod a;\nmod b;\npub use a::Alpha;\npub use b::{Beta as B, Gamma};\n");
    write(src.path(), "a.rs", "use crate::B;\npub struct Alpha(B);\n");
    let b = "pub struct Beta;\npub struct Gamma;\n// crate::a::Alpha\nconst S: &str = \"crate::a::Alpha {\";\n\
             const R: &str = r#\"crate::a::\"#;\nfn f<'a>(x: &'a str) -> char { '{' }\n\
             #[cfg(test)]\nmod tests {\n    use crate::a::Alpha;\n}\n";
    write(src.path(), "b.rs", b);
    let edges = Crate::read(src.path()).edges();
    let module = |name: &str| vec![name.to_string()];
    assert_eq!(edges[&module("a")], BTreeSet::from([module("b")]), "crate::B is b.rs's Beta");
    assert!(edges[&vec![]].is_empty(), "the root only re-exports");
    assert!(edges[&module("b")].is_empty(), "b.rs names a.rs only in a comment, strings and its tests");
}

fn write(src: &Path, name: &str, text: &str) {
    let path = src.join(name);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// The files of one crate's src/, by the module each defines.
struct Crate {
    files: BTreeMap<ModulePath, SourceFile>,
}

/// One file: its path under src/ and its code as tokens.
struct SourceFile {
    name: String,
    tokens: Vec<String>,
}

/// What one file's code names: the names it re-exports (and where they lead; `None` outside the
/// crate) and the module paths it refers to.
#[derive(Default)]
struct Scan {
    exports: BTreeMap<String, Option<ModulePath>>,
    references: Vec<ModulePath>,
}

impl Crate {
    /// Every `.rs` file under `src`; a main.rs beside a lib.rs is a crate of its own, left out.
    fn read(src: &Path) -> Crate {
        let beside_lib = src.join("lib.rs").is_file();
        let mut files = BTreeMap::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
                if path.is_dir() {
                    dirs.push(path);
                } else if name.ends_with(".rs") && !(name == "main.rs" && beside_lib) {
                    let tokens = without_tests(&tokens(&fs::read_to_string(&path).unwrap()));
                    files.insert(module_path(&name), SourceFile { name, tokens });
                }
            }
        }
        Crate { files }
    }

    /// One cycle per back edge of a depth-first walk, as `a.rs -> b.rs -> a.rs`.
    fn cycles(&self) -> Vec<String> {
        let edges = self.edges();
        let mut done = BTreeSet::new();
        let mut cycles = Vec::new();
        for start in edges.keys() {
            walk(start, &edges, &mut Vec::new(), &mut done, &mut cycles);
        }
        let name = |module: &ModulePath| self.files[module].name.clone();
        cycles.iter().map(|cycle| cycle.iter().map(name).collect::<Vec<_>>().join(" -> ")).collect()
    }

    /// Each file's edges to the other files that define what its paths name.
    fn edges(&self) -> BTreeMap<ModulePath, BTreeSet<ModulePath>> {
        let scans: BTreeMap<&ModulePath, Scan> =
            self.files.iter().map(|(module, file)| (module, self.scan(module, &file.tokens))).collect();
        let exports = scans.iter().map(|(module, scan)| (*module, &scan.exports)).collect();
        scans
            .iter()
            .map(|(module, scan)| {
                let targets = scan.references.iter().filter_map(|path| self.defining_file(path, &exports, 0));
                ((*module).clone(), targets.filter(|target| target != *module).collect())
            })
            .collect()
    }

    /// The file that defines what `path` names, through re-exports; `None` outside the crate.
    fn defining_file(
        &self,
        path: &[String],
        exports: &BTreeMap<&ModulePath, &BTreeMap<String, Option<ModulePath>>>,
        hops: usize,
    ) -> Option<ModulePath> {
        let split = (0..=path.len()).rev().find(|len| self.files.contains_key(&path[..*len]))?;
        let (file, rest) = path.split_at(split);
        match rest.first().and_then(|name| exports[&file.to_vec()].get(name)) {
            Some(target) if hops < 16 => {
                let full: ModulePath = target.as_ref()?.iter().chain(&rest[1..]).cloned().collect();
                self.defining_file(&full, exports, hops + 1)
            }
            _ => Some(file.to_vec()),
        }
    }

    /// The re-exports and references in the tokens of the file defining `module`.
    fn scan(&self, module: &ModulePath, tokens: &[String]) -> Scan {
        let mut scan = Scan::default();
        let mut reexports = Vec::new();
        let mut inline = InlineModules::default();
        let mut at = 0;
        while at < tokens.len() {
            let scope = inline.scope(module);
            if tokens[at] == "use" {
                let (paths, end) = use_tree(tokens, at + 1, Vec::new());
                let public = at > 0 && (tokens[at - 1] == "pub" || tokens[at - 1] == ")");
                for (path, alias) in paths {
                    let target = self.absolute(&scope, &path);
                    if public {
                        scan.exports.insert(alias.clone(), target.clone());
                        reexports.push((alias, target, at..end));
                    } else {
                        scan.references.extend(target);
                    }
                }
                at = end;
            } else if self.starts_path(tokens, at, &scope) {
                let (paths, end) = use_tree(tokens, at, Vec::new());
                scan.references.extend(paths.iter().filter_map(|(path, _)| self.absolute(&scope, path)));
                at = end;
            } else {
                inline.step(tokens, at);
                at += 1;
            }
        }
        for (alias, target, statement) in reexports {
            if tokens.iter().enumerate().any(|(at, token)| *token == alias && !statement.contains(&at)) {
                scan.references.extend(target);
            }
        }
        scan
    }

    /// Whether a path into this crate starts at `tokens[at]`: `crate::`, `super::`, `self::` or a
    /// child module of `scope`, not itself the tail of a longer path or a method.
    fn starts_path(&self, tokens: &[String], at: usize, scope: &[String]) -> bool {
        let head = tokens[at].as_str();
        let after_other = at > 0 && (tokens[at - 1] == "::" || tokens[at - 1] == ".");
        tokens.get(at + 1).is_some_and(|next| next == "::")
            && !after_other
            && (matches!(head, "crate" | "super" | "self") || self.is_child(scope, head))
    }

    /// `path` as a module path from the crate root, seen from `scope`; `None` for another crate's
    /// path or a name of the file itself.
    fn absolute(&self, scope: &[String], path: &[String]) -> Option<ModulePath> {
        let supers = path.iter().take_while(|segment| *segment == "super").count();
        let (base, rest) = match path.first()?.as_str() {
            "crate" => (&[][..], &path[1..]),
            "self" => (scope, &path[1..]),
            "super" => (&scope[..scope.len().checked_sub(supers)?], &path[supers..]),
            child if self.is_child(scope, child) => (scope, path),
            _ => return None,
        };
        Some([base, rest].concat())
    }

    /// Whether `name` is a module of its own file under `scope`.
    fn is_child(&self, scope: &[String], name: &str) -> bool {
        self.files.contains_key(&[scope, &[name.to_string()]].concat())
    }
}

/// The inline `mod name { … }` blocks open at a point of a file: what `self` and `super` mean there.
#[derive(Default)]
struct InlineModules {
    /// Each open block's name and the brace depth outside it.
    open: Vec<(String, usize)>,
    depth: usize,
}

impl InlineModules {
    /// The module at this point of the file defining `module`.
    fn scope(&self, module: &[String]) -> ModulePath {
        module.iter().cloned().chain(self.open.iter().map(|(name, _)| name.clone())).collect()
    }

    /// Moves past `tokens[at]`, opening a block at `mod name {` and closing it at its brace.
    fn step(&mut self, tokens: &[String], at: usize) {
        match tokens[at].as_str() {
            "mod" if tokens.get(at + 2).is_some_and(|next| next == "{") => {
                self.open.push((tokens[at + 1].clone(), self.depth))
            }
            "{" => self.depth += 1,
            "}" => {
                self.depth = self.depth.saturating_sub(1);
                if self.open.last().is_some_and(|(_, outside)| *outside == self.depth) {
                    self.open.pop();
                }
            }
            _ => {}
        }
    }
}

/// Depth-first from `node`; a neighbour still on `stack` closes a cycle.
fn walk(
    node: &ModulePath,
    edges: &BTreeMap<ModulePath, BTreeSet<ModulePath>>,
    stack: &mut Vec<ModulePath>,
    done: &mut BTreeSet<ModulePath>,
    cycles: &mut Vec<Vec<ModulePath>>,
) {
    if done.contains(node) {
        return;
    }
    stack.push(node.clone());
    for next in &edges[node] {
        if let Some(open) = stack.iter().position(|on_stack| on_stack == next) {
            cycles.push(stack[open..].iter().chain([next]).cloned().collect());
        } else {
            walk(next, edges, stack, done, cycles);
        }
    }
    stack.pop();
    done.insert(node.clone());
}

/// The module a file under src/ defines: `lib.rs` and `main.rs` the root, `a/mod.rs` and `a.rs` `a`.
fn module_path(name: &str) -> ModulePath {
    let mut path: ModulePath = name.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if path == ["lib"] || path == ["main"] || path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    path
}

/// The paths of the use tree (or plain path) starting at `tokens[at]` after `prefix`, each with
/// the name it brings into scope, and the index after the tree.
fn use_tree(tokens: &[String], mut at: usize, mut prefix: ModulePath) -> (Vec<(ModulePath, String)>, usize) {
    loop {
        match tokens.get(at).map(String::as_str) {
            Some("{") => {
                let mut paths = Vec::new();
                at += 1;
                while tokens.get(at).is_some_and(|token| token != "}") {
                    if tokens[at] == "," {
                        at += 1;
                        continue;
                    }
                    let (group, end) = use_tree(tokens, at, prefix.clone());
                    paths.extend(group);
                    at = end;
                }
                return (paths, at + 1);
            }
            Some("*") => return (vec![(prefix, "*".to_string())], at + 1),
            Some(segment) if is_identifier(segment) => {
                prefix.push(segment.to_string());
                at += 1;
                if tokens.get(at).is_some_and(|token| token == "::") {
                    at += 1;
                    continue;
                }
                if segment == "self" && prefix.len() > 1 {
                    prefix.pop();
                }
                let alias = if tokens.get(at).is_some_and(|token| token == "as") {
                    at += 2;
                    tokens[at - 1].clone()
                } else {
                    prefix.last().unwrap().clone()
                };
                return (vec![(prefix, alias)], at);
            }
            _ => {
                let alias = prefix.last().cloned().unwrap_or_default();
                return (vec![(prefix, alias)], at);
            }
        }
    }
}

fn is_identifier(token: &str) -> bool {
    token.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// `tokens` without the items under `#[cfg(test)]` (up to their `;` or their closing brace).
fn without_tests(tokens: &[String]) -> Vec<String> {
    const ATTRIBUTE: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let mut kept = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        if tokens[at..].starts_with(&ATTRIBUTE.map(String::from)) {
            at = item_end(tokens, at + ATTRIBUTE.len());
        } else {
            kept.push(tokens[at].clone());
            at += 1;
        }
    }
    kept
}

/// The index after the item starting at `tokens[at]`.
fn item_end(tokens: &[String], mut at: usize) -> usize {
    let mut depth = 0;
    while at < tokens.len() {
        match tokens[at].as_str() {
            ";" if depth == 0 => return at + 1,
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return at + 1;
                }
            }
            _ => {}
        }
        at += 1;
    }
    at
}

/// The identifiers, `::` and single punctuation of Rust source; comments, string and character
/// literals are dropped (a `{` or a `crate::` inside them is no code).
fn tokens(source: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut rest = source;
    while let Some(c) = rest.chars().next() {
        let skipped = if c.is_whitespace() {
            Some(c.len_utf8())
        } else if rest.starts_with("//") {
            Some(rest.find('\n').unwrap_or(rest.len()))
        } else if rest.starts_with("/*") {
            Some(rest.find("*/").map_or(rest.len(), |end| end + 2))
        } else {
            literal_len(rest)
        };
        let len = skipped.unwrap_or_else(|| {
            let len = if c.is_alphanumeric() || c == '_' {
                rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len())
            } else if rest.starts_with("::") {
                2
            } else {
                c.len_utf8()
            };
            tokens.push(rest[..len].to_string());
            len
        });
        rest = &rest[len..];
    }
    tokens
}

/// The length of the string or character literal `rest` starts with (`"…"`, `b"…"`, `r#"…"#`,
/// `'x'`, `'\n'`), if it starts with one; a lifetime's `'` is none.
fn literal_len(rest: &str) -> Option<usize> {
    let unprefixed = rest.strip_prefix(['b', 'c']).unwrap_or(rest);
    let prefix = rest.len() - unprefixed.len();
    if let Some(raw) = unprefixed.strip_prefix('r') {
        let body = raw.trim_start_matches('#').strip_prefix('"')?;
        let close = format!("\"{}", "#".repeat(raw.len() - body.len() - 1));
        let end = body.find(&close).map_or(body.len(), |at| at + close.len());
        return Some(rest.len() - body.len() + end);
    }
    if let Some(body) = unprefixed.strip_prefix('"') {
        return Some(prefix + 1 + quoted_len(body, '"'));
    }
    let body = unprefixed.strip_prefix('\'')?;
    let first = body.chars().next()?;
    if first == '\\' {
        return Some(prefix + 1 + quoted_len(body, '\''));
    }
    body[first.len_utf8()..].starts_with('\'').then_some(prefix + 2 + first.len_utf8())
}

/// The length of a quoted literal's body up to and with its closing `quote`, past escapes.
fn quoted_len(body: &str, quote: char) -> usize {
    let mut escaped = false;
    for (at, c) in body.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == quote {
            return at + 1;
        }
    }
    body.len()
}
