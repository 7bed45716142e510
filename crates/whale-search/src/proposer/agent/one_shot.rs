//! The one-shot mode of the LLM proposer: one request per candidate, no tools. In go the
//! incumbent's source, its score and a few of its failed rollouts; out comes a hypothesis line
//! and a whole harness in a code block. It is for a model too small to hold a tool-calling loop
//! (Qwen2.5-Coder-1.5B, asked for tool calls, wrote its harness into its reply instead).

/// The most tokens a one-shot reply may take when `[search.agent] max_tokens` is unset: a
/// harness of about 6,000 characters and its hypothesis.
pub(super) const DEFAULT_MAX_TOKENS: u32 = 2_048;

/// Characters of a hypothesis taken from the reply's prose when it has no `Hypothesis:` line.
const PROSE_HYPOTHESIS_CHARS: usize = 400;

/// A harness read from a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Written {
    pub source: String,
    pub hypothesis: String,
}

/// A fenced code block: its info string (`js`, `json`) and its body; `closed` is false when
/// the reply ended inside it (cut off at its token limit).
#[derive(Debug)]
struct Block<'a> {
    info: &'a str,
    body: String,
    closed: bool,
}

/// The harness of a reply: the longest code block that mentions `solve` (or, failing that, the
/// longest), and the hypothesis line before it. A JSON block with a `source` string, the form
/// of a tool call written into the text, gives that source (and its `hypothesis`). A block the
/// reply was cut off inside is still returned: the search's validation says it does not compile.
pub(super) fn read_reply(text: &str) -> Result<Written, String> {
    let blocks = blocks(text);
    let block = blocks
        .iter()
        .filter(|block| block.body.contains("solve"))
        .max_by_key(|block| block.body.len())
        .or_else(|| blocks.iter().max_by_key(|block| block.body.len()))
        .ok_or_else(|| "the reply has no code block".to_string())?;
    if block.body.trim().is_empty() {
        return Err("the reply's code block is empty".to_string());
    }
    let written_as_json = (block.info.eq_ignore_ascii_case("json") || block.body.trim_start().starts_with('{'))
        .then(|| serde_json::from_str::<serde_json::Value>(&block.body).ok())
        .flatten()
        .and_then(|value| {
            let field = |key: &str| value.get(key).and_then(serde_json::Value::as_str).map(str::to_string);
            field("source").map(|source| (source, field("hypothesis")))
        });
    let (source, json_hypothesis) = written_as_json.unwrap_or_else(|| (block.body.clone(), None));
    let hypothesis = json_hypothesis
        .filter(|h| !h.trim().is_empty())
        .or_else(|| hypothesis_line(text))
        .or_else(|| prose(text))
        .unwrap_or_else(|| {
            let cut = if block.closed { "" } else { ", and was cut off inside its code block" };
            format!("(the reply gave no hypothesis{cut})")
        });
    Ok(Written { source, hypothesis })
}

/// Every fenced block of `text`, in order.
fn blocks(text: &str) -> Vec<Block<'_>> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, Vec<&str>)> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (open.take(), fence) {
            (None, Some(info)) => open = Some((info.trim(), Vec::new())),
            (None, None) => {}
            (Some((info, body)), Some(_)) => blocks.push(Block { info, body: body.join("\n"), closed: true }),
            (Some((info, mut body)), None) => {
                body.push(line);
                open = Some((info, body));
            }
        }
    }
    if let Some((info, body)) = open {
        blocks.push(Block { info, body: body.join("\n"), closed: false });
    }
    blocks
}

/// The text after the first `Hypothesis:` (any case, any markdown emphasis) up to the line's end.
fn hypothesis_line(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let plain = line.trim().trim_start_matches(['*', '#', '-', ' ']);
        let rest = plain.get(..11).filter(|head| head.eq_ignore_ascii_case("hypothesis:")).map(|_| &plain[11..])?;
        let rest = rest.trim().trim_start_matches('*').trim();
        (!rest.is_empty()).then(|| rest.to_string())
    })
}

/// The reply's words outside its code blocks, cut short.
fn prose(text: &str) -> Option<String> {
    let mut inside = false;
    let words: Vec<&str> = text
        .lines()
        .filter(|line| {
            let fence = line.trim_start().starts_with("```");
            inside ^= fence;
            !fence && !inside
        })
        .flat_map(str::split_whitespace)
        .collect();
    let prose = words.join(" ");
    (!prose.is_empty()).then(|| prose.chars().take(PROSE_HYPOTHESIS_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HARNESS: &str = "export async function solve(task, ctx) {\n  return 1;\n}";

    #[test]
    fn a_reply_in_the_asked_form_gives_its_source_and_hypothesis() {
        let reply = format!("**Hypothesis:** vote over three replies\n\n```js\n{HARNESS}\n```\n");
        let written = read_reply(&reply).expect("a harness");
        assert_eq!(written, Written { source: HARNESS.into(), hypothesis: "vote over three replies".into() });
    }

    #[test]
    fn the_block_with_solve_wins_over_longer_ones_and_prose_stands_in_for_a_missing_hypothesis() {
        let example = format!("```text\n{}\n```", "an example output line ".repeat(20));
        let reply = format!("I add a retry.\n{example}\nThe harness:\n```javascript\n{HARNESS}\n```\nDone.");
        let written = read_reply(&reply).expect("a harness");
        assert_eq!(written.source, HARNESS);
        assert_eq!(written.hypothesis, "I add a retry. The harness: Done.");
    }

    #[test]
    fn a_tool_call_written_as_json_gives_its_source() {
        let call = serde_json::json!({"source": HARNESS, "hypothesis": "parse the last number"});
        let reply = format!("```json\n{}\n```", serde_json::to_string_pretty(&call).expect("json"));
        let written = read_reply(&reply).expect("a harness");
        assert_eq!(written, Written { source: HARNESS.into(), hypothesis: "parse the last number".into() });
    }

    #[test]
    fn a_reply_cut_off_inside_its_block_is_still_read_and_one_without_a_block_is_refused() {
        let written = read_reply("```js\nexport async function solve(task, ctx) {\n  return").expect("a harness");
        assert!(written.source.ends_with("  return"));
        assert_eq!(written.hypothesis, "(the reply gave no hypothesis, and was cut off inside its code block)");
        assert_eq!(read_reply("I would add a retry.").unwrap_err(), "the reply has no code block");
        assert_eq!(read_reply("```js\n\n```").unwrap_err(), "the reply's code block is empty");
        assert_eq!(read_reply("").unwrap_err(), "the reply has no code block");
    }
}
