//! Math final answers: finding the answer in a model's reply, and deciding whether two answers
//! are the same number, tuple, interval or text in different spellings.
//!
//! A grader that compared strings would fail `0.5` against `\frac12` and pass 0.333333 for 1/3.
//! So an answer is [extracted](extract_answer) from free text by a configurable order of
//! conventions ([`Extractor`]: `\boxed{}`, "the answer is", `####`, a bare answer, the last
//! number), its LaTeX is normalized into canonical tokens (spacing, `\dfrac`, units, `\text{}`,
//! thousands separators), and two answers are [equivalent] when their structures match, with
//! numbers compared exactly (rationals, square roots, π and i; see `exact.rs`).
//!
//! It is a crate of its own because it is one self-contained piece of text-and-number work that
//! knows nothing of tasks, episodes or verdicts: it depends on no whale crate, and its callers
//! are the math domain's verifier and loader in whale-tasks (which turns a comparison into a
//! `Verdict`) and whale-pretrain's evaluation (which votes over extracted answers).

mod answer;
mod exact;
mod extract;
mod latex;

pub use answer::equivalent;
pub use extract::{extract_answer, last_boxed, Extractor, DEFAULT_ORDER};
pub use latex::is_thousands_grouped;
