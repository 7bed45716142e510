//! An external trainer gives the same run as whale's own: a tiny WHALE run (weight steps and a
//! search phase) whose weight steps run `whale lm train --lora-rank ... --resume-adapter
//! {previous} --keep-order` as their `[weights.trainer]` records exactly what the same run
//! trained in-process with `[weights.lora]` of the same settings records.
//!
//! Why equality is exact: the command trains the same examples (samples.jsonl re-tokenized with
//! the same tokenizer and chat template, the end-of-turn token only after replies that ended
//! their turn) in the same mini-batches (the file is written in whale's training order and
//! `--keep-order` keeps it), from the same adapter (initial matrices drawn from the same seed,
//! then the previous step's matrices and AdamW state, saved as f32 and read back bit for bit),
//! with the same optimizer settings; and rollouts before the first update see the base model
//! either way, since a fresh adapter's B matrices are zero. A control run whose trainer uses
//! another learning rate shows the comparison is sensitive to the training.
//!
//! The same holds for a policy gradient (RLOO): the samples carry each rollout's advantage
//! and sampled tokens, and both trainers learn against the log-probabilities the step's
//! starting weights give those tokens.

mod common;

use common::parity::{assert_same_run, config, in_process_lora, policy_gradient_config, run, traces, whale_lm_train};
use std::collections::BTreeMap;

#[test]
fn an_external_lora_trainer_ends_where_the_in_process_one_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let own = run(dir.path(), "own", &config(&model, &in_process_lora()));
    let external = run(dir.path(), "external", &config(&model, &whale_lm_train("0.002")));
    assert_same_run(&own, &external);
    let control = run(dir.path(), "control", &config(&model, &whale_lm_train("0.004")));
    assert_ne!(traces(&own), traces(&control), "a trainer with another learning rate samples other completions");
}

#[test]
fn an_external_rloo_trainer_ends_where_the_in_process_one_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let own = run(dir.path(), "own", &policy_gradient_config(&model, "rloo", &in_process_lora()));
    let external = run(dir.path(), "external", &policy_gradient_config(&model, "rloo", &whale_lm_train("0.002")));
    assert_same_run(&own, &external);
    let mut groups: BTreeMap<(String, u64), BTreeMap<u64, f64>> = BTreeMap::new();
    for step in std::fs::read_dir(external.join("weights")).expect("steps").map(|e| e.expect("entry").path()) {
        let samples = std::fs::read_to_string(step.join("samples.jsonl")).unwrap_or_default();
        for line in samples.lines() {
            let sample: serde_json::Value = serde_json::from_str(line).expect("a sample");
            let tokens = sample["completion_token_ids"].as_array().expect("token ids").len();
            assert_eq!(sample["behaviour_logprobs"].as_array().expect("log-probabilities").len(), tokens);
            let group = (step.display().to_string(), sample["group"].as_u64().expect("group"));
            let advantage = sample["advantage"].as_f64().expect("advantage");
            groups.entry(group).or_default().insert(sample["rollout"].as_u64().expect("rollout"), advantage);
        }
    }
    assert!(!groups.is_empty(), "some step had a task whose rollouts differed");
    for (group, advantages) in &groups {
        let sum: f64 = advantages.values().sum();
        assert!(sum.abs() < 1e-9, "{group:?}: RLOO advantages {advantages:?} sum to {sum}");
    }
}
