//! The example harnesses in `docs/harness-api.md` compile, and the two full examples run.

mod common;

use common::{arithmetic_job, run, sum_in, Sequence};
use serde_json::json;
use std::sync::Arc;
use whale_harness::{validate, EpisodeSource, Harness, Limits, RolloutJob};
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};

fn examples() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/harness-api.md");
    let doc = std::fs::read_to_string(path).expect("docs/harness-api.md");
    doc.split("```js\n").skip(1).filter_map(|block| block.split("```").next()).map(str::to_string).collect()
}

/// Works the sum out "step by step" and ends with an `ANSWER:` line; plays `e4` when asked for a move.
struct Explainer;

impl Policy for Explainer {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let prompt = &request.messages.last().map(|m| m.content.clone()).unwrap_or_default();
        let text = match sum_in(prompt) {
            Some(sum) => format!("Adding the two numbers.\nANSWER: {sum}"),
            None => "e4".to_string(),
        };
        Ok(Completion {
            text,
            token_ids: vec![],
            logprobs: vec![],
            finish_reason: FinishReason::Stop,
            prompt_tokens: 10,
            completion_tokens: 5,
        })
    }
    fn name(&self) -> String {
        "explainer".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

#[test]
fn every_example_module_validates() {
    let modules: Vec<String> = examples().into_iter().filter(|code| code.contains("export")).collect();
    assert_eq!(modules.len(), 3, "the opening example and the two full ones");
    for code in &modules {
        let info = validate(code, &Limits::default()).unwrap_or_else(|e| panic!("{e}\n{code}"));
        assert!(info.meta.is_some_and(|meta| meta["name"].is_string()));
    }
}

#[test]
fn the_math_example_answers_and_the_chess_example_plays() {
    let modules: Vec<String> = examples().into_iter().filter(|code| code.contains("export")).collect();
    let math = Arc::new(Harness::new("math-example", modules[1].clone()));
    let t = run(vec![arithmetic_job(&math, "m", json!({}), 20, 22, 1)], Arc::new(Explainer), &Limits::default(), 1)
        .remove(0);
    assert_eq!(t.error, None);
    assert_eq!(t.answer, Some(json!("42")));
    assert!(t.success);

    let chess = Arc::new(Harness::new("chess-example", modules[2].clone()));
    let job = RolloutJob {
        task_id: "c".into(),
        task_view: json!({}),
        episode: EpisodeSource::Ready(Box::new(Sequence::new(&["e4", "e5", "e4"]))),
        seed: 2,
        harness: chess,
        weights_version: 0,
    };
    let t = run(vec![job], Arc::new(Explainer), &Limits::default(), 1).remove(0);
    assert_eq!(t.error, None);
    assert!(t.success, "e4, then e4 again after the reply e5: {:?}", t.log);
    assert_eq!(t.answer, Some(json!(["e4", "e4"])));
    assert_eq!(t.log, ["e4 -> e5; e4 -> "]);
}
