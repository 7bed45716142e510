//! A served run whose server dies: the run stops with an error naming the unit that could not
//! run, nothing it recorded counts a failed call as a rollout, and once the server is back the
//! resumed run ends exactly where a run that was never interrupted ends.
//!
//! The server dies (a proxy in front of `whale serve` drops every connection) after a given
//! number of chat requests, chosen to fall in the start's test evaluation, in the first weight
//! step and in the search phase. The request counts of each unit are fixed by the config
//! (3 test tasks x k 2, 2 tasks x 2 rollouts a step, one model call per rollout of the plain
//! harness), whatever order the threads send them in. The same holds when the server itself
//! is stopped with SIGTERM in the middle of a run (its graceful stop: requests in flight
//! answered, new connections refused) and a new one is started on its port.

mod common;

use common::parity::{assert_same_run, config, in_process_lora, run, start, whale_lm_train};
use common::serve::{Outage, Serve};
use whale_loop::experiment::{Experiment, ExperimentError, Verbosity};

/// Which unit a failed run stopped in.
fn unit(error: &ExperimentError) -> &'static str {
    match error {
        ExperimentError::Evaluate(_) => "evaluation",
        ExperimentError::WeightPhase(_) | ExperimentError::Trainer { .. } => "weight step",
        ExperimentError::Search(_) | ExperimentError::SearchPhase(_) => "search",
        _ => "other",
    }
}

#[test]
fn a_run_whose_server_dies_stops_and_resumed_ends_as_if_never_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let own = run(dir.path(), "own", &config(&model, &in_process_lora()));
    let serve = Serve::for_runs_in(dir.path(), &model, "base");
    let outage = Outage::start(&serve.base_url);
    let server = format!(
        "[server]\nbase_url = \"{}\"\nmodel = \"base\"\nkind = \"whale\"\nmax_retries = 1\n\
         backoff_initial_ms = 1\nbackoff_max_ms = 10\n",
        outage.base_url
    );
    let text = config(&model, &format!("{server}{}", whale_lm_train("0.002")));
    let mut stopped = Vec::new();
    for (name, chat_requests) in [("in-eval", 3), ("in-weights", 8), ("in-search", 22)] {
        outage.die_after(chat_requests);
        let error = start(dir.path(), name, &text).expect_err("the server died");
        let message = error.to_string();
        assert!(message.contains("did not run"), "{name}: {message}");
        assert!(message.contains("gave up after 2 attempt(s)"), "{name}: {message}");
        stopped.push(unit(&error));
        let runs = dir.path().join("runs").join(name);
        let state = common::read_json(&runs.join("state.json"));
        assert_eq!(state["finished"], false, "{name}: {state}");
        outage.recover();
        Experiment::resume(&runs, Verbosity::default()).and_then(|mut e| e.run()).expect("the resumed run ends");
        assert_same_run(&own, &runs);
    }
    assert_eq!(stopped, ["evaluation", "weight step", "search"]);
}

#[test]
fn a_run_whose_server_is_stopped_by_sigterm_stops_and_resumed_ends_as_if_never_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let own = run(dir.path(), "own", &config(&model, &in_process_lora()));
    let mut serve = Serve::for_runs_in(dir.path(), &model, "base");
    let port = serve.port();
    let server = format!(
        "[server]\nbase_url = \"{}\"\nmodel = \"base\"\nkind = \"whale\"\nmax_retries = 1\n\
         backoff_initial_ms = 1\nbackoff_max_ms = 10\n",
        serve.base_url
    );
    let text = config(&model, &format!("{server}{}", whale_lm_train("0.002")));
    let runs = dir.path().join("runs").join("stopped");
    let metrics = runs.join("metrics.jsonl");
    let stopper = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !std::fs::read_to_string(&metrics).is_ok_and(|rows| rows.contains("\"weight_step\"")) {
            assert!(std::time::Instant::now() < deadline, "no weight step in two minutes");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        serve.terminate()
    });
    let error = start(dir.path(), "stopped", &text).expect_err("the server stopped after the first weight step");
    let status = stopper.join().expect("the stopper");
    assert!(status.success(), "whale serve exits 0 on SIGTERM: {status}");
    assert_eq!(unit(&error), "weight step", "{error}");
    assert_eq!(common::read_json(&runs.join("state.json"))["finished"], false);
    let _back = Serve::for_runs_in_on(dir.path(), &model, "base", port);
    Experiment::resume(&runs, Verbosity::default()).and_then(|mut e| e.run()).expect("the resumed run ends");
    assert_same_run(&own, &runs);
}
