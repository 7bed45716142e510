//! Math behind [`TaskDomain`]: what the layers above ask of the domain, answered from this
//! folder's loader, generator and judge.

use super::{calculate, MathEpisode};
use crate::{
    Bottleneck, CorpusSource, Environment, EnvironmentError, Episode, EpisodeFactory, LoadReport, PredictionScore,
    RecordError, TaskDomain,
};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
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

    fn load(&self, path: &Path) -> LoadReport {
        super::load(path)
    }

    fn parse_record(&self, value: &Value, file: &Path, line: usize) -> Result<Task, RecordError> {
        super::parse_record(value, file, line)
    }

    fn generate(&self, n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
        super::generate(n, seed, difficulty)
    }

    fn write_native(&self, tasks: &[Task], out: &mut dyn Write) -> std::io::Result<()> {
        super::write_native(tasks, out)
    }

    fn native_extension(&self) -> &'static str {
        "jsonl"
    }

    fn gold_field(&self) -> &'static str {
        "answer"
    }

    fn public_view(&self, task: &Task) -> Value {
        super::public_view(task)
    }

    fn gold_actions(&self, task: &Task) -> Vec<String> {
        super::gold_actions(task)
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
