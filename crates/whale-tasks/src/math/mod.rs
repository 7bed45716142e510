//! The math domain: exact-answer problems (GSM8K, MATH, generated word problems).
//!
//! A task's payload is `{"question", "answer" (gold, as given), "source": "gsm8k" | "math500" |
//! "math" | "plain" | "generated", and optionally "solution", "difficulty", "subject",
//! "level"}`. The harness sees the question and may call a `calculator(expression)` tool; the
//! episode ends with one submitted text, from which the final answer is extracted and compared
//! with the gold answer by mathematical equivalence rather than string equality, so that a
//! correct answer in another spelling (`0.5` for `\frac12`) earns its reward. Reading and
//! comparing answers is the whale-math-answer crate's; this folder turns it into a [`Verdict`].
//!
//! Accepted record forms ([`load`], [`parse_record`]):
//! - GSM8K `{question, answer}` whose answer ends in `#### x` (thousands separators removed);
//! - MATH-500 `{problem, solution, answer, subject, level, unique_id}`;
//! - MATH `{problem, solution, [type], [level]}`: the answer is the last `\boxed{}` of the solution;
//! - plain `{question, answer}` with a string or number answer;
//! - native `{id, domain: "math", payload, [split]}`, as written by [`write_native`].

mod calculator;
mod domain;
mod episode;
mod generator;
mod judge;
mod loader;

pub use calculator::{
    calculate, CalcError, CalcValue, MAX_EXPONENT, MAX_EXPRESSION_CHARS, MAX_NESTING, MAX_RESULT_BITS,
};
pub use domain::MathDomain;
pub use episode::MathEpisode;
pub use generator::{MAX_DIFFICULTY, MIN_DIFFICULTY};
pub use loader::{load, parse_record, write_native};

use judge::judge;
use serde_json::{json, Value};
use whale_core::{Domain, Task, Verdict};

/// The values of the payload's `source` field.
pub const SOURCES: [&str; 5] = ["gsm8k", "math500", "math", "plain", "generated"];

/// A task that cannot be played as a math episode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("task `{id}` belongs to the {domain} domain, not math")]
    WrongDomain { id: String, domain: Domain },
    #[error("task `{id}`: payload field `{field}` is missing")]
    MissingField { id: String, field: &'static str },
    #[error("task `{id}`: payload field `{field}` is not a string")]
    NotAString { id: String, field: &'static str },
}

/// `n` generated word problems at `difficulty` (clamped to 1..=5), reproducible from `seed`;
/// task `i` has id `gen-math-d<difficulty>-<seed>-<i>` and does not depend on `n`.
pub fn generate(n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
    let difficulty = difficulty.clamp(MIN_DIFFICULTY, MAX_DIFFICULTY);
    (0..n as u64)
        .map(|index| {
            let problem = generator::problem(seed, index, difficulty);
            let payload = json!({
                "question": problem.question,
                "answer": problem.answer().to_string(),
                "source": "generated",
                "solution": problem.solution(),
                "difficulty": difficulty,
                "subject": format!("arithmetic/{}", problem.template),
            });
            Task { id: format!("gen-math-d{difficulty}-{seed}-{index}"), domain: Domain::Math, payload, split: None }
        })
        .collect()
}

/// The actions that solve the task: submitting the gold answer.
pub fn gold_actions(task: &Task) -> Vec<String> {
    payload_text(task, "answer").map(|gold| vec![gold.to_string()]).unwrap_or_default()
}

/// The payload without the gold answer and the worked solution.
pub fn public_view(task: &Task) -> Value {
    let mut view = task.payload.clone();
    if let Value::Object(fields) = &mut view {
        fields.remove("answer");
        fields.remove("solution");
    }
    view
}

/// A fresh episode of the task.
pub fn episode(task: &Task) -> Result<MathEpisode, TaskError> {
    if task.domain != Domain::Math {
        return Err(TaskError::WrongDomain { id: task.id.clone(), domain: task.domain });
    }
    let question = payload_text(task, "question")?;
    let gold = payload_text(task, "answer")?;
    Ok(MathEpisode::new(question, gold))
}

/// Judges a model's text (or a bare answer) against the task's gold answer.
pub fn score(task: &Task, prediction: &str) -> Verdict {
    match payload_text(task, "answer") {
        Ok(gold) => judge(gold, prediction).1,
        Err(e) => Verdict::fail(format!("cannot score: {e}")),
    }
}

fn payload_text<'a>(task: &'a Task, field: &'static str) -> Result<&'a str, TaskError> {
    match task.payload.get(field) {
        Some(Value::String(text)) => Ok(text),
        Some(_) => Err(TaskError::NotAString { id: task.id.clone(), field }),
        None => Err(TaskError::MissingField { id: task.id.clone(), field }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(answer: &str) -> Task {
        Task {
            id: "t".into(),
            domain: Domain::Math,
            payload: json!({"question": "q?", "answer": answer, "source": "plain", "solution": "s"}),
            split: None,
        }
    }

    #[test]
    fn score_reads_model_text() {
        let task = plain("18");
        assert!(score(&task, "She makes 9 * 2 = 18 dollars.\n#### 18").success);
        assert!(score(&task, r"So the total is $\boxed{18}$.").success);
        assert!(score(&task, "18").success);
        assert_eq!(score(&task, "17").detail, "expected 18, got 17");
        assert_eq!(score(&task, "   ").detail, "expected 18, got no answer");
        assert_eq!(score(&plain("Evelyn"), "Evelyn").detail, "correct: Evelyn");
    }

    #[test]
    fn bare_fraction_is_not_read_as_its_last_number() {
        assert!(!score(&plain("2"), r"\frac{1}{2}").success);
        assert!(score(&plain("0.5"), r"\frac{1}{2}").success);
    }

    #[test]
    fn public_view_hides_gold() {
        let view = public_view(&plain("18"));
        assert_eq!(view, json!({"question": "q?", "source": "plain"}));
        assert_eq!(gold_actions(&plain("18")), vec!["18".to_string()]);
    }

    #[test]
    fn episodes_need_a_math_task_with_text_fields() {
        let mut task = plain("1");
        task.payload["answer"] = json!(1);
        assert_eq!(episode(&task).err(), Some(TaskError::NotAString { id: "t".into(), field: "answer" }));
        task.payload.as_object_mut().map(|p| p.remove("answer"));
        assert_eq!(episode(&task).err(), Some(TaskError::MissingField { id: "t".into(), field: "answer" }));
        task.domain = Domain::Chess;
        assert!(matches!(episode(&task), Err(TaskError::WrongDomain { .. })));
        assert!(gold_actions(&task).is_empty());
    }
}
