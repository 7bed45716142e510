//! Finding the final answer in a model's free-form text.
//!
//! Models state answers in many conventions (`\boxed{}`, "The answer is ...", GSM8K's
//! `#### `, or just a number at the end). Each convention is one [`Extractor`]; a grader tries
//! them in a configurable order and takes the first that finds something, so a harness
//! author can, say, trust only `\boxed{}`.

use super::latex::TEXT_COMMANDS;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// One way of locating the final answer in a text. GSM8K-style calculator annotations
/// (`<<3*4=12>>`) are removed from the text first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Extractor {
    /// The content of the last complete `\boxed{...}` or `\fbox{...}` (braces matched).
    Boxed,
    /// What follows the last "answer is" / "answer:": a `$...$` span, or the rest of the
    /// sentence — reduced to its last number when it is prose ("therefore 3 apples").
    AnswerIs,
    /// The rest of the line after the last `####`, reduced like [`Extractor::AnswerIs`].
    Hashes,
    /// The whole text, when it is a lone answer rather than prose: one line with no word of
    /// three or more letters outside LaTeX commands and `\text{}` (`\frac{1}{2}`, `(1, 2)`, `10 cm`).
    Bare,
    /// The last number (`-12`, `1,234.5`, `3/4`).
    LastNumber,
}

/// The order graders use by default: explicit markers first, the last number as a last resort.
pub const DEFAULT_ORDER: [Extractor; 5] =
    [Extractor::Boxed, Extractor::AnswerIs, Extractor::Hashes, Extractor::Bare, Extractor::LastNumber];

/// The answer found by the first extractor of `order` that finds a non-empty one.
pub fn extract_answer(text: &str, order: &[Extractor]) -> Option<String> {
    let text = &without_calculator_annotations(text);
    order.iter().find_map(|extractor| {
        let found = match extractor {
            Extractor::Boxed => last_boxed(text),
            Extractor::AnswerIs => after_answer_cue(text).map(answer_in_phrase),
            Extractor::Hashes => after_hashes(text).map(answer_in_phrase),
            Extractor::Bare => bare(text),
            Extractor::LastNumber => last_number(text),
        };
        found.map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
    })
}

/// The text without `<<expression=value>>` annotations (GSM8K's calculator traces).
fn without_calculator_annotations(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find("<<") else {
        return Cow::Borrowed(text);
    };
    let mut clean = String::with_capacity(text.len());
    let mut rest = text;
    let mut next = Some(first);
    while let Some(open) = next {
        let Some(close) = rest[open..].find(">>").map(|c| open + c) else {
            break;
        };
        if rest[open..close].contains('\n') {
            break;
        }
        clean.push_str(&rest[..open]);
        rest = &rest[close + 2..];
        next = rest.find("<<");
    }
    clean.push_str(rest);
    Cow::Owned(clean)
}

/// A phrase after an answer marker: itself when it reads as a lone answer, else its last
/// number (when it has one).
fn answer_in_phrase(phrase: &str) -> &str {
    bare(phrase).or_else(|| last_number(phrase)).unwrap_or(phrase)
}

/// How many of the last `\boxed` occurrences are tried for a complete one (each try may scan
/// to the end of the text).
const MAX_BOX_ATTEMPTS: usize = 16;

/// Content of the last `\boxed{...}` / `\fbox{...}` whose braces close (or `\boxed 5`).
pub fn last_boxed(text: &str) -> Option<&str> {
    let starts = text.match_indices(r"\boxed").chain(text.match_indices(r"\fbox"));
    let mut starts: Vec<(usize, &str)> = starts.collect();
    starts.sort_unstable();
    let mut latest = starts.into_iter().rev().take(MAX_BOX_ATTEMPTS);
    latest.find_map(|(at, command)| boxed_argument(&text[at + command.len()..]))
}

fn boxed_argument(after: &str) -> Option<&str> {
    if after.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None; // another command, e.g. `\fboxsep`
    }
    let trimmed = after.trim_start();
    if let Some(body) = trimmed.strip_prefix('{') {
        return matched_brace_content(body);
    }
    if trimmed.len() == after.len() {
        return None;
    }
    let end = trimmed.find(|c: char| c.is_whitespace() || c == '$').unwrap_or(trimmed.len());
    Some(&trimmed[..end])
}

/// The text up to the `}` that balances an already-consumed `{`; `\{` and `\}` do not count.
fn matched_brace_content(body: &str) -> Option<&str> {
    let mut depth = 1usize;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&body[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

const ANSWER_CUES: [&str; 2] = ["answer is", "answer:"];

fn after_answer_cue(text: &str) -> Option<&str> {
    let lower = text.to_ascii_lowercase();
    let (at, cue) =
        ANSWER_CUES.iter().filter_map(|cue| lower.rfind(cue).map(|at| (at, *cue))).max_by_key(|(at, _)| *at)?;
    let rest = text[at + cue.len()..].trim_start_matches([' ', ':', '*', '\t']);
    if let Some(math) = leading_math_span(rest) {
        return Some(math);
    }
    let line = rest.lines().next().unwrap_or("");
    let sentence_end = line.find(". ").unwrap_or(line.len());
    Some(line[..sentence_end].trim_end_matches(['.', '*', ' ']))
}

/// The content of a `$...$`, `$$...$$` or `\(...\)` span at the start of `text`.
fn leading_math_span(text: &str) -> Option<&str> {
    let (open, close) = [("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")]
        .into_iter()
        .find(|(open, _)| text.starts_with(open))?;
    let body = &text[open.len()..];
    let mut search_from = 0;
    while let Some(offset) = body[search_from..].find(close) {
        let at = search_from + offset;
        if !body[..at].ends_with('\\') || close != "$" {
            return Some(&body[..at]);
        }
        search_from = at + close.len();
    }
    None
}

fn after_hashes(text: &str) -> Option<&str> {
    let at = text.rfind("####")?;
    text[at + 4..].lines().next()
}

fn bare(text: &str) -> Option<&str> {
    let trimmed = text.trim();
    let is_bare = !trimmed.contains('\n') && trimmed.len() <= 200 && longest_prose_word(trimmed) < 3;
    is_bare.then_some(trimmed)
}

/// Commands besides [`TEXT_COMMANDS`] whose braced argument is words, not math.
const OTHER_WORD_ARGUMENT_COMMANDS: [&str; 3] = ["operatorname", "begin", "end"];

fn takes_words(command: &str) -> bool {
    TEXT_COMMANDS.contains(&command) || OTHER_WORD_ARGUMENT_COMMANDS.contains(&command)
}

/// Length of the longest run of letters that is neither a command name nor inside the argument
/// of a command that takes words (`\text{cm}`, `\mbox {cm}`, `\begin{pmatrix}`).
fn longest_prose_word(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut longest, mut run, mut i) = (0, 0, 0);
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let name_len = bytes[i + 1..].iter().take_while(|b| b.is_ascii_alphabetic()).count();
            let name = &text[i + 1..i + 1 + name_len];
            i += 1 + name_len.max(1);
            if let Some(open) = argument_brace(bytes, i).filter(|_| takes_words(name)) {
                i = open + 1 + matched_brace_content(&text[open + 1..]).map_or(0, |c| c.len() + 1);
            }
            run = 0;
        } else {
            run = if bytes[i].is_ascii_alphabetic() { run + 1 } else { 0 };
            longest = longest.max(run);
            i += 1;
        }
    }
    longest
}

/// Index of the `{` that opens a command's argument at `after` (the end of its name), past
/// any whitespace: TeX ignores spaces after a control word (`\text {cm}`).
fn argument_brace(bytes: &[u8], after: usize) -> Option<usize> {
    let spaces = bytes.get(after..)?.iter().take_while(|b| b.is_ascii_whitespace()).count();
    (bytes.get(after + spaces) == Some(&b'{')).then_some(after + spaces)
}

/// The last number in the text: an optional minus, digits (with valid thousands groups), an
/// optional decimal part, and an optional `/denominator`.
fn last_number(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut last = None;
    let mut i = 0;
    while i < bytes.len() {
        let starts_number = bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_digit());
        if !starts_number {
            i += 1;
            continue;
        }
        let end = number_end(bytes, i);
        let negative = i >= 1 && bytes[i - 1] == b'-' && (i == 1 || !bytes[i - 2].is_ascii_alphanumeric());
        let start = if negative { i - 1 } else { i };
        last = Some(&text[start..end]);
        i = end.max(i + 1);
    }
    last
}

fn number_end(bytes: &[u8], start: usize) -> usize {
    let digits_from = |from: usize| bytes[from..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut end = start + digits_from(start);
    while bytes.get(end) == Some(&b',') && digits_from(end + 1) == 3 {
        end += 4;
    }
    for separator in [b'.', b'/'] {
        if bytes.get(end) == Some(&separator) && digits_from(end + 1) > 0 {
            end += 1 + digits_from(end + 1);
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default(text: &str) -> Option<String> {
        extract_answer(text, &DEFAULT_ORDER)
    }

    #[test]
    fn boxed_wins_and_braces_match() {
        assert_eq!(default(r"so \boxed{\frac{1}{2}} is it").as_deref(), Some(r"\frac{1}{2}"));
        assert_eq!(default(r"\boxed{1} then \fbox{2}").as_deref(), Some("2"));
        assert_eq!(default(r"\boxed{\{1,2\}}").as_deref(), Some(r"\{1,2\}"));
        assert_eq!(default(r"\boxed 5$").as_deref(), Some("5"));
        assert_eq!(default(r"\boxed{3} and truncated \boxed{4").as_deref(), Some("3"));
    }

    #[test]
    fn answer_cue_reads_math_spans_and_sentences() {
        assert_eq!(default("The answer is $42$.").as_deref(), Some("42"));
        assert_eq!(default("Thus the answer is 3.5. Done").as_deref(), Some("3.5"));
        assert_eq!(default(r"Final answer: $\$18.90$").as_deref(), Some(r"\$18.90"));
        assert_eq!(default("**Answer:** (1, 2)").as_deref(), Some("(1, 2)"));
        assert_eq!(default("The answer is therefore 3.\n#### 3").as_deref(), Some("3"));
        assert_eq!(default("the final answer is 15 gallons * 8 pints = 120 pints").as_deref(), Some("120"));
        assert_eq!(default("The answer is Evelyn.").as_deref(), Some("Evelyn"));
        assert_eq!(default("The answer is 10 cm.").as_deref(), Some("10 cm"));
    }

    #[test]
    fn hashes_then_bare_then_last_number() {
        assert_eq!(default("9 * 2 = 18\n#### 18").as_deref(), Some("18"));
        assert_eq!(default(r"\frac{1}{2}").as_deref(), Some(r"\frac{1}{2}"));
        assert_eq!(default("She has 1,234 left and -5 more").as_deref(), Some("-5"));
        assert_eq!(default("She pays 3/4 of it").as_deref(), Some("3/4"));
        assert_eq!(default("x-2 apples ended up at 1,000.").as_deref(), Some("1,000"));
        assert_eq!(default("no digits here at all"), None);
    }

    #[test]
    fn calculator_annotations_are_ignored() {
        assert_eq!(default("32 * 0.25 = <<32*0.25=8>>8 own both.\nThe answer is <<8=8>>8.").as_deref(), Some("8"));
        assert_eq!(default("a << b and 5").as_deref(), Some("5"));
        assert_eq!(
            default(r"\begin{pmatrix} 1/3 \\ 2 \end{pmatrix}").as_deref(),
            Some(r"\begin{pmatrix} 1/3 \\ 2 \end{pmatrix}")
        );
    }

    #[test]
    fn text_commands_spaced_from_their_brace_hold_no_prose() {
        for lone in [
            r"8\sqrt{3} \text { square inches}",
            r"\sqrt 3 \mbox { units}",
            r"5\sqrt{2}\textrm  {cm}",
            "12 \\mathrm\t{ inches}",
            r"\textbf {(E)}",
            r"\operatorname {lcm}(a, b)",
        ] {
            assert_eq!(default(lone).as_deref(), Some(lone));
        }
        assert_eq!(default(r"8\sqrt{3} square inches").as_deref(), Some("3"), "a bare word is prose");
        assert_eq!(default(r"see \text").as_deref(), None, "a command at the end");
    }

    #[test]
    fn order_is_configurable() {
        let text = "The answer is 7. #### 8";
        assert_eq!(extract_answer(text, &[Extractor::Hashes]).as_deref(), Some("8"));
        assert_eq!(extract_answer(text, &[Extractor::AnswerIs, Extractor::Hashes]).as_deref(), Some("7"));
        assert_eq!(extract_answer(text, &[Extractor::Boxed]), None);
    }
}
