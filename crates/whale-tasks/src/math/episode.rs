//! A math episode: one question, a calculator, one submission.
//!
//! The episode is deliberately single-shot — the submitted text is the answer — so that the
//! reward measures the whole harness+model pipeline, while the calculator lets a harness trade
//! model calls for exact arithmetic.

use super::calculator::calculate;
use super::judge::judge;
use crate::episode::{Episode, StepOutcome, ToolError, ToolSpec};
use serde_json::{json, Value};
use whale_core::Verdict;

const CALCULATOR: &str = "calculator";

/// An episode of one math task (see [`super::episode`]).
#[derive(Debug, Clone)]
pub struct MathEpisode {
    question: String,
    gold: String,
    verdict: Option<Verdict>,
}

impl MathEpisode {
    pub(crate) fn new(question: &str, gold: &str) -> Self {
        MathEpisode { question: question.to_string(), gold: gold.to_string(), verdict: None }
    }
}

impl Episode for MathEpisode {
    fn observation(&self) -> String {
        self.question.clone()
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: CALCULATOR.into(),
            description: "Evaluates an arithmetic expression exactly: numbers, + - * / ^ (integer powers) and \
                          parentheses. Returns an integer, or a fraction a/b with its decimal value."
                .into(),
            args: vec!["expression".into()],
        }]
    }

    fn call_tool(&mut self, name: &str, args: &[Value]) -> Result<Value, ToolError> {
        if name != CALCULATOR {
            return Err(ToolError::Unknown(name.to_string()));
        }
        if self.is_done() {
            return Err(ToolError::Failed { tool: name.into(), reason: "the episode is over".into() });
        }
        let [Value::String(expression)] = args else {
            let reason = format!("expected one string (the expression), got {}", Value::from(args.to_vec()));
            return Err(ToolError::BadArgs { tool: name.into(), reason });
        };
        calculate(expression)
            .map(|value| json!(value.to_string()))
            .map_err(|e| ToolError::Failed { tool: name.into(), reason: e.to_string() })
    }

    /// Submits the final answer; an empty submission is refused and does not end the episode.
    fn act(&mut self, action: &str) -> StepOutcome {
        if let Some(verdict) = &self.verdict {
            let reply = "the episode is over: an answer was already submitted".into();
            return StepOutcome { reply, invalid: true, done: true, solved: verdict.success };
        }
        if action.trim().is_empty() {
            let reply = "empty submission: submit the final answer".into();
            return StepOutcome { reply, invalid: true, done: false, solved: false };
        }
        let (answer, verdict) = judge(&self.gold, action);
        let solved = verdict.success;
        self.verdict = Some(verdict);
        StepOutcome { reply: format!("submitted: {answer}"), invalid: false, done: true, solved }
    }

    fn is_done(&self) -> bool {
        self.verdict.is_some()
    }

    fn verdict(&self) -> Verdict {
        self.verdict.clone().unwrap_or_else(|| Verdict::fail("no answer submitted"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calculator_tool_and_single_submission() {
        let mut episode = MathEpisode::new("What is 9 * 2?", "18");
        assert_eq!(episode.observation(), "What is 9 * 2?");
        assert_eq!(episode.tools()[0].args, vec!["expression".to_string()]);
        assert_eq!(episode.call_tool("calculator", &[json!("9 * 2")]), Ok(json!("18")));
        assert_eq!(episode.call_tool("calculator", &[json!("1/8")]), Ok(json!("1/8 ≈ 0.125")));
        let refused = episode.call_tool("calculator", &[json!("9 x 2")]);
        assert!(matches!(refused, Err(ToolError::Failed { reason, .. }) if reason.contains("position 2")));
        assert!(matches!(episode.call_tool("calculator", &[json!(9)]), Err(ToolError::BadArgs { .. })));
        assert!(matches!(episode.call_tool("calculator", &[]), Err(ToolError::BadArgs { .. })));
        assert_eq!(episode.call_tool("search", &[json!("x")]), Err(ToolError::Unknown("search".into())));

        assert!(!episode.verdict().success);
        let empty = episode.act("  ");
        assert!(empty.invalid && !empty.done && !episode.is_done());
        let outcome = episode.act("I think it is 17");
        assert_eq!((outcome.done, outcome.solved, outcome.invalid), (true, false, false));
        assert_eq!(outcome.reply, "submitted: 17");
        assert_eq!(episode.verdict().detail, "expected 18, got 17");
        assert_eq!(episode.verdict().reward, 0.0);
        let again = episode.act("18");
        assert!(again.invalid && again.done && !again.solved);
        assert!(episode.call_tool("calculator", &[json!("1+1")]).is_err());
    }

    #[test]
    fn correct_submission_solves() {
        let mut episode = MathEpisode::new("q", r"\frac{1}{2}");
        let outcome = episode.act(r"The answer is $\dfrac12$.");
        assert!(outcome.solved && outcome.done);
        assert_eq!(episode.verdict().reward, 1.0);
    }
}
