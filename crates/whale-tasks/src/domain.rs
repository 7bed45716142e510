//! Domain-generic entry points: one call that works for any [`Domain`].
//!
//! The CLI and the experiment driver name a domain at run time (`whale data check chess
//! FILE`, `whale harness run --domain qa`); this module routes each operation to the domain's
//! own module so that callers never match on the domain themselves. An [`Environment`] holds
//! what all episodes of a run share (the chess retry budgets, the QA search index), so that it
//! is built once and each rollout only asks it for a fresh episode.

use crate::{chess, math, qa, Episode, LoadReport, RecordError};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use whale_core::{Domain, Task, Verdict};

/// The score of one prediction; QA adds exact match and F1.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictionScore {
    pub verdict: Verdict,
    pub em: Option<f64>,
    pub f1: Option<f64>,
}

/// The operations every domain offers, as methods of [`Domain`].
pub trait DomainTasks {
    /// Load every record of a file in any form the domain accepts.
    fn load(self, path: &Path) -> LoadReport;
    /// Parse one JSON record (any accepted form).
    fn parse_record(self, value: &serde_json::Value, file: &Path, line: usize) -> Result<Task, RecordError>;
    /// `n` synthetic tasks, deterministic for `seed`.
    fn generate(self, n: usize, seed: u64, difficulty: u32) -> Vec<Task>;
    /// Write tasks in the domain's native file format (JSONL; Lichess CSV for chess).
    fn write_native(self, tasks: &[Task], out: &mut dyn Write) -> std::io::Result<()>;
    /// The task as a harness may see it: no gold answer, no solution.
    fn public_view(self, task: &Task) -> serde_json::Value;
    /// The actions that solve the task when played in order (empty for a malformed task).
    fn gold_actions(self, task: &Task) -> Vec<String>;
    /// Score a prediction made anywhere (model text, a move list, an answer string).
    fn score(self, task: &Task, prediction: &str) -> PredictionScore;
    /// The native file extension (`jsonl`, `csv`).
    fn native_extension(self) -> &'static str;
}

impl DomainTasks for Domain {
    fn load(self, path: &Path) -> LoadReport {
        match self {
            Domain::Math => math::load(path),
            Domain::Chess => chess::load(path),
            Domain::Qa => qa::load(path),
        }
    }

    fn parse_record(self, value: &serde_json::Value, file: &Path, line: usize) -> Result<Task, RecordError> {
        match self {
            Domain::Math => math::parse_record(value, file, line),
            Domain::Chess => chess::parse_record(value, file, line),
            Domain::Qa => qa::parse_record(value, file, line),
        }
    }

    fn generate(self, n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
        match self {
            Domain::Math => math::generate(n, seed, difficulty),
            Domain::Chess => chess::generate(n, seed, difficulty),
            Domain::Qa => qa::generate(n, seed, difficulty),
        }
    }

    fn write_native(self, tasks: &[Task], out: &mut dyn Write) -> std::io::Result<()> {
        match self {
            Domain::Math => math::write_native(tasks, out),
            Domain::Chess => chess::write_native(tasks, out),
            Domain::Qa => qa::write_native(tasks, out),
        }
    }

    fn public_view(self, task: &Task) -> serde_json::Value {
        match self {
            Domain::Math => math::public_view(task),
            Domain::Chess => chess::public_view(task),
            Domain::Qa => qa::public_view(task),
        }
    }

    fn gold_actions(self, task: &Task) -> Vec<String> {
        match self {
            Domain::Math => math::gold_actions(task),
            Domain::Chess => chess::gold_actions(task),
            Domain::Qa => qa::gold_actions(task),
        }
    }

    fn score(self, task: &Task, prediction: &str) -> PredictionScore {
        match self {
            Domain::Math => PredictionScore { verdict: math::score(task, prediction), em: None, f1: None },
            Domain::Chess => PredictionScore { verdict: chess::score(task, prediction), em: None, f1: None },
            Domain::Qa => {
                let s = qa::score(task, prediction);
                PredictionScore { verdict: s.verdict, em: Some(s.em), f1: Some(s.f1) }
            }
        }
    }

    fn native_extension(self) -> &'static str {
        match self {
            Domain::Chess => "csv",
            Domain::Math | Domain::Qa => "jsonl",
        }
    }
}

/// Replays each task's gold answer through a fresh episode of its domain and returns the
/// verdicts in order. QA episodes search an in-memory index of the tasks' own contexts.
pub fn replay_gold(domain: Domain, tasks: &[Task]) -> Result<Vec<Verdict>, GoldReplayError> {
    let environment = Environment::for_tasks(domain, tasks).map_err(|e| GoldReplayError::Index(e.to_string()))?;
    Ok(tasks
        .iter()
        .map(|task| match environment.episode(task) {
            Ok(mut episode) => play(episode.as_mut(), &domain.gold_actions(task)),
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

/// Where the passages of a QA environment come from.
#[derive(Debug, Clone, Copy)]
pub enum QaCorpus<'a> {
    /// The context paragraphs of these tasks (HotpotQA-form and generated tasks carry them).
    TaskContexts(&'a [Task]),
    /// A corpus file, one passage per line (see [`qa::load_corpus`]).
    File(&'a Path),
}

/// The environment of one domain: everything the episodes of a run share, and a fresh
/// [`Episode`] for any task of the domain on demand.
#[derive(Clone)]
pub enum Environment {
    Math,
    Chess(chess::ChessConfig),
    Qa { retriever: Arc<qa::Retriever>, config: qa::QaConfig },
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Environment::Math => f.write_str("Environment::Math"),
            Environment::Chess(config) => f.debug_tuple("Environment::Chess").field(config).finish(),
            Environment::Qa { retriever, config } => {
                f.debug_struct("Environment::Qa").field("passages", &retriever.len()).field("config", config).finish()
            }
        }
    }
}

/// Why an environment or one of its episodes could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    #[error("task `{id}` belongs to the {found} domain, not {expected}")]
    WrongDomain { id: String, found: Domain, expected: Domain },
    #[error(transparent)]
    Math(#[from] math::TaskError),
    #[error(transparent)]
    Chess(#[from] chess::TaskError),
    #[error("task `{id}` is not a QA task: {reason}")]
    Qa { id: String, reason: String },
    #[error("the QA corpus has {rejected} unreadable record(s), the first: {first}")]
    Corpus { rejected: usize, first: RecordError },
    #[error("cannot build the QA search index: {0}")]
    Index(#[from] qa::QaError),
}

impl Environment {
    /// The environment with the domain's default settings; a QA environment searches an
    /// in-memory index of the tasks' own context paragraphs.
    pub fn for_tasks(domain: Domain, tasks: &[Task]) -> Result<Self, EnvironmentError> {
        match domain {
            Domain::Math => Ok(Environment::Math),
            Domain::Chess => Ok(Environment::Chess(chess::ChessConfig::default())),
            Domain::Qa => Environment::qa(QaCorpus::TaskContexts(tasks), None, qa::QaConfig::default()),
        }
    }

    /// A QA environment over `corpus`, indexed in memory, or in `index_dir` where an index of
    /// exactly these passages is reused and any other is rebuilt. A corpus file with an
    /// unreadable record is refused rather than searched without it.
    pub fn qa(corpus: QaCorpus<'_>, index_dir: Option<&Path>, config: qa::QaConfig) -> Result<Self, EnvironmentError> {
        let passages = match corpus {
            QaCorpus::TaskContexts(tasks) => qa::corpus_from_tasks(tasks),
            QaCorpus::File(path) => {
                let (passages, errors) = qa::load_corpus(path);
                if let Some(first) = errors.first() {
                    return Err(EnvironmentError::Corpus { rejected: errors.len(), first: first.clone() });
                }
                passages
            }
        };
        let retriever = match index_dir {
            Some(dir) => qa::Retriever::open_or_build(&passages, dir)?,
            None => qa::Retriever::in_memory(&passages)?,
        };
        Ok(Environment::Qa { retriever: Arc::new(retriever), config })
    }

    pub fn domain(&self) -> Domain {
        match self {
            Environment::Math => Domain::Math,
            Environment::Chess(_) => Domain::Chess,
            Environment::Qa { .. } => Domain::Qa,
        }
    }

    /// A fresh episode of `task`, or why the task cannot be played here (another domain, a
    /// payload the domain cannot read).
    pub fn episode(&self, task: &Task) -> Result<Box<dyn Episode>, EnvironmentError> {
        let expected = self.domain();
        if task.domain != expected {
            return Err(EnvironmentError::WrongDomain { id: task.id.clone(), found: task.domain, expected });
        }
        Ok(match self {
            Environment::Math => Box::new(math::episode(task)?),
            Environment::Chess(config) => Box::new(chess::episode(task, config)?),
            Environment::Qa { retriever, config } => {
                qa::QaPayload::from_task(task)
                    .map_err(|reason| EnvironmentError::Qa { id: task.id.clone(), reason })?;
                Box::new(qa::episode(task, retriever.clone(), config))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn solve_with_gold(environment: &Environment, task: &Task) -> Verdict {
        let mut episode = environment.episode(task).expect("an episode");
        play(episode.as_mut(), &task.domain.gold_actions(task))
    }

    #[test]
    fn every_domain_makes_fresh_episodes_that_the_gold_actions_solve() {
        for domain in Domain::ALL {
            let tasks = domain.generate(4, 3, 1);
            let environment = Environment::for_tasks(domain, &tasks).expect("an environment");
            assert_eq!(environment.domain(), domain);
            for task in &tasks {
                assert!(solve_with_gold(&environment, task).success, "{domain}: {}", task.id);
                let fresh = environment.episode(task).expect("a second episode");
                assert!(!fresh.is_done(), "{domain}: each episode starts afresh");
            }
        }
    }

    #[test]
    fn a_task_of_another_domain_or_with_a_broken_payload_is_refused() {
        let chess_task = chess::generate(1, 1, 1).remove(0);
        let error = Environment::Math.episode(&chess_task).err().expect("refused");
        assert!(matches!(error, EnvironmentError::WrongDomain { found: Domain::Chess, expected: Domain::Math, .. }));
        assert!(error.to_string().contains("belongs to the chess domain, not math"), "{error}");

        let mut broken = qa::generate(1, 1, 1).remove(0);
        broken.payload = json!({"question": 7});
        let environment = Environment::for_tasks(Domain::Qa, std::slice::from_ref(&broken)).expect("an environment");
        assert!(matches!(environment.episode(&broken), Err(EnvironmentError::Qa { .. })));
        let mut no_fen = chess_task.clone();
        no_fen.payload = json!({"moves": ["e2e4"]});
        assert!(matches!(Environment::Chess(Default::default()).episode(&no_fen), Err(EnvironmentError::Chess(_))));
        let mut no_answer = math::generate(1, 1, 1).remove(0);
        no_answer.payload = json!({"question": "2+2?"});
        assert!(matches!(Environment::Math.episode(&no_answer), Err(EnvironmentError::Math(_))));
    }

    #[test]
    fn the_chess_environment_applies_its_config_to_every_episode() {
        let task = chess::generate(1, 5, 1).remove(0);
        let strict = Environment::Chess(chess::ChessConfig { malformed_retries: 0, illegal_retries: 0 });
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
        let config = qa::QaConfig::default();
        let built = Environment::qa(QaCorpus::File(&corpus), Some(&index), config.clone()).expect("built");
        let reused = Environment::qa(QaCorpus::File(&corpus), Some(&index), config.clone()).expect("reused");
        let Environment::Qa { retriever, .. } = &reused else { panic!("a QA environment") };
        assert_eq!(retriever.origin(), qa::IndexOrigin::Reused);
        assert_eq!(retriever.len(), payload.context.len() as u64);
        let mut episode = built.episode(&task).expect("an episode");
        let hits = episode.call_tool("search", &[json!(supporting.clone()), json!(1)]).expect("a search");
        assert_eq!(hits[0]["title"], json!(supporting));
        assert!(solve_with_gold(&reused, &task).success);

        std::fs::write(&corpus, format!("{}\n{{\"title\": \"no id\"}}\n", lines[0])).expect("corpus written");
        let error = Environment::qa(QaCorpus::File(&corpus), None, config).expect_err("refused");
        assert!(matches!(&error, EnvironmentError::Corpus { rejected: 1, first } if first.line == 2), "{error}");
    }
}
