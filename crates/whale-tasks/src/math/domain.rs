//! Math behind [`TaskDomain`]: what the layers above ask of the domain, answered from this
//! folder's loader, generator and judge.

use super::{calculate, MathEpisode};
use crate::{
    Bottleneck, CorpusSource, Environment, EnvironmentError, Episode, EpisodeFactory, PredictionScore, TaskDomain,
};
use serde_json::Value;
use whale_core::{Domain, Task};
use whale_math_answer::{extract_answer, DEFAULT_ORDER};

/// The math domain.
pub struct MathDomain;

/// Math episodes share nothing: each is its question and its gold answer.
#[derive(Debug)]
struct MathEpisodes;

impl EpisodeFactory for MathEpisodes {
    fn episode(&self, task: &Task) -> Result<Box<dyn Episode>, EnvironmentError> {
        let episode: MathEpisode = super::episode(task)?;
        Ok(Box::new(episode))
    }

    fn passages(&self) -> Option<u64> {
        None
    }
}

impl TaskDomain for MathDomain {
    fn domain(&self) -> Domain {
        Domain::Math
    }

    crate::domain::folder_functions!();

    fn native_extension(&self) -> &'static str {
        "jsonl"
    }

    fn gold_field(&self) -> &'static str {
        "answer"
    }

    fn score(&self, task: &Task, prediction: &str) -> PredictionScore {
        PredictionScore { verdict: super::score(task, prediction), em: None, f1: None }
    }

    fn scores_em_f1(&self) -> bool {
        false
    }

    /// The extracted final answer as an exact number where it is one (`#### 1,000` and
    /// `1000.0` vote together), else as written.
    fn answer_key(&self, answer: &Value) -> String {
        match answer {
            Value::String(text) => {
                let extracted = extract_answer(text, &DEFAULT_ORDER).unwrap_or_else(|| text.trim().to_string());
                calculate(&extracted.replace(',', "")).map_or(extracted, |value| value.0.to_string())
            }
            other => other.to_string(),
        }
    }

    fn searches_a_corpus(&self) -> bool {
        false
    }

    fn environment(&self, _tasks: &[Task], _corpus: CorpusSource<'_>) -> Result<Environment, EnvironmentError> {
        Ok(Environment::new(Domain::Math, MathEpisodes))
    }

    fn bottleneck(&self) -> Bottleneck {
        Bottleneck::Weights
    }
}
