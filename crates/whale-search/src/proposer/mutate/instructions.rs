//! Prompt text inside a harness: the string and template literals that read as instructions
//! to the model (four words or more; not an object key, the operand of a comparison, a log or
//! error message, or a `name`/`description`/`hypothesis` of the harness's `meta`), and their
//! complete sentences, so a prompt can be rewritten in place: a sentence added, dropped or
//! replaced. A fragment that runs on into the next literal (`"... and wait for " + "..."`) is
//! not a sentence and is never cut.

use super::tokens::{tokenize, Token, TokenKind};
use std::ops::Range;

/// An instruction literal of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Instruction {
    /// Byte range of the text between the quotes.
    pub inner: Range<usize>,
    /// A template literal with `${…}` (only appended to, never cut).
    pub substitutions: bool,
    /// Real line breaks separate its lines (a multi-line template).
    pub multiline: bool,
    /// A `+` follows: the text may run on after it.
    pub continued: bool,
}

impl Instruction {
    pub fn text<'s>(&self, source: &'s str) -> &'s str {
        &source[self.inner.clone()]
    }

    /// Its sentences, as byte ranges of the source.
    pub fn sentences(&self, source: &str) -> Vec<Range<usize>> {
        if self.substitutions {
            return Vec::new();
        }
        let offset = self.inner.start;
        sentences(self.text(source)).into_iter().map(|r| r.start + offset..r.end + offset).collect()
    }

    /// Whether a sentence can be added at its end: it is not cut off mid-sentence by a `+`.
    pub fn accepts_append(&self, source: &str) -> bool {
        let text = self.text(source);
        let closed = text.trim_end().ends_with(['.', '!', '?', ':']) || text.ends_with('\n') || text.ends_with("\\n");
        !self.continued || closed
    }

    /// `source` with `phrase` added as the last sentence, on a line of its own when the text
    /// is written in lines.
    pub fn append(&self, source: &str, phrase: &str) -> String {
        let text = self.text(source);
        let separator = if text.ends_with(char::is_whitespace) || text.ends_with("\\n") || text.is_empty() {
            ""
        } else if self.multiline {
            "\n"
        } else if text.contains("\\n") {
            "\\n"
        } else {
            " "
        };
        splice(source, self.inner.end..self.inner.end, &format!("{separator}{phrase}"))
    }

    /// `source` without sentence `index`, the separator before the next sentence included;
    /// `None` unless at least two sentences remain to choose from.
    pub fn drop_sentence(&self, source: &str, index: usize) -> Option<String> {
        let all = self.sentences(source);
        if all.len() < 2 || index >= all.len() {
            return None;
        }
        let cut = match all.get(index + 1) {
            Some(next) => all[index].start..next.start,
            None => all[index - 1].end..all[index].end,
        };
        Some(splice(source, cut, ""))
    }

    /// `source` with sentence `index` replaced by `phrase`.
    pub fn replace_sentence(&self, source: &str, index: usize, phrase: &str) -> Option<String> {
        let all = self.sentences(source);
        all.get(index).map(|range| splice(source, range.clone(), phrase))
    }
}

/// The instruction literals of `source`, in order.
pub(crate) fn instructions(source: &str) -> Vec<Instruction> {
    let tokens = tokenize(source);
    (0..tokens.len())
        .filter(|&i| reads_as_instruction(source, &tokens, i))
        .map(|i| {
            let (start, end) = tokens[i].inner(source);
            Instruction {
                inner: start..end,
                substitutions: tokens[i].kind == (TokenKind::Template { substitutions: true }),
                multiline: source[start..end].contains('\n'),
                continued: tokens.get(i + 1).is_some_and(|t| t.is_punct(source, "+")),
            }
        })
        .collect()
}

fn reads_as_instruction(source: &str, tokens: &[Token], i: usize) -> bool {
    let token = tokens[i];
    if !matches!(token.kind, TokenKind::Quoted | TokenKind::Template { .. }) || token.end - token.start < 2 {
        return false;
    }
    let punct = |at: Option<usize>, p: &str| at.and_then(|j| tokens.get(j)).is_some_and(|t| t.is_punct(source, p));
    let compared_before =
        punct(i.checked_sub(1), "=") && (punct(i.checked_sub(2), "=") || punct(i.checked_sub(2), "!"));
    let compared_after = punct(Some(i + 1), "=") && punct(Some(i + 2), "=") || punct(Some(i + 1), "!");
    let key = punct(Some(i + 1), ":");
    let word = |at: Option<usize>, words: &[&str]| {
        at.and_then(|j| tokens.get(j)).is_some_and(|t| t.kind == TokenKind::Word && words.contains(&t.text(source)))
    };
    let described = punct(i.checked_sub(1), ":") && word(i.checked_sub(2), &META_FIELDS);
    let message = punct(i.checked_sub(1), "(") && word(i.checked_sub(2), &MESSAGE_CALLS);
    let (start, end) = token.inner(source);
    let text = &source[start..end];
    let words = text.split_whitespace().filter(|w| w.chars().any(char::is_alphabetic)).count();
    let letters = text.chars().filter(|c| c.is_alphabetic()).count();
    !compared_before && !compared_after && !key && !described && !message && words >= 4 && letters >= 15
}

/// Fields of a harness's `meta` (text about the harness, not to the model).
const META_FIELDS: [&str; 3] = ["name", "description", "hypothesis"];
/// Callees whose text goes to the log or into an error, not to the model.
const MESSAGE_CALLS: [&str; 8] = ["log", "info", "warn", "error", "debug", "Error", "TypeError", "RangeError"];

/// Complete sentences of literal text: runs ending at `.`, `!` or `?` before a space or the
/// end, or at a line break (a real one or a `\n` escape). A trailing run with neither is a
/// fragment continued elsewhere and left out.
fn sentences(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let is_break = |i: usize| bytes.get(i) == Some(&b'\\') && matches!(bytes.get(i + 1), Some(b'n' | b't'));
    let mut found = Vec::new();
    let mut i = 0;
    loop {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || is_break(i)) {
            i += if is_break(i) { 2 } else { 1 };
        }
        if i >= bytes.len() {
            return found;
        }
        let start = i;
        let mut end = bytes.len();
        while i < bytes.len() {
            if bytes[i] == b'\n' || is_break(i) {
                end = i;
                break;
            }
            if bytes[i] == b'\\' {
                i += 2;
                continue;
            }
            let terminal = matches!(bytes[i], b'.' | b'!' | b'?');
            i += 1;
            if terminal && (i >= bytes.len() || bytes[i].is_ascii_whitespace() || is_break(i)) {
                end = i;
                break;
            }
        }
        let complete = end < bytes.len() || matches!(bytes.last(), Some(b'.' | b'!' | b'?'));
        let end = end.min(bytes.len());
        if complete {
            found.push(start..end);
        }
        i = i.max(end);
    }
}

fn splice(source: &str, range: Range<usize>, with: &str) -> String {
    format!("{}{}{}", &source[..range.start], with, &source[range.end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str =
        "const SYSTEM = \"Solve the problem carefully. Show the key steps.\\nEnd with a line ANSWER: x.\";\n\
                          if (reply.text === \"no answer was given at all\") {}\n\
                          const m = { \"a long key of many words\": 1, role: \"user\" };\n\
                          const T = `Question: ${q}\nAnswer it in one short line please`;\n";

    #[test]
    fn instructions_are_prompt_literals_only() {
        let found = instructions(SOURCE);
        let texts: Vec<&str> = found.iter().map(|i| i.text(SOURCE)).collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(texts[0].starts_with("Solve the problem"));
        assert!(found[1].substitutions && found[1].multiline);
        assert!(found[1].sentences(SOURCE).is_empty());
    }

    #[test]
    fn sentences_are_added_dropped_and_replaced_in_place() {
        let system = &instructions(SOURCE)[0];
        let sentences: Vec<&str> = system.sentences(SOURCE).into_iter().map(|r| &SOURCE[r]).collect();
        assert_eq!(sentences, ["Solve the problem carefully.", "Show the key steps.", "End with a line ANSWER: x."]);
        let dropped = system.drop_sentence(SOURCE, 1).expect("drop");
        assert!(dropped.starts_with("const SYSTEM = \"Solve the problem carefully. End with a line ANSWER: x.\";"));
        let last = system.drop_sentence(SOURCE, 2).expect("drop last");
        assert!(last.starts_with("const SYSTEM = \"Solve the problem carefully. Show the key steps.\";"));
        let appended = system.append(SOURCE, "Be brief.");
        assert!(appended.starts_with(
            "const SYSTEM = \"Solve the problem carefully. Show the key steps.\\nEnd with a line ANSWER: x.\\nBe brief.\";"
        ));
        let replaced = system.replace_sentence(SOURCE, 0, "Be brief.").expect("replace");
        assert!(replaced.starts_with("const SYSTEM = \"Be brief. Show"));
        let template = &instructions(SOURCE)[1];
        assert!(template.append(SOURCE, "Be brief.").contains("one short line please\nBe brief.`"));
        assert_eq!(template.drop_sentence(SOURCE, 0), None);
    }

    #[test]
    fn a_literal_continued_by_concatenation_is_marked_and_its_fragment_is_no_sentence() {
        let source = "const I = \"You can use a calculator. To use it, reply and wait for \" +\n  \"the result. Then answer in one line.\";";
        let found = instructions(source);
        assert_eq!(found.iter().map(|i| i.continued).collect::<Vec<_>>(), [true, false]);
        assert_eq!(found.iter().map(|i| i.accepts_append(source)).collect::<Vec<_>>(), [false, true]);
        let first: Vec<&str> = found[0].sentences(source).into_iter().map(|r| &source[r]).collect();
        assert_eq!(first, ["You can use a calculator."]);
        assert!(found[1].append(source, "Be brief.").ends_with("Then answer in one line. Be brief.\";"));
    }
}
