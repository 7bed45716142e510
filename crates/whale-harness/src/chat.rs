//! The arguments of `ctx.llm.chat(messages, opts)` read from JSON, with error messages aimed at
//! the harness author, and the per-call sampling seed.

use serde_json::Value;
use whale_core::ChatMessage;
use whale_policy::sampling::{MAX_STOPS, MAX_STOP_BYTES};
use whale_policy::SamplingParams;
use whale_tasks::json_kind;

/// The option names `ctx.llm.chat` accepts.
pub const CHAT_OPTIONS: [&str; 6] = ["max_tokens", "temperature", "top_p", "top_k", "stop", "trainable"];

/// Most characters of a message's `role` (roles are not counted in `prompt_chars`).
pub const MAX_ROLE_CHARS: usize = 32;

/// A string is one user message; otherwise an array of `{role, content}` objects.
pub(crate) fn parse_messages(messages: &Value) -> Result<Vec<ChatMessage>, String> {
    match messages {
        Value::String(text) => Ok(vec![ChatMessage::new("user", text.as_str())]),
        Value::Array(items) if !items.is_empty() => {
            items.iter().enumerate().map(|(i, m)| parse_message(i, m)).collect()
        }
        Value::Array(_) => Err("ctx.llm.chat: `messages` is empty".into()),
        other => Err(format!(
            "ctx.llm.chat: `messages` must be a string or an array of {{role, content}} objects, got {}",
            json_kind(other)
        )),
    }
}

fn parse_message(index: usize, message: &Value) -> Result<ChatMessage, String> {
    let field = |name: &str| match message.get(name) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => {
            Err(format!("ctx.llm.chat: messages[{index}].{name} must be a string, got {}", json_kind(other)))
        }
        None => Err(format!("ctx.llm.chat: messages[{index}] has no `{name}`")),
    };
    let role = field("role")?;
    if role.chars().count() > MAX_ROLE_CHARS {
        return Err(format!("ctx.llm.chat: messages[{index}].role is longer than {MAX_ROLE_CHARS} characters"));
    }
    Ok(ChatMessage::new(role, field("content")?))
}

/// Sampling parameters and the `trainable` flag of one call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatOptions {
    pub params: SamplingParams,
    pub trainable: bool,
}

impl ChatOptions {
    /// Reads `opts` over `defaults`; `max_tokens` above `max_tokens_cap` is refused.
    pub fn parse(opts: &Value, defaults: &SamplingParams, max_tokens_cap: usize) -> Result<Self, String> {
        let mut params = defaults.clone();
        params.max_tokens = params.max_tokens.min(max_tokens_cap);
        let mut options = Self { params, trainable: true };
        let fields = match opts {
            Value::Null => return Ok(options),
            Value::Object(fields) => fields,
            other => return Err(format!("ctx.llm.chat: `opts` must be an object, got {}", json_kind(other))),
        };
        for (key, value) in fields {
            options.set(key, value, max_tokens_cap).map_err(|reason| format!("ctx.llm.chat: opts.{key} {reason}"))?;
        }
        Ok(options)
    }

    fn set(&mut self, key: &str, value: &Value, max_tokens_cap: usize) -> Result<(), String> {
        let params = &mut self.params;
        match key {
            "max_tokens" => {
                let n = whole_number(value)?;
                if n == 0 || n > max_tokens_cap as u64 {
                    return Err(format!("must be between 1 and {max_tokens_cap}, got {n}"));
                }
                params.max_tokens = n as usize;
            }
            // Bounded so that the f32 the policy gets is still in range (1e300 is no infinity).
            "temperature" => params.temperature = number_in(value, 0.0, f32::MAX.into(), "at least 0")? as f32,
            "top_p" => params.top_p = number_in(value, f32::MIN_POSITIVE.into(), 1.0, "in (0, 1]")? as f32,
            "top_k" => params.top_k = whole_number(value)? as usize,
            "stop" => params.stop = stop_strings(value)?,
            "trainable" => {
                self.trainable =
                    value.as_bool().ok_or_else(|| format!("must be a boolean, got {}", json_kind(value)))?
            }
            _ => return Err(format!("is not an option; the options are {}", CHAT_OPTIONS.join(", "))),
        }
        Ok(())
    }
}

fn whole_number(value: &Value) -> Result<u64, String> {
    value.as_u64().ok_or_else(|| format!("must be a whole number >= 0, got {value}"))
}

fn number_in(value: &Value, low: f64, high: f64, range: &str) -> Result<f64, String> {
    match value.as_f64() {
        Some(x) if (low..=high).contains(&x) => Ok(x),
        _ => Err(format!("must be a number {range}, got {value}")),
    }
}

fn stop_strings(value: &Value) -> Result<Vec<String>, String> {
    let stops: Vec<String> = match value {
        Value::String(stop) => vec![stop.clone()],
        Value::Array(items) if items.len() > MAX_STOPS => {
            return Err(format!("must hold at most {MAX_STOPS} strings, got {}", items.len()))
        }
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str().map(str::to_string).ok_or_else(|| format!("must hold strings, got {}", json_kind(item)))
            })
            .collect::<Result<_, _>>()?,
        other => return Err(format!("must be a string or an array of strings, got {}", json_kind(other))),
    };
    match stops.iter().find(|stop| stop.len() > MAX_STOP_BYTES) {
        Some(long) => Err(format!("strings must be at most {MAX_STOP_BYTES} bytes long, got {}", long.len())),
        None => Ok(stops),
    }
}

/// The sampling seed of a rollout's `call_index`-th model call (0-based): SplitMix64 of the
/// rollout seed mixed with the index, so every call of every rollout samples independently and
/// reproducibly whatever order the engine schedules them in.
pub fn call_seed(rollout_seed: u64, call_index: u64) -> u64 {
    splitmix64(rollout_seed ^ splitmix64(call_index.wrapping_add(1)))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_string_is_one_user_message() {
        assert_eq!(parse_messages(&json!("hi")).unwrap(), vec![ChatMessage::new("user", "hi")]);
        let two = json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]);
        assert_eq!(parse_messages(&two).unwrap()[1], ChatMessage::new("user", "u"));
    }

    #[test]
    fn malformed_messages_name_the_culprit() {
        let err = parse_messages(&json!([{"role": "user", "content": "a"}, {"role": "user"}])).unwrap_err();
        assert!(err.contains("messages[1] has no `content`"), "{err}");
        let err = parse_messages(&json!([{"role": "user", "content": 3}])).unwrap_err();
        assert!(err.contains("messages[0].content must be a string, got a number"), "{err}");
        assert!(parse_messages(&json!([])).is_err());
        assert!(parse_messages(&json!(7)).unwrap_err().contains("got a number"));
    }

    #[test]
    fn options_override_the_defaults() {
        let defaults = SamplingParams { max_tokens: 8000, ..SamplingParams::default() };
        let none = ChatOptions::parse(&Value::Null, &defaults, 4096).unwrap();
        assert_eq!(none.params.max_tokens, 4096, "the default is capped too");
        assert!(none.trainable);
        let opts =
            json!({"max_tokens": 64, "temperature": 0, "top_p": 0.9, "top_k": 5, "stop": "\n", "trainable": false});
        let parsed = ChatOptions::parse(&opts, &defaults, 4096).unwrap();
        assert_eq!(parsed.params.max_tokens, 64);
        assert_eq!(parsed.params.temperature, 0.0);
        assert_eq!(parsed.params.top_p, 0.9);
        assert_eq!(parsed.params.top_k, 5);
        assert_eq!(parsed.params.stop, vec!["\n".to_string()]);
        assert!(!parsed.trainable);
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        let defaults = SamplingParams::default();
        let err = ChatOptions::parse(&json!({"maxTokens": 5}), &defaults, 4096).unwrap_err();
        assert!(err.contains("opts.maxTokens is not an option"), "{err}");
        let err = ChatOptions::parse(&json!({"max_tokens": 5000}), &defaults, 4096).unwrap_err();
        assert!(err.contains("between 1 and 4096"), "{err}");
        assert!(ChatOptions::parse(&json!({"top_p": 0}), &defaults, 4096).is_err());
        assert!(ChatOptions::parse(&json!({"temperature": -1}), &defaults, 4096).is_err());
        assert!(ChatOptions::parse(&json!({"stop": [1]}), &defaults, 4096).is_err());
        assert!(ChatOptions::parse(&json!({"trainable": "no"}), &defaults, 4096).is_err());
        assert!(ChatOptions::parse(&json!("fast"), &defaults, 4096).is_err());
    }

    #[test]
    fn options_the_policy_would_refuse_are_refused_here() {
        let defaults = SamplingParams::default();
        for opts in [json!({"temperature": 1e300}), json!({"top_p": 1e-50})] {
            let err = ChatOptions::parse(&opts, &defaults, 4096).expect_err("out of f32 range");
            assert!(err.contains("must be a number"), "{err}");
        }
        let ok = ChatOptions::parse(&json!({"temperature": 3e38, "top_p": 1e-30}), &defaults, 4096).unwrap();
        assert_eq!(ok.params.validate(), Ok(()));
        let many: Vec<String> = (0..=MAX_STOPS).map(|i| i.to_string()).collect();
        let err = ChatOptions::parse(&json!({ "stop": many }), &defaults, 4096).unwrap_err();
        assert!(err.contains("at most 16 strings, got 17"), "{err}");
        let err = ChatOptions::parse(&json!({"stop": "x".repeat(1025)}), &defaults, 4096).unwrap_err();
        assert!(err.contains("at most 1024 bytes long, got 1025"), "{err}");
        let full = vec!["x".repeat(MAX_STOP_BYTES); MAX_STOPS];
        assert!(ChatOptions::parse(&json!({ "stop": full }), &defaults, 4096).is_ok());
        let err = parse_messages(&json!([{"role": "r".repeat(33), "content": "hi"}])).unwrap_err();
        assert!(err.contains("messages[0].role is longer than 32 characters"), "{err}");
    }

    #[test]
    fn call_seeds_differ_by_call_and_by_rollout() {
        let seeds: std::collections::HashSet<u64> =
            (0..4).flat_map(|rollout| (0..16).map(move |call| call_seed(rollout, call))).collect();
        assert_eq!(seeds.len(), 64);
        assert_eq!(call_seed(7, 3), call_seed(7, 3));
    }
}
