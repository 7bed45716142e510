//! The registry: the one match from a [`Domain`] to its [`TaskDomain`].
//!
//! [`task_domain`] is the only match over all domains in this crate, so that a new domain is
//! its folder, its impl and one line there, and the compiler names the rest. A caller that holds
//! only the identifier reaches every operation through it, `task_domain(domain).generate(..)`,
//! so each operation has one name, [`TaskDomain`]'s. [`Environment::for_tasks`] builds a
//! domain's environment with its defaults, and [`replay_gold`] plays each task's gold actions.

use crate::{chess, math, qa, CorpusSource, Environment, EnvironmentError, Episode, TaskDomain};
use whale_core::{Domain, Task, Verdict};

/// The domain registered under `domain`: the one match over all domains.
pub fn task_domain(domain: Domain) -> &'static dyn TaskDomain {
    match domain {
        Domain::Math => &math::MathDomain,
        Domain::Chess => &chess::ChessDomain,
        Domain::Qa => &qa::QaDomain,
    }
}

impl Environment {
    /// The environment with the domain's default settings; a domain that searches a corpus
    /// searches an in-memory index of the tasks' own passages.
    pub fn for_tasks(domain: Domain, tasks: &[Task]) -> Result<Self, EnvironmentError> {
        task_domain(domain).environment(tasks, CorpusSource::default())
    }
}

/// Replays each task's gold answer through a fresh episode of its domain and returns the
/// verdicts in order. QA episodes search an in-memory index of the tasks' own contexts.
pub fn replay_gold(domain: Domain, tasks: &[Task]) -> Result<Vec<Verdict>, GoldReplayError> {
    let environment = Environment::for_tasks(domain, tasks).map_err(|e| GoldReplayError::Index(e.to_string()))?;
    Ok(tasks
        .iter()
        .map(|task| match environment.episode(task) {
            Ok(mut episode) => play(episode.as_mut(), &task_domain(domain).gold_actions(task)),
            Err(e) => Verdict::fail(format!("cannot start an episode: {e}")),
        })
        .collect())
}

fn play(episode: &mut dyn Episode, actions: &[String]) -> Verdict {
    for a in actions {
        if episode.is_done() {
            break;
        }
        episode.act(a);
    }
    episode.verdict()
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GoldReplayError {
    #[error("cannot index the QA contexts: {0}")]
    Index(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qa::QaCorpus;
    use serde_json::json;

    fn solve_with_gold(environment: &Environment, task: &Task) -> Verdict {
        let mut episode = environment.episode(task).expect("an episode");
        play(episode.as_mut(), &task_domain(task.domain).gold_actions(task))
    }

    #[test]
    fn the_registry_returns_each_domain_under_its_own_name() {
        for domain in Domain::ALL {
            let registered = task_domain(domain).domain();
            assert_eq!(registered, domain);
            assert_eq!(registered.as_str().parse::<Domain>(), Ok(domain), "{domain}");
            let tasks = task_domain(domain).generate(2, 1, 1);
            assert!(tasks.iter().all(|t| t.domain == domain), "{domain} generates its own tasks");
        }
    }

    #[test]
    fn every_domain_makes_fresh_episodes_that_the_gold_actions_solve() {
        for domain in Domain::ALL {
            let tasks = task_domain(domain).generate(4, 3, 1);
            let environment = Environment::for_tasks(domain, &tasks).expect("an environment");
            assert_eq!(environment.domain(), domain);
            assert_eq!(environment.passages().is_some(), task_domain(domain).searches_a_corpus(), "{domain}");
            for task in &tasks {
                assert!(solve_with_gold(&environment, task).success, "{domain}: {}", task.id);
                let fresh = environment.episode(task).expect("a second episode");
                assert!(!fresh.is_done(), "{domain}: each episode starts afresh");
            }
        }
    }

    #[test]
    fn a_task_of_another_domain_or_with_a_broken_payload_is_refused() {
        let math = Environment::for_tasks(Domain::Math, &[]).expect("an environment");
        let chess_task = chess::generate(1, 1, 1).remove(0);
        let error = math.episode(&chess_task).err().expect("refused");
        assert!(matches!(error, EnvironmentError::WrongDomain { found: Domain::Chess, expected: Domain::Math, .. }));
        assert!(error.to_string().contains("belongs to the chess domain, not math"), "{error}");

        let mut broken = qa::generate(1, 1, 1).remove(0);
        broken.payload = json!({"question": 7});
        let environment = Environment::for_tasks(Domain::Qa, std::slice::from_ref(&broken)).expect("an environment");
        assert!(matches!(environment.episode(&broken), Err(EnvironmentError::Qa { .. })));
        let mut no_fen = chess_task.clone();
        no_fen.payload = json!({"moves": ["e2e4"]});
        let chess = Environment::for_tasks(Domain::Chess, &[]).expect("an environment");
        assert!(matches!(chess.episode(&no_fen), Err(EnvironmentError::Chess(_))));
        let mut no_answer = math::generate(1, 1, 1).remove(0);
        no_answer.payload = json!({"question": "2+2?"});
        assert!(matches!(math.episode(&no_answer), Err(EnvironmentError::Math(_))));
    }

    #[test]
    fn the_chess_environment_applies_its_config_to_every_episode() {
        let task = chess::generate(1, 5, 1).remove(0);
        let strict = chess::environment(chess::ChessConfig { malformed_retries: 0, illegal_retries: 0 });
        let mut episode = strict.episode(&task).expect("an episode");
        let outcome = episode.act("not-a-move");
        assert!(outcome.invalid && outcome.done && !outcome.solved, "{outcome:?}");
        let lenient = Environment::for_tasks(Domain::Chess, &[]).expect("an environment");
        let mut episode = lenient.episode(&task).expect("an episode");
        assert!(!episode.act("not-a-move").done, "the default config allows one malformed move");
    }

    #[test]
    fn a_qa_environment_searches_its_corpus_file_and_keeps_an_index_on_disk() {
        let task = qa::generate(1, 9, 1).remove(0);
        let payload = qa::QaPayload::from_task(&task).expect("a QA payload");
        let supporting = payload.supporting_titles[0].clone();
        let dir = tempfile::tempdir().expect("a temp dir");
        let corpus = dir.path().join("corpus.jsonl");
        let lines: Vec<String> = payload
            .context
            .iter()
            .enumerate()
            .map(|(i, p)| json!({"id": i, "title": p.title, "text": p.text}).to_string())
            .collect();
        std::fs::write(&corpus, lines.join("\n")).expect("corpus written");
        let index = dir.path().join("index");
        let sources = CorpusSource { file: Some(&corpus), index_dir: Some(&index) };
        let built = task_domain(Domain::Qa).environment(&[], sources).expect("built");
        assert_eq!(built.passages(), Some(payload.context.len() as u64));
        let (passages, _) = qa::load_corpus(&corpus);
        let kept = qa::Retriever::open_or_build(&passages, &index).expect("the kept index");
        assert_eq!(kept.origin(), qa::IndexOrigin::Reused);
        let mut episode = built.episode(&task).expect("an episode");
        let hits = episode.call_tool("search", &[json!(supporting.clone()), json!(1)]).expect("a search");
        assert_eq!(hits[0]["title"], json!(supporting));
        assert!(solve_with_gold(&built, &task).success);

        std::fs::write(&corpus, format!("{}\n{{\"title\": \"no id\"}}\n", lines[0])).expect("corpus written");
        let error =
            qa::corpus_environment(QaCorpus::File(&corpus), None, qa::QaConfig::default()).expect_err("refused");
        assert!(matches!(&error, EnvironmentError::Corpus { rejected: 1, first } if first.line == 2), "{error}");
    }
}
