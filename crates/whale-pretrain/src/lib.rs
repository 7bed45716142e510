//! The base models: `whale lm pretrain` and [`ensure_base_model`].
//!
//! whale must run end to end on a laptop without downloading weights, so it trains its own
//! tiny chat models once, from the synthetic corpus of [`corpus`], and caches them under
//! `$WHALE_HOME/models/` (default `~/.cache/whale`). Every later command reuses them. Each
//! domain has its own base model ([`PretrainConfig::for_domain`]): a model this small has
//! room for one domain's skills, not three (docs/base-model.md has the measurements).
//!
//! The pipeline, every stage a function of the seed:
//! 1. build the corpus (math problems in many answer styles, chess puzzles, QA passages);
//! 2. train a byte-level BPE tokenizer on it and write the ChatML template beside it;
//! 3. train a Qwen3-architecture model from scratch with the SFT trainer ([`LossOn`]: math on
//!    assistant turns only, whose prompts are random problem statements it need not produce;
//!    chess and QA on every token, from which a small model learns to read its prompt), warm-up
//!    then cosine decay, a checkpoint every 100 steps so that a killed run resumes where it
//!    stopped;
//! 4. write the final Hugging Face checkpoint, measure mean@8 on held-out tasks of its domain
//!    under the domain's starting harness ([`eval`]), and publish the directory atomically (a
//!    rename), with `whale_pretrain.json` inside as the marker of a complete model.

pub mod corpus;
mod error;
pub mod eval;

pub use error::PretrainError;

use candle_core::{DType, Device};
use corpus::{Conversation, CorpusSpec};
use eval::{EvalReport, EvalSpec};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;
use whale_core::Domain;
use whale_lm::{save_model, GenerationConfig, ModelSize, Qwen3Config, Qwen3Model};
use whale_text::{write_tokenizer_config, CHATML_TEMPLATE, TOKENIZER_FILE};
use whale_train::trainer::TRAINER_STATE_FILE;
use whale_train::{ChatCodec, LrSchedule, SftExample, SftTrainer, StepStats, TrainerConfig};

/// The version of a domain's base model, bumped whenever its corpus, tokenizer or training
/// recipe changes, so that a cached model from an older recipe is never mistaken for the
/// current one. QA's v2 spaces its answers ([`corpus::CorpusSpec::spaced_answers`]).
pub fn base_model_version(domain: Domain) -> &'static str {
    match domain {
        Domain::Math | Domain::Chess => "v1",
        Domain::Qa => "v2",
    }
}

/// Written last into a finished model directory.
pub const DONE_MARKER: &str = "whale_pretrain.json";
/// The evaluation written beside the weights.
pub const EVAL_FILE: &str = "whale_eval.json";
/// The recipe a work directory's checkpoints belong to.
const RECIPE_FILE: &str = "recipe.json";

/// The seed of the default base model.
pub const DEFAULT_SEED: u64 = 0;

const SMALL: ModelSize = ModelSize {
    hidden_size: 128,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 32,
    intermediate_size: 384,
};

/// The model shapes `whale lm pretrain` can train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SizeName {
    /// For tests: seconds per hundred steps.
    Tiny,
    /// 128 wide, 4 layers: about 0.8M parameters plus the embeddings.
    Small,
    /// 256 wide, 4 layers: about 3.1M parameters plus the embeddings.
    Base,
}

impl SizeName {
    pub fn shape(self) -> ModelSize {
        match self {
            SizeName::Tiny => ModelSize::TINY,
            SizeName::Small => SMALL,
            SizeName::Base => ModelSize::BASE,
        }
    }
}

impl std::str::FromStr for SizeName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "tiny" => Ok(SizeName::Tiny),
            "small" => Ok(SizeName::Small),
            "base" => Ok(SizeName::Base),
            other => Err(format!("unknown size `{other}` (expected tiny, small or base)")),
        }
    }
}

/// Everything that determines the base model (and its evaluation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PretrainConfig {
    /// The domain the model serves.
    #[serde(default = "math_domain")]
    pub domain: Domain,
    pub seed: u64,
    pub size: SizeName,
    pub vocab_size: usize,
    pub corpus: CorpusSpec,
    pub steps: u64,
    /// Examples (assistant turns) per optimizer step.
    pub batch_size: usize,
    pub micro_batch_size: usize,
    pub learning_rate: f64,
    pub warmup_steps: u64,
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    /// Examples longer than this are left out of the corpus.
    pub max_seq_len: usize,
    /// Which tokens the loss is on.
    #[serde(default)]
    pub loss: LossOn,
    /// The model's context window.
    pub context_window: usize,
    pub checkpoint_every: u64,
    pub eval: EvalSpec,
}

fn math_domain() -> Domain {
    Domain::Math
}

/// Which tokens of the corpus the model is trained to predict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossOn {
    /// Each assistant turn, given the conversation before it (one example per turn).
    #[default]
    Replies,
    /// Every token of each conversation, prompts included (one example per conversation).
    Everything,
}

impl PretrainConfig {
    /// The math base model's recipe for `seed` (the default model of `whale demo`).
    pub fn default_for_seed(seed: u64) -> Self {
        Self::for_domain(Domain::Math, seed)
    }

    /// The recipe of the base model that serves `domain`. Math keeps a little of the other
    /// domains in its corpus (the recipe the demo's figures come from); chess and QA models
    /// learn their own domain only.
    pub fn for_domain(domain: Domain, seed: u64) -> Self {
        let mut config = Self::math(seed);
        config.domain = domain;
        config.eval = EvalSpec::for_domain(domain);
        let (chess_share, qa_share, conversations, steps, spaced_answers) = match domain {
            Domain::Math => return config,
            Domain::Chess => (1.0, 0.0, 16_000, 900, false),
            Domain::Qa => (0.0, 1.0, 12_000, 1600, true),
        };
        config.corpus = CorpusSpec {
            conversations,
            math_share: 0.0,
            chess_share,
            qa_share,
            chess_difficulties: [1, 2],
            extended_styles: true,
            spaced_answers,
            ..config.corpus
        };
        config.steps = steps;
        config.loss = LossOn::Everything;
        config
    }

    fn math(seed: u64) -> Self {
        Self {
            domain: Domain::Math,
            seed,
            size: SizeName::Small,
            vocab_size: 2048,
            corpus: CorpusSpec {
                conversations: 24_000,
                math_share: 0.84,
                chess_share: 0.06,
                qa_share: 0.10,
                math_difficulties: vec![(1, 0.5), (2, 0.35), (3, 0.15)],
                chess_difficulties: [3, 4],
                extended_styles: false,
                spaced_answers: false,
                held_out: HashSet::new(),
            },
            steps: 900,
            batch_size: 32,
            micro_batch_size: 8,
            learning_rate: 2e-3,
            warmup_steps: 60,
            min_lr_ratio: 0.1,
            weight_decay: 0.01,
            max_seq_len: 384,
            loss: LossOn::Replies,
            context_window: 2048,
            checkpoint_every: 100,
            eval: EvalSpec::default(),
        }
    }

    /// A recipe that pretrains in seconds (tiny model, small corpus, a few steps, a 2 x 2
    /// evaluation), for tests of code that needs some trained model.
    pub fn tiny(seed: u64, steps: u64) -> Self {
        let mut config = Self::default_for_seed(seed);
        config.size = SizeName::Tiny;
        config.steps = steps;
        config.corpus.conversations = 240;
        config.eval.tasks = 2;
        config.eval.samples = 2;
        config
    }

    /// The directory name under `$WHALE_HOME/models/`: `base-<version>-seed<seed>` for the
    /// math recipe, `base-<version>-<domain>-seed<seed>` for the others, with a fingerprint of
    /// the settings appended for any other recipe.
    pub fn model_name(&self) -> String {
        let name = match self.domain {
            Domain::Math => format!("base-{}-seed{}", base_model_version(Domain::Math), self.seed),
            Domain::Chess | Domain::Qa => {
                format!("base-{}-{}-seed{}", base_model_version(self.domain), self.domain, self.seed)
            }
        };
        if *self == Self::for_domain(self.domain, self.seed) {
            return name;
        }
        let settings = serde_json::to_string(self).unwrap_or_default();
        let digest = Sha256::digest(settings.as_bytes());
        let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
        format!("{name}-{hex}")
    }
}

fn io_error(path: &Path, error: impl std::fmt::Display) -> PretrainError {
    PretrainError::Io { path: path.to_path_buf(), reason: error.to_string() }
}

/// `$WHALE_HOME`, else `~/.cache/whale`, else `.whale` in the working directory.
pub fn whale_home() -> PathBuf {
    if let Some(home) = std::env::var_os("WHALE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache").join("whale"),
        None => PathBuf::from(".whale"),
    }
}

/// Where a finished model of `config` lives.
pub fn model_dir(home: &Path, config: &PretrainConfig) -> PathBuf {
    home.join("models").join(config.model_name())
}

/// Whether `dir` holds a finished base model.
pub fn is_complete(dir: &Path) -> bool {
    dir.join(DONE_MARKER).is_file()
}

/// How a call to [`pretrain`] behaves, apart from what it trains.
#[derive(Debug, Clone, Default)]
pub struct PretrainOptions {
    /// Retrain even if the model exists (checkpoints of an unfinished run are still resumed).
    pub force: bool,
    /// Stop once this many steps are done, leaving the checkpoint to resume from (a test hook
    /// that behaves like a kill right after a checkpoint).
    pub stop_after: Option<u64>,
    /// Draw a progress bar on stderr (when it is a terminal; a log line per checkpoint otherwise).
    pub progress: bool,
}

/// What [`pretrain`] did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PretrainOutcome {
    /// The model existed and was reused.
    Reused { dir: PathBuf },
    /// The model was trained (or finished) now.
    Trained { dir: PathBuf, summary: Box<PretrainSummary> },
    /// `stop_after` was reached; the run resumes from `step`.
    Stopped { step: u64 },
}

impl PretrainOutcome {
    /// The finished model's directory, if there is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            PretrainOutcome::Reused { dir } | PretrainOutcome::Trained { dir, .. } => Some(dir),
            PretrainOutcome::Stopped { .. } => None,
        }
    }
}

/// The content of [`DONE_MARKER`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PretrainSummary {
    pub version: String,
    pub config: PretrainConfig,
    pub parameters: usize,
    pub examples: usize,
    pub steps: u64,
    /// The step the last invocation started from (0 unless it resumed).
    pub resumed_from: u64,
    pub tokens_seen: u64,
    /// Mean training loss over the last 50 steps.
    pub final_loss: f64,
    /// Seconds of training in the last invocation, of evaluation, and of the whole invocation.
    pub train_seconds: f64,
    pub eval_seconds: f64,
    pub total_seconds: f64,
    pub eval: EvalReport,
}

/// The base model that serves `domain`, trained first if it is not cached yet (with a
/// progress bar).
pub fn ensure_base_model(domain: Domain) -> Result<PathBuf, PretrainError> {
    let config = PretrainConfig::for_domain(domain, DEFAULT_SEED);
    let options = PretrainOptions { progress: true, ..PretrainOptions::default() };
    let outcome = pretrain(&config, &whale_home(), &options)?;
    outcome.dir().map(Path::to_path_buf).ok_or_else(|| PretrainError::Io {
        path: model_dir(&whale_home(), &config),
        reason: "pretraining stopped before the end".to_string(),
    })
}

/// Trains (or resumes, or reuses) the model of `config` under `home`. Concurrent calls for
/// the same model wait for each other through a lock file.
pub fn pretrain(
    config: &PretrainConfig,
    home: &Path,
    options: &PretrainOptions,
) -> Result<PretrainOutcome, PretrainError> {
    let started = Instant::now();
    let final_dir = model_dir(home, config);
    if is_complete(&final_dir) && !options.force {
        return Ok(PretrainOutcome::Reused { dir: final_dir });
    }
    let work = home.join("pretrain").join(config.model_name());
    std::fs::create_dir_all(&work).map_err(|e| io_error(&work, e))?;
    let lock_path = work.join("lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| io_error(&lock_path, e))?;
    lock.lock().map_err(|e| io_error(&lock_path, e))?;
    if is_complete(&final_dir) && !options.force {
        return Ok(PretrainOutcome::Reused { dir: final_dir });
    }
    let report = |text: String| {
        if options.progress {
            eprintln!("{text}");
        }
    };
    report(format!("pretraining the base model {} into {}", config.model_name(), final_dir.display()));
    if claim_work_dir(&work, config)? {
        report(format!("{}: left by another recipe; starting afresh", work.display()));
    }
    let eval_tasks = eval::tasks(&config.eval);
    let prepared = prepare(config, &work, &eval_tasks)?;
    report(format!(
        "corpus: {} conversations, {} training examples ({:.0}s)",
        prepared.conversations,
        prepared.examples.len(),
        started.elapsed().as_secs_f64()
    ));
    let checkpoints = work.join("checkpoints");
    let run = match train(config, &checkpoints, &prepared.codec, &prepared.examples, options)? {
        TrainEnd::Finished(run) => run,
        TrainEnd::Stopped(step) => return Ok(PretrainOutcome::Stopped { step }),
    };
    report(format!(
        "evaluating mean@{} on {} {} tasks (difficulty {}) with {}",
        config.eval.samples,
        config.eval.tasks,
        config.domain,
        config.eval.difficulty,
        eval::starting_harness(config.domain)
    ));
    let staging = home.join("models").join(format!(".{}.partial", config.model_name()));
    let summary = publish(config, &run, &prepared, &eval_tasks, &staging, started)?;
    remove_dir_if_exists(&final_dir)?;
    std::fs::rename(&staging, &final_dir).map_err(|e| io_error(&final_dir, e))?;
    remove_dir_if_exists(&checkpoints)?;
    Ok(PretrainOutcome::Trained { dir: final_dir, summary: Box::new(summary) })
}

/// Marks `work` as the work directory of `config`'s run. The tokenizer and checkpoints that
/// another recipe left there (the recipe changed under the same name, or an unknown one) are
/// removed rather than resumed; returns whether anything was.
fn claim_work_dir(work: &Path, config: &PretrainConfig) -> Result<bool, PretrainError> {
    let path = work.join(RECIPE_FILE);
    let recipe = serde_json::to_string_pretty(config).map_err(|e| io_error(&path, e))? + "\n";
    if std::fs::read_to_string(&path).is_ok_and(|existing| existing == recipe) {
        return Ok(false);
    }
    let leftovers = ["tokenizer", "tokenizer.partial", "checkpoints"].map(|name| work.join(name));
    let stale = leftovers.iter().any(|dir| dir.exists());
    for dir in &leftovers {
        remove_dir_if_exists(dir)?;
    }
    std::fs::write(&path, recipe).map_err(|e| io_error(&path, e))?;
    Ok(stale)
}

/// The tokenizer and the training examples of a run.
struct Prepared {
    conversations: usize,
    tokenizer_dir: PathBuf,
    codec: ChatCodec,
    examples: Vec<SftExample>,
}

/// Builds the corpus without the evaluation questions, and its tokenizer (kept in `work`).
fn prepare(config: &PretrainConfig, work: &Path, eval_tasks: &[whale_core::Task]) -> Result<Prepared, PretrainError> {
    let mut corpus_spec = config.corpus.clone();
    corpus_spec.held_out = eval::held_out(eval_tasks);
    let corpus = corpus::build(&corpus_spec, config.seed);
    let tokenizer_dir = work.join("tokenizer");
    let codec = prepare_tokenizer(&corpus, config, &tokenizer_dir)?;
    let examples = training_examples(&codec, &corpus, config)?;
    Ok(Prepared { conversations: corpus.len(), tokenizer_dir, codec, examples })
}

/// Writes the finished model into `staging` with its evaluation and, last, its summary.
fn publish(
    config: &PretrainConfig,
    run: &TrainedRun,
    prepared: &Prepared,
    eval_tasks: &[whale_core::Task],
    staging: &Path,
    started: Instant,
) -> Result<PretrainSummary, PretrainError> {
    remove_dir_if_exists(staging)?;
    write_model(&run.trainer, &prepared.tokenizer_dir, staging)?;
    let eval_started = Instant::now();
    let eval_report = eval::evaluate_dir(staging, &config.eval, eval_tasks)?;
    write_json(&staging.join(EVAL_FILE), &eval_report)?;
    let summary = PretrainSummary {
        version: base_model_version(config.domain).to_string(),
        config: config.clone(),
        parameters: run.trainer.model().settings().parameter_count(),
        examples: prepared.examples.len(),
        steps: run.trainer.state().step,
        resumed_from: run.resumed_from,
        tokens_seen: run.trainer.state().tokens_seen,
        final_loss: run.final_loss,
        train_seconds: run.seconds,
        eval_seconds: eval_started.elapsed().as_secs_f64(),
        total_seconds: started.elapsed().as_secs_f64(),
        eval: eval_report,
    };
    write_json(&staging.join(DONE_MARKER), &summary)?;
    Ok(summary)
}

fn remove_dir_if_exists(dir: &Path) -> Result<(), PretrainError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(dir, e)),
        _ => Ok(()),
    }
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), PretrainError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| io_error(path, e))?;
    std::fs::write(path, text + "\n").map_err(|e| io_error(path, e))
}

/// The tokenizer of the corpus, trained once and kept in `dir` (a resumed run must see the same
/// ids), with the ChatML `tokenizer_config.json`.
fn prepare_tokenizer(corpus: &[Conversation], config: &PretrainConfig, dir: &Path) -> Result<ChatCodec, PretrainError> {
    if dir.join(TOKENIZER_FILE).is_file() {
        return Ok(ChatCodec::load(dir)?);
    }
    let partial = dir.with_extension("partial");
    remove_dir_if_exists(&partial)?;
    std::fs::create_dir_all(&partial).map_err(|e| io_error(&partial, e))?;
    let template = whale_text::ChatTemplate::chatml();
    let options = whale_text::RenderOptions::default();
    let texts: Vec<String> = corpus.iter().map(|c| template.render(&c.messages, &options)).collect::<Result<_, _>>()?;
    let tokenizer = whale_text::Tokenizer::train_bpe(texts.iter().map(String::as_str), config.vocab_size)?;
    tokenizer.save(partial.join(TOKENIZER_FILE))?;
    write_tokenizer_config(&partial, CHATML_TEMPLATE, &tokenizer.specials(), config.context_window)?;
    std::fs::rename(&partial, dir).map_err(|e| io_error(dir, e))?;
    Ok(ChatCodec::load(dir)?)
}

/// The corpus as training examples ([`LossOn`]), those longer than `max_seq_len` left out.
fn training_examples(
    codec: &ChatCodec,
    corpus: &[Conversation],
    config: &PretrainConfig,
) -> Result<Vec<SftExample>, PretrainError> {
    let mut examples = Vec::new();
    for conversation in corpus {
        let messages = &conversation.messages;
        let conversation_examples = match config.loss {
            LossOn::Replies => codec.conversation_examples(messages)?,
            LossOn::Everything => vec![codec.whole_conversation_example(messages)?],
        };
        for example in conversation_examples {
            if example.tokens() <= config.max_seq_len {
                examples.push(example);
            }
        }
    }
    if examples.is_empty() {
        return Err(PretrainError::EmptyCorpus(config.max_seq_len));
    }
    Ok(examples)
}

/// How a call to [`train`] ended.
enum TrainEnd {
    Finished(Box<TrainedRun>),
    /// `stop_after` stopped it after this many steps, all checkpointed.
    Stopped(u64),
}

/// A finished training run.
struct TrainedRun {
    trainer: SftTrainer<Qwen3Model>,
    resumed_from: u64,
    final_loss: f64,
    seconds: f64,
}

fn model_config(config: &PretrainConfig, codec: &ChatCodec) -> Qwen3Config {
    let mut model = Qwen3Config::with_size(codec.tokenizer.vocab_size(), config.size.shape());
    model.max_position_embeddings = config.context_window;
    model.eos_token_id = vec![codec.tokenizer.specials().im_end];
    model
}

fn trainer_config(config: &PretrainConfig, codec: &ChatCodec) -> TrainerConfig {
    TrainerConfig {
        learning_rate: config.learning_rate,
        warmup_steps: config.warmup_steps,
        schedule: LrSchedule::Cosine { total_steps: config.steps, min_lr_ratio: config.min_lr_ratio },
        weight_decay: config.weight_decay,
        micro_batch_size: config.micro_batch_size,
        max_seq_len: config.max_seq_len,
        pad_token_id: codec.tokenizer.specials().endoftext,
        ..TrainerConfig::default()
    }
}

/// Trains up to `config.steps`, resuming from the latest checkpoint in `checkpoints`, unless
/// `options.stop_after` stops it first.
fn train(
    config: &PretrainConfig,
    checkpoints: &Path,
    codec: &ChatCodec,
    examples: &[SftExample],
    options: &PretrainOptions,
) -> Result<TrainEnd, PretrainError> {
    let mut trainer = start_trainer(config, checkpoints, codec)?;
    let resumed_from = trainer.state().step;
    let generation = GenerationConfig::for_model(trainer.model().config());
    let mut order = EpochOrder::new(examples.len(), config.seed);
    let mut progress = Progress::new(config.steps, resumed_from, options.progress);
    while trainer.state().step < config.steps {
        let step = trainer.state().step;
        if options.stop_after.is_some_and(|stop| step >= stop) {
            progress.bar.abandon();
            save_checkpoint(&trainer, &generation, checkpoints)?;
            return Ok(TrainEnd::Stopped(step));
        }
        let batch: Vec<SftExample> =
            order.batch(step, config.batch_size).into_iter().map(|i| examples[i].clone()).collect();
        let stats = trainer.step(&batch)?;
        progress.record(&batch, &stats);
        if stats.step % config.checkpoint_every == 0 || stats.step == config.steps {
            save_checkpoint(&trainer, &generation, checkpoints)?;
            progress.log_checkpoint(&stats, config.steps);
        }
    }
    progress.bar.finish();
    let (final_loss, seconds) = (progress.recent_loss(), progress.started.elapsed().as_secs_f64());
    Ok(TrainEnd::Finished(Box::new(TrainedRun { trainer, resumed_from, final_loss, seconds })))
}

/// The trainer at the latest checkpoint, or a fresh model seeded by `config.seed`.
fn start_trainer(
    config: &PretrainConfig,
    checkpoints: &Path,
    codec: &ChatCodec,
) -> Result<SftTrainer<Qwen3Model>, PretrainError> {
    let trainer_config = trainer_config(config, codec);
    Ok(match latest_checkpoint(checkpoints)? {
        Some(dir) => SftTrainer::resume(&dir, trainer_config, DType::F32, &Device::Cpu)?,
        None => {
            let model = Qwen3Model::new_random(&model_config(config, codec), config.seed, DType::F32, &Device::Cpu)?;
            SftTrainer::new(model, trainer_config)?
        }
    })
}

/// Losses over this many steps are averaged in logs and in the summary.
const LOSS_WINDOW: usize = 50;

/// The progress bar (on a terminal) or one log line per checkpoint (otherwise).
struct Progress {
    bar: ProgressBar,
    visible: bool,
    started: Instant,
    losses: Vec<f64>,
    input_tokens: usize,
}

impl Progress {
    fn new(steps: u64, done: u64, visible: bool) -> Self {
        let target = if visible { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(steps), target);
        let style = ProgressStyle::with_template("{bar:30} {pos}/{len} steps · {msg} · {elapsed_precise} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_position(done);
        Self { bar, visible, started: Instant::now(), losses: Vec::new(), input_tokens: 0 }
    }

    fn tokens_per_second(&self) -> f64 {
        self.input_tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    fn record(&mut self, batch: &[SftExample], stats: &StepStats) {
        self.input_tokens += batch.iter().map(SftExample::tokens).sum::<usize>();
        self.losses.push(stats.loss);
        self.bar.set_position(stats.step);
        self.bar.set_message(format!("loss {:.3} · {:.0} tok/s", stats.loss, self.tokens_per_second()));
    }

    /// Mean loss of the last [`LOSS_WINDOW`] steps of this invocation (NaN before any step).
    fn recent_loss(&self) -> f64 {
        let window = &self.losses[self.losses.len().saturating_sub(LOSS_WINDOW)..];
        window.iter().sum::<f64>() / window.len() as f64
    }

    fn log_checkpoint(&self, stats: &StepStats, steps: u64) {
        if self.visible && self.bar.is_hidden() {
            eprintln!(
                "step {}/{steps} loss {:.4} lr {:.2e} {:.0} tok/s {:.0}s",
                stats.step,
                self.recent_loss(),
                stats.learning_rate,
                self.tokens_per_second(),
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// A fresh permutation of the examples per epoch, seeded by (seed, epoch), so the batch of
/// step `s` depends only on `s`: a resumed run sees exactly the batches it would have seen.
struct EpochOrder {
    len: usize,
    seed: u64,
    epoch: Option<usize>,
    permutation: Vec<usize>,
}

impl EpochOrder {
    fn new(len: usize, seed: u64) -> Self {
        Self { len, seed, epoch: None, permutation: Vec::new() }
    }

    fn batch(&mut self, step: u64, batch_size: usize) -> Vec<usize> {
        let start = step as usize * batch_size;
        (start..start + batch_size).map(|position| self.at(position)).collect()
    }

    fn at(&mut self, position: usize) -> usize {
        let epoch = position / self.len;
        if self.epoch != Some(epoch) {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x5EED_0000_0000_0000);
            rng.set_stream(epoch as u64);
            self.permutation = (0..self.len).collect();
            self.permutation.shuffle(&mut rng);
            self.epoch = Some(epoch);
        }
        self.permutation[position % self.len]
    }
}

/// `checkpoints/step-NNNNNN` with the highest step whose save completed.
fn latest_checkpoint(checkpoints: &Path) -> Result<Option<PathBuf>, PretrainError> {
    let entries = match std::fs::read_dir(checkpoints) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(checkpoints, e)),
    };
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in entries {
        let path = entry.map_err(|e| io_error(checkpoints, e))?.path();
        let step = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("step-")?.parse::<u64>().ok());
        if let Some(step) = step.filter(|_| path.join(TRAINER_STATE_FILE).is_file()) {
            if best.as_ref().is_none_or(|(b, _)| step > *b) {
                best = Some((step, path));
            }
        }
    }
    Ok(best.map(|(_, path)| path))
}

/// Saves into a fresh `step-NNNNNN` directory (written under a temporary name, then renamed)
/// and removes the older checkpoints.
fn save_checkpoint(
    trainer: &SftTrainer<Qwen3Model>,
    generation: &GenerationConfig,
    checkpoints: &Path,
) -> Result<(), PretrainError> {
    let name = format!("step-{:06}", trainer.state().step);
    let partial = checkpoints.join(format!("{name}.partial"));
    remove_dir_if_exists(&partial)?;
    trainer.save(&partial, generation)?;
    let dir = checkpoints.join(&name);
    remove_dir_if_exists(&dir)?;
    std::fs::rename(&partial, &dir).map_err(|e| io_error(&dir, e))?;
    for entry in std::fs::read_dir(checkpoints).map_err(|e| io_error(checkpoints, e))? {
        let path = entry.map_err(|e| io_error(checkpoints, e))?.path();
        if path != dir {
            remove_dir_if_exists(&path)?;
        }
    }
    Ok(())
}

/// The final model in the Hugging Face layout: weights, configs and tokenizer files.
fn write_model(trainer: &SftTrainer<Qwen3Model>, tokenizer_dir: &Path, dir: &Path) -> Result<(), PretrainError> {
    let generation = GenerationConfig::for_model(trainer.model().config());
    save_model(trainer.model(), &generation, dir)?;
    ChatCodec::copy_files(tokenizer_dir, dir)?;
    Ok(())
}

/// The [`DONE_MARKER`] of a finished model directory.
pub fn read_summary(dir: &Path) -> Result<PretrainSummary, PretrainError> {
    let path = dir.join(DONE_MARKER);
    let text = std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
    serde_json::from_str(&text).map_err(|e| io_error(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_recipe_has_the_plain_name() {
        assert_eq!(PretrainConfig::default_for_seed(4).model_name(), "base-v1-seed4");
        let tiny = PretrainConfig::tiny(4, 10).model_name();
        assert!(tiny.starts_with("base-v1-seed4-"), "{tiny}");
        assert_ne!(tiny, PretrainConfig::tiny(4, 11).model_name());
        assert_eq!(tiny, PretrainConfig::tiny(4, 10).model_name());
    }

    #[test]
    fn every_domain_has_its_own_recipe_and_name() {
        for domain in Domain::ALL {
            let config = PretrainConfig::for_domain(domain, 2);
            assert_eq!(config.domain, domain);
            assert_eq!(config.eval.domain, domain);
            let expected = match domain {
                Domain::Math => "base-v1-seed2".to_string(),
                Domain::Chess => "base-v1-chess-seed2".to_string(),
                Domain::Qa => "base-v2-qa-seed2".to_string(),
            };
            assert_eq!(config.model_name(), expected);
        }
        assert_eq!(PretrainConfig::for_domain(Domain::Math, 2), PretrainConfig::default_for_seed(2));
        let chess = PretrainConfig::for_domain(Domain::Chess, 2).corpus;
        assert_eq!((chess.math_share, chess.qa_share), (0.0, 0.0));
    }

    #[test]
    fn a_work_directory_left_by_another_recipe_is_not_resumed() {
        let work = tempfile::tempdir().expect("tempdir");
        let config = PretrainConfig::tiny(1, 4);
        let checkpoint = work.path().join("checkpoints").join("step-000002");
        std::fs::create_dir_all(&checkpoint).expect("mkdir");
        assert!(claim_work_dir(work.path(), &config).expect("claimed"), "unknown leftovers are removed");
        assert!(!checkpoint.exists());
        std::fs::create_dir_all(&checkpoint).expect("mkdir");
        assert!(!claim_work_dir(work.path(), &config).expect("claimed"), "the same recipe resumes");
        assert!(checkpoint.exists());
        assert!(claim_work_dir(work.path(), &PretrainConfig::tiny(1, 5)).expect("claimed"));
        assert!(!checkpoint.exists());
    }

    #[test]
    fn every_epoch_is_a_permutation_and_batches_depend_only_on_the_step() {
        let mut order = EpochOrder::new(10, 7);
        let first_epoch: Vec<usize> = (0..5).flat_map(|step| order.batch(step, 2)).collect();
        let mut sorted = first_epoch.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        let second_epoch: Vec<usize> = (5..10).flat_map(|step| order.batch(step, 2)).collect();
        assert_ne!(first_epoch, second_epoch);
        let mut fresh = EpochOrder::new(10, 7);
        assert_eq!(fresh.batch(7, 2), order.batch(7, 2));
        assert_eq!(fresh.batch(1, 2), first_epoch[2..4]);
    }

    #[test]
    fn the_latest_complete_checkpoint_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(latest_checkpoint(&dir.path().join("none")).expect("absent is fine"), None);
        for (name, complete) in [("step-000100", true), ("step-000300", false), ("step-000200", true), ("other", true)]
        {
            let path = dir.path().join(name);
            std::fs::create_dir_all(&path).expect("mkdir");
            if complete {
                std::fs::write(path.join(TRAINER_STATE_FILE), "{}").expect("write");
            }
        }
        assert_eq!(latest_checkpoint(dir.path()).expect("readable"), Some(dir.path().join("step-000200")));
    }
}
