//! The harness phase as the WHALE loop drives it: the run's archive and search, the rollouts
//! the search scores candidates with, and what a finished iteration left in the archive.
//!
//! whale-search owns the search itself; this module supplies its [`Evaluator`] (one seeded
//! rollout per search task under the current weights, every spend recorded once per key so
//! a resumed iteration is not paid for twice), rebuilds each iteration's metrics row from the
//! archive's summary (so the row is the same whether or not the run was killed after the
//! archive concluded the iteration), and ranks the scored harnesses (the fast-slow population
//! and `whale archive top`).

use crate::config::{ProposerKind, RunConfig};
use crate::proposer_server::ServedAgent;
use crate::run_dir::{RunDir, SearchSpend};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use whale_core::{pareto, Objectives, Spend, Task, Trajectory};
use whale_harness::scoring::rollout_seed;
use whale_harness::{run_rollouts, EpisodeSource, Harness, RolloutJob, RunOptions};
use whale_policy::Policy;
use whale_search::{
    instance_frontier, AgentProposer, Archive, ArchiveError, Candidate, CommandProposer, Evaluator, EvaluatorError,
    HarnessSearch, MutateProposer, Proposer, ScoreCard, SearchConfig, SearchError, SummaryEvent,
};
use whale_tasks::split::Splits;
use whale_tasks::{task_domain, Environment};

const SEARCH_SALT: u64 = 0x5EA2_C400_0000_0001;

#[derive(Debug, thiserror::Error)]
pub enum SearchPhaseError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error("the proposer: {0}")]
    Proposer(String),
}

/// One scored harness.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub id: String,
    pub hash: String,
    pub hypothesis: String,
    pub objectives: Objectives,
}

/// Every distinct scored source under `version`, best first (success, then turns, then tokens).
pub fn ranking(archive: &Archive, version: u64) -> Result<Vec<Ranked>, ArchiveError> {
    let mut scored: Vec<Ranked> = scored_candidates(archive, version)?
        .into_iter()
        .map(|(candidate, card)| Ranked {
            id: candidate.meta.id.clone(),
            hash: candidate.meta.hash.clone(),
            hypothesis: candidate.meta.hypothesis.clone(),
            objectives: card.objectives,
        })
        .collect();
    let mut ranked = Vec::new();
    while !scored.is_empty() {
        let objectives: Vec<Objectives> = scored.iter().map(|r| r.objectives).collect();
        let Some(best) = pareto::best(&objectives) else { break };
        ranked.push(scored.remove(best));
    }
    Ok(ranked)
}

/// The fast-slow population under weights `version`: the per-instance Pareto frontier of the
/// archive's scored candidates ([`instance_frontier`], at most `cap`), or, while no candidate
/// solves any search task, the best of the [`ranking`].
pub fn population(archive: &Archive, version: u64, cap: usize) -> Result<Vec<String>, ArchiveError> {
    let cards: Vec<ScoreCard> = scored_candidates(archive, version)?.into_iter().map(|(_, card)| card).collect();
    let frontier = instance_frontier(&cards, cap);
    if frontier.is_empty() {
        return Ok(ranking(archive, version)?.into_iter().take(cap).map(|r| r.hash).collect());
    }
    Ok(frontier.into_iter().map(|index| cards[index].hash.clone()).collect())
}

/// Every unrejected candidate scored under weights `version`, once per content hash, with its
/// card, in the archive's order.
fn scored_candidates(archive: &Archive, version: u64) -> Result<Vec<(&Candidate, ScoreCard)>, ArchiveError> {
    let mut scored: Vec<(&Candidate, ScoreCard)> = Vec::new();
    for candidate in archive.candidates().filter(|c| c.meta.rejection.is_none()) {
        if scored.iter().any(|(seen, _)| seen.meta.hash == candidate.meta.hash) {
            continue;
        }
        if let Some(card) = archive.scores(&candidate.meta.hash, version)? {
            scored.push((candidate, card));
        }
    }
    Ok(scored)
}

/// The row of archive iteration `iteration`, rebuilt from the archive's summary (so a run that
/// was killed after the archive concluded the iteration writes the same row), and whether it
/// found a new best.
pub fn iteration_row(archive: &Archive, iteration: u64) -> (Value, bool) {
    let mut candidates = Vec::new();
    let mut concluded = json!(null);
    let mut new_best = false;
    let mut proposer_error = None;
    for event in archive.events() {
        match event {
            SummaryEvent::Proposed { iteration: i, candidate, hypothesis, rejection, .. } if *i == iteration => {
                candidates.push(json!({"id": candidate.id, "hash": candidate.hash, "hypothesis": hypothesis, "rejection": rejection}));
            }
            SummaryEvent::Scored { iteration: i, candidate, objectives, .. } if *i == iteration => {
                if let Some(entry) = candidates.iter_mut().find(|c| c["hash"] == json!(candidate.hash)) {
                    entry["objectives"] = json!(objectives);
                }
            }
            SummaryEvent::ProposerFailed { iteration: i, error, .. } if *i == iteration => {
                proposer_error = Some(error.clone());
            }
            SummaryEvent::Concluded { iteration: i, weights_version, incumbent, new_best: new } if *i == iteration => {
                new_best = *new;
                concluded = json!({"weights_version": weights_version, "incumbent": incumbent});
            }
            _ => {}
        }
    }
    let incumbent_hash = concluded["incumbent"]["hash"].as_str().unwrap_or_default().to_string();
    let version = concluded["weights_version"].as_u64().unwrap_or_default();
    let success = archive.scores(&incumbent_hash, version).ok().flatten().map(|card| card.objectives.success);
    let row = json!({
        "iteration": iteration,
        "weights_version": version,
        "incumbent": concluded["incumbent"],
        "incumbent_success": success,
        "new_best": new_best,
        "proposer_error": proposer_error,
        "candidates": candidates,
    });
    (row, new_best)
}

/// Opens (or creates and seeds) the run's archive and the search over it.
pub fn open_search(
    config: &RunConfig,
    dir: &RunDir,
    splits: &Splits,
    initial: Harness,
) -> Result<HarnessSearch, SearchPhaseError> {
    let mut archive = Archive::open(dir.archive_dir())?;
    archive.forbid_task_ids(splits.test.iter().map(|t| t.id.clone()));
    archive.seed(&initial.source, &format!("the initial harness ({})", config.harness.initial))?;
    let proposer: Box<dyn Proposer> = match (config.search.proposer, &config.search.command) {
        (ProposerKind::Mutate, _) => Box::new(MutateProposer::default()),
        (ProposerKind::Agent, _) if config.search.agent.local_model.is_some() => {
            Box::new(ServedAgent::start(&config.search.agent).map_err(|e| SearchPhaseError::Proposer(e.to_string()))?)
        }
        (ProposerKind::Agent, _) => Box::new(
            AgentProposer::new(config.search.agent.clone()).map_err(|e| SearchPhaseError::Proposer(e.to_string()))?,
        ),
        (ProposerKind::Command, Some(command)) => Box::new(CommandProposer::new(command.clone())),
        (ProposerKind::Command, None) => {
            return Err(SearchPhaseError::Proposer("the command proposer needs [search.command]".to_string()))
        }
    };
    let search_config = SearchConfig {
        candidates: config.search.candidates,
        acceptance: config.search.acceptance,
        seed: config.seed,
        limits: config.harness.limits.clone(),
        prompt_only: config.condition.uses_population(),
    };
    Ok(HarnessSearch::new(archive, config.tasks.domain, splits.search.clone(), proposer, search_config)?)
}

/// The search phase's rollouts: one per search task, seeded by the task's position so that
/// every candidate meets the same draws (a paired comparison), each spend recorded once.
pub struct SearchRollouts<'e> {
    pub policy: Arc<dyn Policy>,
    pub environment: &'e Environment,
    pub config: &'e RunConfig,
    pub dir: &'e RunDir,
    pub progress: bool,
    /// The unit these rollouts belong to (part of each spend's key).
    pub unit: u64,
}

impl Evaluator for SearchRollouts<'_> {
    fn weights_version(&self) -> u64 {
        self.policy.weights_version()
    }

    fn score(&self, harness: &Harness, tasks: &[Task]) -> Result<Vec<Trajectory>, EvaluatorError> {
        let version = self.policy.weights_version();
        let harness = Arc::new(harness.clone());
        let domain = self.environment.domain();
        let seed = self.config.seed ^ SEARCH_SALT;
        let jobs = tasks
            .iter()
            .enumerate()
            .map(|(index, task)| {
                Ok(RolloutJob {
                    task_id: task.id.clone(),
                    task_view: task_domain(domain).public_view(task),
                    episode: EpisodeSource::Ready(self.environment.episode(task)?),
                    seed: rollout_seed(seed, index, 0),
                    harness: harness.clone(),
                    weights_version: version,
                })
            })
            .collect::<Result<Vec<_>, whale_tasks::EnvironmentError>>()?;
        let options = RunOptions {
            threads: self.config.threads,
            sampling: self.config.sampling.params(),
            progress: self.progress,
            sink: None,
        };
        let started = Instant::now();
        let trajectories = run_rollouts(jobs, self.policy.clone(), &self.config.harness.limits, options)?;
        let first = tasks.first().map_or("", |t| t.id.as_str());
        let spend = SearchSpend {
            key: format!("u{}/{}/w{version}/{}/{first}", self.unit, harness.id, tasks.len()),
            spend: Spend {
                rollouts: trajectories.len() as u64,
                prompt_tokens: trajectories.iter().map(|t| t.prompt_tokens as u64).sum(),
                completion_tokens: trajectories.iter().map(|t| t.completion_tokens as u64).sum(),
                wall_s: started.elapsed().as_secs_f64(),
            },
        };
        self.dir.record_search_spend(&spend)?;
        Ok(trajectories)
    }
}
