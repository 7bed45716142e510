//! Whether a candidate harness copies a search task's own text. A harness must work on unseen
//! tasks (rule 4 of the search), and a small proposer model breaks that rule: shown a failed
//! rollout, it may write that task's question into the harness, which then answers that one
//! search task and no other, and one success on a small search set can carry it past the
//! acceptance rule. So a candidate that adds any string of a search task's payload at least
//! [`MIN_COPIED_CHARS`] long (case, layout and a literal's escapes aside) to its parent is
//! rejected before it costs a rollout. Text the parent already held is the testbed's own (a
//! stock harness's worked examples may come from the split the search tasks are drawn from), and
//! shorter strings (an answer such as "1932") occur in honest harnesses: both are left alone, and
//! so is a copy split across several literals.

use whale_core::Task;

/// The shortest payload string whose presence in a harness counts as a copy.
pub const MIN_COPIED_CHARS: usize = 24;

/// A search task's string found in a harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedText {
    pub task_id: String,
    pub text: String,
}

/// The first string of `tasks`' payloads, [`MIN_COPIED_CHARS`] or longer, that `source` holds
/// and `parent` does not.
pub fn copied_task_text(source: &str, parent: &str, tasks: &[Task]) -> Option<CopiedText> {
    let haystack = normalized(&unescaped(source));
    let inherited = normalized(&unescaped(parent));
    tasks.iter().find_map(|task| {
        let mut strings = Vec::new();
        payload_strings(&task.payload, &mut strings);
        strings.into_iter().find_map(|text| {
            let needle = normalized(text);
            let added = haystack.contains(&needle) && !inherited.contains(&needle);
            (needle.chars().count() >= MIN_COPIED_CHARS && added)
                .then(|| CopiedText { task_id: task.id.clone(), text: text.to_string() })
        })
    })
}

fn payload_strings<'a>(value: &'a serde_json::Value, out: &mut Vec<&'a str>) {
    match value {
        serde_json::Value::String(text) => out.push(text),
        serde_json::Value::Array(items) => items.iter().for_each(|item| payload_strings(item, out)),
        serde_json::Value::Object(fields) => fields.values().for_each(|field| payload_strings(field, out)),
        _ => {}
    }
}

/// `source` with the escapes a string literal writes a question with undone.
fn unescaped(source: &str) -> String {
    source.replace("\\n", "\n").replace("\\t", "\t").replace("\\\"", "\"").replace("\\'", "'").replace("\\`", "`")
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
    fn short_strings_and_nested_fields_are_told_apart() {
        let tasks = [task(
            "t",
            json!({"answers": ["1969"], "context": [{"title": "A", "text": "The bridge opened in the spring of 1932."}]}),
        )];
        assert_eq!(copied_task_text("return \"1969\";", "", &tasks), None, "an answer alone is no copy");
        let copied =
            copied_task_text("// the bridge opened in the spring of 1932.", "", &tasks).expect("a nested passage");
        assert_eq!(copied.text, "The bridge opened in the spring of 1932.");
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
