//! The view swap. A tool may return the same items in several forms: a chess position's legal
//! moves in UCI and in SAN, where SAN also marks checks and mates. Which form a prompt shows
//! is a protocol choice a small model is sensitive to, and no instruction edit can change it.
//! This edit finds such forms in the tool results the incumbent's rollouts recorded, and swaps
//! the one a prompt template shows (and the word that names it in that template) for another.

use super::tokens::{self, TokenKind};
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use whale_core::Trajectory;

/// The fields of one tool's object results that hold the same items in other forms: arrays of
/// one length (the same in each field of a result) in every recorded result of the tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Forms {
    pub tool: String,
    pub fields: Vec<String>,
}

/// Every tool whose recorded results show two or more forms, by tool name.
pub(crate) fn forms(trajectories: &[&Trajectory]) -> Vec<Forms> {
    let mut by_tool: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for call in trajectories.iter().flat_map(|t| &t.tool_calls).filter(|c| c.error.is_none()) {
        let here = parallel_arrays(&call.result);
        by_tool.entry(call.name.as_str()).or_insert_with(|| here.clone()).retain(|field| here.contains(field));
    }
    by_tool
        .into_iter()
        .filter(|(_, fields)| fields.len() >= 2)
        .map(|(tool, fields)| Forms { tool: tool.to_string(), fields })
        .collect()
}

/// The keys of `result`'s non-empty array fields when they all have one length (else none).
fn parallel_arrays(result: &serde_json::Value) -> Vec<String> {
    let Some(object) = result.as_object() else { return Vec::new() };
    let arrays: Vec<(&String, usize)> =
        object.iter().filter_map(|(key, value)| Some((key, value.as_array()?.len()))).filter(|(_, n)| *n > 0).collect();
    let same_length = arrays.windows(2).all(|pair| pair[0].1 == pair[1].1);
    if !same_length {
        return Vec::new();
    }
    arrays.into_iter().map(|(key, _)| key.clone()).collect()
}

/// A field access `.field` inside a `${…}` substitution of a template literal: what a prompt
/// shows the model.
struct Shown<'f> {
    /// The template literal token (byte range in the source).
    template: (usize, usize),
    /// Where the field's name starts in the source.
    at: usize,
    field: &'f str,
    forms: &'f Forms,
}

/// The incumbent with one shown form swapped for another, and the hypothesis; `None` when no
/// template shows a form.
pub(crate) fn swap(source: &str, forms: &[Forms], rng: &mut ChaCha8Rng) -> Option<(String, String)> {
    let shown = shown_fields(source, forms);
    let chosen = shown.choose(rng)?;
    let others: Vec<&String> = chosen.forms.fields.iter().filter(|f| f.as_str() != chosen.field).collect();
    let replacement = others.choose(rng)?.as_str();
    let (start, end) = chosen.template;
    let template = &source[start..end];
    let access_at = chosen.at - start;
    let mut rewritten = String::with_capacity(template.len() + replacement.len());
    rewritten.push_str(&template[..access_at]);
    rewritten.push_str(replacement);
    rewritten.push_str(&template[access_at + chosen.field.len()..]);
    let rewritten = rename_in_text(&rewritten, chosen.field, replacement);
    let edited = format!("{}{rewritten}{}", &source[..start], &source[end..]);
    let hypothesis = format!(
        "View swap: the prompt shows the `{replacement}` form instead of the `{field}` form (fields that the \
         `{tool}` tool's recorded results hold side by side: the same items written another way), and names it so. \
         A model can read one form better than another: one it saw more in training, or one that carries \
         more of what the task needs. Refuted if the success rate does not rise.",
        tool = chosen.forms.tool,
        field = chosen.field,
    );
    Some((edited, hypothesis))
}

/// Every `.field` of a form inside a template substitution.
fn shown_fields<'f>(source: &str, forms: &'f [Forms]) -> Vec<Shown<'f>> {
    let mut shown = Vec::new();
    for token in tokens::tokenize(source) {
        if token.kind != (TokenKind::Template { substitutions: true }) {
            continue;
        }
        let template = token.text(source);
        for substitution in tokens::substitutions(template) {
            let offset = token.start + (substitution.as_ptr() as usize - template.as_ptr() as usize);
            for f in forms {
                for field in &f.fields {
                    for at in accesses(substitution, field) {
                        shown.push(Shown { template: (token.start, token.end), at: offset + at, field, forms: f });
                    }
                }
            }
        }
    }
    shown
}

/// Where `.field` (a whole property name) occurs in `code`: the offsets of the names.
fn accesses(code: &str, field: &str) -> Vec<usize> {
    let pattern = format!(".{field}");
    code.match_indices(&pattern)
        .map(|(at, _)| at + 1)
        .filter(|&at| !code[at + field.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$'))
        .collect()
}

/// `template` with every whole word equal to `from` (any case) outside its substitutions
/// replaced by `to` in the same case: "in UCI" becomes "in SAN".
fn rename_in_text(template: &str, from: &str, to: &str) -> String {
    let substitutions: Vec<(usize, usize)> = tokens::substitutions(template)
        .into_iter()
        .map(|s| {
            let at = s.as_ptr() as usize - template.as_ptr() as usize;
            (at, at + s.len())
        })
        .collect();
    let inside = |at: usize| substitutions.iter().any(|&(start, end)| at >= start && at < end);
    let lower = template.to_lowercase();
    if lower.len() != template.len() {
        return template.to_string();
    }
    let mut out = String::with_capacity(template.len());
    let mut last = 0;
    for (at, _) in lower.match_indices(&from.to_lowercase()) {
        let end = at + from.len();
        let bounded = !template[..at].ends_with(is_word_char) && !template[end..].starts_with(is_word_char);
        if inside(at) || !bounded {
            continue;
        }
        out.push_str(&template[last..at]);
        out.push_str(&same_case(&template[at..end], to));
        last = end;
    }
    out.push_str(&template[last..]);
    out
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `word` spelt in the case of `like`: all capitals, a capital first, or as given.
fn same_case(like: &str, word: &str) -> String {
    let letters: Vec<char> = like.chars().filter(|c| c.is_alphabetic()).collect();
    if letters.len() > 1 && letters.iter().all(|c| c.is_uppercase()) {
        return word.to_uppercase();
    }
    let mut chars = word.chars();
    match (like.chars().next(), chars.next()) {
        (Some(first), Some(head)) if first.is_uppercase() => head.to_uppercase().chain(chars).collect(),
        _ => word.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_keep_their_case_and_substitutions_are_left_alone() {
        let template = "`Moves: ${legal.uci.join(\" \")}\\nReply in UCI (uci, Uci), not fuci.`";
        assert_eq!(
            rename_in_text(template, "uci", "san"),
            "`Moves: ${legal.uci.join(\" \")}\\nReply in SAN (san, San), not fuci.`"
        );
    }

    #[test]
    fn forms_are_non_empty_arrays_of_one_length() {
        let mut fields = parallel_arrays(&serde_json::json!({"uci": ["e2e4", "d2d4"], "san": ["e4", "d4"], "n": 2}));
        fields.sort();
        assert_eq!(fields, ["san", "uci"]);
        assert!(parallel_arrays(&serde_json::json!({"a": [1], "b": [1, 2]})).is_empty());
        assert!(parallel_arrays(&serde_json::json!(["e4", "d4"])).is_empty());
    }

    #[test]
    fn only_whole_property_names_are_accesses() {
        assert_eq!(accesses("${legal.uci.join(' ')} ${x.ucix} ${a.uci}", "uci"), vec![8, 37]);
    }
}
