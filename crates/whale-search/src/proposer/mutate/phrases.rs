//! The phrase bank of prompt rewrites: instructions known to change how chat models answer,
//! each with the reason it might help. No phrase holds a quote, backslash, backtick or `$`,
//! so one can be spliced into any JavaScript string or template literal as it is.

use whale_core::Trajectory;

/// One instruction, why adding it could help, and the kind of failure it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Phrase {
    pub text: &'static str,
    pub why: &'static str,
    pub remedy: Failure,
}

/// How a rollout failed, as a reflection on its trace sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Failure {
    /// A model reply was cut off at `max_tokens`.
    Rambling,
    /// The rollout ended without an answer the verifier could judge.
    NoAnswer,
    /// An answer was judged, and it was wrong.
    Wrong,
}

impl Failure {
    /// The kind of a failed rollout.
    pub fn of(trajectory: &Trajectory) -> Self {
        if trajectory.model_calls.iter().any(|call| call.finish_reason == "length") {
            Failure::Rambling
        } else if trajectory.error.is_some() || trajectory.answer.is_none() {
            Failure::NoAnswer
        } else {
            Failure::Wrong
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Failure::Rambling => "cut off at max_tokens",
            Failure::NoAnswer => "without an answer the verifier could judge",
            Failure::Wrong => "answered wrongly",
        }
    }
}

pub(crate) const PHRASES: [Phrase; 10] = [
    Phrase {
        text: "Think step by step, then give the final answer on the last line.",
        why: "reasoning written out before the answer gets multi-step problems right more often",
        remedy: Failure::Wrong,
    },
    Phrase {
        text: "Check your result once before you give the final answer.",
        why: "a single self-check catches slips in arithmetic or reading",
        remedy: Failure::Wrong,
    },
    Phrase {
        text: "Answer with the final result only, without explanation.",
        why: "a bare answer is cheaper to generate and simpler to parse; success holds if the reasoning was not needed",
        remedy: Failure::Rambling,
    },
    Phrase {
        text: "First restate in one sentence what is being asked.",
        why: "restating the question keeps the reply on what is actually asked",
        remedy: Failure::Wrong,
    },
    Phrase {
        text: "Rely on the information the tools return rather than on memory.",
        why: "answers grounded in tool output are less often hallucinated",
        remedy: Failure::Wrong,
    },
    Phrase {
        text: "Write the final answer after ANSWER: on the last line.",
        why: "a fixed marker makes the answer easy to find for the parser",
        remedy: Failure::NoAnswer,
    },
    Phrase {
        text: "Be brief.",
        why: "shorter replies cost fewer tokens and stop before rambling",
        remedy: Failure::Rambling,
    },
    Phrase {
        text: "Accuracy matters more than speed; work carefully.",
        why: "an explicit accuracy goal makes the model less hasty",
        remedy: Failure::Wrong,
    },
    Phrase {
        text: "If the question is ambiguous, pick the most likely reading and answer it.",
        why: "the model commits to an answer instead of asking back or refusing",
        remedy: Failure::NoAnswer,
    },
    Phrase {
        text: "Consider two approaches and keep the answer you are more sure of.",
        why: "comparing two lines of attack catches a wrong first idea",
        remedy: Failure::Wrong,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phrase_splices_into_any_literal() {
        for phrase in PHRASES {
            assert!(!phrase.text.contains(['"', '\'', '`', '\\', '$', '\n']), "{}", phrase.text);
            assert!(!phrase.why.is_empty());
        }
    }
}
