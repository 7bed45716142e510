//! One chat-completion request to an OpenAI-compatible server (vLLM, SGLang, hosted APIs)
//! with function tools, and the parts of the reply the session needs.

use crate::proposer::{ProposerError, TokenUsage};
use serde_json::{json, Value};
use whale_http::{ClientConfig, HttpError, JsonClient};

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolRequest {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them (a JSON object, as text).
    pub arguments: String,
}

/// The model's turn.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// The assistant message to append to the conversation.
    pub message: Value,
    pub tool_requests: Vec<ToolRequest>,
    pub usage: TokenUsage,
}

pub(crate) struct ChatClient {
    http: JsonClient,
    url: String,
    model: String,
    sampling: Sampling,
}

/// The sampling settings of a session.
pub(crate) struct Sampling {
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
}

impl ChatClient {
    pub fn new(base_url: &str, model: &str, http: ClientConfig, sampling: Sampling) -> Result<Self, ProposerError> {
        let http = JsonClient::new(http).map_err(|e| ProposerError::Config(e.to_string()))?;
        Ok(Self {
            http,
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            model: model.to_string(),
            sampling,
        })
    }

    /// Sends the conversation (with `tools` the model may call, if any) and returns the model's turn.
    pub fn complete(&self, messages: &[Value], tools: Option<&Value>) -> Result<Turn, ProposerError> {
        let mut body = json!({"model": self.model, "messages": messages});
        if let Some(tools) = tools {
            body["tools"] = tools.clone();
            body["tool_choice"] = json!("auto");
        }
        if let Some(temperature) = self.sampling.temperature {
            body["temperature"] = json!(temperature);
        }
        if let Some(max_tokens) = self.sampling.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        let api_error = |error: HttpError| ProposerError::Api { status: error.status(), message: error.to_string() };
        let text = self.http.post(&self.url, &body).map_err(api_error)?;
        let reply: Value = serde_json::from_str(&text).map_err(|e| ProposerError::Api {
            status: None,
            message: format!("{}: reply is not JSON: {e}", self.url),
        })?;
        parse_turn(&reply).map_err(ProposerError::Reply)
    }
}

fn parse_turn(reply: &Value) -> Result<Turn, String> {
    let message =
        reply.pointer("/choices/0/message").ok_or_else(|| "the reply has no choices[0].message".to_string())?;
    let calls = message.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
    let tool_requests = calls
        .iter()
        .map(|call| {
            let field = |pointer: &str| call.pointer(pointer).and_then(Value::as_str).map(str::to_string);
            match (field("/id"), field("/function/name")) {
                (Some(id), Some(name)) => {
                    Ok(ToolRequest { id, name, arguments: field("/function/arguments").unwrap_or_default() })
                }
                _ => Err(format!("a tool call lacks an id or a function name: {call}")),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut assistant = json!({"role": "assistant", "content": message.get("content").cloned().unwrap_or(Value::Null)});
    if !calls.is_empty() {
        assistant["tool_calls"] = Value::Array(calls);
    }
    let count = |key: &str| reply.pointer(&format!("/usage/{key}")).and_then(Value::as_u64).unwrap_or(0);
    let usage = TokenUsage {
        requests: 1,
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
    };
    Ok(Turn { message: assistant, tool_requests, usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_keeps_the_tool_calls_and_the_usage() {
        let reply = json!({"choices": [{"message": {"role": "assistant", "content": null, "reasoning_content": "x",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3}});
        let turn = parse_turn(&reply).expect("turn");
        assert_eq!(
            turn.tool_requests,
            vec![ToolRequest { id: "c1".into(), name: "list_dir".into(), arguments: "{}".into() }]
        );
        assert_eq!(turn.usage, TokenUsage { requests: 1, prompt_tokens: 12, completion_tokens: 3 });
        assert!(turn.message.get("reasoning_content").is_none());
        assert_eq!(turn.message["tool_calls"][0]["id"], "c1");
        assert!(parse_turn(&json!({"choices": []})).is_err());
        let broken = json!({"choices": [{"message": {"tool_calls": [{"function": {"name": "x"}}]}}]});
        assert!(parse_turn(&broken).unwrap_err().contains("lacks an id"));
    }
}
