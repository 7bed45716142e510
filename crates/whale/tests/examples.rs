//! Every tiny-model example config runs for a few steps: its tasks load and split, its initial
//! harness runs, weight steps, a search unit and evaluations complete, and a report is written.

mod common;

use std::path::{Path, PathBuf};
use whale_loop::condition::Condition;
use whale_loop::config::RunConfig;
use whale_loop::experiment::{Experiment, Verbosity};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The example shrunk to a few steps on a tiny random model.
fn shrunk(name: &str, model: &Path) -> RunConfig {
    let mut config = RunConfig::load(&examples().join(format!("{name}.toml"))).expect("the example loads");
    config.model.path = Some(model.to_path_buf());
    config.condition = Condition::Whale;
    config.threads = 8;
    config.tasks.search = 3;
    config.tasks.test = 3;
    config.weights.tasks_per_step = 2;
    config.weights.rollouts_per_task = 2;
    config.weights.reward_threshold = -1.0;
    config.weights.skip_truncated = false;
    config.harness.limits.max_tokens_per_call = 16;
    config.sampling.max_tokens = 16;
    config.search.candidates = 1;
    config.schedule.weight_steps = 2;
    config.schedule.search_iterations = 2;
    config.schedule.budget = 20;
    config.eval.k = 1;
    config
}

fn run_example(name: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_in(dir.path());
    let config = shrunk(name, &model);
    let root = dir.path().join("runs").join(name);
    let mut experiment = Experiment::create(config, &root, Verbosity::default()).expect("the run starts");
    let outcome = experiment.run().expect("the run finishes");
    whale_study::report::write_run_report(&outcome.dir).expect("the run's report");
    let state = experiment.state();
    assert!(state.finished);
    assert_eq!(state.weight_steps, 4, "{name}: two weight phases of two steps");
    assert!(state.outcomes.len() > 4, "{name}: a search unit ran between them");
    assert!(outcome.evals.len() >= 3, "{name}: start, boundaries and end evaluated");
    assert!(outcome.evals.iter().all(|e| e.scores.tasks == 3 && e.scores.k == 1));
    assert!(root.join("report.html").is_file());
}

#[test]
fn the_math_example_runs() {
    run_example("math");
}

#[test]
fn the_chess_example_runs() {
    run_example("chess");
}

#[test]
fn the_qa_example_runs() {
    run_example("qa");
}

#[test]
fn the_smollm2_qa_testbed_runs() {
    run_example("qa-smollm2");
}

#[test]
fn the_qwen2_5_math_testbed_runs() {
    run_example("math-qwen2.5");
}

/// Runs the shrunk example `name`, an LLM proposer's testbed, with the proposer's model served by
/// the run itself (the tiny model, in `dir`, no retries) after `adjust`, until its server
/// refuses (every recorded session's server stopped by then): the stopped run, its directory and
/// its error.
fn run_until_the_proposer_refuses(
    name: &str,
    dir: &Path,
    adjust: impl FnOnce(&mut RunConfig),
) -> (Experiment, PathBuf, String) {
    let model = common::tiny_model_in(dir);
    let mut config = shrunk(name, &model);
    assert_eq!(config.search.proposer, whale_loop::config::ProposerKind::Agent);
    config.search.agent.local_model = Some(model.clone());
    config.search.agent.max_retries = 0;
    adjust(&mut config);
    let root = dir.join("runs").join(name);
    let mut experiment = Experiment::create(config, &root, Verbosity::default()).expect("the run starts");
    let Err(error) = experiment.run() else { panic!("the proposer's server refused, yet the run finished") };
    assert_the_proposers_servers_stopped(&root);
    (experiment, root, error.to_string())
}

/// Each recorded session's server is gone once its proposal is over: the proposer's model is
/// served for a proposal only, not beside the run's weight steps and evaluations.
fn assert_the_proposers_servers_stopped(root: &Path) {
    let sessions: Vec<_> = std::fs::read_dir(root.join("archive/sessions")).expect("sessions").collect();
    assert!(!sessions.is_empty(), "a session recorded");
    for session in sessions {
        let text = std::fs::read_to_string(session.expect("a session").path()).expect("read");
        let session: serde_json::Value = serde_json::from_str(&text).expect("a session");
        let url = session["base_url"].as_str().expect("the session's server");
        let address = url.trim_start_matches("http://").split('/').next().expect("host:port");
        assert!(std::net::TcpStream::connect(address).is_err(), "{url} still answers after its proposal");
    }
}

/// The math testbed with the one-shot LLM proposer, its proposer's model served by the run
/// itself: here the tiny model, whose 2,048-token context cannot hold the proposer's prompt (the
/// harness, its score and failed rollouts in the tiny tokenizer's many tokens). A refusal of the
/// proposer's server is infrastructure: the run stops naming it, having scored nothing for it.
#[test]
fn the_qwen2_5_math_testbed_with_the_one_shot_proposer_serves_it_and_stops_on_its_refusal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (experiment, _, error) = run_until_the_proposer_refuses("math-qwen2.5-one-shot", dir.path(), |config| {
        assert!(config.search.agent.one_shot);
    });
    assert!(error.contains("one-shot") && error.contains("context window"), "{error}");
    assert!(!experiment.state().finished);
}

/// The agent-proposer testbed, its proposer's model served by the run itself: here the tiny
/// model, whose ChatML template has no tools part, so the session's first request is refused
/// (400). A proposer whose server refuses is infrastructure, not a search that found nothing: the
/// run stops with the server's reason, the session recorded, and the server gone with the run.
#[test]
fn the_agent_proposer_testbed_serves_its_own_proposer_and_stops_on_its_refusal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (experiment, root, error) = run_until_the_proposer_refuses("qa-smollm2-agent", dir.path(), |config| {
        config.search.agent.model = Some("proposer".to_string());
    });
    assert!(error.contains("no tools part") && error.contains("agent"), "{error}");
    let sessions: Vec<_> = std::fs::read_dir(root.join("archive/sessions")).expect("sessions").flatten().collect();
    let session = std::fs::read_to_string(sessions[0].path()).expect("a session");
    assert!(session.contains("no tools part") && session.contains("\"model\": \"proposer\""), "{session}");
    let url = session.split("\"base_url\": \"").nth(1).and_then(|rest| rest.split('"').next()).expect("its url");
    drop(experiment);
    let gone = reqwest::blocking::get(format!("{url}/models"));
    assert!(gone.is_err(), "the proposer's server stops with the run");
}
