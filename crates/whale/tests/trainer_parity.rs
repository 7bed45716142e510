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

mod common;

use common::parity::{assert_same_run, config, in_process_lora, run, traces, whale_lm_train};

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
