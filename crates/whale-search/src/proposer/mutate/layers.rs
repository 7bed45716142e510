//! Mechanisms added around a harness without understanding its code: the exported `solve`
//! is renamed `whaleBaseSolve` (the one anchor: an `export [async] function solve(` or
//! `export const|let|var solve =` at the top level), and a new exported `solve` runs it
//! through a stack of *layers*. A layer is a middleware `(task, ctx, next)` that may hand
//! `next` an adapted `ctx` (a wrapped `ctx.llm.chat`, a wrapped `ctx.env.submit`/`play`) and
//! post-process its result. Each layer is one delimited block of source:
//!
//! ```text
//! // whale:layer vote-2 begin
//! // hypothesis: ...
//! { ...; whaleLayers.push(function whaleVote(task, ctx, next) { ... }); }
//! // whale:layer vote-2 end
//! ```
//!
//! so a later mutation (or a person) can delete exactly one mechanism. The last block is the
//! outermost layer and sees every model call the others make. Below all layers a budget guard
//! counts the real model calls and prompt characters against the rollout's limits (as they
//! were when the scaffold was added) and turns the call that would break them into an
//! ordinary, catchable error, so a mechanism that multiplies calls (voting, retrying) makes a
//! harness degrade the way it does when a model call is refused instead of ending the rollout.

use super::mechanisms::{Formatting, Parsing};
use super::tokens::{tokenize, Token, TokenKind};
use std::fmt;
use std::str::FromStr;
use whale_harness::Limits;

const SCAFFOLD_BEGIN: &str = "// whale:layers begin";
const LAYER_PREFIX: &str = "// whale:layer ";
const BASE_SOLVE: &str = "whaleBaseSolve";

/// Shared helpers of every layer, and the exported `solve` that stacks them over the budget
/// guard; `{{MODEL_CALLS}}` and `{{PROMPT_CHARS}}` are filled in from the limits.
const SCAFFOLD: &str = r#"// whale:layers begin
// Added by whale's mutation proposer. The harness's own `solve` is now `whaleBaseSolve`; each
// block between `whale:layer <name> begin` and `whale:layer <name> end` below wraps it in one
// mechanism (the last block outermost), and deleting a block removes exactly that mechanism.
const whaleLayers = [];
const whaleBudget = { calls: 0, chars: 0, maxCalls: {{MODEL_CALLS}}, maxChars: {{PROMPT_CHARS}} };
function whaleMessages(messages) {
  if (typeof messages === "string") return [{ role: "user", content: messages }];
  return Array.isArray(messages) ? messages.map((m) => ({ ...m })) : messages;
}
function whaleLastUser(list) {
  for (let i = list.length - 1; i >= 0; i--) if (list[i] && list[i].role === "user") return i;
  return -1;
}
function whaleFinalAnswer(text) {
  const source = String(text);
  const boxed = source.lastIndexOf("\\boxed{");
  if (boxed >= 0) {
    let depth = 0;
    for (let i = boxed + 7; i < source.length; i++) {
      if (source[i] === "{") depth += 1;
      else if (source[i] === "}" && depth === 0) return source.slice(boxed + 7, i).trim();
      else if (source[i] === "}") depth -= 1;
    }
  }
  const marked = [...source.matchAll(/answer\s*(?:is|:)\s*([^\n]+)/gi)].map((m) => m[1].trim()).filter((a) => a !== "");
  const lines = source.split("\n").map((line) => line.trim()).filter((line) => line !== "");
  const found = marked.length ? marked[marked.length - 1] : lines.length ? lines[lines.length - 1] : "";
  return found.replace(/^\*+|\*+$/g, "").replace(/\.$/, "").trim();
}
function whaleWithLlm(ctx, chat) {
  return Object.freeze({ ...ctx, llm: Object.freeze({ chat }) });
}
function whaleWithEnv(ctx, act) {
  const env = ctx.env;
  return Object.freeze({
    ...ctx,
    env: Object.freeze({
      get observation() {
        return env.observation;
      },
      get done() {
        return env.done;
      },
      tools: env.tools,
      play: (move) => act("play", move),
      submit: (answer) => act("submit", answer),
    }),
  });
}
function whalePromptChars(messages) {
  const list = whaleMessages(messages);
  return Array.isArray(list) ? list.reduce((n, m) => n + String(m && m.content).length, 0) : 0;
}
function whaleHasRoom(calls, chars) {
  return whaleBudget.calls + calls <= whaleBudget.maxCalls && whaleBudget.chars + chars <= whaleBudget.maxChars;
}
function whaleGuarded(ctx) {
  return whaleWithLlm(ctx, (messages, opts) => {
    const size = whalePromptChars(messages);
    if (!whaleHasRoom(1, size)) {
      throw new Error(`ctx.llm.chat: the rollout's budget is used up (${whaleBudget.calls} calls, ${whaleBudget.chars} prompt characters)`);
    }
    whaleBudget.calls += 1;
    whaleBudget.chars += size;
    return ctx.llm.chat(messages, opts);
  });
}
export async function solve(task, ctx) {
  const run = whaleLayers.reduce((next, layer) => (t, c) => layer(t, c, next), whaleBaseSolve);
  return run(task, whaleGuarded(ctx));
}
// whale:layers end
"#;

/// What a layer does. A layer's name in the source is `<kind>-<n>` (`vote-2`,
/// `format-recent-window-1`), spelled as the archives' harnesses already hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayerKind {
    /// A phrase-bank instruction added to the system message.
    Instruction,
    /// A tool consulted before model calls.
    ToolStep,
    /// The model writes the query of the harness's searches.
    Query,
    /// Several replies per call and a majority vote on the final answer.
    Vote,
    /// Asking again after invalid output.
    Retry,
    Format(Formatting),
    Parse(Parsing),
    /// Solved training examples shown before each call.
    FewShot,
}

impl LayerKind {
    /// Every kind, in the order an error lists them.
    fn all() -> Vec<LayerKind> {
        let plain = [LayerKind::Instruction, LayerKind::ToolStep, LayerKind::Query, LayerKind::Vote, LayerKind::Retry];
        let formats = Formatting::ALL.map(LayerKind::Format);
        let parses = Parsing::ALL.map(LayerKind::Parse);
        plain.into_iter().chain(formats).chain(parses).chain([LayerKind::FewShot]).collect()
    }

    fn known() -> String {
        LayerKind::all().iter().map(LayerKind::to_string).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerKind::Instruction => f.write_str("instruction"),
            LayerKind::ToolStep => f.write_str("tool-step"),
            LayerKind::Query => f.write_str("query"),
            LayerKind::Vote => f.write_str("vote"),
            LayerKind::Retry => f.write_str("retry"),
            LayerKind::Format(Formatting::SystemIntoUser) => f.write_str("format-system-into-user"),
            LayerKind::Format(Formatting::Compact) => f.write_str("format-compact"),
            LayerKind::Format(Formatting::RecentWindow) => f.write_str("format-recent-window"),
            LayerKind::Parse(Parsing::Final) => f.write_str("parse-final"),
            LayerKind::Parse(Parsing::Number) => f.write_str("parse-number"),
            LayerKind::Parse(Parsing::Clean) => f.write_str("parse-clean"),
            LayerKind::FewShot => f.write_str("few-shot"),
        }
    }
}

impl FromStr for LayerKind {
    type Err = UnknownLayerKind;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        LayerKind::all()
            .into_iter()
            .find(|kind| kind.to_string() == name)
            .ok_or_else(|| UnknownLayerKind(name.to_string()))
    }
}

/// A layer kind this proposer does not write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `kind`: unknown value `{0}` (known: {known})", known = LayerKind::known())]
pub(crate) struct UnknownLayerKind(String);

/// A layer marker of a source that names no layer this proposer writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LayerError {
    #[error("line {line}: layer `{name}`: {source}")]
    Kind { line: usize, name: String, source: UnknownLayerKind },
    #[error("line {line}: layer `{name}`: field `name`: not `<kind>-<n>`")]
    Name { line: usize, name: String },
}

/// One layer block of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layer {
    pub kind: LayerKind,
    /// Tells apart the layers of one kind: `vote-2` is `vote` number 2.
    pub number: u32,
    pub hypothesis: String,
    /// Byte range of the block, marker lines included.
    pub start: usize,
    pub end: usize,
}

impl Layer {
    /// `<kind>-<n>`, e.g. `vote-2`.
    pub fn name(&self) -> String {
        format!("{}-{}", self.kind, self.number)
    }
}

/// The layer blocks of `source`, in order; an error for a marker whose name is not
/// `<kind>-<n>` of a known kind.
pub(crate) fn layers(source: &str) -> Result<Vec<Layer>, LayerError> {
    let mut found = Vec::new();
    let mut open: Option<(String, LayerKind, u32, usize, String)> = None;
    let mut offset = 0;
    for (index, line) in source.split_inclusive('\n').enumerate() {
        let trimmed = line.trim();
        if let Some(marker) = trimmed.strip_prefix(LAYER_PREFIX) {
            if let Some(name) = marker.strip_suffix(" begin") {
                let (kind, number) = kind_and_number(name, index + 1)?;
                open = Some((name.to_string(), kind, number, offset, String::new()));
            } else if let (Some(name), Some((begun, kind, number, start, hypothesis))) =
                (marker.strip_suffix(" end"), open.take())
            {
                if name == begun {
                    found.push(Layer { kind, number, hypothesis, start, end: offset + line.len() });
                }
            }
        } else if let (Some(text), Some((.., hypothesis))) = (trimmed.strip_prefix("// hypothesis: "), open.as_mut()) {
            if hypothesis.is_empty() {
                *hypothesis = text.to_string();
            }
        }
        offset += line.len();
    }
    Ok(found)
}

/// The kind and number of the layer named `name` on line `line`.
fn kind_and_number(name: &str, line: usize) -> Result<(LayerKind, u32), LayerError> {
    let (kind, number) = name.rsplit_once('-').ok_or_else(|| LayerError::Name { line, name: name.to_string() })?;
    let number = number.parse().map_err(|_| LayerError::Name { line, name: name.to_string() })?;
    let kind = kind.parse().map_err(|source| LayerError::Kind { line, name: name.to_string(), source })?;
    Ok((kind, number))
}

/// `source` with `body` added as the outermost layer of `kind`, numbered apart from the
/// source's `existing` layers; `None` when the harness has no `solve` export this module can
/// anchor on.
pub(crate) fn add_layer(
    source: &str,
    existing: &[Layer],
    kind: LayerKind,
    hypothesis: &str,
    body: &str,
    limits: &Limits,
) -> Option<String> {
    let mut scaffolded = with_scaffold(source, limits)?;
    let number = (1..).find(|&n| !existing.iter().any(|l| l.kind == kind && l.number == n)).unwrap_or(1);
    if !scaffolded.ends_with('\n') {
        scaffolded.push('\n');
    }
    let hypothesis = hypothesis.replace(['\n', '\r'], " ");
    scaffolded.push_str(&format!(
        "{LAYER_PREFIX}{kind}-{number} begin\n// hypothesis: {hypothesis}\n{{\n{}\n}}\n{LAYER_PREFIX}{kind}-{number} end\n",
        body.trim_end()
    ));
    Some(scaffolded)
}

/// `source` without `layer`.
pub(crate) fn remove_layer(source: &str, layer: &Layer) -> String {
    format!("{}{}", &source[..layer.start], &source[layer.end..])
}

/// `source` with the scaffold (unchanged if it already has one).
fn with_scaffold(source: &str, limits: &Limits) -> Option<String> {
    if source.contains(SCAFFOLD_BEGIN) {
        return Some(source.to_string());
    }
    let (export, name) = solve_export(source)?;
    let mut edited = String::with_capacity(source.len() + SCAFFOLD.len() + 32);
    edited.push_str(&source[..export.start]);
    edited.push_str(&source[skip_spaces(source, export.end)..name.start]);
    edited.push_str(BASE_SOLVE);
    edited.push_str(&source[name.end..]);
    if !edited.ends_with('\n') {
        edited.push('\n');
    }
    // Characters are counted in UTF-16 units here and may be counted otherwise by the host:
    // the guard keeps a margin.
    let prompt_chars = limits.prompt_chars / 100 * 95;
    edited.push_str(
        &SCAFFOLD
            .replace("{{MODEL_CALLS}}", &limits.model_calls.to_string())
            .replace("{{PROMPT_CHARS}}", &prompt_chars.to_string()),
    );
    Some(edited)
}

/// The `export` keyword and the `solve` name of a top-level `export [async] function solve(`
/// or `export const|let|var solve =`.
fn solve_export(source: &str) -> Option<(Token, Token)> {
    let tokens = tokenize(source);
    let mut depth = 0i64;
    for (i, token) in tokens.iter().enumerate() {
        match token.kind {
            TokenKind::Punct if token.is_punct(source, "{") => depth += 1,
            TokenKind::Punct if token.is_punct(source, "}") => depth -= 1,
            TokenKind::Word if depth == 0 && token.is_word(source, "export") => {
                if let Some(name) = exported_solve(source, &tokens[i + 1..]) {
                    return Some((*token, name));
                }
            }
            _ => {}
        }
    }
    None
}

fn exported_solve(source: &str, after: &[Token]) -> Option<Token> {
    let word = |i: usize, w: &str| after.get(i).is_some_and(|t| t.is_word(source, w));
    let punct = |i: usize, p: &str| after.get(i).is_some_and(|t| t.is_punct(source, p));
    let skip = usize::from(word(0, "async"));
    if word(skip, "function") && word(skip + 1, "solve") && punct(skip + 2, "(") {
        return after.get(skip + 1).copied();
    }
    if (word(0, "const") || word(0, "let") || word(0, "var")) && word(1, "solve") && punct(2, "=") {
        return after.get(1).copied();
    }
    None
}

fn skip_spaces(source: &str, from: usize) -> usize {
    from + source[from..].len() - source[from..].trim_start().len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use whale_harness::{validate, Limits};

    const PLAIN: &str = "// export function solve( in a comment\nconst s = \"export function solve(\";\n\
                         export async function solve(task, ctx) {\n  return ctx.llm.chat(s).text;\n}\n";
    const PASS: &str = "whaleLayers.push((task, ctx, next) => next(task, ctx));";

    #[test]
    fn the_export_is_renamed_and_layers_stack_and_come_off_one_by_one() {
        let limits = Limits::default();
        let one = add_layer(PLAIN, &[], LayerKind::Retry, "first", PASS, &limits).expect("anchor");
        assert!(one.contains("async function whaleBaseSolve(task, ctx)"));
        assert!(one.contains("// export function solve( in a comment"), "comments are not anchors");
        assert!(one.contains("const s = \"export function solve(\";"), "strings are not anchors");
        let existing = layers(&one).expect("layers");
        let two = add_layer(&one, &existing, LayerKind::Retry, "second\nline", PASS, &limits).expect("anchor");
        assert_eq!(two.matches(SCAFFOLD_BEGIN).count(), 1);
        let found = layers(&two).expect("layers");
        assert_eq!(found.iter().map(Layer::name).collect::<Vec<_>>(), ["retry-1", "retry-2"]);
        assert_eq!(found[1].hypothesis, "second line");
        assert_eq!(found[0].kind, LayerKind::Retry);
        for source in [&one, &two] {
            validate(source, &limits).expect("valid");
        }
        let back = remove_layer(&two, &found[1]);
        assert_eq!(back, one);
    }

    #[test]
    fn const_exports_are_anchored_and_harnesses_without_an_anchor_are_left_alone() {
        let arrow = "export const solve = (task, ctx) => ctx.llm.chat('hi').text;\n";
        let limits = Limits::default();
        let layered = add_layer(arrow, &[], LayerKind::Vote, "h", PASS, &limits).expect("anchor");
        assert!(layered.starts_with("const whaleBaseSolve = (task, ctx)"));
        assert!(layered.contains("maxCalls: 16, maxChars: 190000"));
        validate(&layered, &limits).expect("valid");
        let nested = "function f() { export function solve() {} }\nexport { f as solve };\n";
        assert_eq!(add_layer(nested, &[], LayerKind::Vote, "h", "", &limits), None);
    }

    /// The names the proposer has always written, so the layers of archived harnesses read the same.
    #[test]
    fn every_kind_reads_back_from_the_name_archives_hold() {
        let names = [
            "instruction",
            "tool-step",
            "query",
            "vote",
            "retry",
            "format-system-into-user",
            "format-compact",
            "format-recent-window",
            "parse-final",
            "parse-number",
            "parse-clean",
            "few-shot",
        ];
        assert_eq!(LayerKind::all().iter().map(LayerKind::to_string).collect::<Vec<_>>(), names);
        for (kind, name) in LayerKind::all().into_iter().zip(names) {
            assert_eq!(name.parse::<LayerKind>(), Ok(kind));
            let source = add_layer(PLAIN, &[], kind, "h", PASS, &Limits::default()).expect("anchor");
            assert!(source.contains(&format!("// whale:layer {name}-1 begin\n")), "{source}");
            assert_eq!(layers(&source).expect("layers")[0].name(), format!("{name}-1"));
        }
    }

    #[test]
    fn a_marker_of_an_unknown_kind_is_an_error_naming_its_line_and_the_value() {
        let source = format!(
            "{PLAIN}// whale:layer retry-1 begin\n{{}}\n// whale:layer retry-1 end\n\
                              // whale:layer echo-2 begin\n{{}}\n// whale:layer echo-2 end\n"
        );
        let error = layers(&source).expect_err("echo is no kind").to_string();
        assert!(error.starts_with("line 9: layer `echo-2`: field `kind`: unknown value `echo` (known: instruction,"));
        let unnumbered = format!("{PLAIN}// whale:layer vote begin\n");
        assert_eq!(layers(&unnumbered), Err(LayerError::Name { line: 6, name: "vote".to_string() }));
    }
}
