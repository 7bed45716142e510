//! What one rollout did: every model call and tool call in order, the answer and its verdict.

use serde::{Deserialize, Serialize};

/// One chat message as sent to a model. An assistant turn that called tools carries the calls
/// (OpenAI's `tool_calls` list, each call's `arguments` an object as chat templates read it),
/// and a `tool` turn the id of the call it answers; both are absent from plain chats and from
/// the JSON of a trajectory without them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None }
    }
}

fn yes() -> bool {
    true
}

/// The tokens a policy sampled for one call, and the log-probability the sampling policy gave
/// each (at temperature 1, over the whole vocabulary): what a policy-gradient update needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SampledTokens {
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
}

/// One call to the policy. Only `trainable` calls feed the weight phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCall {
    pub messages: Vec<ChatMessage>,
    pub completion: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    #[serde(default = "yes")]
    pub trainable: bool,
    #[serde(default)]
    pub finish_reason: String,
    #[serde(default)]
    pub latency_ms: f64,
    /// The sampled tokens, when the policy reported them. Kept in memory for the weight phase
    /// and never written to traces, which people and the proposer read.
    #[serde(skip)]
    pub sampled: Option<SampledTokens>,
}

/// One call of a domain tool by the harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub name: String,
    pub args: serde_json::Value,
    pub result: serde_json::Value,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub latency_ms: f64,
}

/// How a verifier judged the end state of an episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// In [0, 1].
    pub reward: f64,
    pub success: bool,
    /// Human-readable reason ("expected 42, got 41", "mate accepted", ...).
    #[serde(default)]
    pub detail: String,
}

impl Verdict {
    pub fn pass(detail: impl Into<String>) -> Self {
        Self { reward: 1.0, success: true, detail: detail.into() }
    }
    pub fn fail(detail: impl Into<String>) -> Self {
        Self { reward: 0.0, success: false, detail: detail.into() }
    }
}

/// Why a rollout ended without a judged answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Timeout,
    OutOfMemory,
    StackOverflow,
    CallLimit,
    Exception,
    BadAnswer,
    Policy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutError {
    pub kind: ErrorKind,
    pub message: String,
    #[serde(default)]
    pub stack: Option<String>,
}

/// Wall time of a rollout split by where it went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WallTime {
    pub model_ms: f64,
    pub tools_ms: f64,
    pub harness_ms: f64,
}

/// One rollout; serialised as one JSON line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub task_id: String,
    pub harness_id: String,
    pub weights_version: u64,
    pub seed: u64,
    pub model_calls: Vec<ModelCall>,
    pub tool_calls: Vec<ToolCall>,
    /// Model and tool calls interleaved in the order they happened: ("model", i) / ("tool", i).
    #[serde(default)]
    pub order: Vec<(String, usize)>,
    pub answer: Option<serde_json::Value>,
    pub reward: f64,
    pub success: bool,
    /// The verifier's reason ("expected 42, got 41"), so traces show why a rollout failed.
    #[serde(default)]
    pub verdict_detail: String,
    pub error: Option<RolloutError>,
    pub turns: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    #[serde(default)]
    pub wall: WallTime,
    #[serde(default)]
    pub log: Vec<String>,
}

impl Trajectory {
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a trajectory always serialises")
    }
    pub fn tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trajectory_is_one_json_line_and_round_trips() {
        let t = Trajectory {
            task_id: "gsm8k-test-1".into(),
            harness_id: "abc".into(),
            weights_version: 3,
            seed: 7,
            model_calls: vec![ModelCall {
                messages: vec![ChatMessage::new("user", "What is 2+2?\nThink.")],
                completion: "4\n".into(),
                prompt_tokens: 9,
                completion_tokens: 2,
                trainable: true,
                finish_reason: "stop".into(),
                latency_ms: 1.0,
                sampled: None,
            }],
            tool_calls: vec![],
            order: vec![("model".into(), 0)],
            answer: Some(serde_json::json!("4")),
            reward: 1.0,
            success: true,
            verdict_detail: "4 equals 4".into(),
            error: None,
            turns: 1,
            prompt_tokens: 9,
            completion_tokens: 2,
            wall: WallTime::default(),
            log: vec![],
        };
        let line = t.to_json_line();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Trajectory>(&line).unwrap(), t);
        assert_eq!(t.tokens(), 11);
    }

    #[test]
    fn model_calls_default_to_trainable() {
        let c: ModelCall =
            serde_json::from_str(r#"{"messages":[],"completion":"x","prompt_tokens":1,"completion_tokens":1}"#)
                .unwrap();
        assert!(c.trainable);
    }
}
