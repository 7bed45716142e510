//! The agentic proposer against a scripted OpenAI-compatible server on 127.0.0.1: its tools
//! read the archive, refuse every way out of it, check and write candidates, and its whole
//! session is kept in the archive.

mod common;

use common::{tasks, SumEvaluator, PARSED, PARSED_SMALL, PLAIN};
use serde_json::{json, Value};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use whale_core::Domain;
use whale_search::{
    AgentConfig, AgentProposer, Archive, CandidateResult, HarnessSearch, SearchConfig, SearchError, SummaryEvent,
};

/// One request the server received: its headers (lower-cased names) and JSON body.
#[derive(Debug, Clone)]
struct Received {
    headers: Vec<(String, String)>,
    body: Value,
}

/// Serves `replies` in order (status, JSON body), one per connection, and records requests.
fn serve(replies: Vec<(u16, Value)>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("address"));
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = received.clone();
    std::thread::spawn(move || {
        for (status, reply) in replies {
            let Ok((stream, _)) = listener.accept() else { return };
            let mut reader = BufReader::new(stream);
            let mut headers = Vec::new();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line.trim() != "" {
                if let Some((name, value)) = line.split_once(':') {
                    headers.push((name.trim().to_lowercase(), value.trim().to_string()));
                }
                line.clear();
            }
            let length = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok());
            let mut body = vec![0; length.unwrap_or(0)];
            reader.read_exact(&mut body).expect("body");
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            log.lock().expect("log").push(Received { headers, body });
            let text = reply.to_string();
            let mut stream = reader.into_inner();
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                text.len()
            );
            stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(text.as_bytes())).expect("reply");
        }
    });
    (url, received)
}

fn calls(calls: &[(&str, &str, Value)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}))
        .collect();
    json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": calls}, "finish_reason": "tool_calls"}],
           "usage": {"prompt_tokens": 100, "completion_tokens": 20}})
}

fn tool_reply(request: &Received, id: &str) -> String {
    let messages = request.body["messages"].as_array().expect("messages");
    let reply = messages.iter().find(|m| m["role"] == "tool" && m["tool_call_id"] == id).expect("a reply");
    reply["content"].as_str().expect("text").to_string()
}

fn config(url: &str) -> AgentConfig {
    AgentConfig {
        base_url: Some(url.to_string()),
        model: Some("proposer-model".into()),
        api_key: Some("sk-test".into()),
        max_turns: 5,
        timeout_s: 20,
        ..AgentConfig::default()
    }
}

fn agent(url: &str) -> Box<AgentProposer> {
    Box::new(AgentProposer::new(config(url)).expect("agent"))
}

#[test]
fn the_agent_reads_the_archive_is_confined_to_it_and_writes_candidates() {
    let outside = tempfile::tempdir().expect("tempdir");
    fs::write(outside.path().join("secret.txt"), "the-secret-content-42").expect("secret");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(PLAIN, "start").expect("seed");
    std::os::unix::fs::symlink(outside.path(), dir.path().join("door")).expect("symlink");
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), dir.path().join("leak.txt")).expect("symlink");

    let first = calls(&[
        ("c1", "list_dir", json!({"path": "."})),
        ("c2", "read_file", json!({"path": "candidates/c0000/harness.js"})),
        ("c3", "read_file", json!({"path": "candidates/../../secret.txt"})),
        ("c4", "read_file", json!({"path": outside.path().join("secret.txt")})),
        ("c5", "read_file", json!({"path": "door/secret.txt"})),
        ("c6", "read_file", json!({"path": "leak.txt"})),
        ("c7", "grep", json!({"pattern": "secret-content"})),
        ("c8", "grep", json!({"pattern": "CTX.LLM.CHAT", "path": "candidates"})),
        ("c9", "list_dir", json!({"path": "door"})),
    ]);
    let second = calls(&[
        ("d1", "check_candidate", json!({"source": "export function solve( {"})),
        ("d2", "write_candidate", json!({"source": PARSED, "hypothesis": "parse the last number of the reply"})),
        ("d3", "nonsense_tool", json!({})),
    ]);
    let last = json!({"choices": [{"message": {"role": "assistant", "content": "Done."}}],
                      "usage": {"prompt_tokens": 300, "completion_tokens": 5}});
    let (url, received) = serve(vec![(200, first), (200, second), (200, last)]);

    let config = SearchConfig { candidates: 2, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(archive, Domain::Math, tasks(6), agent(&url), config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    assert_eq!(report.proposer_error, None);
    assert_eq!(report.candidates.len(), 1);
    assert!(matches!(report.candidates[0].result, CandidateResult::Scored { .. }));
    assert_eq!(report.candidates[0].hypothesis, "parse the last number of the reply");
    assert!(report.accepted.is_some());
    assert_eq!((report.proposer_tokens.requests, report.proposer_tokens.prompt_tokens), (3, 500));
    assert_eq!(report.proposer_tokens.completion_tokens, 45);

    let requests = received.lock().expect("log").clone();
    assert_eq!(requests.len(), 3);
    let auth = requests[0].headers.iter().find(|(n, _)| n == "authorization").map(|(_, v)| v.as_str());
    assert_eq!(auth, Some("Bearer sk-test"));
    assert_eq!(requests[0].body["model"], "proposer-model");
    assert_eq!(requests[0].body["tools"].as_array().map(Vec::len), Some(5));
    let system = requests[0].body["messages"][0]["content"].as_str().expect("system");
    assert!(system.contains("One mechanism per candidate") && system.contains("No constant-only tuning"));
    assert!(system.contains("Nothing specific to a dataset's items") && system.contains("ctx.llm.chat"));
    let task = requests[0].body["messages"][1]["content"].as_str().expect("task");
    assert!(task.contains("candidates/c0000/harness.js") && task.contains("Write 2 candidate(s)"));

    let replies = &requests[1];
    let listing = tool_reply(replies, "c1");
    assert!(listing.contains("candidates/") && listing.contains("summary.jsonl") && listing.contains("door (link)"));
    assert!(tool_reply(replies, "c2").contains("You add numbers."));
    assert!(tool_reply(replies, "c3").contains("climbs out with `..`"));
    assert!(tool_reply(replies, "c4").contains("is absolute"));
    assert!(tool_reply(replies, "c5").contains("leads outside the directory"));
    assert!(tool_reply(replies, "c6").contains("leads outside the directory"));
    assert_eq!(tool_reply(replies, "c7"), "no match");
    assert!(tool_reply(replies, "c8").contains("candidates/c0000/harness.js:"));
    assert!(tool_reply(replies, "c9").contains("leads outside the directory"));
    for request in &requests {
        assert!(!request.body.to_string().contains("the-secret-content-42"), "the secret never left its directory");
    }
    let replies = &requests[2];
    assert!(tool_reply(replies, "d1").starts_with("invalid: the harness does not compile"));
    assert!(tool_reply(replies, "d2").starts_with("candidate 1 of 2 recorded; valid"));
    assert!(tool_reply(replies, "d3").contains("unknown tool `nonsense_tool`"));

    let session: Value =
        serde_json::from_str(&fs::read_to_string(dir.path().join("sessions/1.json")).expect("session")).expect("json");
    assert_eq!(session["turns"], 3);
    assert_eq!(session["usage"]["prompt_tokens"], 500);
    assert_eq!(session["candidates"][0], "parse the last number of the reply");
    let messages = session["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2 + 1 + 9 + 1 + 3 + 1, "system, task, every turn and every tool reply");
    assert_eq!(messages.last().expect("last")["content"], "Done.");
}

#[test]
fn a_compact_session_shows_the_incumbent_and_its_failures_inline_and_keeps_tool_replies_short() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(PARSED_SMALL, "start").expect("seed");
    let start = archive.incumbent().expect("incumbent").meta.hash.clone();
    let read =
        calls(&[("c1", "read_file", json!({"path": "harness-api.md"})), ("c2", "grep", json!({"pattern": "e"}))]);
    let write = calls(&[("d1", "write_candidate", json!({"source": PARSED, "hypothesis": "parse the last number"}))]);
    let (url, received) = serve(vec![(200, read), (200, write)]);
    let compact = AgentConfig { compact: true, ..config(&url) };
    let proposer = Box::new(AgentProposer::new(compact).expect("agent"));
    let config = SearchConfig { candidates: 1, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(archive, Domain::Math, tasks(6), proposer, config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    assert_eq!((report.proposer_error, report.candidates.len()), (None, 1));

    let requests = received.lock().expect("log").clone();
    let system = requests[0].body["messages"][0]["content"].as_str().expect("system");
    let task = requests[0].body["messages"][1]["content"].as_str().expect("task");
    assert!(system.contains("One mechanism per candidate") && system.contains("ctx.llm.chat"), "{system}");
    assert!(system.contains("at most 16 model calls"), "the run's limits: {system}");
    assert!(
        system.len() < include_str!("../../../docs/harness-api.md").len() / 3,
        "the API in brief: {} characters",
        system.len()
    );
    assert!(task.contains("return task.a === 0 && numbers"), "the incumbent's source inline: {task}");
    assert!(task.contains("% of the 6 search tasks"), "its score: {task}");
    let failed = search.archive().scores(&start, 1);
    let failed = failed.expect("scores").expect("recorded").tasks.iter().filter(|t| !t.success).count();
    assert!(failed > 0, "the harness fails every sum whose first addend is not 0");
    assert!(task.contains(&format!("of its {failed} failed rollouts")) && task.contains("its reply:"), "{task}");
    let read_file = requests[0].body["tools"][1]["function"]["description"].as_str().expect("description");
    assert!(read_file.contains("3000 characters"), "{read_file}");
    let api = tool_reply(&requests[1], "c1");
    assert!(api.len() < 3_200 && api.contains("more characters; read from offset 3000"), "{} characters", api.len());
    let grep = tool_reply(&requests[1], "c2");
    assert!(grep.lines().count() <= 21 && grep.ends_with("more matches"), "{grep}");
}

#[test]
fn a_malformed_tool_call_is_the_proposers_output_not_an_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(PLAIN, "start").expect("seed");
    let broken = json!({"choices": [{"message": {"role": "assistant", "content": null,
        "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}}]});
    let (url, _) = serve(vec![(200, broken)]);
    let mut search =
        HarnessSearch::new(archive, Domain::Math, tasks(4), agent(&url), SearchConfig::default()).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("a poor reply does not stop the run");
    let error = report.proposer_error.expect("recorded");
    assert!(error.contains("unusable reply") && error.contains("lacks an id"), "{error}");
    assert!(report.candidates.is_empty() && report.accepted.is_none());
    assert_eq!(search.archive().next_iteration(), 2, "the iteration is concluded");
}

#[test]
fn a_failing_server_is_recorded_and_stops_the_search() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(PLAIN, "start").expect("seed");
    let look = calls(&[("c1", "list_dir", json!({}))]);
    let (url, _) = serve(vec![(200, look), (400, json!({"error": {"message": "maximum context length exceeded"}}))]);
    let mut search =
        HarnessSearch::new(archive, Domain::Math, tasks(4), agent(&url), SearchConfig::default()).expect("search");
    let evaluator = SumEvaluator::new(1);
    let error = search.iterate(&evaluator).expect_err("a refused request stops the search");
    let SearchError::Proposer { iteration: 1, error, .. } = &error else { panic!("{error}") };
    assert!(error.contains("HTTP 400") && error.contains("maximum context length"), "{error}");
    assert!(search.archive().events().iter().any(|e| matches!(e, SummaryEvent::ProposerFailed { .. })));
    assert_eq!(search.archive().next_iteration(), 1, "no iteration concluded without its candidates");
    let session = fs::read_to_string(dir.path().join("sessions/1.json")).expect("session kept");
    assert!(session.contains("HTTP 400") && session.contains("list_dir"));
}

fn said(content: &str) -> Value {
    json!({"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 200, "completion_tokens": 50}})
}

#[test]
fn a_one_shot_session_asks_once_per_candidate_without_tools_and_reads_each_reply_or_says_why_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(PARSED_SMALL, "start").expect("seed");
    let as_asked = said(&format!("Hypothesis: parse the last number of the reply\n```js\n{PARSED}\n```"));
    let garbage = said("I would make the harness better by thinking harder.");
    let as_json = said(&format!(
        "```json\n{}\n```",
        json!({"source": PARSED.replace("max_tokens: 32", "max_tokens: 48"), "hypothesis": "a longer reply"})
    ));
    let (url, received) = serve(vec![(200, as_asked), (200, garbage), (200, as_json)]);
    let one_shot = AgentConfig { one_shot: true, ..config(&url) };
    let proposer = Box::new(AgentProposer::new(one_shot).expect("proposer"));
    let config = SearchConfig { candidates: 3, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(archive, Domain::Math, tasks(6), proposer, config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    assert_eq!(report.proposer_error, None);
    let hypotheses: Vec<&str> = report.candidates.iter().map(|c| c.hypothesis.as_str()).collect();
    assert_eq!(hypotheses, ["parse the last number of the reply", "a longer reply"]);
    assert!(report.candidates.iter().all(|c| matches!(c.result, CandidateResult::Scored { .. })));
    let proposers: Vec<&str> = search.archive().candidates().map(|c| c.meta.proposer.as_str()).collect();
    assert_eq!(proposers, ["seed", "one-shot", "one-shot"]);
    assert_eq!((report.proposer_tokens.requests, report.proposer_tokens.prompt_tokens), (3, 600));
    assert!(report.proposer_seconds > 0.0, "the proposer's wall time is measured");

    let requests = received.lock().expect("log").clone();
    assert_eq!(requests.len(), 3, "one request per candidate");
    let tasks: Vec<&str> = requests.iter().map(|r| r.body["messages"][1]["content"].as_str().expect("task")).collect();
    for request in &requests {
        assert!(request.body.get("tools").is_none() && request.body.get("tool_choice").is_none());
        assert_eq!(request.body["max_tokens"], 2048, "a bounded reply by default");
        assert_eq!(request.body["messages"].as_array().map(Vec::len), Some(2));
    }
    let system = requests[0].body["messages"][0]["content"].as_str().expect("system");
    assert!(system.contains("Hypothesis: <what you changed") && system.contains("ctx.llm.chat"), "{system}");
    assert!(tasks[0].contains("return task.a === 0 && numbers") && tasks[0].contains("```js code block"));
    let first_failure = |task: &str| task.lines().find(|l| l.starts_with("task sum-")).map(str::to_string);
    assert_ne!(first_failure(tasks[0]), first_failure(tasks[1]), "each request shows other failures");

    let session: Value =
        serde_json::from_str(&fs::read_to_string(dir.path().join("sessions/1.json")).expect("session")).expect("json");
    let outcomes: Vec<&str> = session["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .map(|r| r["outcome"].as_str().expect("outcome"))
        .collect();
    assert_eq!(outcomes, ["candidate 1", "no candidate: the reply has no code block", "candidate 2"]);
    assert_eq!(session["turns"], 3);
}

/// PLAIN with its answer taken by a helper: a one-shot reply may rewrite the helper alone.
const WITH_HELPER: &str = r#"const INSTRUCTION = "You add numbers. Reply with the sum.";

function pick(text) {
  return text.trim();
}

export function solve(task, ctx) {
  const reply = ctx.llm.chat([{ role: "system", content: INSTRUCTION }, { role: "user", content: ctx.env.observation }]);
  return pick(reply.text);
}
"#;

#[test]
fn a_one_shot_reply_of_one_function_is_merged_into_its_parent_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(WITH_HELPER, "start").expect("seed");
    let fragment = "function pick(text) {\n  const numbers = text.match(/-?\\d+/g);\n  return numbers ? numbers[numbers.length - 1] : undefined;\n}";
    let (url, _) = serve(vec![(200, said(&format!("Hypothesis: submit the last number\n```js\n{fragment}\n```")))]);
    let proposer = Box::new(AgentProposer::new(AgentConfig { one_shot: true, ..config(&url) }).expect("proposer"));
    let config = SearchConfig { candidates: 1, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(archive, Domain::Math, tasks(4), proposer, config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("iterate");
    assert_eq!(report.candidates[0].hypothesis, "submit the last number [merged into c0000: the reply lacked solve]");
    assert!(
        matches!(report.candidates[0].result, CandidateResult::Scored { objectives, .. } if objectives.success == 1.0)
    );
    let accepted = report.accepted.expect("the merged harness wins");
    let source = &search.archive().candidate(&accepted.id).expect("archived").source;
    assert!(
        source.contains("const INSTRUCTION")
            && source.contains("export function solve")
            && source.contains("text.match")
    );
    let session = fs::read_to_string(dir.path().join("sessions/1.json")).expect("session");
    assert!(session.contains("candidate 1 [merged into c0000"), "{session}");
}

#[test]
fn one_shot_replies_without_a_harness_are_the_proposers_output_not_an_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(PLAIN, "start").expect("seed");
    let (url, _) = serve(vec![(200, said("No.")), (200, said("```js\n```"))]);
    let proposer = Box::new(AgentProposer::new(AgentConfig { one_shot: true, ..config(&url) }).expect("proposer"));
    let config = SearchConfig { candidates: 2, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(archive, Domain::Math, tasks(4), proposer, config).expect("search");
    let report = search.iterate(&SumEvaluator::new(1)).expect("a poor reply does not stop the run");
    let error = report.proposer_error.expect("recorded");
    assert!(error.contains("no reply held a harness") && error.contains("code block is empty"), "{error}");
    assert!(report.candidates.is_empty());
    assert_eq!(search.archive().next_iteration(), 2, "the iteration is concluded");
    let session = fs::read_to_string(dir.path().join("sessions/1.json")).expect("session kept");
    assert!(session.contains("no candidate: the reply has no code block") && session.contains("\"No.\""), "{session}");
}

#[test]
fn a_one_shot_server_failure_stops_the_search_and_the_session_keeps_the_harness_already_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archive = Archive::open(dir.path()).expect("archive");
    archive.seed(PLAIN, "start").expect("seed");
    let first = said(&format!("Hypothesis: parse the last number\n```js\n{PARSED}\n```"));
    let (url, _) = serve(vec![(200, first), (400, json!({"error": {"message": "maximum context length exceeded"}}))]);
    let proposer = Box::new(AgentProposer::new(AgentConfig { one_shot: true, ..config(&url) }).expect("proposer"));
    let config = SearchConfig { candidates: 2, ..SearchConfig::default() };
    let mut search = HarnessSearch::new(archive, Domain::Math, tasks(4), proposer, config).expect("search");
    let error = search.iterate(&SumEvaluator::new(1)).expect_err("a refused request stops the search");
    let SearchError::Proposer { iteration: 1, error, .. } = &error else { panic!("{error}") };
    assert!(error.contains("HTTP 400") && error.contains("maximum context length"), "{error}");
    assert_eq!(search.archive().next_iteration(), 1, "no iteration concluded without its candidates");
    let session: Value =
        serde_json::from_str(&fs::read_to_string(dir.path().join("sessions/1.json")).expect("session")).expect("json");
    assert_eq!(session["candidates"][0], "parse the last number");
    assert!(session["error"].as_str().expect("the error").contains("HTTP 400"), "{session}");
}
