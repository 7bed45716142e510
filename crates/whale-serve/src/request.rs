//! The request bodies the server accepts, parsed strictly: a field the server does not
//! implement is refused with a 400 naming it rather than ignored, because a client that sends
//! `presence_penalty` and silently gets a plain completion learns something false. Tools are
//! read by [`crate::tools`].
//! Sampling fields map onto [`SamplingParams`]; a missing one takes whale's default
//! (temperature 1, top_p 1, top_k 20, max_tokens 1024), a missing seed a random one.

use serde::Deserialize;
use serde_json::Value;
use whale_core::ChatMessage;
use whale_policy::sampling::{MAX_STOPS, MAX_STOP_BYTES};
use whale_policy::SamplingParams;

use crate::error::ApiError;
use crate::tools::{self, ToolRequest};

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 128;

/// Which endpoint a generation request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: messages through the chat template.
    Chat,
    /// `/v1/completions`: raw text continued without a template.
    Text,
}

impl Endpoint {
    /// The request field holding the prompt.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Text => "prompt",
        }
    }
}

/// The body of `/v1/chat/completions` and `/v1/completions` as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireGeneration {
    model: String,
    messages: Option<Vec<WireMessage>>,
    prompt: Option<WirePrompt>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    stop: Option<WireStop>,
    /// Any 64-bit integer ([`seed_bits`]).
    seed: Option<serde_json::Number>,
    n: Option<usize>,
    /// A boolean for chat; for text completions the legacy number of alternatives (only 0).
    logprobs: Option<Value>,
    top_logprobs: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    echo: Option<bool>,
    /// vLLM's and llama.cpp's: generate to `max_tokens` past end-of-sequence tokens.
    ignore_eos: Option<bool>,
    /// vLLM's switch for `token_ids` in the reply; whale always returns them.
    #[serde(rename = "return_token_ids")]
    _return_token_ids: Option<bool>,
    /// An end-user id for abuse tracking; accepted and not used.
    #[serde(rename = "user")]
    _user: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireMessage {
    role: String,
    /// Absent or null only in an assistant turn that called tools.
    content: Option<WireContent>,
    #[serde(rename = "name")]
    _name: Option<String>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WirePart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WirePrompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WireStop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// What to generate from, once the endpoint's rules are checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Messages(Vec<ChatMessage>),
    Text(String),
    Ids(Vec<u32>),
}

/// A valid generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub endpoint: Endpoint,
    pub model: String,
    pub prompt: Prompt,
    /// The parameters of choice 0; choice `i` uses seed `seed + i`.
    pub params: SamplingParams,
    pub n: usize,
    pub logprobs: bool,
    pub stream: bool,
    /// Send a last chunk with the usage before `[DONE]`.
    pub include_usage: bool,
    /// The tools the model may call (chat only).
    pub tools: Option<ToolRequest>,
}

impl GenerationRequest {
    /// Parses and checks a body sent to `endpoint`; every problem is a 400 naming the field.
    pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<Self, ApiError> {
        let wire: WireGeneration = json_body(body)?;
        let prompt = prompt(&wire, endpoint)?;
        let logprobs = logprobs(wire.logprobs.as_ref(), endpoint)?;
        for (field, value) in
            [("presence_penalty", wire.presence_penalty), ("frequency_penalty", wire.frequency_penalty)]
        {
            if value.is_some_and(|v| v != 0.0) {
                return Err(unsupported(field, "penalties are not implemented; send 0 or leave it out"));
            }
        }
        if wire.top_logprobs.is_some_and(|k| k > 0) {
            return Err(unsupported("top_logprobs", "only the sampled token's logprob is returned; send 0"));
        }
        if wire.echo == Some(true) {
            return Err(unsupported("echo", "echoing the prompt is not implemented"));
        }
        let tools = ToolRequest::parse(wire.tools.as_deref(), wire.tool_choice.as_ref(), wire.parallel_tool_calls)?;
        if tools.is_some() && endpoint == Endpoint::Text {
            return Err(unsupported("tools", "text completions take no tools; use /v1/chat/completions"));
        }
        let n = wire.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(invalid("n", format!("must be between 1 and {MAX_CHOICES}, got {n}")));
        }
        Ok(Self {
            endpoint,
            model: wire.model.clone(),
            prompt,
            params: sampling_params(&wire)?,
            n,
            logprobs,
            stream: wire.stream.unwrap_or(false),
            include_usage: wire.stream_options.and_then(|options| options.include_usage).unwrap_or(false),
            tools,
        })
    }

    /// The parameters of each of the `n` choices: choice i samples with seed `seed + i`.
    pub fn choices(&self) -> Vec<SamplingParams> {
        (0..self.n as u64)
            .map(|index| SamplingParams { seed: self.params.seed.wrapping_add(index), ..self.params.clone() })
            .collect()
    }
}

/// A JSON body read into `T`; a 400 otherwise, naming the field at fault (`messages[0].role`)
/// in its message and `param` when the fault is inside the body rather than the whole of it.
pub fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        match path.as_str() {
            "." => ApiError::bad_request(format!("invalid request body: {inner}")),
            _ => ApiError::bad_request(format!("invalid request body: `{path}`: {inner}")).with_param(path),
        }
    })?;
    deserializer.end().map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    Ok(value)
}

fn invalid(param: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("`{param}` {message}")).with_param(param)
}

fn unsupported(param: &str, reason: &str) -> ApiError {
    ApiError::bad_request(format!("`{param}` is not supported: {reason}")).with_param(param)
}

fn prompt(wire: &WireGeneration, endpoint: Endpoint) -> Result<Prompt, ApiError> {
    match (endpoint, &wire.messages, &wire.prompt) {
        (Endpoint::Chat, Some(messages), None) => {
            if messages.is_empty() {
                return Err(invalid("messages", "must hold at least one message"));
            }
            messages.iter().enumerate().map(chat_message).collect::<Result<_, _>>().map(Prompt::Messages)
        }
        (Endpoint::Chat, _, Some(_)) => Err(unsupported("prompt", "chat completions take `messages`")),
        (Endpoint::Chat, None, None) => Err(invalid("messages", "is required")),
        (Endpoint::Text, None, Some(prompt)) => match prompt {
            WirePrompt::Text(text) => Ok(Prompt::Text(text.clone())),
            WirePrompt::Texts(texts) if texts.len() == 1 => Ok(Prompt::Text(texts[0].clone())),
            WirePrompt::Texts(texts) => Err(invalid("prompt", format!("must be one prompt, got {}", texts.len()))),
            WirePrompt::Ids(ids) => Ok(Prompt::Ids(ids.clone())),
        },
        (Endpoint::Text, Some(_), _) => Err(unsupported("messages", "text completions take `prompt`")),
        (Endpoint::Text, None, None) => Err(invalid("prompt", "is required")),
    }
}

fn chat_message((index, message): (usize, &WireMessage)) -> Result<ChatMessage, ApiError> {
    let calls = match &message.tool_calls {
        Some(_) if message.role != "assistant" => {
            return Err(invalid(&format!("messages[{index}].tool_calls"), "belongs to an assistant message"))
        }
        Some(calls) => Some(tools::history_calls(calls, index)?),
        None => None,
    };
    let content = match &message.content {
        None if calls.is_some() => String::new(),
        None => return Err(invalid(&format!("messages[{index}].content"), "is required")),
        Some(WireContent::Text(text)) => text.clone(),
        Some(WireContent::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(piece)) => text.push_str(piece),
                    (kind, _) => {
                        return Err(unsupported("messages", &format!("content parts of type `{kind}` without text")))
                    }
                }
            }
            text
        }
    };
    let mut chat = ChatMessage::new(message.role.clone(), content);
    chat.tool_calls = calls;
    chat.tool_call_id = message.tool_call_id.clone();
    Ok(chat)
}

fn logprobs(value: Option<&Value>, endpoint: Endpoint) -> Result<bool, ApiError> {
    match (endpoint, value) {
        (_, None | Some(Value::Null)) => Ok(false),
        (Endpoint::Chat, Some(Value::Bool(wanted))) => Ok(*wanted),
        (Endpoint::Chat, Some(other)) => Err(invalid("logprobs", format!("must be a boolean, got {other}"))),
        (Endpoint::Text, Some(Value::Number(k))) if k.as_u64() == Some(0) => Ok(true),
        (Endpoint::Text, Some(other)) => {
            Err(invalid("logprobs", format!("must be 0 (the sampled tokens' logprobs, no alternatives), got {other}")))
        }
    }
}

/// A seed given as any 64-bit integer: whale's clients send a u64 seed's bits as an i64, the
/// range vLLM accepts, and a negative seed is read back as the u64 with the same bits.
fn seed_bits(seed: &serde_json::Number) -> Result<u64, ApiError> {
    seed.as_u64()
        .or_else(|| seed.as_i64().map(|signed| signed as u64))
        .ok_or_else(|| invalid("seed", format!("must be an integer in the range of i64 or u64, got {seed}")))
}

fn sampling_params(wire: &WireGeneration) -> Result<SamplingParams, ApiError> {
    let defaults = SamplingParams::default();
    let top_k = match wire.top_k {
        None => defaults.top_k,
        Some(-1 | 0) => 0,
        Some(k) if k > 0 => usize::try_from(k).map_err(|_| invalid("top_k", "is too large"))?,
        Some(k) => return Err(invalid("top_k", format!("must be -1, 0 (no limit) or positive, got {k}"))),
    };
    let params = SamplingParams {
        temperature: wire.temperature.unwrap_or(defaults.temperature),
        top_p: wire.top_p.unwrap_or(defaults.top_p),
        top_k,
        max_tokens: wire.max_completion_tokens.or(wire.max_tokens).unwrap_or(defaults.max_tokens),
        stop: stops(wire.stop.as_ref())?,
        seed: wire.seed.as_ref().map_or_else(|| Ok(rand::random()), seed_bits)?,
        ignore_eos: wire.ignore_eos.unwrap_or(false),
    };
    params.validate().map_err(|e| ApiError::bad_request(e.to_string()).with_param(e.field()))?;
    Ok(params)
}

/// The stop strings, at most [`MAX_STOPS`] of at most [`MAX_STOP_BYTES`] each.
fn stops(stop: Option<&WireStop>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => Vec::new(),
        Some(WireStop::One(stop)) => vec![stop.clone()],
        Some(WireStop::Many(stops)) => stops.clone(),
    };
    if stops.len() > MAX_STOPS {
        return Err(invalid("stop", format!("must hold at most {MAX_STOPS} strings, got {}", stops.len())));
    }
    if let Some(long) = stops.iter().find(|stop| stop.len() > MAX_STOP_BYTES) {
        let length = long.len();
        return Err(invalid("stop", format!("strings must be at most {MAX_STOP_BYTES} bytes long, got {length}")));
    }
    Ok(stops)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(body: &str) -> Result<GenerationRequest, ApiError> {
        GenerationRequest::parse(body.as_bytes(), Endpoint::Chat)
    }

    #[test]
    fn a_full_chat_request_maps_onto_sampling_params() {
        let request = chat(
            r#"{"model": "m", "messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "2?"}]}],
                "temperature": 0, "top_p": 0.5, "top_k": -1, "max_completion_tokens": 7, "stop": "\n",
                "seed": 3, "n": 2, "logprobs": true, "top_logprobs": 0, "stream": true,
                "stream_options": {"include_usage": true}, "user": "u", "return_token_ids": true,
                "ignore_eos": true}"#,
        )
        .expect("valid");
        assert_eq!(
            request.prompt,
            Prompt::Messages(vec![ChatMessage::new("system", "be brief"), ChatMessage::new("user", "2+2?")])
        );
        let expected = SamplingParams {
            temperature: 0.0,
            top_p: 0.5,
            top_k: 0,
            max_tokens: 7,
            stop: vec!["\n".into()],
            seed: 3,
            ignore_eos: true,
        };
        assert_eq!(request.params, expected);
        assert_eq!(request.choices().iter().map(|c| c.seed).collect::<Vec<_>>(), [3, 4]);
        assert!(request.logprobs && request.stream && request.include_usage);
        assert_eq!(request.n, 2);
    }

    #[test]
    fn a_seed_is_any_64_bit_integer_a_negative_one_its_u64_bits() {
        let seed = |text: &str| {
            let body =
                format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "seed": {text}}}"#);
            chat(&body).map(|request| request.params.seed)
        };
        assert_eq!(seed("18446744073709551615").expect("u64::MAX"), u64::MAX);
        assert_eq!(seed("-1").expect("as vLLM takes it"), u64::MAX);
        assert_eq!(seed("-9223372036854775808").expect("i64::MIN"), 1 << 63);
        let error = seed("18446744073709551616").expect_err("past 64 bits");
        assert!(error.to_string().contains("`seed` must be an integer"), "{error}");
        let error = seed("1.5").expect_err("not an integer");
        assert!(error.to_string().contains("got 1.5"), "{error}");
    }

    #[test]
    fn defaults_are_whales_and_text_prompts_take_strings_or_ids() {
        let request = GenerationRequest::parse(br#"{"model": "m", "prompt": [5, 6]}"#, Endpoint::Text).expect("ids");
        assert_eq!(request.prompt, Prompt::Ids(vec![5, 6]));
        let defaults = SamplingParams::default();
        assert_eq!((request.params.top_k, request.params.max_tokens), (defaults.top_k, defaults.max_tokens));
        assert!(!request.logprobs && !request.stream);
        let request = GenerationRequest::parse(br#"{"model": "m", "prompt": ["a"], "logprobs": 0}"#, Endpoint::Text)
            .expect("one");
        assert_eq!((request.prompt, request.logprobs), (Prompt::Text("a".into()), true));
    }

    #[test]
    fn bad_requests_are_refused_with_the_field_named() {
        let refused = |body: &str, endpoint, needle: &str| {
            let error = GenerationRequest::parse(body.as_bytes(), endpoint).expect_err(body);
            assert_eq!(error.status, 400, "{body}");
            assert!(error.message.contains(needle), "{body}: {}", error.message);
        };
        let chat = Endpoint::Chat;
        refused("{", chat, "invalid request body");
        refused(r#"{"model": "m"}"#, chat, "`messages` is required");
        refused(r#"{"model": 3, "messages": []}"#, chat, "invalid type");
        refused(r#"{"model": "m", "messages": []}"#, chat, "at least one");
        refused(
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "functions": []}"#,
            chat,
            "unknown field `functions`",
        );
        refused(r#"{"model": "m", "messages": [{"role": "user"}]}"#, chat, "`messages[0].content` is required");
        refused(
            r#"{"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]}"#,
            chat,
            "belongs to an assistant message",
        );
        refused(
            r#"{"model": "m", "prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}"#,
            Endpoint::Text,
            "text completions take no tools",
        );
        refused(
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": -1}"#,
            chat,
            "temperature",
        );
        refused(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 0}"#, chat, "top_p");
        refused(
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#,
            chat,
            "max_tokens",
        );
        refused(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}"#, chat, "`n`");
        refused(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_k": -2}"#, chat, "top_k");
        refused(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 1}"#, chat, "boolean");
        refused(
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
            chat,
            "top_logprobs",
        );
        refused(
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 1}"#,
            chat,
            "penalties",
        );
        refused(
            r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            chat,
            "image_url",
        );
        refused(r#"{"model": "m", "prompt": "x"}"#, chat, "take `messages`");
        refused(r#"{"model": "m", "prompt": ["a", "b"]}"#, Endpoint::Text, "one prompt");
        refused(r#"{"model": "m", "prompt": "a", "logprobs": 3}"#, Endpoint::Text, "must be 0");
        refused(r#"{"model": "m", "prompt": "a", "echo": true}"#, Endpoint::Text, "echo");
    }

    #[test]
    fn stop_strings_are_bounded_in_number_and_length() {
        let stop = |stop: Value| {
            let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": stop});
            chat(&body.to_string()).map(|request| request.params.stop)
        };
        let most = vec!["s".to_string(); MAX_STOPS];
        assert_eq!(stop(json!(most)).expect("the most allowed"), most);
        let longest = "x".repeat(MAX_STOP_BYTES);
        assert_eq!(stop(json!(longest)).expect("the longest allowed"), vec![longest]);
        for (too_much, needle) in [
            (json!(vec!["s"; MAX_STOPS + 1]), "at most 16 strings, got 17"),
            (json!("x".repeat(MAX_STOP_BYTES + 1)), "at most 1024 bytes long, got 1025"),
            (json!(["\n", "é".repeat(513)]), "got 1026"),
        ] {
            let error = stop(too_much).expect_err(needle);
            assert_eq!(
                (error.status, error.kind, error.param.as_deref()),
                (400, "invalid_request_error", Some("stop"))
            );
            assert!(error.message.contains(needle), "{}", error.message);
        }
    }
}
