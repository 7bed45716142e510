//! OpenAI tool calling over a model whose chat template has a tools part (Qwen2.5's, Qwen3's):
//! the request's `tools`, `tool_choice` and `parallel_tool_calls` read and checked, the tools
//! rendered by the model's own template, and the reply's `<tool_call>` blocks (the Hermes format
//! those templates ask the model for) parsed into `tool_calls`, as vLLM's `hermes` parser does.
//!
//! Why a reply that does not parse is content: the model wrote it, and a client that sees it can
//! tell the model's mistake from the server's; a 500 would blame the server for the model.
//!
//! `tool_choice`:
//! - `none`: no tools are rendered and nothing is parsed (vLLM's default for `none`);
//! - `auto` (the default when tools are given): the tools are rendered, and whatever blocks the
//!   model writes are parsed;
//! - `required` and a named function: also open the assistant turn inside a call
//!   (`<tool_call>\n`, and for a named one `{"name": "NAME", "arguments": `). whale has no
//!   constrained decoding, so the model is started inside a call rather than held to a grammar:
//!   what it then writes may still fail to parse, and comes back as content.

use serde_json::{json, Value};

use crate::error::ApiError;

/// Where a tool call opens and closes in the Hermes format.
pub const CALL_START: &str = "<tool_call>";
pub const CALL_END: &str = "</tool_call>";

/// Whether and how the model may call the request's tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A chat request's tools, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The `tools` as sent: each `{"type": "function", "function": {"name", ...}}`.
    pub schemas: Vec<Value>,
    pub choice: ToolChoice,
    /// Whether more than one call may come back (`parallel_tool_calls`, true by default).
    pub parallel: bool,
}

impl ToolRequest {
    /// The request's tools, or `None` when it has none (`tools` absent or empty). A
    /// `tool_choice` without tools, a function not among them, and a malformed schema are 400s
    /// naming the field.
    pub fn parse(
        tools: Option<&[Value]>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Self>, ApiError> {
        let schemas = tools.unwrap_or_default();
        let names =
            schemas.iter().enumerate().map(|(index, tool)| tool_name(index, tool)).collect::<Result<Vec<_>, _>>()?;
        let choice = match choice {
            None | Some(Value::Null) => None,
            Some(value) => Some(tool_choice(value, &names)?),
        };
        if schemas.is_empty() {
            return match choice {
                None | Some(ToolChoice::None) => Ok(None),
                Some(_) => Err(invalid("tool_choice", "needs `tools`")),
            };
        }
        let choice = choice.unwrap_or(ToolChoice::Auto);
        Ok(Some(Self { schemas: schemas.to_vec(), choice, parallel: parallel.unwrap_or(true) }))
    }

    /// The schemas the chat template renders: none under `tool_choice: "none"`.
    pub fn rendered(&self) -> Option<&[Value]> {
        (self.choice != ToolChoice::None).then_some(self.schemas.as_slice())
    }

    /// Whether the reply is read for tool calls.
    pub fn parses(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// Whether the assistant turn opens inside a call (`required`, a named function).
    pub fn opens_in_call(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// A choice's reply read for calls: its calls (and the content before them), or, when it
    /// has none or one that does not parse, the whole reply as content, the opening included.
    pub fn read(&self, text: &str) -> Result<ToolReply, String> {
        let full = self.opening() + text;
        parse_reply(&full, self.parallel).ok_or(full)
    }

    /// The text the assistant turn opens with, before the model's first token: inside a call for
    /// `required` and a named function, nothing otherwise. It is part of the reply that is parsed.
    pub fn opening(&self) -> String {
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => String::new(),
            ToolChoice::Required => format!("{CALL_START}\n"),
            ToolChoice::Named(name) => format!("{CALL_START}\n{{\"name\": {}, \"arguments\": ", json!(name)),
        }
    }
}

/// The name of tool `index`, checking its shape.
fn tool_name(index: usize, tool: &Value) -> Result<String, ApiError> {
    let field = |name: &str| format!("tools[{index}].{name}");
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(invalid(&field("type"), "must be \"function\""));
    }
    let function = tool.get("function").filter(|f| f.is_object());
    let function = function.ok_or_else(|| invalid(&field("function"), "must be an object"))?;
    let name = function.get("name").and_then(Value::as_str).filter(|name| !name.is_empty());
    let name = name.ok_or_else(|| invalid(&field("function.name"), "must be a non-empty string"))?;
    if function.get("parameters").is_some_and(|parameters| !parameters.is_object()) {
        return Err(invalid(&field("function.parameters"), "must be a JSON Schema object"));
    }
    Ok(name.to_string())
}

fn tool_choice(value: &Value, names: &[String]) -> Result<ToolChoice, ApiError> {
    match value {
        Value::String(text) => match text.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(invalid("tool_choice", format!("must be none, auto, required or a function, got {other:?}"))),
        },
        Value::Object(_) => {
            let name = value.pointer("/function/name").and_then(Value::as_str);
            let name = name.filter(|_| value.get("type").and_then(Value::as_str) == Some("function"));
            let name = name.ok_or_else(|| {
                invalid("tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}")
            })?;
            if !names.iter().any(|known| known == name) {
                return Err(invalid("tool_choice", format!("names {name:?}, which is not among `tools`")));
            }
            Ok(ToolChoice::Named(name.to_string()))
        }
        other => Err(invalid("tool_choice", format!("must be a string or an object, got {other}"))),
    }
}

fn invalid(param: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("`{param}` {message}")).with_param(param)
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `call_` and 24 hex digits, unique per call.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON string, as OpenAI sends them.
    pub arguments: String,
}

impl ToolCall {
    /// The call as an entry of a message's `tool_calls`; `index` is set in streamed deltas.
    pub fn json(&self, index: Option<usize>) -> Value {
        let mut call = json!({
            "id": self.id, "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if let Some(index) = index {
            call["index"] = json!(index);
        }
        call
    }
}

/// A reply read for tool calls: the text before the first call, and the calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    /// `None` when only whitespace comes before the first call.
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

/// The calls in `text` (the opening, then the model's reply): every `<tool_call>` block, the last
/// one possibly unclosed (generation stopped at the end-of-turn token), each a JSON object with a
/// string `name` and object `arguments`. `None` when there is no block or any block does not
/// parse: the reply is then content as it stands. Without `parallel`, the first call only.
pub fn parse_reply(text: &str, parallel: bool) -> Option<ToolReply> {
    let start = text.find(CALL_START)?;
    let mut calls = Vec::new();
    let mut rest = &text[start..];
    while let Some(after) = rest.strip_prefix(CALL_START) {
        let (body, next) = match after.find(CALL_END) {
            Some(end) => (&after[..end], after[end + CALL_END.len()..].trim_start()),
            None => (after, ""),
        };
        calls.push(parse_call(body)?);
        rest = next;
    }
    if !rest.trim().is_empty() {
        return None;
    }
    if !parallel {
        calls.truncate(1);
    }
    let content = Some(text[..start].to_string()).filter(|before| !before.trim().is_empty());
    Some(ToolReply { content, calls })
}

fn parse_call(body: &str) -> Option<ToolCall> {
    let call: Value = serde_json::from_str(body.trim()).ok()?;
    let name = call.get("name")?.as_str()?.to_string();
    let arguments = match call.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(arguments) if arguments.is_object() => arguments.clone(),
        Some(_) => return None,
    };
    Some(ToolCall { id: format!("call_{:024x}", rand::random::<u128>() >> 32), name, arguments: arguments.to_string() })
}

/// An assistant message's `tool_calls` as sent back in a later request, with each call's
/// `arguments` (a JSON string on the wire) made an object where it parses, as chat templates
/// read it (`tool_call.arguments | tojson`); vLLM does the same.
pub fn history_calls(calls: &[Value], index: usize) -> Result<Value, ApiError> {
    let mut converted = Vec::with_capacity(calls.len());
    for (position, call) in calls.iter().enumerate() {
        let field = |rest: &str| format!("messages[{index}].tool_calls[{position}]{rest}");
        let function = call.get("function").filter(|f| f.is_object());
        let mut function = function.cloned().ok_or_else(|| invalid(&field(""), "needs a `function` object"))?;
        if function.get("name").and_then(Value::as_str).is_none() {
            return Err(invalid(&field(".function.name"), "must be a string"));
        }
        if let Some(Value::String(text)) = function.get("arguments") {
            if let Ok(parsed) = serde_json::from_str::<Value>(text) {
                function["arguments"] = parsed;
            }
        }
        let mut call = call.clone();
        call["function"] = function;
        converted.push(call);
    }
    Ok(Value::Array(converted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}})
    }

    #[test]
    fn calls_are_read_from_hermes_blocks_and_anything_else_is_content() {
        let text = "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n\
                    <tool_call>\n{\"name\": \"mul\", \"arguments\": {}}\n</tool_call>";
        let reply = parse_reply(text, true).expect("two calls");
        assert_eq!(reply.content.as_deref(), Some("Let me add.\n"));
        let names: Vec<&str> = reply.calls.iter().map(|call| call.name.as_str()).collect();
        assert_eq!(names, ["add", "mul"]);
        assert_eq!(serde_json::from_str::<Value>(&reply.calls[0].arguments).unwrap(), json!({"a": 1, "b": 2}));
        assert_ne!(reply.calls[0].id, reply.calls[1].id);
        assert_eq!(parse_reply(text, false).unwrap().calls.len(), 1);
        let unclosed = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n";
        assert_eq!(parse_reply(unclosed, true).unwrap().content, None);
        for broken in [
            "no call at all",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}\n</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"add\", \"arguments\": \"a=1\"}</tool_call>",
            "<tool_call>{\"name\": \"add\"}</tool_call> and then prose",
        ] {
            assert_eq!(parse_reply(broken, true), None, "{broken:?}");
        }
    }

    #[test]
    fn tool_choice_is_checked_against_the_tools() {
        let tools = [tool("add"), tool("mul")];
        let parse = |choice: Value| ToolRequest::parse(Some(&tools), Some(&choice), None);
        assert_eq!(parse(json!("required")).unwrap().unwrap().opening(), "<tool_call>\n");
        let named = parse(json!({"type": "function", "function": {"name": "mul"}})).unwrap().unwrap();
        assert_eq!(named.opening(), "<tool_call>\n{\"name\": \"mul\", \"arguments\": ");
        assert!(named.parallel && named.parses());
        let none = parse(json!("none")).unwrap().unwrap();
        assert!(none.rendered().is_none() && !none.parses());
        for (choice, message) in [
            (json!({"type": "function", "function": {"name": "div"}}), "not among"),
            (json!("sometimes"), "tool_choice"),
            (json!(3), "tool_choice"),
        ] {
            let error = parse(choice).unwrap_err();
            assert!(error.message.contains(message) && error.param.as_deref() == Some("tool_choice"), "{error:?}");
        }
        let error = ToolRequest::parse(None, Some(&json!("required")), None).unwrap_err();
        assert!(error.message.contains("needs `tools`"), "{error:?}");
        assert_eq!(ToolRequest::parse(Some(&[]), None, None).unwrap(), None);
        let bad = [json!({"type": "function", "function": {"name": ""}})];
        let error = ToolRequest::parse(Some(&bad), None, None).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("tools[0].function.name"));
    }

    #[test]
    fn history_calls_get_their_arguments_as_objects() {
        let calls = [json!({"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}})];
        let converted = history_calls(&calls, 2).unwrap();
        assert_eq!(converted[0]["function"]["arguments"], json!({"a": 1}));
        let error = history_calls(&[json!({"id": "c1"})], 2).unwrap_err();
        assert!(error.param.unwrap().starts_with("messages[2].tool_calls"));
    }
}
