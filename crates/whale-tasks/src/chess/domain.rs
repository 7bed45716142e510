//! Chess behind [`TaskDomain`]: what the layers above ask of the domain, answered from this
//! folder's Lichess reader, puzzle generator and game.

use super::{ChessConfig, ChessEpisode};
use crate::{
    Bottleneck, CorpusSource, Environment, EnvironmentError, Episode, EpisodeFactory, LoadReport, PredictionScore,
    RecordError, TaskDomain,
};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use whale_core::{Domain, Task};

/// The chess domain.
pub struct ChessDomain;

/// Chess episodes share their retry budgets.
#[derive(Debug)]
struct ChessEpisodes(ChessConfig);

impl EpisodeFactory for ChessEpisodes {
    fn episode(&self, task: &Task) -> Result<Box<dyn Episode>, EnvironmentError> {
        let episode: ChessEpisode = super::episode(task, &self.0)?;
        Ok(Box::new(episode))
    }

    fn passages(&self) -> Option<u64> {
        None
    }
}

/// A chess environment whose episodes follow `config`.
pub fn environment(config: ChessConfig) -> Environment {
    Environment::new(Domain::Chess, ChessEpisodes(config))
}

impl TaskDomain for ChessDomain {
    fn domain(&self) -> Domain {
        Domain::Chess
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
        "csv"
    }

    fn gold_field(&self) -> &'static str {
        "Moves"
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

    /// The moves played, space-separated.
    fn answer_key(&self, answer: &Value) -> String {
        match answer {
            Value::Array(moves) => moves.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "),
            other => other.to_string(),
        }
    }

    fn searches_a_corpus(&self) -> bool {
        false
    }

    fn environment(&self, _tasks: &[Task], _corpus: CorpusSource<'_>) -> Result<Environment, EnvironmentError> {
        Ok(environment(ChessConfig::default()))
    }

    fn bottleneck(&self) -> Bottleneck {
        Bottleneck::Unstated
    }
}
