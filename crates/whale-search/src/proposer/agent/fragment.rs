//! A one-shot reply that holds only part of a harness. Asked for the whole file, a small model
//! often writes only what it changed: one function, or `solve` without the constants it reads,
//! or `solve` without its `export`. Such a reply is completed from its parent: the parent's
//! top-level declarations in their order, each replaced by the reply's of the same name (keeping
//! the parent's `export`), then the reply's new ones. A reply that declares `solve` and every
//! parent name it uses is taken as written. Declarations are found with the mutate proposer's
//! lexer, so that a brace or a keyword inside a string or a comment is not read as code.

use crate::proposer::mutate::tokens::{tokenize, Token, TokenKind};
use std::collections::BTreeSet;

/// Words that start a top-level declaration.
const DECLARING: [&str; 7] = ["export", "function", "async", "const", "let", "var", "class"];

/// Punctuation after which a line break does not end a statement (`x =\n value`).
const CONTINUING: [&str; 15] = ["=", "+", "-", "*", "/", ",", "(", "[", ".", "?", ":", "&", "|", "<", ">"];

/// A reply completed from its parent, and what the reply lacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Completed {
    pub source: String,
    /// The parent's names the reply used without declaring, and `solve` or its `export` if the
    /// reply lacked them.
    pub lacked: Vec<String>,
}

/// One top-level declaration: its name (`None` for a destructuring one), the span of its text
/// (from the comment lines just above it to the next declaration) and whether it is exported.
#[derive(Debug)]
struct Item {
    name: Option<String>,
    start: usize,
    /// Where its first word is.
    at: usize,
    end: usize,
    exported: bool,
}

/// A module's text before its first declaration, and its declarations.
struct Module<'s> {
    source: &'s str,
    preamble_end: usize,
    items: Vec<Item>,
    words: BTreeSet<&'s str>,
}

impl<'s> Module<'s> {
    fn read(source: &'s str) -> Self {
        let tokens = tokenize(source);
        let mut starts = Vec::new();
        let mut depth = 0i32;
        for (i, token) in tokens.iter().enumerate() {
            if depth == 0 && starts_statement(source, &tokens, i) {
                starts.push(i);
            }
            depth += nesting(source, token);
        }
        let mut items: Vec<Item> = starts
            .iter()
            .map(|&i| Item {
                name: declared_name(source, &tokens[i..]),
                start: leading_comments_start(source, line_start(source, tokens[i].start)),
                at: tokens[i].start,
                end: source.len(),
                exported: tokens[i].is_word(source, "export"),
            })
            .collect();
        for next in 1..items.len() {
            items[next - 1].end = items[next].start;
        }
        let words = tokens.iter().filter(|t| t.kind == TokenKind::Word).map(|t| t.text(source)).collect();
        Self { source, preamble_end: items.first().map_or(source.len(), |item| item.start), items, words }
    }

    fn item(&self, name: &str) -> Option<&Item> {
        self.items.iter().find(|item| item.name.as_deref() == Some(name))
    }

    fn text(&self, item: &Item) -> &'s str {
        &self.source[item.start..item.end]
    }

    fn names(&self) -> BTreeSet<&str> {
        self.items.iter().filter_map(|item| item.name.as_deref()).collect()
    }
}

/// How a token changes the nesting of brackets.
fn nesting(source: &str, token: &Token) -> i32 {
    match token.kind {
        TokenKind::Punct => match token.text(source) {
            "(" | "[" | "{" => 1,
            ")" | "]" | "}" => -1,
            _ => 0,
        },
        _ => 0,
    }
}

/// Whether token `i` (at nesting depth 0) begins a declaration statement.
fn starts_statement(source: &str, tokens: &[Token], i: usize) -> bool {
    let token = &tokens[i];
    if token.kind != TokenKind::Word || !DECLARING.contains(&token.text(source)) {
        return false;
    }
    let Some(previous) = i.checked_sub(1).map(|p| &tokens[p]) else { return true };
    if previous.is_punct(source, ";") || previous.is_punct(source, "}") {
        return true;
    }
    let new_line = source[previous.end..token.start].contains('\n');
    new_line && !(previous.kind == TokenKind::Punct && CONTINUING.contains(&previous.text(source)))
}

/// The name a declaration starting at `tokens[0]` declares (`None` for `const { a } = …`).
fn declared_name(source: &str, tokens: &[Token]) -> Option<String> {
    let skipped = ["export", "default", "async", "function", "const", "let", "var", "class"];
    let keyword =
        |t: &&Token| t.is_punct(source, "*") || t.kind == TokenKind::Word && skipped.contains(&t.text(source));
    tokens.iter().find(|t| !keyword(t)).filter(|t| t.kind == TokenKind::Word).map(|t| t.text(source).to_string())
}

fn line_start(source: &str, at: usize) -> usize {
    source[..at].rfind('\n').map_or(0, |i| i + 1)
}

/// The start of the `//` comment lines right above the line starting at `at`, else `at`.
fn leading_comments_start(source: &str, mut at: usize) -> usize {
    while at > 0 {
        let above = line_start(source, at - 1);
        if !source[above..at].trim_start().starts_with("//") {
            break;
        }
        at = above;
    }
    at
}

/// `reply` completed from `parent` if it is a fragment of it; `None` if it stands alone (or
/// declares nothing to merge).
pub(super) fn complete(reply: &str, parent: &str) -> Option<Completed> {
    let reply_module = Module::read(reply);
    let parent_module = Module::read(parent);
    if reply_module.items.is_empty() {
        return None;
    }
    let declared = reply_module.names();
    let mut lacked: Vec<String> = parent_module
        .names()
        .into_iter()
        .filter(|name| !declared.contains(name) && reply_module.words.contains(name))
        .map(str::to_string)
        .collect();
    match reply_module.item("solve") {
        None => lacked.push("solve".to_string()),
        Some(solve) if !solve.exported => lacked.push("export of solve".to_string()),
        Some(_) => {}
    }
    if lacked.is_empty() {
        return None;
    }
    Some(Completed { source: merged(&reply_module, &parent_module), lacked })
}

/// The parent's declarations, each replaced by the reply's of the same name, then the reply's
/// new ones; the reply's preamble if it wrote one.
fn merged(reply: &Module<'_>, parent: &Module<'_>) -> String {
    let reply_preamble = &reply.source[..reply.preamble_end];
    let preamble =
        if reply_preamble.trim().is_empty() { &parent.source[..parent.preamble_end] } else { reply_preamble };
    let mut out = with_newline(preamble);
    for item in &parent.items {
        let replacement = item.name.as_deref().and_then(|name| reply.item(name));
        let text = match replacement {
            Some(new) if item.exported && !new.exported => {
                format!("{}export {}", &reply.source[new.start..new.at], &reply.source[new.at..new.end])
            }
            Some(new) => reply.text(new).to_string(),
            None => parent.text(item).to_string(),
        };
        out.push_str(&with_newline(&text));
    }
    let parent_names = parent.names();
    for item in reply.items.iter().filter(|item| item.name.as_deref().is_none_or(|n| !parent_names.contains(n))) {
        out.push_str(&with_newline(reply.text(item)));
    }
    out
}

fn with_newline(text: &str) -> String {
    if text.is_empty() || text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use whale_harness::{validate, Limits};

    const PARENT: &str = "// A harness.\nexport const meta = { name: \"p\" };\n\n// The instruction.\nconst INSTRUCTION =\n  \"Answer { briefly }; \" +\n  \"no sentence.\";\n\nfunction clean(text) {\n  return text.trim();\n}\n\nexport function solve(task, ctx) {\n  return clean(ctx.llm.chat([{ role: \"system\", content: INSTRUCTION }, { role: \"user\", content: ctx.env.observation }]).text);\n}\n";

    #[test]
    fn a_reply_of_one_changed_function_is_merged_into_its_parent() {
        let reply = "function clean(text) {\n  return text.trim().replace(/\\.$/, \"\");\n}\n";
        let completed = complete(reply, PARENT).expect("a fragment");
        assert_eq!(completed.lacked, ["solve"]);
        assert!(completed.source.contains("replace(/\\.$/"), "{}", completed.source);
        assert_eq!(completed.source.matches("function clean").count(), 1);
        assert!(completed.source.contains("const INSTRUCTION =\n  \"Answer { briefly }; \" +\n  \"no sentence.\";"));
        validate(&completed.source, &Limits::default()).expect("the merged harness validates");
    }

    #[test]
    fn a_solve_without_its_constants_or_export_keeps_the_parent_s_and_is_exported() {
        let reply = "// Exclaim.\nasync function solve(task, ctx) {\n  const reply = ctx.llm.chat([{ role: \"system\", content: INSTRUCTION }]);\n  return clean(reply.text) + \"!\";\n}\nconst EXTRA = 1;\n";
        let completed = complete(reply, PARENT).expect("a fragment");
        assert_eq!(completed.lacked, ["INSTRUCTION", "clean", "export of solve"]);
        let source = &completed.source;
        assert!(source.starts_with("// A harness.\n"), "{source}");
        assert!(source.contains("// Exclaim.\nexport async function solve"), "{source}");
        assert!(source.trim_end().ends_with("const EXTRA = 1;"), "new declarations come last: {source}");
        assert!(
            source.find("const INSTRUCTION").expect("kept")
                < source.find("export async function solve").expect("solve")
        );
        validate(source, &Limits::default()).expect("the merged harness validates");
    }

    #[test]
    fn a_whole_harness_is_taken_as_written() {
        assert_eq!(complete(PARENT, PARENT), None);
        let renamed = PARENT.replace("clean", "tidy");
        assert_eq!(complete(&renamed, PARENT), None, "a reply may drop a parent's function it no longer uses");
        assert_eq!(complete("return 1;", PARENT), None, "nothing declared, nothing to merge");
    }

    /// The parent a one-shot request showed: the first `js` block of its task message.
    fn shown_parent(task: &str) -> &str {
        let start = task.find("```js\n").expect("the task shows the incumbent") + 6;
        let end = start + task[start..].find("\n```").expect("a closed block");
        &task[start..=end]
    }

    /// Qwen2.5-Coder-1.5B's own one-shot replies, as the committed transcripts hold them
    /// (docs/results/llm-proposer/): each reply that is a fragment of the harness it was shown
    /// validates once merged, unless it imports a module, which no merge can mend. Prints a
    /// line per reply (`-- --nocapture`).
    #[test]
    fn the_real_model_s_fragment_replies_validate_once_merged() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/llm-proposer");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("the committed transcripts")
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.to_string_lossy().contains("one-shot"))
            .collect();
        files.sort();
        let (mut merged, mut mended) = (0, 0);
        for file in &files {
            let session: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(file).expect("read")).expect("a session");
            for (i, reply) in session["replies"].as_array().expect("replies").iter().enumerate() {
                let parent = shown_parent(reply["task"].as_str().expect("task"));
                let content = reply["reply"]["content"].as_str().unwrap_or_default();
                let Ok(harness) = super::super::one_shot::read_reply(content) else { continue };
                let name = file.file_name().expect("name").to_string_lossy();
                let Some(completed) = complete(&harness.source, parent) else {
                    println!("{name} reply {}: whole", i + 1);
                    continue;
                };
                merged += 1;
                let outcome = validate(&completed.source, &Limits::default()).map(|_| ()).map_err(|e| e.to_string());
                println!("{name} reply {}: lacked {:?}, merged: {outcome:?}", i + 1, completed.lacked);
                match outcome {
                    Ok(()) => mended += 1,
                    Err(_) => assert!(completed.source.contains("import "), "{}", completed.source),
                }
            }
        }
        assert!(merged >= 2 && mended >= 1, "{merged} merged, {mended} of them valid");
    }
}
