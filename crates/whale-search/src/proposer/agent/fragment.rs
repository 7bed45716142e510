//! A one-shot reply that holds only part of a harness. Asked for the whole file, a small model
//! often writes only what it changed: one function, or `solve` without the constants it reads,
//! or `solve` without its `export`. Such a reply is completed from its parent: the parent's
//! top-level statements in their order, each declaration replaced by the reply's of the same
//! name (keeping the parent's `export`), the reply's new statements placed before the first
//! replaced declaration that follows them in the reply. A reply that exports `solve` and declares
//! every parent name it uses is taken as written, and so is one cut off inside its code block.
//! Statements are found with the mutate proposer's lexer, so that a brace or a keyword inside a
//! string or a comment is not read as code.

use crate::proposer::mutate::tokens::{substitutions, tokenize, Token, TokenKind};
use std::collections::BTreeSet;

/// Words that go on a statement rather than start one (`} else {`).
const CONTINUING_WORDS: [&str; 4] = ["else", "catch", "finally", "while"];

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

/// One top-level statement: the names it declares (none for an expression or a block), the span
/// of its text (from the comment lines just above it to the next statement) and whether it is
/// an `export` declaration.
#[derive(Debug)]
struct Item {
    names: Vec<String>,
    start: usize,
    /// Where its first token is.
    at: usize,
    end: usize,
    exported: bool,
}

/// A module's text before its first statement, its statements, the names it exports, and the
/// names its code uses that it does not declare anywhere.
struct Module<'s> {
    source: &'s str,
    preamble_end: usize,
    items: Vec<Item>,
    exported: BTreeSet<String>,
    free_words: BTreeSet<&'s str>,
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
            .enumerate()
            .map(|(n, &i)| {
                let until = starts.get(n + 1).copied().unwrap_or(tokens.len());
                Item {
                    names: declared_names(source, &tokens[i..until]),
                    start: item_start(source, tokens[i].start),
                    at: tokens[i].start,
                    end: source.len(),
                    exported: tokens[i].is_word(source, "export"),
                }
            })
            .collect();
        for next in 1..items.len() {
            items[next - 1].end = items[next].start;
        }
        let exported = exported_names(source, &tokens, &items);
        let preamble_end = items.first().map_or(source.len(), |item| item.start);
        Self { source, preamble_end, items, exported, free_words: free_words(source, &tokens) }
    }

    /// The index of the statement that declares `name`.
    fn declaring(&self, name: &str) -> Option<usize> {
        self.items.iter().position(|item| item.names.iter().any(|n| n == name))
    }

    fn text(&self, item: &Item) -> &'s str {
        &self.source[item.start..item.end]
    }

    fn names(&self) -> BTreeSet<&str> {
        self.items.iter().flat_map(|item| item.names.iter().map(String::as_str)).collect()
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

/// Whether token `i` (at nesting depth 0) begins a statement: a word or a block after a `;`, a
/// `}`, or a line break that does not continue an expression.
fn starts_statement(source: &str, tokens: &[Token], i: usize) -> bool {
    let token = &tokens[i];
    let word = token.kind == TokenKind::Word && !CONTINUING_WORDS.contains(&token.text(source));
    if !word && !token.is_punct(source, "{") {
        return false;
    }
    let Some(previous) = i.checked_sub(1).map(|p| &tokens[p]) else { return true };
    if previous.is_punct(source, ";") || previous.is_punct(source, "}") {
        return true;
    }
    let new_line = source[previous.end..token.start].contains('\n');
    new_line && !(previous.kind == TokenKind::Punct && CONTINUING.contains(&previous.text(source)))
}

/// The names a statement declares: a function's or a class's, or every declarator's of a
/// `const`, `let` or `var` (`const a = 1, b = 2`); none for a destructuring one.
fn declared_names(source: &str, tokens: &[Token]) -> Vec<String> {
    let skipped = ["export", "async", "function", "class"];
    let keyword =
        |t: &&Token| t.is_punct(source, "*") || t.kind == TokenKind::Word && skipped.contains(&t.text(source));
    let Some(first) = tokens.iter().position(|t| !keyword(&t)) else { return Vec::new() };
    let declares = tokens[..first].iter().any(|t| t.kind == TokenKind::Word && t.text(source) != "export");
    let binding = ["const", "let", "var"].contains(&tokens[first].text(source));
    if !binding {
        let named = declares && tokens[first].kind == TokenKind::Word;
        return if named { vec![tokens[first].text(source).to_string()] } else { Vec::new() };
    }
    let mut names = Vec::new();
    let mut depth = 0i32;
    let mut expecting = true;
    for token in &tokens[first + 1..] {
        if expecting && token.kind == TokenKind::Word {
            names.push(token.text(source).to_string());
        }
        depth += nesting(source, token);
        expecting = depth == 0 && token.is_punct(source, ",");
    }
    names
}

/// The names `export` makes public: exported declarations', and those of `export { a, b }` and
/// `export default a`.
fn exported_names(source: &str, tokens: &[Token], items: &[Item]) -> BTreeSet<String> {
    let mut exported: BTreeSet<String> =
        items.iter().filter(|item| item.exported).flat_map(|item| item.names.iter().cloned()).collect();
    for (i, token) in tokens.iter().enumerate() {
        if !token.is_word(source, "export") {
            continue;
        }
        let rest = &tokens[i + 1..];
        if rest.first().is_some_and(|t| t.is_punct(source, "{")) {
            let list = rest.iter().skip(1).take_while(|t| !t.is_punct(source, "}"));
            exported.extend(
                list.filter(|t| t.kind == TokenKind::Word && t.text(source) != "as")
                    .map(|t| t.text(source).to_string()),
            );
        } else if rest.first().is_some_and(|t| t.is_word(source, "default")) {
            exported.extend(rest.get(1).filter(|t| t.kind == TokenKind::Word).map(|t| t.text(source).to_string()));
        }
    }
    exported
}

/// The words the code uses as names (not after a `.`, not an object key before a `:`, and also
/// inside a template's `${…}`), less every name it declares at any depth.
fn free_words<'s>(source: &'s str, tokens: &[Token]) -> BTreeSet<&'s str> {
    let mut used = BTreeSet::new();
    let mut declared = BTreeSet::new();
    for (i, token) in tokens.iter().enumerate() {
        match token.kind {
            TokenKind::Word => {
                let after_dot = i > 0 && tokens[i - 1].is_punct(source, ".");
                let key = tokens.get(i + 1).is_some_and(|t| t.is_punct(source, ":"));
                let text = token.text(source);
                if ["const", "let", "var", "function", "class"].contains(&text) {
                    declared.extend(tokens.get(i + 1).filter(|t| t.kind == TokenKind::Word).map(|t| t.text(source)));
                } else if !after_dot && !key {
                    used.insert(text);
                }
            }
            TokenKind::Template { substitutions: true } => {
                for code in substitutions(token.text(source)) {
                    used.extend(tokenize(code).iter().filter(|t| t.kind == TokenKind::Word).map(|t| t.text(code)));
                }
            }
            _ => {}
        }
    }
    used.retain(|word| !declared.contains(word));
    used
}

/// Where a statement's text starts: with the comment lines just above it when it begins its
/// line, else at its first token.
fn item_start(source: &str, at: usize) -> usize {
    let line = line_start(source, at);
    if !source[line..at].trim().is_empty() {
        return at;
    }
    let mut start = line;
    while start > 0 {
        let above = line_start(source, start - 1);
        if !source[above..start].trim_start().starts_with("//") {
            break;
        }
        start = above;
    }
    start
}

fn line_start(source: &str, at: usize) -> usize {
    source[..at].rfind('\n').map_or(0, |i| i + 1)
}

/// `reply` completed from `parent` if it is a fragment of it; `None` if it stands alone (or
/// declares nothing to merge).
pub(super) fn complete(reply: &str, parent: &str) -> Option<Completed> {
    let reply_module = Module::read(reply);
    let parent_module = Module::read(parent);
    if reply_module.items.iter().all(|item| item.names.is_empty()) {
        return None;
    }
    let declared = reply_module.names();
    let mut lacked: Vec<String> = parent_module
        .names()
        .into_iter()
        .filter(|name| !declared.contains(name) && reply_module.free_words.contains(name))
        .map(str::to_string)
        .collect();
    if !declared.contains("solve") {
        lacked.push("solve".to_string());
    } else if !reply_module.exported.contains("solve") {
        lacked.push("export of solve".to_string());
    }
    if lacked.is_empty() {
        return None;
    }
    Some(Completed { source: merged(&reply_module, &parent_module), lacked })
}

/// The parent's statements, each declaration replaced by the reply's of the same name, and the
/// reply's new statements before the first replaced one that follows them in the reply (the
/// rest at the end); the reply's preamble if it wrote one.
fn merged(reply: &Module<'_>, parent: &Module<'_>) -> String {
    let reply_preamble = &reply.source[..reply.preamble_end];
    let preamble =
        if reply_preamble.trim().is_empty() { &parent.source[..parent.preamble_end] } else { reply_preamble };
    let parent_names = parent.names();
    let new: Vec<usize> = (0..reply.items.len())
        .filter(|&j| {
            let item = &reply.items[j];
            match item.names.is_empty() {
                true => !parent.source.contains(reply.text(item).trim()),
                false => item.names.iter().all(|name| !parent_names.contains(name.as_str())),
            }
        })
        .collect();
    let mut emitted = BTreeSet::new();
    let mut out = with_newline(preamble);
    for item in &parent.items {
        let replacement = item.names.iter().find_map(|name| reply.declaring(name));
        let Some(j) = replacement else {
            out.push_str(&with_newline(parent.text(item)));
            continue;
        };
        for &k in new.iter().filter(|&&k| k < j) {
            if emitted.insert(k) {
                out.push_str(&with_newline(reply.text(&reply.items[k])));
            }
        }
        if !emitted.insert(j) {
            continue;
        }
        let new_item = &reply.items[j];
        let exported_here = new_item.exported || new_item.names.iter().any(|n| reply.exported.contains(n));
        if item.exported && !exported_here {
            out.push_str(&with_newline(&format!(
                "{}export {}",
                &reply.source[new_item.start..new_item.at],
                &reply.source[new_item.at..new_item.end]
            )));
        } else {
            out.push_str(&with_newline(reply.text(new_item)));
        }
    }
    for &k in &new {
        if emitted.insert(k) {
            out.push_str(&with_newline(reply.text(&reply.items[k])));
        }
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

    #[test]
    fn top_level_code_between_declarations_stays_and_a_reply_s_own_exports_are_read() {
        let layered = format!("{PARENT}{{\n  whaleLayers.push(\"vote-1\");\n}}\n");
        let reply =
            "export function solve(task, ctx) {\n  const clean = (t) => t;\n  return clean(`${INSTRUCTION}`);\n}\n";
        let completed = complete(reply, &layered).expect("INSTRUCTION is used inside a template only");
        assert_eq!(completed.lacked, ["INSTRUCTION"], "a local `clean` is not the parent's");
        assert!(completed.source.contains("whaleLayers.push(\"vote-1\")"), "{}", completed.source);
        let exported_apart =
            "const INSTRUCTION = \"x\";\nfunction solve(task, ctx) {\n  return INSTRUCTION;\n}\nexport { solve };\n";
        assert_eq!(complete(exported_apart, PARENT), None, "`export {{ solve }}` exports it");
    }

    #[test]
    fn declarators_on_one_line_and_new_constants_read_by_replaced_ones_keep_their_order() {
        let parent = "const A = 1, B = 2; const C = 3;\nexport function solve() {\n  return A + B + C;\n}\n";
        let module = Module::read(parent);
        let names: Vec<&Vec<String>> = module.items.iter().map(|item| &item.names).collect();
        assert_eq!(
            names,
            [&vec!["A".to_string(), "B".to_string()], &vec!["C".to_string()], &vec!["solve".to_string()]]
        );
        let reply = "const D = 4;\nconst C = D + 1;\n";
        let completed = complete(reply, parent).expect("no solve");
        let source = &completed.source;
        assert!(
            source.find("const D = 4;").expect("new") < source.find("const C = D + 1;").expect("replaced"),
            "{source}"
        );
        assert!(source.contains("const A = 1, B = 2; ") && !source.contains("const C = 3"), "{source}");
        validate(source, &Limits::default()).expect("the merged harness validates");
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
                if harness.cut_off {
                    continue;
                }
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
        assert_eq!((merged, mended), (6, 4), "fragments merged, and of them valid, in the committed transcripts");
    }
}
