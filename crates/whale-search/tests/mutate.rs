//! The mutation proposer on the stock harnesses of every domain, run on real episodes, and on
//! harness code it has no anchor in.

use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use whale_core::{ChatMessage, Domain, ModelCall, Task, Trajectory, WallTime};
use whale_harness::{run_rollouts, EpisodeSource, Harness, Limits, RolloutJob, RunOptions, STOCK_HARNESSES};
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError};
use whale_search::{
    Candidate, CandidateMeta, MutateProposer, Mutation, Proposal, ProposalContext, Proposer, ProposerError,
};
use whale_tasks::{task_domain, Environment};

/// Plays the model for any domain: the first legal move a prompt lists, else a prose answer
/// with a `####` line.
struct Generalist;

impl Policy for Generalist {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let last = request.messages.last().map_or("", |m| m.content.as_str());
        let legal = last.lines().find_map(|line| line.strip_prefix("Legal moves: "));
        let text = match legal.and_then(|moves| moves.split_whitespace().next()) {
            Some(first) => first.to_string(),
            None => "The answer is 5.\n#### 5".to_string(),
        };
        Ok(completion(text))
    }
    fn name(&self) -> String {
        "generalist".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

/// A finished reply of `text` (the token counts are placeholders no test reads).
fn completion(text: String) -> Completion {
    Completion {
        text,
        token_ids: vec![1],
        logprobs: vec![0.0],
        finish_reason: FinishReason::Stop,
        prompt_tokens: 3,
        completion_tokens: 2,
    }
}

fn candidate(source: &str) -> Candidate {
    Candidate {
        meta: CandidateMeta {
            id: "c0007".into(),
            parent: None,
            hypothesis: "stock".into(),
            hash: whale_harness::content_hash(source),
            iteration: 0,
            proposer: "seed".into(),
            rejection: None,
        },
        source: source.to_string(),
    }
}

/// A successful training trajectory whose first call makes a few-shot example.
fn example() -> Trajectory {
    Trajectory {
        task_id: "train-1".into(),
        harness_id: "h".into(),
        weights_version: 0,
        seed: 0,
        model_calls: vec![ModelCall {
            messages: vec![ChatMessage::new("user", "What is 2 + 2?")],
            completion: "2 + 2 = 4.\n#### 4".into(),
            prompt_tokens: 6,
            completion_tokens: 8,
            trainable: true,
            finish_reason: "stop".into(),
            latency_ms: 1.0,
            sampled: None,
        }],
        tool_calls: vec![],
        order: vec![("model".into(), 0)],
        answer: Some(json!("4")),
        reward: 1.0,
        success: true,
        verdict_detail: String::new(),
        error: None,
        turns: 1,
        prompt_tokens: 6,
        completion_tokens: 8,
        wall: WallTime::default(),
        log: vec![],
    }
}

/// [`MutateProposer::mutate`] of an incumbent whose layers all read.
fn mutate(mutation: Mutation, ctx: &ProposalContext<'_>, seed: u64) -> Option<Proposal> {
    MutateProposer::mutate(mutation, ctx, seed).expect("the incumbent's layers read")
}

fn context<'a>(incumbent: &'a Candidate, examples: &'a [Trajectory], limits: &'a Limits) -> ProposalContext<'a> {
    ProposalContext {
        archive: Path::new("."),
        incumbent,
        domain: Domain::Math,
        candidates: 3,
        iteration: 4,
        weights_version: 0,
        seed: 9,
        examples,
        limits,
        prompt_only: false,
        failures: &[],
    }
}

/// What `source`'s rollouts on `tasks` did: per task (in order) the error, and in all the
/// model calls and tool calls made.
struct Outcomes {
    errors: Vec<Option<String>>,
    model_calls: usize,
    tool_calls: usize,
}

fn outcomes(source: &str, domain: Domain, tasks: &[Task], environment: &Environment) -> Outcomes {
    let trajectories = rollouts(source, domain, tasks, environment);
    Outcomes {
        model_calls: trajectories.iter().map(|t| t.model_calls.len()).sum(),
        tool_calls: trajectories.iter().map(|t| t.tool_calls.len()).sum(),
        errors: trajectories.into_iter().map(|t| t.error.map(|e| format!("{:?}: {}", e.kind, e.message))).collect(),
    }
}

/// One rollout of `source` per task, played by [`Generalist`].
fn rollouts(source: &str, domain: Domain, tasks: &[Task], environment: &Environment) -> Vec<Trajectory> {
    rollouts_by(Arc::new(Generalist), source, domain, tasks, environment)
}

fn rollouts_by(
    policy: Arc<dyn Policy>,
    source: &str,
    domain: Domain,
    tasks: &[Task],
    environment: &Environment,
) -> Vec<Trajectory> {
    let harness = Arc::new(Harness::from_source(source));
    let jobs = tasks
        .iter()
        .enumerate()
        .map(|(i, task)| RolloutJob {
            task_id: task.id.clone(),
            task_view: task_domain(domain).public_view(task),
            episode: EpisodeSource::Ready(environment.episode(task).expect("episode")),
            seed: i as u64,
            harness: harness.clone(),
            weights_version: 0,
        })
        .collect();
    let options = RunOptions { threads: 4, progress: false, ..RunOptions::default() };
    run_rollouts(jobs, policy, &Limits::default(), options).expect("run")
}

#[test]
fn every_mutation_of_every_stock_harness_validates_and_runs_as_safely_as_the_original() {
    let limits = Limits::default();
    let examples = [example()];
    let always = [Mutation::AddPhrase, Mutation::ToolStep, Mutation::Vote, Mutation::Retry, Mutation::Format];
    for stock in STOCK_HARNESSES {
        let tasks = task_domain(stock.domain).generate(3, 5, 1);
        let environment = Environment::for_tasks(stock.domain, &tasks).expect("environment");
        let original = outcomes(stock.source, stock.domain, &tasks, &environment);
        let incumbent = candidate(stock.source);
        let ctx = context(&incumbent, &examples, &limits);
        let mut applied = BTreeSet::new();
        for mutation in Mutation::ALL {
            for seed in 0..2 {
                let Some(proposal) = mutate(mutation, &ctx, seed) else { continue };
                applied.insert(format!("{mutation:?}"));
                assert_ne!(proposal.source, stock.source, "{} {mutation:?}", stock.name);
                assert!(proposal.hypothesis.len() > 40, "{} {mutation:?}: {}", stock.name, proposal.hypothesis);
                assert_eq!(proposal.parent.as_deref(), Some("c0007"));
                let mutated = outcomes(&proposal.source, stock.domain, &tasks, &environment);
                for (before, after) in original.errors.iter().zip(&mutated.errors) {
                    if before.is_none() {
                        assert_eq!(after, &None, "{} {mutation:?} seed {seed}:\n{}", stock.name, proposal.source);
                    }
                }
                let calls = |o: &Outcomes| o.model_calls + o.tool_calls;
                match mutation {
                    Mutation::Vote => assert!(mutated.model_calls > original.model_calls, "{} votes", stock.name),
                    Mutation::ToolStep => assert!(calls(&mutated) > calls(&original), "{} consults", stock.name),
                    _ => {}
                }
            }
        }
        for mutation in always.iter().chain(&[Mutation::FewShot, Mutation::Parse]) {
            assert!(applied.contains(&format!("{mutation:?}")), "{}: {mutation:?} did not apply", stock.name);
        }
        assert!(!applied.contains("DropLayer"), "{}: a stock harness has no layer to drop", stock.name);
    }
}

#[test]
fn a_layer_added_by_one_mutation_can_be_dropped_by_another() {
    let limits = Limits::default();
    let stock = STOCK_HARNESSES.iter().find(|s| s.name == "math/calculator").expect("stock");
    let incumbent = candidate(stock.source);
    let voted = mutate(Mutation::Vote, &context(&incumbent, &[], &limits), 1).expect("vote");
    assert!(voted.source.contains("// whale:layer vote-1 begin"));
    let layered = candidate(&voted.source);
    let ctx = context(&layered, &[], &limits);
    assert_eq!(mutate(Mutation::Vote, &ctx, 1), None, "one vote layer is enough");
    let dropped = mutate(Mutation::DropLayer, &ctx, 1).expect("drop");
    assert!(!dropped.source.contains("whale:layer vote"));
    assert!(dropped.hypothesis.starts_with("Ablation: remove the `vote-1` mechanism"), "{}", dropped.hypothesis);
    let stepped = mutate(Mutation::ToolStep, &ctx, 1).expect("tool step");
    let two = candidate(&stepped.source);
    let ctx = context(&two, &[], &limits);
    let removed: Vec<String> =
        (0..8).filter_map(|seed| mutate(Mutation::DropLayer, &ctx, seed)).map(|p| p.hypothesis).collect();
    assert!(removed.iter().any(|h| h.starts_with("Remove the tool step `tool-step-1`")), "{removed:?}");
}

#[test]
fn an_incumbent_with_a_layer_of_an_unknown_kind_is_an_error_naming_the_value() {
    let limits = Limits::default();
    let stock = STOCK_HARNESSES.iter().find(|s| s.name == "math/calculator").expect("stock");
    let voted = mutate(Mutation::Vote, &context(&candidate(stock.source), &[], &limits), 1).expect("vote");
    let renamed = candidate(&voted.source.replace("whale:layer vote-1", "whale:layer consensus-1"));
    let outcome = MutateProposer::default().propose(&context(&renamed, &[], &limits));
    let Err(ProposerError::Incumbent(message)) = outcome else { panic!("{outcome:?}") };
    assert!(message.contains("layer `consensus-1`: field `kind`: unknown value `consensus`"), "{message}");
}

#[test]
fn harness_code_without_anchors_gets_only_the_edits_that_apply() {
    let limits = Limits::default();
    let no_export_anchor = "function solve(task, ctx) {\n  return ctx.llm.chat(\"Answer the question below in a few words.\\n\" + ctx.env.observation).text;\n}\nexport { solve };\n";
    let incumbent = candidate(no_export_anchor);
    let ctx = context(&incumbent, &[], &limits);
    let applicable: Vec<Mutation> =
        Mutation::ALL.into_iter().filter(|&m| (0..4).any(|seed| mutate(m, &ctx, seed).is_some())).collect();
    assert_eq!(applicable, [Mutation::AddPhrase, Mutation::RewriteSentence]);
    let bare = "function solve(task, ctx) { return ctx.llm.chat(ctx.env.observation).text; }\nexport { solve };\n";
    let incumbent = candidate(bare);
    let mut proposer = MutateProposer::default();
    assert_eq!(proposer.propose(&context(&incumbent, &[], &limits)).expect("propose"), vec![]);
}

#[test]
fn proposals_are_deterministic_for_a_seed_distinct_and_valid() {
    let limits = Limits::default();
    let stock = STOCK_HARNESSES.iter().find(|s| s.name == "qa/search").expect("stock");
    let incumbent = candidate(stock.source);
    let ctx = context(&incumbent, &[], &limits);
    let first = MutateProposer::default().propose(&ctx).expect("propose");
    assert_eq!(first, MutateProposer::default().propose(&ctx).expect("propose"));
    assert_eq!(first.len(), 3);
    let hashes: BTreeSet<String> = first.iter().map(|p| whale_harness::content_hash(&p.source)).collect();
    assert_eq!(hashes.len(), 3);
    let later = ProposalContext { iteration: 5, ..ctx };
    assert_ne!(first, MutateProposer::default().propose(&later).expect("propose"));
    for proposal in &first {
        whale_harness::validate(&proposal.source, &limits).expect("valid");
    }
}

/// A failed search rollout whose one reply was cut off at `max_tokens`.
fn rambling_failure() -> Trajectory {
    let mut trajectory = example();
    trajectory.model_calls[0].finish_reason = "length".into();
    trajectory.reward = 0.0;
    trajectory.success = false;
    trajectory
}

#[test]
fn prompt_only_proposals_change_only_prompt_text_and_reflect_on_the_failures() {
    let limits = Limits::default();
    let failures = [rambling_failure(), rambling_failure(), example()];
    let mut proposed = 0;
    for stock in STOCK_HARNESSES {
        let (name, source) = (stock.name, stock.source);
        let incumbent = candidate(source);
        let ctx = ProposalContext { prompt_only: true, failures: &failures, ..context(&incumbent, &[], &limits) };
        for proposal in MutateProposer::default().propose(&ctx).expect("proposals") {
            assert!(
                whale_search::only_prompt_text_differs(source, &proposal.source),
                "{name}: a prompt-only proposal changed code: {}",
                proposal.hypothesis
            );
            if proposal.hypothesis.contains("Prompt rewrite: add") || proposal.hypothesis.contains("with \"") {
                assert!(
                    proposal
                        .hypothesis
                        .starts_with("Reflection on the incumbent's 3 failed search rollouts (2 cut off"),
                    "{name}: {}",
                    proposal.hypothesis
                );
                let answers = ["Answer with the final result only, without explanation.", "Be brief."];
                assert!(answers.iter().any(|a| proposal.source.contains(a)), "{name}: {}", proposal.hypothesis);
            }
            proposed += 1;
        }
    }
    assert!(proposed >= STOCK_HARNESSES.len(), "most stock harnesses have a prompt to rewrite: {proposed}");
}

#[test]
fn a_view_swap_shows_the_legal_moves_in_san_where_the_tool_recorded_both_forms() {
    let limits = Limits::default();
    let stock = STOCK_HARNESSES.iter().find(|s| s.name == "chess/legal-moves").expect("stock");
    let tasks = task_domain(Domain::Chess).generate(6, 3, 1);
    let environment = Environment::for_tasks(Domain::Chess, &tasks).expect("environment");
    let recorded = rollouts(stock.source, Domain::Chess, &tasks, &environment);
    let incumbent = candidate(stock.source);
    let blind = context(&incumbent, &[], &limits);
    assert_eq!(mutate(Mutation::ViewSwap, &blind, 1), None, "no recorded tool result, no forms");
    let ctx = ProposalContext { failures: &recorded, ..context(&incumbent, &[], &limits) };
    let swaps: Vec<_> = (0..6).filter_map(|seed| mutate(Mutation::ViewSwap, &ctx, seed)).collect();
    let shown =
        swaps.iter().find(|p| p.source.contains("Legal moves: ${legal.san.join")).expect("the move list swapped");
    assert!(shown.source.contains("Reply with the best move in SAN."), "{}", shown.source);
    assert!(shown.hypothesis.contains("`san` form instead of the `uci` form"), "{}", shown.hypothesis);
    let played = rollouts(&shown.source, Domain::Chess, &tasks, &environment);
    for (before, after) in recorded.iter().zip(&played) {
        assert_eq!(after.error, None);
        let prompt = &after.model_calls[0].messages.last().expect("a prompt").content;
        let legal = before.tool_calls.iter().find(|c| c.name == "legal_moves").expect("listed");
        let san: Vec<&str> = legal.result["san"].as_array().expect("san").iter().filter_map(|m| m.as_str()).collect();
        assert!(prompt.contains(&format!("Legal moves: {}", san.join(" "))), "{prompt}");
        assert_eq!(after.tool_calls.len(), before.tool_calls.len(), "the same moves are played");
    }
}

#[test]
fn where_no_tool_shows_two_forms_the_proposals_are_those_without_the_view_swap() {
    let limits = Limits::default();
    for name in ["math/calculator", "qa/search"] {
        let stock = STOCK_HARNESSES.iter().find(|s| s.name == name).expect("stock");
        let tasks = task_domain(stock.domain).generate(3, 5, 1);
        let environment = Environment::for_tasks(stock.domain, &tasks).expect("environment");
        let recorded = rollouts(stock.source, stock.domain, &tasks, &environment);
        assert!(stock.domain != Domain::Qa || recorded.iter().any(|t| !t.tool_calls.is_empty()), "qa/search searches");
        let incumbent = candidate(stock.source);
        let ctx = ProposalContext { failures: &recorded, candidates: 8, ..context(&incumbent, &[], &limits) };
        let without: Vec<Mutation> = Mutation::ALL.into_iter().filter(|&m| m != Mutation::ViewSwap).collect();
        let all = MutateProposer::default().propose(&ctx).expect("propose");
        assert_eq!(all, MutateProposer::with_mutations(without).propose(&ctx).expect("propose"), "{name}");
        assert_eq!(all.len(), 8);
    }
}

/// Answers the search protocol with its own queries: the question's last word, then (shown
/// results) `more <that word>`; every other prompt gets a short answer.
struct Searcher;

impl Policy for Searcher {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let protocol = request.messages.first().is_some_and(|m| m.role == "system" && m.content.contains("SEARCH:"));
        let question = request.messages.get(1).map_or("", |m| m.content.as_str());
        let word = question.split_whitespace().last().unwrap_or("").trim_end_matches('?');
        let text = match request.messages.len() {
            2 if protocol => format!("SEARCH: {word}"),
            4 if protocol => format!("SEARCH: more {word}"),
            _ => "Answer: Paris".to_string(),
        };
        Ok(completion(text))
    }
    fn name(&self) -> String {
        "searcher".into()
    }
    fn weights_version(&self) -> u64 {
        0
    }
}

#[test]
fn a_query_rewrite_searches_the_models_queries_first_and_returns_as_many_passages() {
    let limits = Limits::default();
    let stock = STOCK_HARNESSES.iter().find(|s| s.name == "qa/search").expect("stock");
    let tasks = task_domain(Domain::Qa).generate(4, 5, 2);
    let environment = Environment::for_tasks(Domain::Qa, &tasks).expect("environment");
    let recorded = rollouts(stock.source, Domain::Qa, &tasks, &environment);
    let incumbent = candidate(stock.source);
    assert_eq!(mutate(Mutation::Query, &context(&incumbent, &[], &limits), 1), None, "no search seen");
    let ctx = ProposalContext { failures: &recorded, ..context(&incumbent, &[], &limits) };
    let proposals: Vec<_> = (0..8).filter_map(|seed| mutate(Mutation::Query, &ctx, seed)).collect();
    for hops in [1, 2] {
        let proposal = proposals
            .iter()
            .find(|p| p.hypothesis.contains("second hop") == (hops == 2))
            .unwrap_or_else(|| panic!("a proposal with {hops} hop(s)"));
        assert!(proposal.hypothesis.contains("(`search`)"), "{}", proposal.hypothesis);
        let played = rollouts_by(Arc::new(Searcher), &proposal.source, Domain::Qa, &tasks, &environment);
        for (task, (before, after)) in tasks.iter().zip(recorded.iter().zip(&played)) {
            assert_eq!(after.error, None, "{}", proposal.source);
            let question = task.payload["question"].as_str().expect("question");
            let word = question.split_whitespace().last().expect("a word").trim_end_matches('?');
            let searches: Vec<_> = after.tool_calls.iter().filter(|c| c.name == "search").collect();
            let queries: Vec<&str> = searches.iter().filter_map(|c| c.args[0].as_str()).collect();
            let expected: Vec<String> =
                [question.to_string(), word.to_string(), format!("more {word}")][..1 + hops].to_vec();
            assert_eq!(queries, expected, "the harness's search, then the model's");
            assert_eq!(after.model_calls.len(), hops + 1, "one query per hop, then the answer");
            let own = &searches[0].result;
            let first_of_model = &searches[1].result[0]["title"];
            let answer_prompt = &after.model_calls[hops].messages.last().expect("prompt").content;
            let shown: Vec<&str> = answer_prompt.lines().filter(|l| l.starts_with('[')).collect();
            assert_eq!(shown.len(), own.as_array().expect("hits").len(), "as many passages as the harness asked for");
            assert!(shown[0].starts_with(&format!("[{}]", first_of_model.as_str().expect("title"))), "{answer_prompt}");
            assert_eq!(before.tool_calls.iter().filter(|c| c.name == "search").count(), 1);
        }
    }
}

#[test]
fn where_no_tool_searches_or_is_passed_an_integer_the_proposals_are_those_without_those_edits() {
    let limits = Limits::default();
    for name in ["math/calculator", "chess/legal-moves"] {
        let stock = STOCK_HARNESSES.iter().find(|s| s.name == name).expect("stock");
        let tasks = task_domain(stock.domain).generate(3, 5, 1);
        let environment = Environment::for_tasks(stock.domain, &tasks).expect("environment");
        let recorded = rollouts(stock.source, stock.domain, &tasks, &environment);
        assert!(recorded.iter().any(|t| !t.tool_calls.is_empty()), "{name} calls tools");
        let incumbent = candidate(stock.source);
        let ctx = ProposalContext { failures: &recorded, candidates: 8, ..context(&incumbent, &[], &limits) };
        let new = [Mutation::Query, Mutation::ToolArgument];
        let without: Vec<Mutation> = Mutation::ALL.into_iter().filter(|m| !new.contains(m)).collect();
        let all = MutateProposer::default().propose(&ctx).expect("propose");
        assert_eq!(all, MutateProposer::with_mutations(without).propose(&ctx).expect("propose"), "{name}");
        for mutation in new {
            assert_eq!(mutate(mutation, &ctx, 3), None, "{name} {mutation:?}");
        }
    }
}

#[test]
fn a_tool_argument_step_changes_how_many_passages_the_search_returns() {
    let limits = Limits::default();
    let stock = STOCK_HARNESSES.iter().find(|s| s.name == "qa/search").expect("stock");
    let tasks = task_domain(Domain::Qa).generate(4, 5, 2);
    let environment = Environment::for_tasks(Domain::Qa, &tasks).expect("environment");
    let incumbent = candidate(stock.source);
    let ctx = context(&incumbent, &[], &limits);
    let mut ks = BTreeSet::new();
    for seed in 0..8 {
        let proposal = mutate(Mutation::ToolArgument, &ctx, seed).expect("search(question, 3)");
        let played = rollouts(&proposal.source, Domain::Qa, &tasks, &environment);
        for trajectory in &played {
            assert_eq!(trajectory.error, None);
            let search = trajectory.tool_calls.iter().find(|c| c.name == "search").expect("a search");
            let k = search.args[1].as_u64().expect("k");
            assert_eq!(search.result.as_array().expect("hits").len() as u64, k);
            assert!(proposal.hypothesis.starts_with(&format!("Tool argument: pass {k} instead of 3 as argument 2")));
            ks.insert(k);
        }
    }
    assert_eq!(ks, BTreeSet::from([2, 4]));
}
