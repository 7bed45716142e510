//! The tool-argument step. How much a tool returns is often set by a number the harness passes
//! it, a search's count of results above all: a small model reading three passages can do
//! worse than one reading two, and no edit of the prompt text changes what it is shown. This
//! edit finds the integer literals passed directly to `ctx.tools.<name>(…)` and moves one of
//! them a step up or down.

use super::tokens::{tokenize, Token, TokenKind};
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// An integer literal passed to a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Argument {
    pub tool: String,
    /// Its position among the call's arguments, from 1.
    pub position: usize,
    pub value: u64,
    /// Byte range of the literal.
    pub start: usize,
    pub end: usize,
}

/// Every integer literal that is a whole argument of a `ctx.tools.<name>(…)` call, in order.
pub(crate) fn arguments(source: &str) -> Vec<Argument> {
    let tokens = tokenize(source);
    let mut found = Vec::new();
    for i in 0..tokens.len() {
        let Some(tool) = tool_call(source, &tokens[i..]) else { continue };
        found.extend(literals(source, &tokens[i + 6..]).into_iter().map(|(position, token, value)| Argument {
            tool: tool.to_string(),
            position,
            value,
            start: token.start,
            end: token.end,
        }));
    }
    found
}

/// The tool's name when `tokens` start `ctx . tools . <name> (`.
fn tool_call<'s>(source: &'s str, tokens: &[Token]) -> Option<&'s str> {
    let pattern =
        [("ctx", TokenKind::Word), (".", TokenKind::Punct), ("tools", TokenKind::Word), (".", TokenKind::Punct)];
    let head = tokens.get(..6)?;
    let matches =
        pattern.iter().zip(head).all(|((text, kind), token)| token.kind == *kind && token.text(source) == *text);
    (matches && head[4].kind == TokenKind::Word && head[5].is_punct(source, "(")).then(|| head[4].text(source))
}

/// The whole-argument integer literals of an argument list that starts at `tokens[0]` (just
/// after its `(`), with their positions.
fn literals(source: &str, tokens: &[Token]) -> Vec<(usize, Token, u64)> {
    let mut found = Vec::new();
    let (mut depth, mut position) = (0usize, 1usize);
    for (i, token) in tokens.iter().enumerate() {
        let text = token.text(source);
        match (token.kind, text) {
            (TokenKind::Punct, "(" | "[" | "{") => depth += 1,
            (TokenKind::Punct, ")" | "]" | "}") if depth == 0 => break,
            (TokenKind::Punct, ")" | "]" | "}") => depth -= 1,
            (TokenKind::Punct, ",") if depth == 0 => position += 1,
            (TokenKind::Number, _) if depth == 0 => {
                let alone_before = i == 0 || tokens[i - 1].is_punct(source, ",");
                let alone_after = tokens.get(i + 1).is_some_and(|t| t.is_punct(source, ",") || t.is_punct(source, ")"));
                if let (true, true, Ok(value)) = (alone_before, alone_after, text.parse::<u64>()) {
                    found.push((position, *token, value));
                }
            }
            _ => {}
        }
    }
    found
}

/// `source` with one tool argument a step up or down (never below 1), and the hypothesis.
pub(crate) fn step(source: &str, rng: &mut ChaCha8Rng) -> Option<(String, String)> {
    let found = arguments(source);
    let argument = found.choose(rng)?;
    let choices: Vec<u64> = [argument.value.checked_sub(1), argument.value.checked_add(1)]
        .into_iter()
        .flatten()
        .filter(|&v| v >= 1)
        .collect();
    let value = *choices.choose(rng)?;
    let (old, tool, position) = (argument.value, &argument.tool, argument.position);
    let direction = if value < old {
        "fewer results leave a small model less to be distracted by"
    } else {
        "more results raise the chance that what the task needs is among them"
    };
    let hypothesis = format!(
        "Tool argument: pass {value} instead of {old} as argument {position} of `ctx.tools.{tool}` (for a search, \
         how many results come back): {direction}. Refuted if the success rate does not rise."
    );
    let edited = format!("{}{value}{}", &source[..argument.start], &source[argument.end..]);
    Some((edited, hypothesis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn only_whole_integer_arguments_of_tool_calls_are_found() {
        let source =
            "const k = 3;\nconst a = ctx.tools.search(question, 3);\nconst b = ctx.tools.search(q, k + 1, [2]);\n\
                      const c = ctx.tools.search(`${ctx.tools.search(q, 5)}`, 2.5);\nctx.tools.count(7, f(8), 9)\n\
                      // ctx.tools.search(q, 4)\nctx.llm.chat(prompt, 6);\n";
        let found: Vec<(String, usize, u64)> =
            arguments(source).into_iter().map(|a| (a.tool, a.position, a.value)).collect();
        assert_eq!(found, [("search".to_string(), 2, 3), ("count".to_string(), 1, 7), ("count".to_string(), 3, 9)]);
    }

    #[test]
    fn a_step_moves_one_argument_by_one_and_never_below_one() {
        let source = "export function solve(task, ctx) { return ctx.tools.search(task.q, 1); }\n";
        for seed in 0..8 {
            let (edited, hypothesis) = step(source, &mut ChaCha8Rng::seed_from_u64(seed)).expect("an argument");
            assert_eq!(edited, source.replace("(task.q, 1)", "(task.q, 2)"), "{hypothesis}");
            assert!(hypothesis.starts_with("Tool argument: pass 2 instead of 1 as argument 2 of `ctx.tools.search`"));
        }
        let three = source.replace("(task.q, 1)", "(task.q, 3)");
        let values: Vec<String> =
            (0..16).filter_map(|seed| step(&three, &mut ChaCha8Rng::seed_from_u64(seed))).map(|(e, _)| e).collect();
        assert!(values.iter().any(|e| e.contains("(task.q, 2)")) && values.iter().any(|e| e.contains("(task.q, 4)")));
        assert_eq!(step("ctx.tools.search(q);", &mut ChaCha8Rng::seed_from_u64(0)), None);
    }
}
