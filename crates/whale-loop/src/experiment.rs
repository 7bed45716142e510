//! One run of one condition: the WHALE loop (or a baseline) from the first evaluation to the
//! last, in units of work that each end with a commit to the run directory. The run's report is
//! drawn from that directory by whoever ran it (whale-study's `report::write_run_report`).
//!
//! The loop asks the [`Scheduler`] for the next phase, runs one weight step or one search
//! unit (the incumbent's re-scoring at the start of a harness phase, then one archive
//! iteration at a time), and takes a test evaluation whenever [`EvalSchedule`] says one is
//! due. Each unit is deterministic given the state before it (seeds derive from the run seed
//! and the unit's number, weights come from the last checkpoint plus the journal), so a run
//! resumed after a kill takes the same decisions and reaches the same result as one that was
//! never interrupted. With `[server]` the rollouts go to an inference server, and with
//! `[weights.trainer]` the weights change by an external command ([`crate::scale_out::external_weights`]):
//! its last committed update is installed again on resume, and a step it did not finish is
//! retried from its recorded rollouts.

use crate::condition::Condition;
use crate::config::RunConfig;
use crate::lock::{DirLock, LockError};
use crate::metrics_row::{MetricsRow, RowKind};
use crate::run_dir::{EvalMemo, RunDir, RunDirError, RunState, ServedWeights, CONFIG_FILE, STATE_FILE};
use crate::scale_out::external_weights::{
    policy_gradient_samples, ExternalTrainer, ExternalWeightsError, RolloutRecord, Sample, StepFiles, Update,
    WeightsTarget,
};
use crate::scale_out::server::{ServedPolicy, ServerAdmin, ServerConfig};
use crate::schedule::{Outcome, Phase, Plan, Scheduler, Spent};
use crate::search_phase::{self, iteration_row, open_search, SearchPhaseError, SearchRollouts};
use crate::test_eval::{EvalReason, EvalRecord, EvalSchedule, TestSet};
use crate::weight_phase::{self, PassStats, RunTrainer, StepJournal, StepReport, WeightPhase, WeightPhaseError};
use candle_core::{DType, Device};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use whale_core::{Ledger, Purpose, Spend, Task, Trajectory};
use whale_engine::{EngineConfig, LocalPolicy};
use whale_harness::scoring::{environment, EvaluateError};
use whale_harness::{stock_harness, validate, Harness};
use whale_lm::Decoder;
use whale_policy::Policy;
use whale_search::{HarnessSearch, ProposalRecord};
use whale_tasks::split::{split, SplitSizes, Splits};
use whale_tasks::{task_domain, Environment};

/// The line a weight step prints: RFT's kept share, or a policy gradient's signal, clipping
/// and KL.
fn step_line(report: &StepReport) -> String {
    let loss = report.loss.map_or("-".to_string(), |l| format!("{l:.3}"));
    let head = format!("weight step {}: reward {:.3}", report.step, report.reward_mean);
    let Some(pg) = &report.policy_gradient else {
        return format!(
            "{head}, kept {}/{} ({:.0}%), {} updates, loss {loss}",
            report.kept,
            report.rollouts,
            100.0 * report.acceptance_rate,
            report.updates
        );
    };
    let optional = |value: Option<f64>| value.map_or("-".to_string(), |v| format!("{v:.3}"));
    format!(
        "{head}, {}/{} tasks with signal, |advantage| {:.3}, {} updates, loss {loss}, clipped {}, KL {}",
        pg.groups - pg.zero_signal_groups,
        pg.groups,
        pg.advantage_abs_mean,
        report.updates,
        optional(pg.clip_fraction),
        optional(pg.kl)
    )
}

/// Kept rollouts of the last weight step offered to the proposer as few-shot material.
const EXAMPLES_KEPT: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("tasks: {0}")]
    Tasks(String),
    #[error("the initial harness: {0}")]
    Harness(String),
    #[error("the model: {0}")]
    Model(String),
    #[error(transparent)]
    Evaluate(#[from] EvaluateError),
    #[error(transparent)]
    WeightPhase(#[from] WeightPhaseError),
    #[error(transparent)]
    Search(#[from] whale_search::SearchError),
    #[error(transparent)]
    Archive(#[from] whale_search::ArchiveError),
    #[error(transparent)]
    SearchPhase(#[from] SearchPhaseError),
    #[error("{source}\n(once that is fixed, `whale run --resume {}` retries the step)", dir.display())]
    Trainer { dir: PathBuf, source: Box<ExternalWeightsError> },
    #[error("{} already holds a run; resume it with `whale run --resume {}`", .0.display(), .0.display())]
    Exists(PathBuf),
    #[error("the run in {} was made by another config: {reason}", dir.display())]
    Mismatch { dir: PathBuf, reason: String },
}

/// How a run talks to the terminal.
#[derive(Debug, Clone, Copy, Default)]
pub struct Verbosity {
    /// Progress bars for rollouts and a line per unit on stderr.
    pub progress: bool,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub dir: PathBuf,
    pub condition: Condition,
    pub ledger: Ledger,
    pub evals: Vec<EvalRecord>,
}

/// The tasks of `config`, loaded and generated, split into disjoint train / search / test sets.
pub fn task_splits(config: &RunConfig) -> Result<Splits, ExperimentError> {
    let spec = &config.tasks;
    let mut tasks: Vec<Task> = Vec::new();
    for file in &spec.files {
        let report = task_domain(spec.domain).load(file);
        if let Some(first) = report.rejected.first() {
            return Err(ExperimentError::Tasks(format!("{} bad record(s), the first: {first}", report.rejected.len())));
        }
        tasks.extend(report.into_tasks());
    }
    let difficulties = &spec.difficulties;
    let seed = spec.seed.unwrap_or(config.seed);
    for (index, &difficulty) in difficulties.iter().enumerate() {
        let share = spec.generate / difficulties.len() + usize::from(index < spec.generate % difficulties.len());
        tasks.extend(task_domain(spec.domain).generate(share, seed ^ u64::from(difficulty) << 32, difficulty));
    }
    let sizes = SplitSizes { train: spec.train, search: spec.search, test: spec.test };
    split(tasks, sizes, seed).map_err(|e| ExperimentError::Tasks(e.to_string()))
}

/// The initial harness: a stock harness by name, or a file. A file that does not compile, whose
/// top-level code fails, or that exports no `solve` is refused before any rollout: every rollout
/// under it would fail, and those failures would be the harness file's, not the model's.
pub fn initial_harness(config: &RunConfig) -> Result<Harness, ExperimentError> {
    if let Some(stock) = stock_harness(&config.harness.initial) {
        return Ok(stock.harness());
    }
    let path = &config.harness.initial;
    let source = std::fs::read_to_string(path).map_err(|e| ExperimentError::Harness(format!("{path}: {e}")))?;
    validate(&source, &config.harness.limits).map_err(|e| ExperimentError::Harness(format!("{path}: {e}")))?;
    Ok(Harness::from_source(source))
}

/// The device `[model]` names (whale-study's coupling loads each kept weights onto it).
pub fn device(config: &RunConfig) -> Result<Device, ExperimentError> {
    config.model.open_device().map_err(ExperimentError::Model)
}

/// The model's dtype; the configuration was validated to name f32 or bf16.
pub fn dtype(config: &RunConfig) -> DType {
    config.model.candle_dtype()
}

/// The run's base model directory: `[model] path`, else the domain's base model (made once).
pub fn model_dir(config: &RunConfig) -> Result<PathBuf, ExperimentError> {
    match &config.model.path {
        Some(path) => Ok(path.clone()),
        None => {
            whale_pretrain::ensure_base_model(config.tasks.domain).map_err(|e| ExperimentError::Model(e.to_string()))
        }
    }
}

/// `stored` with the settings a run may resume under a change of taken from `config`:
/// `keep_phase_weights` and `prefix_cache_tokens` ([`Experiment::check_stored_config`]).
fn with_resumable_settings(mut stored: RunConfig, config: &RunConfig) -> RunConfig {
    stored.weights.keep_phase_weights = config.weights.keep_phase_weights;
    stored.model.prefix_cache_tokens = config.model.prefix_cache_tokens;
    stored
}

/// The in-process engine's settings from `[model]`.
pub fn engine_config(config: &RunConfig) -> EngineConfig {
    EngineConfig {
        max_batch_size: config.model.max_batch_size,
        max_context: config.model.max_context,
        max_prefill_tokens: config.model.max_prefill_tokens,
        prefix_cache_tokens: config.model.prefix_cache_tokens,
        quantized: config.model.quantized,
        ..EngineConfig::default()
    }
}

/// The policy of a run and how its weights change.
struct Model {
    /// What every rollout talks to.
    policy: Arc<dyn Policy>,
    weights: Weights,
    /// The base model as a trainer names it (the base of a LoRA adapter).
    base_model: PathBuf,
}

/// The in-process engine over `model.path` (or the default base model).
fn local_model(config: &RunConfig) -> Result<Model, ExperimentError> {
    let device = device(config)?;
    let model_dir = model_dir(config)?;
    let policy = LocalPolicy::load(&model_dir, dtype(config), &device, engine_config(config))
        .map_err(|e| ExperimentError::Model(format!("{}: {e}", model_dir.display())))?;
    let engine = Arc::new(policy);
    let (policy, weights): (Arc<dyn Policy>, Weights) = match &config.weights.trainer {
        Some(trainer) => {
            let external = ExternalTrainer {
                config: trainer.clone(),
                base: trainer.base.clone().unwrap_or_else(|| model_dir.display().to_string()),
                name_prefix: format!("{}-{}", config.name, config.condition),
                target: WeightsTarget::Local { policy: engine.clone(), base: Box::new(engine.decoder()) },
            };
            (engine, Weights::External(Box::new(external)))
        }
        None => (engine.clone(), Weights::InProcess { engine, trainer: None, reference: None }),
    };
    Ok(Model { policy, weights, base_model: model_dir })
}

/// The model behind `[server]`: no weights are loaded here.
fn served_model(config: &RunConfig, server: &ServerConfig) -> Result<Model, ExperimentError> {
    let served = |e: &dyn std::fmt::Display| ExperimentError::Model(format!("[server] {}: {e}", server.base_url));
    let policy = Arc::new(ServedPolicy::new(server).map_err(|e| served(&e))?);
    let weights = match &config.weights.trainer {
        Some(trainer) => {
            let base = trainer.base.clone().or_else(|| config.model.path.as_ref().map(|p| p.display().to_string()));
            let external = ExternalTrainer {
                config: trainer.clone(),
                base: base.unwrap_or_else(|| server.model.clone()),
                name_prefix: format!("{}-{}", config.name, config.condition),
                target: WeightsTarget::Server {
                    admin: ServerAdmin::new(server).map_err(|e| served(&e))?,
                    policy: policy.clone(),
                    base_model: server.model.clone(),
                },
            };
            Weights::External(Box::new(external))
        }
        None => Weights::Fixed,
    };
    Ok(Model { policy, weights, base_model: PathBuf::from(&server.model) })
}

/// How weight steps change the policy.
enum Weights {
    /// The in-process trainer on the in-process engine's model (none before it is restored,
    /// and none for harness-only).
    /// `reference` is the starting weights, kept for a policy gradient's KL penalty.
    InProcess { engine: Arc<LocalPolicy>, trainer: Option<RunTrainer>, reference: Option<Box<Decoder>> },
    /// The `[weights.trainer]` command.
    External(Box<ExternalTrainer>),
    /// Never: the served weights of a harness-only run on a `[server]` without a trainer.
    Fixed,
}

/// The phase's settings, from the parts of an experiment it borrows.
fn weight_phase<'a>(
    config: &'a RunConfig,
    environment: &'a Environment,
    train: &'a [Task],
    sampling: &'a whale_policy::SamplingParams,
    progress: bool,
) -> WeightPhase<'a> {
    WeightPhase {
        config: &config.weights,
        environment,
        train,
        limits: &config.harness.limits,
        sampling,
        threads: config.threads,
        seed: config.seed,
        progress,
    }
}

/// A run in progress.
pub struct Experiment {
    dir: RunDir,
    config: RunConfig,
    state: RunState,
    splits: Splits,
    environment: Environment,
    /// The model directory the run starts from (the base of a LoRA adapter).
    base_model: PathBuf,
    /// What every rollout talks to.
    policy: Arc<dyn Policy>,
    weights: Weights,
    search: HarnessSearch,
    scheduler: Scheduler,
    verbosity: Verbosity,
    /// Held for as long as the run is open; declared last, so released last.
    _lock: DirLock,
}

impl Experiment {
    /// Prepares a new run of `config.condition` in `root` (which must not hold a run yet).
    /// Like [`Self::resume`], it locks `root` before writing anything: while another process
    /// writes there it fails with [`ExperimentError::Lock`].
    pub fn create(config: RunConfig, root: &Path, verbosity: Verbosity) -> Result<Self, ExperimentError> {
        Self::create_with(config, root, verbosity, Vec::new())
    }

    /// [`Self::create`] with evaluations of the base weights (version 0) already taken by
    /// another run of the same config, which this run reuses instead of repeating.
    pub fn create_with(
        config: RunConfig,
        root: &Path,
        verbosity: Verbosity,
        base_evals: Vec<EvalMemo>,
    ) -> Result<Self, ExperimentError> {
        let config = config.for_condition();
        let lock = DirLock::create(root)?;
        if root.join(STATE_FILE).is_file() {
            return Err(ExperimentError::Exists(root.to_path_buf()));
        }
        let dir = RunDir::create(root)?;
        crate::run_dir::write_atomic(&dir.path(CONFIG_FILE), config.to_toml()?.as_bytes())?;
        let mut state = RunState::new(config.condition);
        state.evals = base_evals.into_iter().filter(|memo| memo.weights_version == 0).collect();
        let experiment = Self::assemble(dir, lock, config, state, verbosity)?;
        experiment.dir.commit(&experiment.state)?;
        Ok(experiment)
    }

    /// Reopens the run in `root` where its last completed unit left it.
    /// A run killed before its first commit starts afresh from its `config.toml`.
    pub fn resume(root: &Path, verbosity: Verbosity) -> Result<Self, ExperimentError> {
        if !root.join(CONFIG_FILE).is_file() {
            return Err(RunDirError::NotARun(root.to_path_buf()).into());
        }
        let lock = DirLock::acquire(root)?;
        if let Some(previous) = lock.interrupted() {
            eprintln!(
                "note: the last process to write {} ({previous}) did not end normally (a signal, running \
                 out of memory or a machine that went down); resuming after its last completed unit",
                root.display()
            );
        }
        let dir = RunDir::create(root)?;
        let config = RunConfig::load(&dir.path(CONFIG_FILE))?;
        let state = if dir.has_state() { dir.read_state()? } else { RunState::new(config.condition) };
        if state.condition != config.condition {
            return Err(ExperimentError::Mismatch {
                dir: root.to_path_buf(),
                reason: format!("state of {} but config of {}", state.condition, config.condition),
            });
        }
        dir.truncate_metrics(state.metrics_rows)?;
        Self::assemble(dir, lock, config, state, verbosity)
    }

    /// Creates the run, or resumes it when `root` already holds this config's run
    /// ([`Self::check_stored_config`]); a new `keep_phase_weights` or `prefix_cache_tokens` is
    /// stored first ([`Self::store_settings`]), and holds from the next weight phase, or from the
    /// engine the resumed run starts, on.
    pub fn create_or_resume(
        config: RunConfig,
        root: &Path,
        verbosity: Verbosity,
        base_evals: Vec<EvalMemo>,
    ) -> Result<Self, ExperimentError> {
        let config = config.for_condition();
        if !root.join(STATE_FILE).is_file() {
            return Self::create_with(config, root, verbosity, base_evals);
        }
        Self::check_stored_config(&config, root)?;
        Self::store_settings(&config, root)?;
        Self::resume(root, verbosity)
    }

    /// Whether the run in `root` is a run of `config`: its `config.toml` may differ in
    /// `keep_phase_weights`, which changes what a run keeps, and `prefix_cache_tokens`, which
    /// changes how fast the engine computes (and its rounding, as batching does), not what.
    pub fn check_stored_config(config: &RunConfig, root: &Path) -> Result<(), ExperimentError> {
        let config = config.clone().for_condition();
        let stored = RunConfig::load(&root.join(CONFIG_FILE))?;
        if with_resumable_settings(stored, &config) != config {
            return Err(ExperimentError::Mismatch {
                dir: root.to_path_buf(),
                reason: "its config.toml differs from the one given".to_string(),
            });
        }
        Ok(())
    }

    /// Writes `config`'s resumable settings ([`with_resumable_settings`]) into the run's
    /// `config.toml` where they differ, for the resumed run to read.
    fn store_settings(config: &RunConfig, root: &Path) -> Result<(), ExperimentError> {
        let path = root.join(CONFIG_FILE);
        let stored = RunConfig::load(&path)?;
        let given = with_resumable_settings(stored.clone(), config);
        if given != stored {
            crate::run_dir::write_atomic(&path, given.to_toml()?.as_bytes())?;
        }
        Ok(())
    }

    fn assemble(
        dir: RunDir,
        lock: DirLock,
        config: RunConfig,
        state: RunState,
        verbosity: Verbosity,
    ) -> Result<Self, ExperimentError> {
        let splits = task_splits(&config)?;
        let all: Vec<Task> = [&splits.train[..], &splits.search[..], &splits.test[..]].concat();
        let environment = environment(config.tasks.domain, &all, config.tasks.corpus.as_deref(), None)?;
        let Model { policy, weights, base_model } = match &config.server {
            Some(server) => served_model(&config, server)?,
            None => local_model(&config)?,
        };
        let search = open_search(&config, &dir, &splits, initial_harness(&config)?)?;
        let condition = config.condition;
        let weight_step_cost = (config.weights.tasks_per_step * config.weights.rollouts_per_task) as u64;
        let search_iteration_cost = (config.search.candidates * (config.tasks.search + 1)) as u64;
        let scheduler = Scheduler {
            plan: Plan::of(condition, &config.schedule, weight_step_cost, search_iteration_cost),
            budget: config.schedule.budget,
            adaptive: config.schedule.adaptive.clone(),
            search_stale_limit: config.schedule.search_stale_limit,
        };
        let mut experiment = Self {
            dir,
            config,
            state,
            splits,
            environment,
            base_model,
            policy,
            weights,
            search,
            scheduler,
            verbosity,
            _lock: lock,
        };
        experiment.restore_weights()?;
        experiment.restore_examples()?;
        Ok(experiment)
    }

    /// Restores the weights of the last committed step: in-process, the newest checkpoint plus
    /// the journal of the steps after it; with an external trainer, its last update installed
    /// again.
    fn restore_weights(&mut self) -> Result<(), ExperimentError> {
        if self.state.condition == Condition::HarnessOnly {
            return Ok(());
        }
        let engine = match &self.weights {
            Weights::InProcess { engine, .. } => engine.clone(),
            Weights::External(trainer) => {
                let restored = match &self.state.served {
                    Some(served) => trainer.install(served, self.state.weights_version),
                    None => trainer.install_base(self.state.weights_version),
                };
                restored.map_err(trainer_failed(self.dir.root()))?;
                return Ok(());
            }
            Weights::Fixed => return Ok(()),
        };
        let device = device(&self.config)?;
        let model_error = |e: &dyn std::fmt::Display| ExperimentError::Model(e.to_string());
        let weights = &self.config.weights;
        let mut trainer = if self.state.checkpoint_step > 0 {
            let path = self.dir.checkpoint_path(self.state.checkpoint_step);
            weight_phase::resume_trainer(weights, &engine, &path, &device)
        } else {
            weight_phase::new_trainer(weights, &engine, self.config.seed)
        }
        .map_err(|e| model_error(&e))?;
        for step in self.state.checkpoint_step + 1..=self.state.weight_steps {
            let journal: StepJournal = self.dir.read_journal(step)?;
            trainer.apply(&journal, weights).map_err(|e| model_error(&e))?;
        }
        engine.set_weights_version(self.state.weights_version).map_err(|e| model_error(&e))?;
        let reference = if weights.algorithm.is_policy_gradient() && weights.policy_gradient.kl_coef > 0.0 {
            let model = Decoder::load(&self.base_model, dtype(&self.config), &device)
                .map_err(|e| ExperimentError::Model(format!("{}: {e}", self.base_model.display())))?;
            Some(Box::new(model))
        } else {
            None
        };
        self.weights = Weights::InProcess { engine, trainer: Some(trainer), reference };
        Ok(())
    }

    fn restore_examples(&mut self) -> Result<(), ExperimentError> {
        let examples: Vec<Trajectory> =
            self.dir.read_examples()?.iter().filter_map(|line| serde_json::from_str(line).ok()).collect();
        self.search.set_examples(examples);
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        self.dir.root()
    }

    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// Runs to the end of the budget (from wherever the run stands). The report is the caller's
    /// to write, while it still holds this experiment (and so the directory's lock).
    pub fn run(&mut self) -> Result<RunOutcome, ExperimentError> {
        while !self.state.finished {
            // Between units, the memory the last one freed goes back ([`whale_kernels::runtime`]).
            whale_kernels::runtime::release_freed_memory();
            let next = self.scheduler.next(&self.state.outcomes, self.spent());
            let last_eval = self.state.last_eval_at;
            if let Some(reason) = self.eval_schedule().due(&self.state.outcomes, last_eval, next) {
                self.evaluation_unit(reason)?;
                continue;
            }
            let last = self.state.outcomes.last().map(Outcome::phase);
            if last == Some(Phase::Weights) && next != Some(Phase::Weights) {
                self.keep_phase_weights()?;
            }
            match next {
                Some(Phase::Weights) => self.weight_unit()?,
                Some(Phase::Search) => self.search_unit()?,
                None => {
                    self.state.finished = true;
                    self.dir.commit(&self.state)?;
                    self.say_proposals();
                }
            }
        }
        self.outcome()
    }

    fn outcome(&self) -> Result<RunOutcome, ExperimentError> {
        let evals = MetricsRow::read_evaluations(&self.dir)?;
        Ok(RunOutcome {
            dir: self.dir.root().to_path_buf(),
            condition: self.state.condition,
            ledger: self.state.ledger.clone(),
            evals,
        })
    }

    fn eval_schedule(&self) -> EvalSchedule {
        EvalSchedule { every_steps: self.config.eval.every_steps, every_iterations: self.config.eval.every_iterations }
    }

    fn spent(&self) -> Spent {
        Spent {
            training: self.state.ledger.training_rollouts(),
            weights: self.state.ledger.get(Purpose::WeightPhase).rollouts,
        }
    }

    fn incumbent(&self) -> Harness {
        self.search.incumbent().harness()
    }

    /// The harnesses weight steps roll out with: the incumbent, or the fast-slow population.
    fn training_harnesses(&self) -> Vec<Harness> {
        if !self.state.condition.uses_population() {
            return vec![self.incumbent()];
        }
        let archive = self.search.archive();
        let population: Vec<Harness> = self
            .state
            .population
            .iter()
            .filter_map(|hash| archive.candidates().find(|c| &c.meta.hash == hash).map(|c| c.harness()))
            .collect();
        if population.is_empty() {
            vec![self.incumbent()]
        } else {
            population
        }
    }

    fn evaluation_unit(&mut self, reason: EvalReason) -> Result<(), ExperimentError> {
        let harness = self.incumbent();
        let test = TestSet {
            tasks: &self.splits.test,
            environment: &self.environment,
            k: self.config.eval.k,
            seed: self.config.seed,
            threads: self.config.threads,
            limits: &self.config.harness.limits,
            sampling: &self.config.sampling.params(),
            progress: self.verbosity.progress,
        };
        let record = test.evaluate(reason, &harness, &self.policy, &self.state.evals)?;
        if !record.reused {
            self.state.evals.push(EvalMemo {
                harness_id: record.harness_id.clone(),
                weights_version: record.weights_version,
                scores: record.scores,
                task_means: record.task_means.clone(),
            });
        }
        self.state.ledger.record(Purpose::TestEval, record.spend());
        self.state.last_eval_at = Some(self.state.outcomes.len());
        self.say(format!(
            "eval ({:?}): mean@{} {} pass {:.3} maj {:.3}{}",
            record.reason,
            record.scores.k,
            record.scores.mean,
            record.scores.pass.value,
            record.scores.maj.value,
            if record.reused { " (reused)" } else { "" }
        ));
        let before = cumulative(&self.state.ledger);
        self.commit_unit(RowKind::Evaluation, serde_json::to_value(&record).unwrap_or(Value::Null), before)
    }

    fn weight_unit(&mut self) -> Result<(), ExperimentError> {
        let before = cumulative(&self.state.ledger);
        let step = self.state.weight_steps + 1;
        let (report, examples, replaced) = match self.weights {
            Weights::InProcess { .. } => {
                let (report, examples) = self.in_process_step(step)?;
                (report, examples, None)
            }
            Weights::External(_) => self.external_step(step)?,
            Weights::Fixed => {
                return Err(ExperimentError::Model("a weight step needs [weights.trainer] on a [server]".to_string()))
            }
        };
        let lines: Vec<String> = examples.iter().map(Trajectory::to_json_line).collect();
        self.dir.write_examples(&lines)?;
        self.search.set_examples(examples);
        self.state.weight_steps = step;
        self.state.outcomes.push(Outcome::Weights { reward: report.reward_mean });
        self.state.ledger.record(
            Purpose::WeightPhase,
            Spend {
                rollouts: report.rollouts as u64,
                prompt_tokens: report.prompt_tokens as u64,
                completion_tokens: report.completion_tokens as u64,
                wall_s: report.rollout_seconds + report.train_seconds,
            },
        );
        self.say(step_line(&report));
        let row = serde_json::to_value(&report).unwrap_or(Value::Null);
        self.commit_unit(RowKind::WeightStep, row, before)?;
        match (&self.weights, replaced) {
            (Weights::External(trainer), Some(replaced)) => {
                trainer.retire(&replaced).map_err(trainer_failed(self.dir.root()))?
            }
            (Weights::InProcess { .. }, _) if step.is_multiple_of(self.config.weights.checkpoint_every) => {
                self.dir.prune(step)?
            }
            _ => {}
        }
        Ok(())
    }

    /// A step trained in-process: rollouts, one SFT pass, the journal, a checkpoint if due.
    fn in_process_step(&mut self, step: u64) -> Result<(StepReport, Vec<Trajectory>), ExperimentError> {
        let harnesses = self.training_harnesses();
        let sampling = self.config.sampling.params();
        let phase =
            weight_phase(&self.config, &self.environment, &self.splits.train, &sampling, self.verbosity.progress);
        let Weights::InProcess { engine, trainer: Some(trainer), reference } = &mut self.weights else {
            return Err(ExperimentError::Model("no trainer".to_string()));
        };
        let (report, journal, kept) = phase.step_run(step, &harnesses, engine, trainer, reference.as_deref())?;
        self.dir.write_journal(step, &journal)?;
        if report.updates > 0 {
            self.state.weights_version += 1;
            engine
                .set_weights_version(self.state.weights_version)
                .map_err(|e| ExperimentError::Model(e.to_string()))?;
        }
        if step.is_multiple_of(self.config.weights.checkpoint_every) {
            self.save_checkpoint(step)?;
        }
        Ok((report, kept.into_iter().take(EXAMPLES_KEPT).collect()))
    }

    /// A step trained by the external command: rollouts (or those of an earlier attempt),
    /// `samples.jsonl`, the command, its output installed. Returns the step's report, the
    /// kept rollouts for the proposer and the weights the update replaced.
    fn external_step(
        &mut self,
        step: u64,
    ) -> Result<(StepReport, Vec<Trajectory>, Option<ServedWeights>), ExperimentError> {
        let files = StepFiles::new(self.dir.weight_step_dir(step));
        let record = match files.read_record()? {
            Some(record) => record,
            None => self.external_rollouts(step, &files)?,
        };
        let mut report = record.report;
        let Weights::External(trainer) = &self.weights else {
            return Err(ExperimentError::Model("no external trainer".to_string()));
        };
        if report.examples == 0 {
            return Ok((report, record.examples, None));
        }
        let update = Update {
            step,
            files: &files,
            previous: self.state.served.as_ref(),
            version: self.state.weights_version + 1,
            run_dir: self.dir.root(),
            progress: self.verbosity.progress,
        };
        let (weights, seconds) = trainer.update(&update).map_err(trainer_failed(self.dir.root()))?;
        report.updates = 1;
        report.train_seconds = seconds;
        report.loss = files.trainer_loss().map_err(trainer_failed(self.dir.root()))?;
        self.state.weights_version += 1;
        let replaced = self.state.served.replace(weights);
        Ok((report, record.examples, replaced))
    }

    /// The rollouts of an external step, their samples and record written to the step's files.
    fn external_rollouts(&self, step: u64, files: &StepFiles) -> Result<RolloutRecord, ExperimentError> {
        let harnesses = self.training_harnesses();
        let sampling = self.config.sampling.params();
        let phase =
            weight_phase(&self.config, &self.environment, &self.splits.train, &sampling, self.verbosity.progress);
        let started = Instant::now();
        let trajectories = phase.rollouts(step, &harnesses, &self.policy)?;
        let rollout_seconds = started.elapsed().as_secs_f64();
        let kept = weight_phase::kept(&trajectories, self.config.weights.reward_threshold);
        let (samples, policy_gradient) = if self.config.weights.algorithm.is_policy_gradient() {
            let signal = phase.signal(&trajectories);
            let samples = policy_gradient_samples(&trajectories, &signal)?;
            let advantages: Vec<f64> = samples.iter().filter_map(|(s, _)| s.advantage).collect();
            (samples, Some(signal.report(&advantages, &PassStats::default())))
        } else {
            let calls = weight_phase::trained_calls(&kept, self.config.weights.skip_truncated);
            (calls.map(|call| (Sample::from_call(call), call.completion_tokens)).collect(), None)
        };
        let trained_tokens = samples.iter().map(|(_, tokens)| tokens).sum();
        let samples = phase.training_order(step, samples.into_iter().map(|(sample, _)| sample).collect());
        let report = StepReport {
            trained_tokens,
            policy_gradient,
            ..weight_phase::rollout_report(step, &trajectories, kept.len(), samples.len(), rollout_seconds)
        };
        let examples = kept.into_iter().take(EXAMPLES_KEPT).cloned().collect();
        let record = RolloutRecord { report, examples };
        files.write(&samples, &record)?;
        Ok(record)
    }

    /// Saves into a partial directory renamed into place; the state names it once committed.
    fn save_checkpoint(&mut self, step: u64) -> Result<(), ExperimentError> {
        let Weights::InProcess { trainer: Some(trainer), .. } = &self.weights else { return Ok(()) };
        let target = self.dir.checkpoint_path(step);
        let partial = target.with_extension("partial");
        for stale in [&partial, &target] {
            if stale.exists() {
                std::fs::remove_dir_all(stale)
                    .map_err(|source| RunDirError::Io { path: stale.to_path_buf(), source })?;
            }
        }
        weight_phase::save_trainer(trainer, &partial, &self.base_model)
            .map_err(|e| ExperimentError::Model(e.to_string()))?;
        std::fs::rename(&partial, &target).map_err(|source| RunDirError::Io { path: target.clone(), source })?;
        self.state.checkpoint_step = step;
        Ok(())
    }

    /// At the end of a weight phase: the weights as they are now, in `phase-weights/vN/`
    /// (written under another name and renamed, so a kill leaves it whole or absent).
    fn keep_phase_weights(&self) -> Result<(), ExperimentError> {
        let Weights::InProcess { trainer: Some(trainer), .. } = &self.weights else { return Ok(()) };
        let version = self.state.weights_version;
        let target = self.dir.phase_weights_path(version);
        if version == 0 || !self.config.weights.keep_phase_weights || target.is_dir() {
            return Ok(());
        }
        let partial = target.with_extension("partial");
        if partial.exists() {
            std::fs::remove_dir_all(&partial).map_err(|source| RunDirError::Io { path: partial.clone(), source })?;
        }
        weight_phase::save_phase_weights(trainer, &partial, &self.base_model)?;
        std::fs::rename(&partial, &target).map_err(|source| RunDirError::Io { path: target, source })?;
        Ok(())
    }

    fn search_unit(&mut self) -> Result<(), ExperimentError> {
        let before = cumulative(&self.state.ledger);
        let starting = self.state.outcomes.last().map(Outcome::phase) != Some(Phase::Search);
        let evaluator = SearchRollouts {
            policy: self.policy.clone(),
            environment: &self.environment,
            config: &self.config,
            dir: &self.dir,
            progress: self.verbosity.progress,
            unit: self.state.units + 1,
        };
        let (kind, row, new_best, proposer_tokens) = if starting {
            let rescore = self.search.rescore_incumbent(&evaluator)?;
            let row = json!({
                "harness_id": rescore.card.hash,
                "weights_version": rescore.card.weights_version,
                "objectives": rescore.card.objectives,
            });
            (RowKind::Rescore, row, false, Spend::default())
        } else {
            let iteration = self.state.search_iterations + 1;
            let mut proposer_tokens = Spend::default();
            if self.search.archive().next_iteration() == iteration {
                let report = self.search.iterate(&evaluator)?;
                proposer_tokens.prompt_tokens = report.proposer_tokens.prompt_tokens;
                proposer_tokens.completion_tokens = report.proposer_tokens.completion_tokens;
                proposer_tokens.wall_s = report.proposer_seconds;
            }
            let (row, new_best) = iteration_row(self.search.archive(), iteration);
            self.state.search_iterations = iteration;
            (RowKind::SearchIteration, row, new_best, proposer_tokens)
        };
        self.refresh_population()?;
        let search = self.dir.search_spends()?.iter().fold(Spend::default(), |mut total, s| {
            total.rollouts += s.spend.rollouts;
            total.prompt_tokens += s.spend.prompt_tokens;
            total.completion_tokens += s.spend.completion_tokens;
            total.wall_s += s.spend.wall_s;
            total
        });
        let rollouts = search.rollouts.saturating_sub(self.state.ledger.get(Purpose::Search).rollouts);
        self.state.ledger.by_purpose.insert(Purpose::Search, search);
        self.state.ledger.record(Purpose::Proposer, proposer_tokens);
        self.state.outcomes.push(Outcome::Search { new_best, rollouts });
        let success = row["objectives"]["success"].as_f64().or_else(|| row["incumbent_success"].as_f64());
        self.say(format!(
            "search {}{}: incumbent success {}",
            if starting {
                "phase starts, incumbent re-scored".to_string()
            } else {
                format!("iteration {}", self.state.search_iterations)
            },
            if new_best { " (new best)" } else { "" },
            success.map_or("-".to_string(), |s| format!("{s:.3}"))
        ));
        self.commit_unit(kind, row, before)
    }

    /// Fast-slow: the per-instance Pareto frontier of the harnesses scored under the current
    /// weights, at most `population` of them.
    fn refresh_population(&mut self) -> Result<(), ExperimentError> {
        if !self.state.condition.uses_population() {
            return Ok(());
        }
        let population = search_phase::population(
            self.search.archive(),
            self.policy.weights_version(),
            self.config.search.population,
        )?;
        if !population.is_empty() {
            self.state.population = population;
        }
        Ok(())
    }

    /// Appends the unit's row (with the cumulative spend) and commits the state.
    fn commit_unit(&mut self, kind: RowKind, mut row: Value, before: Value) -> Result<(), ExperimentError> {
        self.state.units += 1;
        let mut rows = Vec::new();
        if let Some(boundary) = self.phase_boundary(kind, before) {
            rows.push(boundary);
        }
        if let Value::Object(fields) = &mut row {
            fields.insert("kind".to_string(), json!(kind));
            fields.insert("unit".to_string(), json!(self.state.units));
            fields.insert("cumulative".to_string(), cumulative(&self.state.ledger));
        }
        rows.push(row);
        self.dir.append_metrics(&rows)?;
        self.state.metrics_rows += rows.len();
        self.dir.commit(&self.state)?;
        Ok(())
    }

    /// A `phase` row when this unit starts a phase (its first weight step or search unit),
    /// carrying the cumulative spend from before the unit.
    fn phase_boundary(&self, kind: RowKind, before: Value) -> Option<Value> {
        if kind == RowKind::Evaluation {
            return None;
        }
        let outcomes = &self.state.outcomes;
        let current = outcomes.last()?.phase();
        let previous = outcomes.len().checked_sub(2).map(|i| outcomes[i].phase());
        (previous != Some(current)).then(|| {
            json!({
                "kind": RowKind::Phase,
                "phase": current,
                "unit": self.state.units,
                "cumulative": before,
            })
        })
    }

    /// At the run's end: what its proposers did, and why proposals failed (`whale archive DIR
    /// proposals` prints the same, with the proposer's spend).
    fn say_proposals(&self) {
        let record = ProposalRecord::from_events(self.search.archive().events());
        if record.proposed > 0 || !record.failures.is_empty() {
            record.to_string().lines().for_each(|line| self.say(line.to_string()));
        }
    }

    fn say(&self, line: String) {
        if self.verbosity.progress {
            let training = self.state.ledger.training_rollouts();
            eprintln!("[{} {}/{} rollouts] {line}", self.state.condition, training, self.config.schedule.budget);
        }
    }
}

/// An external trainer's failure in the run in `dir` (the error says how to retry the step).
fn trainer_failed(dir: &Path) -> impl Fn(ExternalWeightsError) -> ExperimentError + '_ {
    move |source| ExperimentError::Trainer { dir: dir.to_path_buf(), source: Box::new(source) }
}

/// The cumulative spend every metrics row carries, so curves can be drawn against cost.
fn cumulative(ledger: &Ledger) -> Value {
    let tokens: u64 = ledger.by_purpose.values().map(|s| s.prompt_tokens + s.completion_tokens).sum();
    let wall: f64 = ledger.by_purpose.values().map(|s| s.wall_s).sum();
    json!({
        "training_rollouts": ledger.training_rollouts(),
        "weight_rollouts": ledger.get(Purpose::WeightPhase).rollouts,
        "search_rollouts": ledger.get(Purpose::Search).rollouts,
        "test_rollouts": ledger.get(Purpose::TestEval).rollouts,
        "tokens": tokens,
        "proposer_tokens": ledger.get(Purpose::Proposer).prompt_tokens + ledger.get(Purpose::Proposer).completion_tokens,
        "wall_seconds": wall,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TaskConfig;

    #[test]
    fn a_run_resumes_under_another_prefix_cache_or_kept_phase_weights_and_stores_them() {
        let root = tempfile::tempdir().expect("tempdir");
        let mut config = RunConfig::default();
        config.model.prefix_cache_tokens = 16_384;
        std::fs::write(root.path().join(CONFIG_FILE), config.to_toml().expect("toml")).expect("write");
        let mut given = RunConfig::default();
        given.weights.keep_phase_weights = !config.weights.keep_phase_weights;
        Experiment::check_stored_config(&given, root.path()).expect("the same run");
        Experiment::store_settings(&given, root.path()).expect("stored");
        let stored = RunConfig::load(&root.path().join(CONFIG_FILE)).expect("load");
        assert_eq!(stored, given, "the given settings are what the resumed run reads");
        given.weights.learning_rate *= 2.0;
        let error = Experiment::check_stored_config(&given, root.path()).expect_err("another run");
        assert!(error.to_string().contains("differs from the one given"), "{error}");
    }

    fn test_ids(seed: u64, tasks_seed: Option<u64>) -> Vec<String> {
        let tasks =
            TaskConfig { generate: 200, train: 100, search: 20, test: 40, seed: tasks_seed, ..TaskConfig::default() };
        let config = RunConfig { seed, tasks, ..RunConfig::default() };
        task_splits(&config).expect("splits").test.into_iter().map(|task| task.id).collect()
    }

    /// `[tasks] seed` holds the tasks and the split while the run's seed changes; without it
    /// the run's seed draws them.
    #[test]
    fn a_tasks_seed_keeps_the_tasks_of_runs_with_other_seeds() {
        assert_eq!(test_ids(1, Some(0)), test_ids(0, None));
        assert_eq!(test_ids(1, Some(0)), test_ids(2, Some(0)));
        assert_ne!(test_ids(1, None), test_ids(0, None));
    }
}
