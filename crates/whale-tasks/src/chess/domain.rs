//! Chess behind [`TaskDomain`]: what the layers above ask of the domain, answered from this
//! folder's Lichess reader, puzzle generator and game.

use super::{ChessConfig, ChessEpisode};
use crate::{
    Bottleneck, CorpusSource, Environment, EnvironmentError, Episode, EpisodeFactory, PredictionScore, TaskDomain,
};
use serde_json::Value;
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

    crate::domain::folder_functions!();

    fn native_extension(&self) -> &'static str {
        "csv"
    }

    fn gold_field(&self) -> &'static str {
        "Moves"
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
