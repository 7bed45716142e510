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
pub(super) struct ReplyHarness {
    pub source: String,
    pub hypothesis: String,
    /// The reply ended inside its code block (cut off at its token limit).
    pub cut_off: bool,
}

/// A fenced code block: its info string (`js`, `json`) and its body; `closed` is false when
/// the reply ended inside it (cut off at its token limit).
#[derive(Debug)]
struct Block<'a> {
    info: &'a str,
    body: String,
    closed: bool,
}

/// A reply split into its fenced code blocks and the lines outside them.
struct Parts<'a> {
    blocks: Vec<Block<'a>>,
    prose: Vec<&'a str>,
}

/// The harness of a reply: the last code block that mentions `solve` (a model that echoes the
/// incumbent first writes its own after it), or else the longest, and the reply's
/// `Hypothesis:` line. A JSON block holding a `source` string (at its top or in `arguments`),
/// the form of a tool call written into the text, gives that source and its hypothesis. A
/// block the reply was cut off inside is still returned: the search's validation says it
/// does not compile.
pub(super) fn read_reply(text: &str) -> Result<ReplyHarness, String> {
    let parts = parts(text);
    let block = harness_block(&parts.blocks).ok_or_else(|| "the reply has no code block".to_string())?;
    let (source, json_hypothesis) = json_tool_call(block).unwrap_or_else(|| (block.body.clone(), None));
    if source.trim().is_empty() {
        return Err("the reply's code block is empty".to_string());
    }
    let hypothesis = json_hypothesis
        .filter(|h| !h.trim().is_empty())
        .or_else(|| hypothesis_line(&parts.prose))
        .or_else(|| prose(&parts.prose))
        .unwrap_or_else(|| {
            let cut = if block.closed { "" } else { ", and was cut off inside its code block" };
            format!("(the reply gave no hypothesis{cut})")
        });
    Ok(ReplyHarness { source, hypothesis, cut_off: !block.closed })
}

fn harness_block<'b, 'a>(blocks: &'b [Block<'a>]) -> Option<&'b Block<'a>> {
    blocks.iter().rev().find(|block| block.body.contains("solve")).or_else(|| {
        // The first of equally long blocks, as the reply wrote them.
        blocks.iter().rev().max_by_key(|block| block.body.len())
    })
}

/// The source (and hypothesis) of a block that is a JSON object with a `source` string, at its
/// top or under `arguments` (an object, or an object written as a string).
fn json_tool_call(block: &Block<'_>) -> Option<(String, Option<String>)> {
    if !block.info.eq_ignore_ascii_case("json") && !block.body.trim_start().starts_with('{') {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(&block.body).ok()?;
    let arguments = match value.get("arguments") {
        Some(serde_json::Value::String(text)) => serde_json::from_str(text).ok(),
        Some(arguments) => Some(arguments.clone()),
        None => None,
    };
    let found = [Some(&value), arguments.as_ref()].into_iter().flatten().find_map(|object| {
        let field = |key: &str| object.get(key).and_then(serde_json::Value::as_str).map(str::to_string);
        field("source").map(|source| (source, field("hypothesis")))
    });
    found
}

/// A fence line: up to three spaces, a run of three or more backticks, and what follows it.
fn fence(line: &str) -> Option<(usize, &str)> {
    let unindented = line.trim_start_matches(' ');
    if line.len() - unindented.len() > 3 {
        return None;
    }
    let ticks = unindented.len() - unindented.trim_start_matches('`').len();
    (ticks >= 3).then(|| (ticks, &unindented[ticks..]))
}

/// The reply's fenced blocks and the lines outside them, by CommonMark's rule: a block opens
/// on a fence whose info string has no backtick and closes on a fence of at least as many
/// backticks with nothing after them, so that a "```json" line inside a harness's prompt text
/// does not end the harness.
fn parts(text: &str) -> Parts<'_> {
    let mut parts = Parts { blocks: Vec::new(), prose: Vec::new() };
    let mut open: Option<(usize, &str, Vec<&str>)> = None;
    for line in text.lines() {
        match (open.take(), fence(line)) {
            (None, Some((ticks, info))) if !info.contains('`') => open = Some((ticks, info.trim(), Vec::new())),
            (None, _) => parts.prose.push(line),
            (Some((ticks, info, body)), Some((closing, rest))) if closing >= ticks && rest.trim().is_empty() => {
                parts.blocks.push(Block { info, body: body.join("\n"), closed: true });
            }
            (Some((ticks, info, mut body)), _) => {
                body.push(line);
                open = Some((ticks, info, body));
            }
        }
    }
    if let Some((_, info, body)) = open {
        parts.blocks.push(Block { info, body: body.join("\n"), closed: false });
    }
    parts
}

/// The text after the first `Hypothesis:` outside the code blocks (any case, with or without
/// markdown emphasis around the word) up to the line's end.
fn hypothesis_line(prose: &[&str]) -> Option<String> {
    let emphasis: &[char] = &['*', '_', '#', '-', ' '];
    prose.iter().find_map(|line| {
        let plain = line.trim().trim_start_matches(emphasis);
        let word = plain.get(..10).filter(|word| word.eq_ignore_ascii_case("hypothesis"))?;
        let rest = plain[word.len()..].trim_start_matches(['*', '_']).strip_prefix(':')?;
        let rest = rest.trim().trim_start_matches(['*', '_']).trim();
        (!rest.is_empty()).then(|| rest.to_string())
    })
}

/// The reply's words outside its code blocks, cut short.
fn prose(lines: &[&str]) -> Option<String> {
    let words: Vec<&str> = lines.iter().flat_map(|line| line.split_whitespace()).collect();
    let prose = words.join(" ");
    (!prose.is_empty()).then(|| prose.chars().take(PROSE_HYPOTHESIS_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HARNESS: &str = "export async function solve(task, ctx) {\n  return 1;\n}";

    #[test]
    fn a_reply_in_the_asked_form_gives_its_source_and_hypothesis() {
        for line in [
            "Hypothesis: vote over three replies",
            "**Hypothesis**: vote over three replies",
            "## HYPOTHESIS: vote over three replies",
        ] {
            let reply = format!("{line}\r\n\r\n```js\r\n{}\r\n```\r\n", HARNESS.replace('\n', "\r\n"));
            let harness = read_reply(&reply).expect("a harness");
            assert_eq!(
                harness,
                ReplyHarness { source: HARNESS.into(), hypothesis: "vote over three replies".into(), cut_off: false }
            );
        }
    }

    #[test]
    fn the_last_block_with_solve_wins_and_prose_stands_in_for_a_missing_hypothesis() {
        let example = format!("```text\n{}\n```", "an example output line ".repeat(20));
        let echoed = format!("```js\n{HARNESS}\n// the incumbent, echoed, longer\n```");
        let reply = format!("I add a retry.\n{example}\n{echoed}\nThe harness:\n```javascript\n{HARNESS}\n```\nDone.");
        let harness = read_reply(&reply).expect("a harness");
        assert_eq!(harness.source, HARNESS);
        assert_eq!(harness.hypothesis, "I add a retry. The harness: Done.");
        let hypothesis_in_code = format!("```js\n// Hypothesis: not this one\n{HARNESS}\n```");
        assert_eq!(read_reply(&hypothesis_in_code).expect("a harness").hypothesis, "(the reply gave no hypothesis)");
    }

    #[test]
    fn a_fence_with_an_info_string_inside_a_harness_does_not_end_it() {
        let source = "export function solve(task, ctx) {\n  const ask = `Reply as\n```json\n{\"answer\": 1}\n```\n`;\n  return ask;\n}";
        let reply = format!("Hypothesis: ask for JSON\n````js\n{source}\n````");
        assert_eq!(read_reply(&reply).expect("a harness").source, source);
    }

    #[test]
    fn a_tool_call_written_as_json_gives_its_source() {
        let flat = serde_json::json!({"source": HARNESS, "hypothesis": "parse the last number"});
        let arguments = serde_json::json!({"source": HARNESS, "hypothesis": "parse the last number"});
        let nested = serde_json::json!({"name": "write_candidate", "arguments": arguments});
        let as_text = serde_json::json!({"name": "write_candidate", "arguments": arguments.to_string()});
        for call in [flat, nested, as_text] {
            let reply = format!("```json\n{}\n```", serde_json::to_string_pretty(&call).expect("json"));
            let harness = read_reply(&reply).expect("a harness");
            assert_eq!(
                harness,
                ReplyHarness { source: HARNESS.into(), hypothesis: "parse the last number".into(), cut_off: false }
            );
        }
        let empty = format!("```json\n{}\n```", serde_json::json!({"source": " ", "hypothesis": "h"}));
        assert_eq!(read_reply(&empty).unwrap_err(), "the reply's code block is empty");
    }

    #[test]
    fn a_reply_cut_off_inside_its_block_is_still_read_and_one_without_a_block_is_refused() {
        let harness = read_reply("```js\nexport async function solve(task, ctx) {\n  return").expect("a harness");
        assert!(harness.source.ends_with("  return") && harness.cut_off);
        assert_eq!(harness.hypothesis, "(the reply gave no hypothesis, and was cut off inside its code block)");
        assert_eq!(read_reply("I would add a retry.").unwrap_err(), "the reply has no code block");
        assert_eq!(read_reply("```js\n\n```").unwrap_err(), "the reply's code block is empty");
        assert_eq!(read_reply("").unwrap_err(), "the reply has no code block");
        assert_eq!(read_reply("    ```js\n    indented code\n    ```").unwrap_err(), "the reply has no code block");
    }
}
