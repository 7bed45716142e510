//! Search QA behind [`TaskDomain`]: what the layers above ask of the domain, answered from
//! this folder's records, generator, retriever and SQuAD verifier.

use super::{corpus_from_tasks, load_corpus, normalize_answer, QaConfig, QaPayload, Retriever};
use crate::{
    Bottleneck, CorpusSource, Environment, EnvironmentError, Episode, EpisodeFactory, PredictionScore, TaskDomain,
};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use whale_core::{Domain, Task};

/// The search QA domain.
pub struct QaDomain;

/// Where the passages of a QA environment come from.
#[derive(Debug, Clone, Copy)]
pub enum QaCorpus<'a> {
    /// The context paragraphs of these tasks (HotpotQA-form and generated tasks carry them).
    TaskContexts(&'a [Task]),
    /// A corpus file, one passage per line (see [`load_corpus`]).
    File(&'a Path),
}

/// QA episodes share one search index and one config.
struct QaEpisodes {
    retriever: Arc<Retriever>,
    config: QaConfig,
}

impl std::fmt::Debug for QaEpisodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QaEpisodes").field("passages", &self.retriever.len()).field("config", &self.config).finish()
    }
}

impl EpisodeFactory for QaEpisodes {
    fn episode(&self, task: &Task) -> Result<Box<dyn Episode>, EnvironmentError> {
        QaPayload::from_task(task).map_err(|reason| EnvironmentError::Qa { id: task.id.clone(), reason })?;
        Ok(Box::new(super::episode(task, self.retriever.clone(), &self.config)))
    }

    fn passages(&self) -> Option<u64> {
        Some(self.retriever.len())
    }
}

/// A QA environment over `corpus`, indexed in memory, or in `index_dir` where an index of
/// exactly these passages is reused and any other is rebuilt. A corpus file with an
/// unreadable record is refused rather than searched without it.
pub fn corpus_environment(
    corpus: QaCorpus<'_>,
    index_dir: Option<&Path>,
    config: QaConfig,
) -> Result<Environment, EnvironmentError> {
    let passages = match corpus {
        QaCorpus::TaskContexts(tasks) => corpus_from_tasks(tasks),
        QaCorpus::File(path) => {
            let (passages, errors) = load_corpus(path);
            if let Some(first) = errors.first() {
                return Err(EnvironmentError::Corpus { rejected: errors.len(), first: first.clone() });
            }
            passages
        }
    };
    let retriever = match index_dir {
        Some(dir) => Retriever::open_or_build(&passages, dir)?,
        None => Retriever::in_memory(&passages)?,
    };
    Ok(Environment::new(Domain::Qa, QaEpisodes { retriever: Arc::new(retriever), config }))
}

impl TaskDomain for QaDomain {
    fn domain(&self) -> Domain {
        Domain::Qa
    }

    crate::domain::folder_functions!();

    fn native_extension(&self) -> &'static str {
        "jsonl"
    }

    fn gold_field(&self) -> &'static str {
        "answer"
    }

    fn score(&self, task: &Task, prediction: &str) -> PredictionScore {
        let score = super::score(task, prediction);
        PredictionScore { verdict: score.verdict, em: Some(score.em), f1: Some(score.f1) }
    }

    fn scores_em_f1(&self) -> bool {
        true
    }

    /// The answer SQuAD-normalised (`The Eiffel Tower.` and `eiffel tower` vote together).
    fn answer_key(&self, answer: &Value) -> String {
        match answer {
            Value::String(text) => normalize_answer(text),
            other => other.to_string(),
        }
    }

    fn searches_a_corpus(&self) -> bool {
        true
    }

    /// Searches the corpus file when one is given, else the tasks' own context paragraphs.
    fn environment(&self, tasks: &[Task], corpus: CorpusSource<'_>) -> Result<Environment, EnvironmentError> {
        let source = corpus.file.map_or(QaCorpus::TaskContexts(tasks), QaCorpus::File);
        corpus_environment(source, corpus.index_dir, QaConfig::default())
    }

    fn bottleneck(&self) -> Bottleneck {
        Bottleneck::Harness
    }
}
