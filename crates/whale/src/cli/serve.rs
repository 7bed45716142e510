//! `whale serve ...`: the OpenAI-compatible server and its benchmark.

use crate::serve_bench::{self, Peer, ServeBenchSettings, LISTENING};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use whale_lm::EngineConfig;
use whale_pretrain::{self as pretrain, PretrainConfig};
use whale_serve::{LoadSettings, ModelRegistry, ServeConfig, Server};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServeArgs {
    #[command(subcommand)]
    command: Option<ServeCommand>,
    #[command(flatten)]
    options: ServeOptions,
}

#[derive(Debug, Subcommand)]
enum ServeCommand {
    /// Measure tokens/s and p50/p99 latency of concurrent chat requests sent over HTTP to
    /// `whale serve` running in a second process, against the same requests sent to the engine
    /// in-process (or, with --peer, to another server serving the same checkpoint: vLLM,
    /// llama.cpp's llama-server), rounds alternating, and print both with their ratio.
    Bench {
        /// Compare with this OpenAI-compatible server (its base URL, like
        /// http://127.0.0.1:8001/v1) instead of the in-process engine; it must already serve the
        /// checkpoint given by --model.
        #[arg(long, requires = "model")]
        peer: Option<String>,
        /// The model name the peer serves the checkpoint under (default: the model directory
        /// as given, as vLLM names it).
        #[arg(long, requires = "peer")]
        peer_model: Option<String>,
        /// Every reply runs to --max-tokens past end-of-sequence tokens on both paths, so both
        /// generate the same tokens (vLLM's and llama.cpp's ignore_eos).
        #[arg(long)]
        ignore_eos: bool,
        /// A checkpoint directory (default: the base model if it is cached, else --random).
        #[arg(long, conflicts_with = "random")]
        model: Option<PathBuf>,
        /// Serve a fresh random model of the 256-wide size instead (nothing to train first).
        #[arg(long)]
        random: bool,
        /// Concurrent requests per round.
        #[arg(long, default_value_t = 64)]
        requests: usize,
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Completion tokens each request asks for.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
    },
}

#[derive(Debug, Args)]
struct ServeOptions {
    /// A Hugging Face model directory, Qwen3 or Qwen3.5 (default: the base model, pretrained first
    /// if needed).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The name requests put in `model` (default: the model directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed on the first line of stdout).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Most sequences the engine generates at once; more requests wait in arrival order.
    #[arg(long, default_value_t = EngineConfig::default().max_batch_size)]
    max_batch_size: usize,
    /// Requests worked on at once (each holds a thread while the engine generates).
    #[arg(long, default_value_t = ServeConfig::default().workers)]
    workers: usize,
    /// cpu, or cuda (a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Fault injection for testing clients: answer this fraction of chat and text completion
    /// requests with 503 at once, without generating.
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Seed of the fault injector's draws.
    #[arg(long, default_value_t = 0)]
    fail_seed: u64,
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    match args.command {
        Some(ServeCommand::Bench { peer, peer_model, ignore_eos, model, random, requests, rounds, max_tokens }) => {
            let peer = peer.map(|base_url| Peer {
                base_url,
                model: peer_model
                    .unwrap_or_else(|| model.as_ref().map(|d| d.display().to_string()).unwrap_or_default()),
            });
            let model_dir = match (model, random) {
                (_, true) => None,
                (Some(dir), false) => Some(dir),
                (None, false) => cached_base_model(),
            };
            let whale = std::env::current_exe().context("cannot find the whale executable")?;
            let settings = ServeBenchSettings { model_dir, requests, rounds, max_tokens, ignore_eos, peer, whale };
            print!("{}", serve_bench::run(&settings)?);
            Ok(ExitCode::SUCCESS)
        }
        None => serve(args.options),
    }
}

/// The default base model's directory when it is already trained.
fn cached_base_model() -> Option<PathBuf> {
    let dir = pretrain::model_dir(&pretrain::whale_home(), &PretrainConfig::default_for_seed(pretrain::DEFAULT_SEED));
    pretrain::is_complete(&dir).then_some(dir)
}

fn serve(options: ServeOptions) -> Result<ExitCode> {
    let dir = match options.model {
        Some(dir) => dir,
        None => pretrain::ensure_base_model(whale_core::Domain::Math)?,
    };
    let device = match options.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0).context("cannot open CUDA device 0")?,
        other => bail!("--device {other}: expected cpu or cuda"),
    };
    let engine = EngineConfig { max_batch_size: options.max_batch_size, ..EngineConfig::default() };
    let settings = LoadSettings { dtype: DType::F32, device, engine };
    let registry = ModelRegistry::open(&dir, options.served_model_name, settings)
        .with_context(|| format!("cannot serve {}", dir.display()))?;
    let name = registry.base_name().to_string();
    let config = ServeConfig {
        host: options.host,
        port: options.port,
        workers: options.workers,
        fail_rate: options.fail_rate,
        fail_seed: options.fail_seed,
        ..ServeConfig::default()
    };
    let server = Server::start(&config, registry)?;
    println!("{LISTENING}{}", server.base_url());
    std::io::stdout().flush().context("cannot write to stdout")?;
    eprintln!("serving `{name}` ({}); stop with Ctrl-C", dir.display());
    if config.fail_rate > 0.0 {
        eprintln!("fault injection: {} of generation requests get a 503 (seed {})", config.fail_rate, config.fail_seed);
    }
    server.wait()
}
