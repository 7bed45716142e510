//! The verdict on a model's text: the answer read from it, compared with the gold answer by
//! mathematical equivalence, and quoted (shortened) in the verdict's detail.

use whale_core::Verdict;
use whale_math_answer::{equivalent, extract_answer, DEFAULT_ORDER};

/// Longest extracted answer quoted in full in a verdict.
const SHOWN_ANSWER_CHARS: usize = 80;

/// The answer read from `prediction` (by [`DEFAULT_ORDER`], else the whole text) and the verdict.
pub(super) fn judge(gold: &str, prediction: &str) -> (String, Verdict) {
    let answer = extract_answer(prediction, &DEFAULT_ORDER).unwrap_or_else(|| prediction.trim().to_string());
    let shown: String = if answer.chars().count() > SHOWN_ANSWER_CHARS {
        answer.chars().take(SHOWN_ANSWER_CHARS).chain("…".chars()).collect()
    } else {
        answer.clone()
    };
    let verdict = if equivalent(&answer, gold) {
        Verdict::pass(format!("correct: {shown}"))
    } else if answer.is_empty() {
        Verdict::fail(format!("expected {gold}, got no answer"))
    } else {
        Verdict::fail(format!("expected {gold}, got {shown}"))
    };
    (shown, verdict)
}
