//! Reply bodies in the OpenAI shapes: `chat.completion` and `text_completion` objects, their
//! streamed chunks, and the usage. Each choice also carries `token_ids`, the sampled ids (vLLM's
//! `return_token_ids` spelling), so a remote client gets exactly what a local one would.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use whale_policy::Completion;
use whale_text::Tokenizer;

use crate::request::Endpoint;
use crate::tools::ToolRequest;

/// The finish reason of a choice that ended in tool calls.
pub const TOOL_CALLS_FINISH: &str = "tool_calls";

/// The fields every body of one reply shares.
#[derive(Debug, Clone)]
pub struct ReplyHeader {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

impl ReplyHeader {
    pub fn new(endpoint: Endpoint, model: &str) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Text => "cmpl",
        };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
        Self { id: format!("{prefix}-{:032x}", rand::random::<u128>()), created, model: model.to_string(), endpoint }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Text, _) => "text_completion",
        }
    }

    /// The whole reply of a request answered at once; with `tools` read, each chat choice's
    /// calls in its message's `tool_calls`.
    pub fn completion(
        &self,
        completions: &[Completion],
        tokenizer: &Tokenizer,
        logprobs: bool,
        tools: Option<&ToolRequest>,
    ) -> Value {
        let tools = tools.filter(|tools| tools.parses());
        let choices: Vec<Value> = completions
            .iter()
            .enumerate()
            .map(|(index, completion)| {
                let logprobs = logprobs.then(|| self.logprobs(tokenizer, &completion.token_ids, &completion.logprobs));
                let mut choice = json!({
                    "index": index,
                    "finish_reason": completion.finish_reason.as_str(),
                    "logprobs": logprobs,
                    "token_ids": completion.token_ids,
                });
                match (self.endpoint, tools) {
                    (Endpoint::Chat, Some(tools)) => {
                        let (message, finish) = tool_message(completion, tools);
                        choice["message"] = message;
                        choice["finish_reason"] = json!(finish);
                    }
                    (Endpoint::Chat, None) => {
                        choice["message"] = json!({"role": "assistant", "content": completion.text})
                    }
                    (Endpoint::Text, _) => choice["text"] = json!(completion.text),
                }
                choice
            })
            .collect();
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage(completions),
        })
    }

    /// A streamed chunk with one choice's update: new text (for chat, `role` in the first),
    /// the tokens it came from, and the finish reason in the last.
    pub fn chunk(&self, index: usize, update: ChunkUpdate<'_>, tokenizer: &Tokenizer, logprobs: bool) -> Value {
        let mut choice = json!({
            "index": index,
            "finish_reason": update.finish_reason,
            "logprobs": (logprobs && !update.token_ids.is_empty())
                .then(|| self.logprobs(tokenizer, update.token_ids, update.logprobs)),
            "token_ids": update.token_ids,
        });
        match self.endpoint {
            Endpoint::Chat => {
                let mut delta = json!({});
                if update.first {
                    delta["role"] = json!("assistant");
                }
                if update.first || !update.text.is_empty() {
                    delta["content"] = json!(update.text);
                }
                if let Some(calls) = update.tool_calls {
                    delta["tool_calls"] = calls.clone();
                }
                choice["delta"] = delta;
            }
            Endpoint::Text => choice["text"] = json!(update.text),
        }
        self.chunk_with(vec![choice])
    }

    /// The last chunk when the client asked for `stream_options.include_usage`.
    pub fn usage_chunk(&self, completions: &[Completion]) -> Value {
        let mut chunk = self.chunk_with(Vec::new());
        chunk["usage"] = usage(completions);
        chunk
    }

    fn chunk_with(&self, choices: Vec<Value>) -> Value {
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model, "choices": choices})
    }

    /// Per-token logprobs: chat's `content` list, or the legacy completions' parallel lists.
    fn logprobs(&self, tokenizer: &Tokenizer, ids: &[u32], logprobs: &[f32]) -> Value {
        let pieces: Vec<String> = ids.iter().map(|&id| token_piece(tokenizer, id)).collect();
        match self.endpoint {
            Endpoint::Chat => {
                let content: Vec<Value> = pieces
                    .iter()
                    .zip(logprobs)
                    .map(|(piece, logprob)| {
                        // A token ending inside a UTF-8 character has no text of its own.
                        let bytes = (!piece.contains(char::REPLACEMENT_CHARACTER)).then(|| piece.as_bytes().to_vec());
                        json!({"token": piece, "logprob": logprob, "bytes": bytes, "top_logprobs": []})
                    })
                    .collect();
                json!({"content": content})
            }
            Endpoint::Text => {
                let offsets: Vec<usize> = pieces
                    .iter()
                    .scan(0, |offset, piece| {
                        let start = *offset;
                        *offset += piece.len();
                        Some(start)
                    })
                    .collect();
                json!({"tokens": pieces, "token_logprobs": logprobs, "top_logprobs": null, "text_offset": offsets})
            }
        }
    }
}

/// What one streamed chunk says about one choice.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChunkUpdate<'a> {
    /// The choice's first chunk (chat sends the role in it).
    pub first: bool,
    pub text: &'a str,
    pub token_ids: &'a [u32],
    pub logprobs: &'a [f32],
    /// The choice's calls, each with its `index`, sent whole once the choice is done.
    pub tool_calls: Option<&'a Value>,
    pub finish_reason: Option<&'static str>,
}

/// A chat choice's message when the reply is read for tool calls, and its finish reason: the
/// calls and `tool_calls` when the reply (after the turn's opening) holds them, else the whole
/// reply, opening included, as content.
fn tool_message(completion: &Completion, tools: &ToolRequest) -> (Value, &'static str) {
    match tools.read(&completion.text) {
        Ok(reply) => {
            let calls: Vec<Value> = reply.calls.iter().map(|call| call.json(None)).collect();
            (json!({"role": "assistant", "content": reply.content, "tool_calls": calls}), TOOL_CALLS_FINISH)
        }
        Err(content) => (json!({"role": "assistant", "content": content}), completion.finish_reason.as_str()),
    }
}

/// Usage of a request: the prompt once, the completion tokens of every choice.
pub fn usage(completions: &[Completion]) -> Value {
    let prompt_tokens = completions.first().map_or(0, |completion| completion.prompt_tokens);
    let completion_tokens: usize = completions.iter().map(|completion| completion.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// The text of one token, special tokens spelled out.
fn token_piece(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}
