//! The harness phase, one iteration at a time. A phase starts by re-scoring the incumbent
//! under the current weights ([`HarnessSearch::rescore_incumbent`]); each
//! [`HarnessSearch::iterate`] then asks the proposer for M candidates, validates each
//! (compile, then one smoke rollout), scores the valid ones with one rollout per search task,
//! and lets the acceptance rule pick the next incumbent among them and the current one.
//! Whoever drives the search (the scheduler) decides how many iterations a phase has.
//!
//! Nothing a proposer does stops the run: an error or a panic is recorded and the iteration
//! ends without candidates; an invalid candidate is recorded with the reason. Only the
//! evaluator failing (the rollout machinery itself) or the archive failing to write ends an
//! iteration with an error, and a rerun resumes it from what the archive kept.

use crate::acceptance::Acceptance;
use crate::archive::{Archive, ArchiveError, Candidate, CandidateDraft, CandidateRef, SummaryEvent};
use crate::copied_text::{copied_task_text, CopiedText};
use crate::prompt_text::only_prompt_text_differs;
use crate::proposer::{Proposal, ProposalContext, Proposer, TokenUsage};
use crate::score::ScoreCard;
use serde::{Deserialize, Serialize};
use std::panic::{catch_unwind, AssertUnwindSafe};
use whale_core::{Domain, Objectives, Task, Trajectory};
use whale_harness::{validate, Harness, Limits};

pub type EvaluatorError = Box<dyn std::error::Error + Send + Sync>;

/// Runs harnesses on tasks under the current weights: one rollout per task, trajectories in
/// task order. The whale crate implements it with `whale_harness::run_rollouts` and the policy.
pub trait Evaluator {
    /// The weights the rollouts run under (results are keyed by it).
    fn weights_version(&self) -> u64;

    fn score(&self, harness: &Harness, tasks: &[Task]) -> Result<Vec<Trajectory>, EvaluatorError>;
}

/// How a search runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// Candidates per iteration (M).
    pub candidates: usize,
    pub acceptance: Acceptance,
    /// Seeds the proposer and the bootstrap.
    pub seed: u64,
    /// The limits candidates are validated under (the rollouts' own limits live in the evaluator).
    pub limits: Limits,
    /// Accept only candidates that change nothing but the incumbent's prompt text
    /// ([`crate::only_prompt_text_differs`]); others are recorded as rejected, unscored.
    pub prompt_only: bool,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            candidates: 3,
            acceptance: Acceptance::default(),
            seed: 0,
            limits: Limits::default(),
            prompt_only: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("the archive has no incumbent; seed it first")]
    NoIncumbent,
    #[error("a search needs at least one search task")]
    NoTasks,
    #[error("the evaluator failed: {0}")]
    Evaluator(EvaluatorError),
    #[error("the evaluator returned {got} trajectories for {expected} tasks")]
    Trajectories { expected: usize, got: usize },
    /// The proposer's model server or command failed: no iteration is concluded without the
    /// candidates it would have written.
    #[error("iteration {iteration}: the {proposer} proposer failed: {error}")]
    Proposer { iteration: u64, proposer: String, error: String },
}

/// What became of one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum CandidateResult {
    Rejected { reason: String },
    Scored { objectives: Objectives, reused: bool },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateReport {
    pub candidate: CandidateRef,
    pub hypothesis: String,
    pub result: CandidateResult,
}

/// What one iteration did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationReport {
    pub iteration: u64,
    pub weights_version: u64,
    /// The incumbent the iteration started from, and its score.
    pub incumbent: CandidateRef,
    pub incumbent_objectives: Objectives,
    /// Why the proposer produced nothing (an error or a panic), if it failed.
    pub proposer_error: Option<String>,
    pub candidates: Vec<CandidateReport>,
    /// The candidate that became the incumbent, if one did.
    pub accepted: Option<CandidateRef>,
    pub new_best: bool,
    /// Rollouts (smoke and scoring) and their tokens spent in this iteration.
    pub rollouts: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Tokens the proposer spent in this iteration.
    pub proposer_tokens: TokenUsage,
    /// Seconds the proposer took to propose (its model's turns, or its command).
    #[serde(default)]
    pub proposer_seconds: f64,
}

/// Rollouts and tokens spent.
#[derive(Debug, Clone, Copy, Default)]
struct Spent {
    rollouts: usize,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl Spent {
    fn add(&mut self, trajectories: &[Trajectory]) {
        self.rollouts += trajectories.len();
        self.prompt_tokens += trajectories.iter().map(|t| t.prompt_tokens).sum::<usize>();
        self.completion_tokens += trajectories.iter().map(|t| t.completion_tokens).sum::<usize>();
    }
}

/// The incumbent's score at the start of a phase, and the rollouts paid for it now (0 when
/// the archive already held and had accounted for it).
#[derive(Debug, Clone, PartialEq)]
pub struct Rescore {
    pub card: ScoreCard,
    pub rollouts: usize,
}

/// A card and whether it came from the archive rather than fresh rollouts.
struct Scoring {
    card: ScoreCard,
    reused: bool,
    rollouts: usize,
}

/// A Meta-Harness search over one archive.
pub struct HarnessSearch {
    archive: Archive,
    tasks: Vec<Task>,
    proposer: Box<dyn Proposer>,
    config: SearchConfig,
    domain: Domain,
    examples: Vec<Trajectory>,
}

impl HarnessSearch {
    /// A search of `archive` (already seeded) over the search tasks `tasks` of `domain`.
    pub fn new(
        archive: Archive,
        domain: Domain,
        tasks: Vec<Task>,
        proposer: Box<dyn Proposer>,
        config: SearchConfig,
    ) -> Result<Self, SearchError> {
        if tasks.is_empty() {
            return Err(SearchError::NoTasks);
        }
        archive.admit(&tasks)?;
        if archive.incumbent().is_none() {
            return Err(SearchError::NoIncumbent);
        }
        Ok(Self { archive, tasks, proposer, config, domain, examples: Vec::new() })
    }

    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    pub fn into_archive(self) -> Archive {
        self.archive
    }

    pub fn incumbent(&self) -> &Candidate {
        self.archive.incumbent().expect("a search's archive always has an incumbent")
    }

    /// Successful training trajectories the proposer may draw few-shot examples from; any of
    /// a test task (by split id) is left out.
    pub fn set_examples(&mut self, examples: Vec<Trajectory>) {
        self.examples = examples.into_iter().filter(|t| t.success && !self.archive.is_forbidden(&t.task_id)).collect();
    }

    /// Scores the incumbent under the evaluator's weights (from the archive when it already
    /// was) and records it: the start of a harness phase.
    pub fn rescore_incumbent(&mut self, evaluator: &dyn Evaluator) -> Result<Rescore, SearchError> {
        let incumbent = self.incumbent().clone();
        self.rescore(&incumbent, evaluator, &mut Spent::default(), true)
    }

    /// The incumbent's card; logged when `always` or when rollouts were paid for it now.
    fn rescore(
        &mut self,
        incumbent: &Candidate,
        evaluator: &dyn Evaluator,
        spent: &mut Spent,
        always: bool,
    ) -> Result<Rescore, SearchError> {
        let scoring = self.score(incumbent, evaluator, spent)?;
        if always || scoring.rollouts > 0 {
            self.archive.append(SummaryEvent::Rescored {
                candidate: incumbent.reference(),
                weights_version: scoring.card.weights_version,
                objectives: scoring.card.objectives,
                reused: scoring.reused,
                rollouts: scoring.rollouts,
            })?;
            self.archive.write_frontier(scoring.card.weights_version)?;
        }
        Ok(Rescore { card: scoring.card, rollouts: scoring.rollouts })
    }

    /// One iteration: propose, validate, score, accept.
    pub fn iterate(&mut self, evaluator: &dyn Evaluator) -> Result<IterationReport, SearchError> {
        let iteration = self.archive.next_iteration();
        let version = evaluator.weights_version();
        let incumbent = self.incumbent().clone();
        let mut spent = Spent::default();
        let incumbent_card = self.rescore(&incumbent, evaluator, &mut spent, false)?.card;
        let usage_before = self.proposer.usage();
        let failures: Vec<Trajectory> =
            self.archive.traces(&incumbent.meta.hash, version)?.into_iter().filter(|t| !t.success).collect();
        let proposing = std::time::Instant::now();
        let (proposals, proposer_error) = self.propose(iteration, version, &incumbent, &failures)?;
        let proposer_seconds = proposing.elapsed().as_secs_f64();
        let proposer_tokens = self.proposer.usage().since(usage_before);
        let mut reports = Vec::new();
        let mut scored: Vec<(Candidate, ScoreCard)> = Vec::new();
        for proposal in proposals.into_iter().take(self.config.candidates) {
            let (report, card) = self.screen(iteration, proposal, evaluator, &mut spent)?;
            if let Some(scoring) = card {
                scored.push(scoring);
            }
            reports.push(report);
        }
        let cards: Vec<&ScoreCard> = scored.iter().map(|(_, card)| card).collect();
        let seed = self.config.seed ^ iteration.wrapping_mul(0xA24B_AED4_963E_E407);
        let accepted = self.config.acceptance.choose(&incumbent_card, &cards, seed).map(|i| scored[i].0.reference());
        let after = accepted.clone().unwrap_or_else(|| incumbent.reference());
        self.archive.append(SummaryEvent::Concluded {
            iteration,
            weights_version: version,
            incumbent: after,
            new_best: accepted.is_some(),
        })?;
        self.archive.write_frontier(version)?;
        Ok(IterationReport {
            iteration,
            weights_version: version,
            incumbent: incumbent.reference(),
            incumbent_objectives: incumbent_card.objectives,
            proposer_error,
            candidates: reports,
            new_best: accepted.is_some(),
            accepted,
            rollouts: spent.rollouts,
            prompt_tokens: spent.prompt_tokens,
            completion_tokens: spent.completion_tokens,
            proposer_tokens,
            proposer_seconds,
        })
    }

    /// The proposals of one iteration. A proposer that panics, or fails in what it wrote, is
    /// recorded and yields none; one whose model server or command failed
    /// ([`ProposerError::is_infrastructure`]) is recorded and stops the search, since an iteration
    /// without candidates would read as a search that found nothing.
    fn propose(
        &mut self,
        iteration: u64,
        weights_version: u64,
        incumbent: &Candidate,
        failures: &[Trajectory],
    ) -> Result<(Vec<Proposal>, Option<String>), SearchError> {
        let ctx = ProposalContext {
            archive: self.archive.root(),
            incumbent,
            domain: self.domain,
            candidates: self.config.candidates,
            iteration,
            weights_version,
            seed: self.config.seed,
            examples: &self.examples,
            limits: &self.config.limits,
            prompt_only: self.config.prompt_only,
            failures,
        };
        let proposer = &mut self.proposer;
        let (error, infrastructure) = match catch_unwind(AssertUnwindSafe(|| proposer.propose(&ctx))) {
            Ok(Ok(proposals)) => return Ok((proposals, None)),
            Ok(Err(error)) => (error.to_string(), error.is_infrastructure()),
            Err(panic) => (format!("the proposer panicked: {}", panic_message(panic.as_ref())), false),
        };
        let proposer = self.proposer.name().to_string();
        self.archive.append(SummaryEvent::ProposerFailed {
            iteration,
            proposer: proposer.clone(),
            error: error.clone(),
        })?;
        if infrastructure {
            return Err(SearchError::Proposer { iteration, proposer, error });
        }
        Ok((Vec::new(), Some(error)))
    }

    /// Validates, records and (if valid) scores one proposal.
    fn screen(
        &mut self,
        iteration: u64,
        proposal: Proposal,
        evaluator: &dyn Evaluator,
        spent: &mut Spent,
    ) -> Result<(CandidateReport, Option<(Candidate, ScoreCard)>), SearchError> {
        let harness = Harness::from_source(proposal.source.as_str());
        let version = evaluator.weights_version();
        let cached = self.archive.scores(&harness.id, version)?.is_some();
        // A resumed iteration does not smoke-test again what the killed one already did.
        let screened = self.archive.proposed(iteration, &harness.id).map(|c| c.meta.rejection.clone());
        let mut smoke = Spent::default();
        let code_changed =
            self.config.prompt_only && !only_prompt_text_differs(&self.incumbent().source, &harness.source);
        // A question counts as inherited only from a parent that was not itself rejected.
        let parent = proposal
            .parent
            .as_deref()
            .and_then(|id| self.archive.candidate(id))
            .filter(|candidate| candidate.meta.rejection.is_none())
            .unwrap_or(self.incumbent());
        let validation = validate(&harness.source, &self.config.limits);
        let copied = validation.is_ok().then(|| copied_task_text(&harness.source, &parent.source, &self.tasks));
        let rejection = match (validation, screened) {
            (Err(error), _) => Some(format!("does not validate: {error}")),
            (Ok(_), _) if code_changed => {
                Some("changes the harness's code, and only its prompt text may change here".to_string())
            }
            (Ok(_), _) if copied.as_ref().is_some_and(Option::is_some) => copied.flatten().as_ref().map(copy_rejection),
            (Ok(_), _) if cached => None,
            (Ok(_), Some(earlier)) => earlier,
            (Ok(_), None) => self.smoke(&harness, evaluator, &mut smoke)?,
        };
        spent.rollouts += smoke.rollouts;
        spent.prompt_tokens += smoke.prompt_tokens;
        spent.completion_tokens += smoke.completion_tokens;
        let parent = proposal.parent.clone().unwrap_or_else(|| self.incumbent().meta.id.clone());
        let proposer = self.proposer.name().to_string();
        let draft = CandidateDraft {
            source: &proposal.source,
            hypothesis: &proposal.hypothesis,
            parent: Some(&parent),
            proposer: &proposer,
            rejection: rejection.clone(),
        };
        let candidate = self.archive.add_candidate(iteration, draft)?;
        self.archive.append(SummaryEvent::Proposed {
            iteration,
            candidate: candidate.reference(),
            parent: candidate.meta.parent.clone(),
            hypothesis: candidate.meta.hypothesis.clone(),
            proposer,
            rejection: rejection.clone(),
            rollouts: smoke.rollouts,
        })?;
        let report = |result| CandidateReport {
            candidate: candidate.reference(),
            hypothesis: candidate.meta.hypothesis.clone(),
            result,
        };
        if let Some(reason) = rejection {
            return Ok((report(CandidateResult::Rejected { reason }), None));
        }
        let scoring = self.score(&candidate, evaluator, spent)?;
        self.archive.append(SummaryEvent::Scored {
            iteration,
            candidate: candidate.reference(),
            weights_version: version,
            objectives: scoring.card.objectives,
            reused: scoring.reused,
            rollouts: scoring.rollouts,
        })?;
        let result = CandidateResult::Scored { objectives: scoring.card.objectives, reused: scoring.reused };
        Ok((report(result), Some((candidate, scoring.card))))
    }

    /// One rollout on the first search task; the reason to reject if it failed (a failed model
    /// call is no rollout: the evaluator returns an error instead).
    fn smoke(
        &self,
        harness: &Harness,
        evaluator: &dyn Evaluator,
        spent: &mut Spent,
    ) -> Result<Option<String>, SearchError> {
        let trajectories = self.run(harness, evaluator, &self.tasks[..1])?;
        spent.add(&trajectories);
        Ok(trajectories
            .iter()
            .find_map(|t| t.error.as_ref())
            .map(|error| format!("its smoke rollout failed ({:?}): {}", error.kind, error.message)))
    }

    /// The candidate's card under the evaluator's weights: from the archive if recorded, else
    /// from one rollout per search task, recorded.
    fn score(
        &self,
        candidate: &Candidate,
        evaluator: &dyn Evaluator,
        spent: &mut Spent,
    ) -> Result<Scoring, SearchError> {
        let version = evaluator.weights_version();
        let hash = &candidate.meta.hash;
        if let Some(card) = self.archive.scores(hash, version)? {
            // Results written by a run killed before it logged them are paid for here, once.
            let reused = self.archive.is_paid_for(hash, version);
            let rollouts = if reused { 0 } else { card.rollouts() };
            return Ok(Scoring { card, reused, rollouts });
        }
        let trajectories = self.run(&candidate.harness(), evaluator, &self.tasks)?;
        spent.add(&trajectories);
        let card = ScoreCard::from_trajectories(hash, version, &trajectories);
        self.archive.record_results(&self.tasks, &card, &trajectories)?;
        Ok(Scoring { rollouts: card.rollouts(), card, reused: false })
    }

    fn run(
        &self,
        harness: &Harness,
        evaluator: &dyn Evaluator,
        tasks: &[Task],
    ) -> Result<Vec<Trajectory>, SearchError> {
        let trajectories = evaluator.score(harness, tasks).map_err(SearchError::Evaluator)?;
        if trajectories.len() != tasks.len() {
            return Err(SearchError::Trajectories { expected: tasks.len(), got: trajectories.len() });
        }
        Ok(trajectories)
    }
}

/// Why a candidate holding a search task's question is rejected; the text up to the first
/// colon is the reason's kind in [`crate::ProposalRecord`].
fn copy_rejection(copied: &CopiedText) -> String {
    let shown: String = copied.text.chars().take(80).collect();
    format!("copies a search task's question: task {} asks \"{shown}\"", copied.task_id)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".to_string())
}
