//! `whale lm ...`: the local language model.

use crate::lm::{self, GenerateSettings, SftSettings};
use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;
use whale_core::Domain;
use whale_lm::LoraConfig;
use whale_pretrain::eval::{self, EvalSpec};
use whale_pretrain::{self as pretrain, PretrainConfig, PretrainOptions, PretrainOutcome, SizeName};

#[derive(Debug, Subcommand)]
pub enum LmCommand {
    /// Train a domain's base model on its synthetic corpus and cache it in
    /// $WHALE_HOME/models (default ~/.cache/whale). Reuses a cached model, resumes an
    /// interrupted run from its last checkpoint, and prints mean@8 on held-out tasks of the
    /// domain under its starting harness (math/plain, chess/legal-moves, qa/search).
    Pretrain {
        /// The domain the model serves: math (the demo's), chess or qa.
        #[arg(long, default_value_t = Domain::Math)]
        domain: Domain,
        #[arg(long, default_value_t = pretrain::DEFAULT_SEED)]
        seed: u64,
        /// Retrain even if the model is cached.
        #[arg(long)]
        force: bool,
        /// Optimizer steps (default: the recipe's).
        #[arg(long)]
        steps: Option<u64>,
        /// Model shape: tiny, small or base.
        #[arg(long, hide = true)]
        size: Option<SizeName>,
        /// Corpus size in conversations (for tests).
        #[arg(long, hide = true)]
        conversations: Option<usize>,
        /// Evaluation tasks (for tests).
        #[arg(long, hide = true)]
        eval_tasks: Option<usize>,
        /// Evaluation samples per task (for tests).
        #[arg(long, hide = true)]
        eval_samples: Option<usize>,
        /// Stop after this many steps as if killed (for tests of resumption).
        #[arg(long, hide = true)]
        stop_after: Option<u64>,
    },
    /// Sample completions from a model; the prompt is sent as one user message.
    Generate {
        /// A checkpoint directory (default: the base model, pretrained first if needed).
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long)]
        prompt: String,
        /// Completions to sample, with seeds seed, seed+1, ...
        #[arg(long, default_value_t = 1)]
        n: usize,
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        #[arg(long, default_value_t = 1.0)]
        temperature: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Continue the prompt as raw text, without the chat template.
        #[arg(long)]
        raw: bool,
        /// A PEFT LoRA adapter directory (from `whale lm train --lora-rank`) to apply to the model.
        #[arg(long)]
        adapter: Option<PathBuf>,
    },
    /// Measure mean@k of a model on generated tasks of a domain, as pretraining does: math with
    /// the plain one-call prompt ("<question>\nGive the final answer after ####."), chess and
    /// qa with their starting harness (chess/legal-moves, qa/search).
    Eval {
        /// A checkpoint directory (default: the domain's base model, pretrained first if needed).
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, default_value_t = Domain::Math)]
        domain: Domain,
        #[arg(long, default_value_t = EvalSpec::default().tasks)]
        tasks: usize,
        #[arg(long, default_value_t = EvalSpec::default().samples)]
        samples: usize,
        /// Generator difficulty (default: pretraining's for the domain: 1 for math and chess,
        /// 2 for qa).
        #[arg(long)]
        difficulty: Option<u32>,
        /// Generator seed of the tasks (default: pretraining's held-out tasks).
        #[arg(long, default_value_t = EvalSpec::default().seed)]
        seed: u64,
    },
    /// Measure generation and training speed (tokens/s, model FLOP/s, MFU) on this machine.
    Bench {
        /// A checkpoint directory (default: the base model, pretrained first if needed).
        #[arg(long, conflicts_with = "random")]
        model: Option<PathBuf>,
        /// Bench a fresh random model of the 256-wide size instead (nothing to train first).
        #[arg(long)]
        random: bool,
    },
    /// Write the random 256-wide model that `whale serve bench --random` serves (5.25M
    /// parameters, an 8,192-token BPE trained on the synthetic corpus, seed 7) as a checkpoint
    /// directory, so that another server can load the same weights (`scripts/peer-bench.sh`).
    Random {
        /// The directory to write (config.json, model.safetensors, tokenizer files).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Fine-tune a model on an sft.jsonl of {"messages": [...], "completion": "..."} lines:
    /// the completion is the assistant's reply to the messages, and only it is trained on.
    /// With --lora-rank (or --resume-adapter) only a LoRA adapter is trained and the output is
    /// a PEFT adapter directory (adapter_config.json, adapter_model.safetensors) plus the
    /// optimizer state, which `peft`, vLLM and SGLang load and `whale lm merge` folds in.
    Train {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        data: PathBuf,
        /// Output directory: a checkpoint, or a PEFT adapter directory when training LoRA.
        #[arg(short, long)]
        output: PathBuf,
        #[arg(long, default_value_t = 1)]
        epochs: usize,
        #[arg(long, default_value_t = 1e-4)]
        lr: f64,
        /// Examples per optimizer step.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Shuffles the examples (each epoch from the seed and the updates done before it) and
        /// draws a new adapter's initial matrices.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Train a LoRA adapter of this rank instead of the whole model.
        #[arg(long)]
        lora_rank: Option<usize>,
        /// The adapter's update is scaled by alpha / rank [default: 16].
        #[arg(long, requires = "lora_rank")]
        lora_alpha: Option<f64>,
        /// Dropout on the adapter's input while training [default: 0].
        #[arg(long, requires = "lora_rank")]
        lora_dropout: Option<f64>,
        /// Projections to adapt, comma-separated, from q_proj, k_proj, v_proj, o_proj,
        /// gate_proj, up_proj, down_proj [default: all seven].
        #[arg(long, requires = "lora_rank", value_delimiter = ',')]
        lora_targets: Option<Vec<String>>,
        /// Continue the LoRA run saved in this adapter directory (written by an earlier
        /// --lora-rank run: its settings, matrices and optimizer state), e.g. once per weight
        /// step with that step's data. --model must be the same base. An empty value means
        /// none, so that one command line serves every weight step of an external trainer
        /// (`--resume-adapter {previous}` is empty before the first update); --lora-* given
        /// beside an adapter must match its settings.
        #[arg(long, value_name = "DIR")]
        resume_adapter: Option<std::ffi::OsString>,
        /// Train in the file's order instead of shuffling: whale writes a weight step's
        /// samples.jsonl in its own trainer's order, cut into mini-batches of --batch.
        #[arg(long)]
        keep_order: bool,
        /// Also write `{"loss": L}` to this file, L the mean loss per completion token over this
        /// run's updates (a WHALE run passes `{metrics}` here and shows L in its weight-step line).
        #[arg(long, value_name = "FILE")]
        metrics: Option<PathBuf>,
        /// For policy-gradient samples (a WHALE step under `algorithm = "grpo"` or `"rloo"`
        /// writes each call with its advantage and sampled tokens): PPO's clip range. Such
        /// data are trained on with the clipped surrogate, not the supervised loss.
        #[arg(long, default_value_t = 0.2)]
        clip_epsilon: f64,
    },
    /// Fold a LoRA adapter into its base model: writes a full checkpoint (config.json,
    /// model.safetensors in the base's dtype, generation_config.json, tokenizer files).
    Merge {
        /// The base model's checkpoint directory.
        #[arg(long)]
        model: PathBuf,
        /// The PEFT adapter directory.
        #[arg(long)]
        adapter: PathBuf,
        /// Output checkpoint directory.
        #[arg(short, long)]
        output: PathBuf,
    },
}

pub fn run(command: LmCommand) -> Result<ExitCode> {
    match command {
        LmCommand::Pretrain {
            domain,
            seed,
            force,
            steps,
            size,
            conversations,
            eval_tasks,
            eval_samples,
            stop_after,
        } => {
            let mut config = PretrainConfig::for_domain(domain, seed);
            config.steps = steps.unwrap_or(config.steps);
            config.size = size.unwrap_or(config.size);
            config.corpus.conversations = conversations.unwrap_or(config.corpus.conversations);
            config.eval.tasks = eval_tasks.unwrap_or(config.eval.tasks);
            config.eval.samples = eval_samples.unwrap_or(config.eval.samples);
            let options = PretrainOptions { force, stop_after, progress: true };
            print_pretrain(&pretrain::pretrain(&config, &pretrain::whale_home(), &options)?)
        }
        LmCommand::Generate { model, prompt, n, max_tokens, temperature, seed, raw, adapter } => {
            let dir = match model {
                Some(dir) => dir,
                None => pretrain::ensure_base_model(Domain::Math)?,
            };
            let settings = GenerateSettings { n, max_tokens, temperature, seed, raw, adapter };
            for (i, completion) in lm::generate(&dir, &prompt, &settings)?.iter().enumerate() {
                let (tokens, finish) = (completion.completion_tokens, completion.finish_reason.as_str());
                println!("--- completion {} ({tokens} tokens, {finish}) ---", i + 1);
                println!("{}", completion.text);
            }
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Eval { model, domain, tasks, samples, difficulty, seed } => {
            let dir = match model {
                Some(dir) => dir,
                None => pretrain::ensure_base_model(domain)?,
            };
            let defaults = EvalSpec::for_domain(domain);
            let difficulty = difficulty.unwrap_or(defaults.difficulty);
            let spec = EvalSpec { tasks, samples, difficulty, seed, ..defaults };
            let report = eval::evaluate_dir(&dir, &spec, &eval::tasks(&spec))?;
            let scores = &report.scores;
            println!(
                "{}: {} {domain} tasks (difficulty {difficulty}) x {samples} samples with {} in {:.0}s",
                dir.display(),
                scores.tasks,
                report.prompt,
                report.seconds
            );
            println!("mean@{samples} {}  pass@{samples} {}  maj@{samples} {}", scores.mean, scores.pass, scores.maj);
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Bench { model, random } => {
            let model_dir = match (model, random) {
                (_, true) => None,
                (Some(dir), false) => Some(dir),
                (None, false) => Some(pretrain::ensure_base_model(Domain::Math)?),
            };
            let config = whale_lm::BenchConfig { model_dir, ..whale_lm::BenchConfig::default() };
            print!("{}", whale_lm::run_bench(&config, &candle_core::Device::Cpu)?);
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Random { output } => {
            std::fs::create_dir_all(&output).with_context(|| format!("cannot create {}", output.display()))?;
            let description = crate::serve_bench::write_random_model(&output)
                .with_context(|| format!("cannot write the random model to {}", output.display()))?;
            println!("wrote a {description} model to {}", output.display());
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Train {
            model,
            data,
            output,
            epochs,
            lr,
            batch,
            seed,
            lora_rank,
            lora_alpha,
            lora_dropout,
            lora_targets,
            resume_adapter,
            keep_order,
            metrics,
            clip_epsilon,
        } => {
            let lora = lora_rank.map(|rank| {
                let defaults = LoraConfig::default();
                LoraConfig {
                    rank,
                    alpha: lora_alpha.unwrap_or(defaults.alpha),
                    dropout: lora_dropout.unwrap_or(defaults.dropout),
                    target_modules: lora_targets.unwrap_or(defaults.target_modules),
                }
            });
            let resume_adapter = resume_adapter.filter(|dir| !dir.is_empty()).map(PathBuf::from);
            if !(clip_epsilon > 0.0 && clip_epsilon < 1.0) {
                anyhow::bail!("--clip-epsilon must lie in (0, 1), got {clip_epsilon}");
            }
            let settings = SftSettings {
                epochs,
                learning_rate: lr,
                batch_size: batch,
                seed,
                lora,
                resume_adapter,
                keep_order,
                clip_epsilon,
            };
            let (mut loss_sum, mut tokens) = (0.0, 0usize);
            let mut on_step = |stats: &whale_lm::StepStats, total: u64| {
                eprintln!("step {}/{total} loss {:.4} ({} tokens)", stats.step, stats.loss, stats.tokens);
                loss_sum += stats.loss * stats.tokens as f64;
                tokens += stats.tokens;
            };
            let report = lm::train_sft(&model, &data, &output, &settings, &mut on_step)?;
            if let Some(file) = metrics {
                let loss = (tokens > 0).then(|| loss_sum / tokens as f64);
                std::fs::write(&file, serde_json::json!({ "loss": loss }).to_string())
                    .with_context(|| format!("writing {}", file.display()))?;
            }
            println!(
                "trained {} {} on {} {}examples, {} steps in all: loss {:.4} -> {:.4}; wrote {}",
                report.trained_parameters,
                if report.adapter { "adapter parameters" } else { "parameters" },
                report.examples,
                if report.policy_gradient { "policy-gradient " } else { "" },
                report.steps,
                report.loss_before,
                report.loss_after,
                report.output.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Merge { model, adapter, output } => {
            let projections = lm::merge_adapter(&model, &adapter, &output)?;
            println!("merged the adapter into {projections} projections; wrote {}", output.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `mean@8 on 64 chess tasks (difficulty 1, harness chess/plain): ...   pass@8: ...`
fn eval_line(eval: &eval::EvalReport) -> String {
    let how = if eval.prompt.starts_with("harness ") { eval.prompt.as_str() } else { "plain prompt" };
    format!(
        "mean@{k} on {} {} tasks (difficulty {}, {how}): {}   pass@{k}: {}",
        eval.spec.tasks,
        eval.spec.domain,
        eval.spec.difficulty,
        eval.scores.mean,
        eval.scores.pass,
        k = eval.spec.samples,
    )
}

fn print_pretrain(outcome: &PretrainOutcome) -> Result<ExitCode> {
    match outcome {
        PretrainOutcome::Reused { dir } => {
            println!("base model already trained: {}", dir.display());
            let eval = pretrain::read_summary(dir)?.eval;
            println!("{}", eval_line(&eval));
        }
        PretrainOutcome::Trained { dir, summary } => {
            let eval = &summary.eval;
            println!(
                "trained {} steps ({} parameters) in {:.0}s, evaluated in {:.0}s; final loss {:.4}",
                summary.steps, summary.parameters, summary.train_seconds, summary.eval_seconds, summary.final_loss
            );
            println!("model: {}", dir.display());
            println!("{}", eval_line(eval));
        }
        PretrainOutcome::Stopped { step } => println!("stopped after step {step}; run again to resume"),
    }
    Ok(ExitCode::SUCCESS)
}
