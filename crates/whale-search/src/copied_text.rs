//! Whether a candidate harness copies a search task's question. A harness must work on unseen
//! tasks (rule 4 of the search), and a small proposer model breaks that rule: shown a failed
//! rollout, it may write that task's question into the harness, which then answers that one
//! search task and no other, and one success on a small search set can carry it past the
//! acceptance rule. So a candidate that adds a search task's `question` (at least
//! [`MIN_COPIED_CHARS`] long; case, layout and a string literal's escapes aside) to its parent
//! is rejected before it costs a rollout. Only questions are looked for: passages recur across
//! tasks and a retrieval corpus, and a few-shot example of a training task may rightly quote
//! one. Text the parent already held is the testbed's own (a stock harness's worked examples may
//! come from the split the search tasks are drawn from). Left alone: shorter questions, copied
//! answers, a question split across several literals, and chess positions (a payload holds the
//! position before the puzzle's setup move, not the one the model is shown).

use whale_core::Task;

/// The shortest question whose presence in a harness counts as a copy.
pub const MIN_COPIED_CHARS: usize = 24;

/// A search task's question found in a harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedText {
    pub task_id: String,
    pub text: String,
}

/// The first of `tasks`' questions, [`MIN_COPIED_CHARS`] or longer, that `source` holds and
/// `parent` does not.
pub fn copied_task_text(source: &str, parent: &str, tasks: &[Task]) -> Option<CopiedText> {
    let haystack = normalized(&unescaped(source));
    let inherited = normalized(&unescaped(parent));
    tasks.iter().find_map(|task| {
        let question = task.payload.get("question")?.as_str()?;
        let needle = normalized(question);
        (needle.chars().count() >= MIN_COPIED_CHARS && haystack.contains(&needle) && !inherited.contains(&needle))
            .then(|| CopiedText { task_id: task.id.clone(), text: question.to_string() })
    })
}

/// `source` with a string literal's escapes undone, in one pass (`\\frac` is `\frac`).
fn unescaped(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n' | 'r' | 't') => out.push(' '),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// Lower case, every run of whitespace one space, trimmed.
fn normalized(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use whale_core::Domain;

    fn task(id: &str, payload: serde_json::Value) -> Task {
        Task { id: id.into(), domain: Domain::Qa, payload, split: None }
    }

    #[test]
    fn a_question_written_into_a_literal_is_found_whatever_its_case_layout_and_escapes() {
        let tasks = [
            task("t1", json!({"question": "Who wrote the  letters of Ada Quill?", "answers": ["Ben Holt"]})),
            task("t2", json!({"question": "In what year was Volbe Krynthethzol born?", "answers": ["1969"]})),
        ];
        let source = "const q = \"in what year was\\nVolbe Krynthethzol born?\";\nexport function solve() {}";
        let copied = copied_task_text(source, "", &tasks).expect("the second task's question");
        assert_eq!(copied.task_id, "t2");
        assert_eq!(copied.text, "In what year was Volbe Krynthethzol born?");
    }

    #[test]
    fn only_questions_of_their_length_count_and_latex_escapes_are_read() {
        let passage = "The bridge opened in the spring of 1932.";
        let tasks = [
            task("t", json!({"question": "Who?", "answers": ["1969"], "context": [{"title": "A", "text": passage}]})),
            task("m", json!({"question": "Compute $\\frac{3}{4} + \\frac{1}{4}$ and simplify."})),
        ];
        assert_eq!(
            copied_task_text(&format!("// {passage}\nreturn \"1969\";"), "", &tasks),
            None,
            "a passage, an answer"
        );
        let latex = r#"const Q = "Compute $\\frac{3}{4} + \\frac{1}{4}$ and simplify.";"#;
        let copied = copied_task_text(latex, "", &tasks).expect("a LaTeX question written in a JS string");
        assert_eq!(copied.task_id, "m");
    }

    #[test]
    fn text_the_parent_already_held_is_not_a_copy() {
        let tasks = [task("t", json!({"question": "Natalia sold clips to 48 of her friends in April."}))];
        let parent = "const EXAMPLE = \"Natalia sold clips to 48 of her friends in April.\";";
        let child = format!("{parent}\nconst MORE = 1;");
        assert_eq!(copied_task_text(&child, parent, &tasks), None, "a worked example the testbed's harness holds");
        assert!(copied_task_text(&child, "const MORE = 1;", &tasks).is_some(), "the same text added by the candidate");
    }
}
