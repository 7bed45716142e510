//! Whether two harnesses differ only in their prompt text: fast-slow's fast half may rewrite
//! what a harness says to the model (instructions, phrasing, the text of its messages) but not
//! its code (control flow, calls, expressions). Both sources are lexed, every string and
//! template literal's text is blanked (a template's `${…}` substitutions are code and stay),
//! comments and layout are dropped, and what remains must be the same token for token. A
//! literal's text counts as text whatever the code does with it, so a stop string or a split
//! marker may change too.

use crate::proposer::mutate::tokens::{substitutions, tokenize, TokenKind};

/// The code of `source`: its tokens, with the text of every literal blanked.
fn code(source: &str) -> Vec<String> {
    tokenize(source)
        .iter()
        .map(|token| match token.kind {
            TokenKind::Quoted | TokenKind::Template { substitutions: false } => "\"…\"".to_string(),
            TokenKind::Template { substitutions: true } => format!("`{}`", substitutions(token.text(source)).join("…")),
            _ => token.text(source).to_string(),
        })
        .collect()
}

/// Whether `after` is `before` with only the text of string and template literals changed
/// (comments and layout may differ too).
pub fn only_prompt_text_differs(before: &str, after: &str) -> bool {
    code(before) == code(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HARNESS: &str = r#"
export function solve(task, ctx) {
  // Ask once.
  const reply = ctx.llm.chat(`${ctx.env.observation}\nGive the final answer after ANSWER:.`, { max_tokens: 64 });
  return reply.text.split("ANSWER:").pop().trim();
}
"#;

    #[test]
    fn literal_text_comments_and_layout_are_prompt_text_and_the_rest_is_code() {
        let reworded = HARNESS
            .replace("Give the final answer after ANSWER:.", "Think step by step. Give the final answer after ANSWER:.")
            .replace("// Ask once.", "// Ask once, politely.")
            .replace("{ max_tokens: 64 }", "{max_tokens: 64}");
        assert!(only_prompt_text_differs(HARNESS, &reworded));
        let split = HARNESS.replace(r#"split("ANSWER:")"#, r#"split("Answer:")"#);
        assert!(only_prompt_text_differs(HARNESS, &split), "a literal is text, whatever it is used for");
        for code in [
            HARNESS.replace("max_tokens: 64", "max_tokens: 65"),
            HARNESS.replace("${ctx.env.observation}", "${ctx.env.observation.trim()}"),
            HARNESS.replace(".pop().trim()", ".pop()"),
            HARNESS.replace("return reply", "ctx.log(1);\n  return reply"),
        ] {
            assert!(!only_prompt_text_differs(HARNESS, &code), "code changed: {code}");
        }
    }
}
