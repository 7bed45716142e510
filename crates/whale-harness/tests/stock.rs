//! The stock harnesses do what their descriptions claim: scripted policies play the model's
//! part on real episodes of each domain, and the trajectories show the tool loops, votes,
//! retries and searches the harnesses are built around.

use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use whale_core::{Domain, Task, Trajectory};
use whale_harness::{run_rollouts, stock_harness, EpisodeSource, Limits, RolloutJob, RunOptions};
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};
use whale_tasks::qa::QaPayload;
use whale_tasks::{task_domain, Environment};

/// Replies with `script(request, call_index)`, and keeps every request.
struct Scripted<F> {
    script: F,
    requests: Mutex<Vec<ChatRequest>>,
}

impl<F: Fn(&ChatRequest, usize) -> String + Send + Sync> Scripted<F> {
    fn new(script: F) -> Arc<Self> {
        Arc::new(Self { script, requests: Mutex::new(Vec::new()) })
    }

    fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().expect("requests").clone()
    }
}

impl<F: Fn(&ChatRequest, usize) -> String + Send + Sync> Policy for Scripted<F> {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let mut requests = self.requests.lock().expect("requests");
        let text = (self.script)(&request, requests.len());
        requests.push(request);
        Ok(Completion {
            text,
            token_ids: vec![1],
            logprobs: vec![0.0],
            finish_reason: FinishReason::Stop,
            prompt_tokens: 1,
            completion_tokens: 1,
        })
    }
    fn name(&self) -> String {
        "scripted".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

fn rollout(name: &str, task: &Task, policy: Arc<dyn Policy>) -> Trajectory {
    let stock = stock_harness(name).expect("a stock harness");
    let environment = Environment::for_tasks(stock.domain, std::slice::from_ref(task)).expect("an environment");
    let job = RolloutJob {
        task_id: task.id.clone(),
        task_view: task_domain(stock.domain).public_view(task),
        episode: EpisodeSource::Ready(environment.episode(task).expect("an episode")),
        seed: 3,
        harness: Arc::new(stock.harness()),
        weights_version: 0,
    };
    let options = RunOptions { threads: 1, progress: false, ..RunOptions::default() };
    let trajectory = run_rollouts(vec![job], policy, &Limits::default(), options).expect("a run").remove(0);
    assert_eq!(trajectory.error, None, "{name}: {:?}", trajectory.log);
    trajectory
}

fn last_message(request: &ChatRequest) -> &str {
    request.messages.last().map_or("", |m| m.content.as_str())
}

fn math_task(question: &str, answer: &str) -> Task {
    Task {
        id: "m".into(),
        domain: Domain::Math,
        payload: json!({"question": question, "answer": answer, "source": "plain"}),
        split: None,
    }
}

fn tools<'a>(trajectory: &'a Trajectory, name: &str) -> Vec<&'a whale_core::ToolCall> {
    trajectory.tool_calls.iter().filter(|c| c.name == name).collect()
}

#[test]
fn math_calculator_runs_each_calc_line_through_the_tool_and_reads_the_final_answer() {
    let task = math_task("Ann has 6 bags of 7 apples. How many apples does she have?", "42");
    let policy = Scripted::new(|request: &ChatRequest, _| match last_message(request).strip_prefix("RESULT: ") {
        Some(value) => format!("#### {value}"),
        None => "Apples in the bags: CALC: 6 * 7".to_string(),
    });
    let t = rollout("math/calculator", &task, policy.clone());
    assert!(t.success, "{}", t.verdict_detail);
    let calls = tools(&t, "calculator");
    assert_eq!((calls.len(), &calls[0].args, &calls[0].result), (1, &json!(["6 * 7"]), &json!("42")));
    let requests = policy.requests();
    assert_eq!(requests[0].messages[0].role, "system");
    assert!(requests[0].messages[0].content.contains("`CALC: <expression>`"));
    assert_eq!(last_message(&requests[1]), "RESULT: 42");
    assert_eq!(requests[1].messages[2].content, "Apples in the bags: CALC: 6 * 7");
}

#[test]
fn math_calculator_submits_the_last_result_when_the_model_never_answers() {
    let task = math_task("What is 2 times 21?", "42");
    let policy =
        Scripted::new(|_: &ChatRequest, i| if i % 2 == 0 { "CALC: 2 x 21" } else { "CALC: 2 * 21" }.to_string());
    let t = rollout("math/calculator", &task, policy);
    assert!(t.success, "{}", t.verdict_detail);
    assert_eq!(t.turns, 8, "the loop stops after its turn budget");
    let refused = tools(&t, "calculator").into_iter().filter(|c| c.error.is_some()).count();
    assert_eq!(refused, 4, "`2 x 21` is refused by the calculator and answered RESULT: error");
    assert!(t.model_calls[1].messages.iter().any(|m| m.content == "RESULT: error"));
}

#[test]
fn math_vote_submits_the_most_common_answer_however_it_is_written() {
    let task = math_task("What is 6 times 7?", "42");
    let replies = ["#### 41", "So the answer is 42.", "6 * 7 = 42\n#### 42", "\\boxed{40}", "no idea"];
    let policy = Scripted::new(move |_: &ChatRequest, i| replies[i].to_string());
    let t = rollout("math/vote", &task, policy);
    assert_eq!((t.turns, t.answer.clone()), (5, Some(json!("42"))));
    assert!(t.success);
}

#[test]
fn math_verify_submits_the_first_answer_the_check_confirms_and_does_not_train_on_checks() {
    let task = math_task("What is 6 times 7?", "42");
    let policy = Scripted::new(|request: &ChatRequest, i| {
        let last = last_message(request);
        match last.split("Proposed answer: ").nth(1) {
            Some(rest) => if rest.starts_with("42\n") { "yes" } else { "no" }.to_string(),
            None => if i == 0 { "#### 41" } else { "#### 42" }.to_string(),
        }
    });
    let t = rollout("math/verify", &task, policy);
    assert!(t.success);
    assert_eq!(t.turns, 4);
    let trainable: Vec<bool> = t.model_calls.iter().map(|c| c.trainable).collect();
    assert_eq!(trainable, [true, false, true, false]);
}

fn mate_in(moves: u32) -> Task {
    task_domain(Domain::Chess).generate(1, 21, moves).remove(0)
}

#[test]
fn chess_legal_moves_retries_an_illegal_reply_once_with_the_legal_moves_in_the_prompt() {
    let task = mate_in(1);
    let gold = task_domain(Domain::Chess).gold_actions(&task);
    let policy = Scripted::new(move |_: &ChatRequest, i| if i == 0 { "Qz9!".to_string() } else { gold[0].clone() });
    let t = rollout("chess/legal-moves", &task, policy.clone());
    assert!(t.success, "{}", t.verdict_detail);
    let requests = policy.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].messages, requests[1].messages, "the retry asks the same question again");
    let prompt = last_message(&requests[0]);
    assert!(prompt.starts_with("Chess puzzle: ") && prompt.contains("to move and mate in 1."), "{prompt}");
    assert!(prompt.contains("Legal moves: ") && prompt.contains(&task_domain(Domain::Chess).gold_actions(&task)[0]));
}

#[test]
fn chess_legal_moves_never_plays_an_illegal_move_whatever_the_model_says() {
    let task = mate_in(2);
    let t = rollout("chess/legal-moves", &task, Scripted::new(|_: &ChatRequest, _| "resign".to_string()));
    let plays = tools(&t, "env.play");
    assert!(!plays.is_empty());
    assert!(plays.iter().all(|p| p.result["invalid"] == json!(false)), "{plays:?}");
    assert_eq!(t.turns, 2 * plays.len(), "one retry per move, then a legal move at random");
}

#[test]
fn chess_board_plays_the_whole_line_in_one_dialogue() {
    let task = mate_in(2);
    let gold = task_domain(Domain::Chess).gold_actions(&task);
    let policy = Scripted::new(move |request: &ChatRequest, _| {
        let turn = request.messages.iter().filter(|m| m.role == "user").count() - 1;
        format!("Best move: {}", gold[turn])
    });
    let t = rollout("chess/board", &task, policy.clone());
    assert!(t.success, "{}", t.verdict_detail);
    let requests = policy.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].messages.len(), 3, "the second move continues the first one's dialogue");
    assert!(requests[0].messages[0].content.ends_with("Find the strongest move."));
    assert!(requests[0].messages[0].content.contains(" to move; the last move was "));
}

#[test]
fn chess_vote_plays_the_move_most_samples_agree_on() {
    let task = mate_in(1);
    let gold = task_domain(Domain::Chess).gold_actions(&task)[0].clone();
    let legal: Value = Environment::for_tasks(Domain::Chess, &[])
        .and_then(|e| e.episode(&task))
        .map(|mut e| e.call_tool("legal_moves", &[]).expect("legal moves"))
        .expect("an episode");
    let other = legal["uci"].as_array().and_then(|m| m.iter().find(|m| **m != json!(gold))).cloned();
    let other = other.and_then(|m| m.as_str().map(String::from)).expect("another legal move");
    let policy = Scripted::new(move |_: &ChatRequest, i| if i == 0 { other.clone() } else { gold.clone() });
    let t = rollout("chess/vote", &task, policy);
    assert!(t.success, "{}", t.verdict_detail);
    assert_eq!(t.turns, 3);
}

fn qa_task(difficulty: u32) -> (Task, QaPayload) {
    let task = task_domain(Domain::Qa).generate(1, 17, difficulty).remove(0);
    let payload = QaPayload::from_task(&task).expect("a QA payload");
    (task, payload)
}

#[test]
fn qa_search_answers_from_the_passages_of_the_question_and_cleans_the_answer() {
    let (task, payload) = qa_task(1);
    let answer = payload.answers[0].clone();
    let policy = Scripted::new(move |_: &ChatRequest, _| format!("Answer: {answer}.\nextra"));
    let t = rollout("qa/search", &task, policy.clone());
    assert!(t.success, "{}", t.verdict_detail);
    assert_eq!(t.answer, Some(json!(payload.answers[0])));
    assert_eq!(tools(&t, "search")[0].args, json!([payload.question, 3]));
    let prompt = last_message(&policy.requests()[0]).to_string();
    assert!(prompt.starts_with("Answer the question using the passages.\n["), "{prompt}");
    assert!(prompt.contains(&format!("[{}] ", payload.supporting_titles[0])), "{prompt}");
}

#[test]
fn qa_rewrite_searches_the_query_the_model_writes() {
    let (task, payload) = qa_task(1);
    let (title, answer) = (payload.supporting_titles[0].clone(), payload.answers[0].clone());
    let policy = Scripted::new(move |request: &ChatRequest, _| {
        if last_message(request).starts_with("RESULTS:") {
            answer.clone()
        } else {
            format!("SEARCH: {title}")
        }
    });
    let t = rollout("qa/rewrite", &task, policy);
    assert!(t.success, "{}", t.verdict_detail);
    let searches = tools(&t, "search");
    assert_eq!(searches.len(), 1);
    assert_eq!(searches[0].args, json!([payload.supporting_titles[0], 2]));
    assert_eq!(searches[0].result[0]["title"], json!(payload.supporting_titles[0]));
}

#[test]
fn qa_two_hop_searches_the_question_then_the_bridge_entity() {
    let (task, payload) = qa_task(3);
    assert_eq!(payload.supporting_titles.len(), 2);
    let (bridge, answer) = (payload.supporting_titles[1].clone(), payload.answers[0].clone());
    let policy = Scripted::new(move |request: &ChatRequest, _| {
        let searched = request.messages.iter().filter(|m| m.content.starts_with("RESULTS:")).count();
        if searched == 1 {
            format!("SEARCH: {bridge}")
        } else {
            answer.clone()
        }
    });
    let t = rollout("qa/two-hop", &task, policy);
    assert!(t.success, "{}", t.verdict_detail);
    let searches = tools(&t, "search");
    assert_eq!(searches.len(), 2);
    assert_eq!(searches[0].args, json!([payload.question, 2]));
    assert_eq!(searches[1].args, json!([payload.supporting_titles[1], 4]));
    assert_eq!(t.turns, 2);
}
