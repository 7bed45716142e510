//! `whale serve` over a Qwen3.5 checkpoint: the server's replies are the in-process engine's.

mod common;

use common::{local, remote, request, start, write_qwen35_model};
use whale_policy::Policy;
use whale_serve::ServeConfig;

#[test]
fn a_served_qwen3_5_model_answers_as_the_in_process_engine_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_qwen35_model(dir.path(), 4);
    let server = start(dir.path(), ServeConfig::default());
    let client = remote(&server, "base", 0);
    let engine = local(dir.path());
    for (question, temperature, seed) in [("Kalo has 3 apples.", 0.0, 0), ("Who wrote it?", 1.0, 9)] {
        let served = client.chat(request(question, temperature, seed, 16)).expect("the server answers");
        let direct = engine.chat(request(question, temperature, seed, 16)).expect("the engine answers");
        assert_eq!(served.token_ids, direct.token_ids, "{question}");
        assert_eq!(served.text, direct.text);
        assert!(!served.token_ids.is_empty());
    }
}
