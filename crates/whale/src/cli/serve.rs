//! `whale serve ...`: the OpenAI-compatible server and its benchmark.

use crate::serve_bench::{self, Peer, ServeBenchSettings, LISTENING};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use whale_engine::EngineConfig;
use whale_pretrain::{self as pretrain, PretrainConfig};
use whale_serve::{ApiKey, LoadSettings, ModelRegistry, RuntimeLoading, ServeConfig, Server};

/// The variable `whale serve` reads its API key from when --api-key is not given.
pub const API_KEY_ENV: &str = "WHALE_API_KEY";

/// `whale serve --help`'s closing lines: a cluster set-up first.
const SET_UPS: &str = "\
A GPU box that a cluster's runs reach, keyed, hot-loading the adapters whale's runs write:
  export WHALE_API_KEY=$(openssl rand -hex 32)  # runs: the same in WHALE_SERVER_API_KEY ([server] api_key_env)
  whale serve --model DIR --host 0.0.0.0 --allow-runtime-loading --allowed-path runs/
On this machine only (loopback, no key needed):
  whale serve --model DIR --port 8000";

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, after_help = SET_UPS)]
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
        /// Words of synthetic context before each request's question, for longer prompts (the
        /// table prints the mean prompt tokens each server counted); 0 sends the question alone.
        #[arg(long, default_value_t = 0)]
        prompt_words: usize,
    },
}

#[derive(Debug, Args)]
struct ServeOptions {
    /// A Hugging Face model directory, Qwen3, Qwen3.5, Qwen2 or Llama, or a GGUF file or a
    /// fetched model's name (converted once into $WHALE_HOME/models) (default: the base model,
    /// pretrained first if needed).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The name requests put in `model` (default: --model as written, or for a directory its
    /// last component).
    #[arg(long)]
    served_model_name: Option<String>,
    /// The address to listen on. One that is not loopback (127.0.0.0/8, ::1, localhost) needs an
    /// API key, or --insecure-no-auth.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Every request must carry `Authorization: Bearer KEY` (else 401). Prefer the variable
    /// WHALE_API_KEY, which `ps` does not show.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Serve a --host that is not loopback without an API key: anyone who reaches the port can
    /// generate (and, with --allow-runtime-loading, load models).
    #[arg(long)]
    insecure_no_auth: bool,
    /// Let clients load and unload adapters and checkpoints and replace the base weights
    /// (/v1/load_lora_adapter, /v1/unload_lora_adapter, /update_weights_from_disk), reading only
    /// under --allowed-path; without it those endpoints answer 403. whale's runs with
    /// `[server] kind = "whale"` need it.
    #[arg(long)]
    allow_runtime_loading: bool,
    /// A directory runtime loads may read under (repeatable; it must exist). Symlinks and `..`
    /// are resolved first, so neither leads out of it. None given: nothing loads.
    #[arg(long = "allowed-path", value_name = "DIR", requires = "allow_runtime_loading")]
    allowed_paths: Vec<PathBuf>,
    /// 0 picks a free port (printed on the first line of stdout).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Most sequences the engine generates at once; more requests wait in arrival order.
    #[arg(long, default_value_t = EngineConfig::default().max_batch_size)]
    max_batch_size: usize,
    /// Most tokens of finished requests the engine keeps for later prompts that begin with them
    /// (a conversation's next turn, a repeated prompt, a shared system prompt): faster, equal up
    /// to rounding. 0 feeds every prompt whole.
    #[arg(long, default_value_t = EngineConfig::default().prefix_cache_tokens)]
    prefix_cache_tokens: usize,
    /// Generate from 8-bit (Q8_0) copies of the weights (f32 dense models): faster batched
    /// decoding on wide models (Qwen2.5-Coder-1.5B), slightly different samples.
    #[arg(long)]
    quantized: bool,
    /// Requests worked on at once (each holds a thread while the engine generates).
    #[arg(long, default_value_t = ServeConfig::default().workers)]
    workers: usize,
    /// Generation requests that may wait for a worker beyond --workers; past that a generation
    /// request gets 429 with `Retry-After: 1` at once (whale's own client waits and retries).
    #[arg(long, default_value_t = ServeConfig::default().max_queued_requests)]
    max_queued_requests: usize,
    /// Connections open at once; more wait in the kernel's backlog until one closes.
    #[arg(long, default_value_t = ServeConfig::default().max_connections)]
    max_connections: usize,
    /// Larger request bodies get 413.
    #[arg(long, default_value_t = ServeConfig::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Seconds a client may take to send a request's headers (an idle keep-alive connection
    /// included); the connection is closed then.
    #[arg(long, default_value_t = ServeConfig::default().header_read_timeout.as_secs_f64())]
    header_timeout: f64,
    /// Seconds a client may take to send a request's body once its headers are in (408 then).
    #[arg(long, default_value_t = ServeConfig::default().body_read_timeout.as_secs_f64())]
    body_timeout: f64,
    /// On SIGTERM or Ctrl-C: seconds the requests in flight may take to finish (new connections
    /// are refused at once); those still running then get 503, and the process exits 0.
    #[arg(long, default_value_t = 20.0)]
    shutdown_grace: f64,
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
        Some(ServeCommand::Bench {
            peer,
            peer_model,
            ignore_eos,
            model,
            random,
            requests,
            rounds,
            max_tokens,
            prompt_words,
        }) => {
            let peer = peer.map(|base_url| Peer {
                base_url,
                model: peer_model
                    .unwrap_or_else(|| model.as_ref().map(|d| d.display().to_string()).unwrap_or_default()),
            });
            let model_dir = match (model, random) {
                (_, true) => None,
                (Some(given), false) => Some(super::lm::model_dir(&given)?),
                (None, false) => cached_base_model(),
            };
            let whale = std::env::current_exe().context("cannot find the whale executable")?;
            let settings =
                ServeBenchSettings { model_dir, requests, rounds, max_tokens, ignore_eos, prompt_words, peer, whale };
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

/// The name a model given by a fetched model's name or a GGUF file is served under: `--model`
/// as written, as vLLM serves `--model`, rather than the name of the directory it was converted
/// into. A directory is served under its last component.
fn name_as_given(given: &std::path::Path) -> Option<String> {
    (!given.is_dir()).then(|| given.display().to_string())
}

fn serve(options: ServeOptions) -> Result<ExitCode> {
    let dir = match &options.model {
        Some(given) => super::lm::model_dir(given)?,
        None => pretrain::ensure_base_model(whale_core::Domain::Math)?,
    };
    let served_name = options.served_model_name.or_else(|| options.model.as_deref().and_then(name_as_given));
    let device = match options.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0).context("cannot open CUDA device 0")?,
        other => bail!("--device {other}: expected cpu or cuda"),
    };
    let engine = EngineConfig {
        max_batch_size: options.max_batch_size,
        prefix_cache_tokens: options.prefix_cache_tokens,
        quantized: options.quantized,
        ..EngineConfig::default()
    };
    let settings = LoadSettings { dtype: DType::F32, device, engine };
    let registry =
        ModelRegistry::open(&dir, served_name, settings).with_context(|| format!("cannot serve {}", dir.display()))?;
    let name = registry.base_name().to_string();
    let config = ServeConfig {
        host: options.host,
        port: options.port,
        workers: options.workers,
        max_queued_requests: options.max_queued_requests,
        max_connections: options.max_connections,
        max_body_bytes: options.max_body_bytes,
        header_read_timeout: seconds("--header-timeout", options.header_timeout)?,
        body_read_timeout: seconds("--body-timeout", options.body_timeout)?,
        fail_rate: options.fail_rate,
        fail_seed: options.fail_seed,
        api_key: api_key(options.api_key)?,
        insecure_no_auth: options.insecure_no_auth,
        runtime_loading: RuntimeLoading {
            enabled: options.allow_runtime_loading,
            allowed_paths: options.allowed_paths,
        },
    };
    let grace = seconds("--shutdown-grace", options.shutdown_grace)?;
    let server = Server::start(&config, registry)?;
    let signals = server.stop_signals()?;
    // The notes go out before the address, so whoever waits for the address has them too.
    eprintln!("serving `{name}` ({}); stop with Ctrl-C or SIGTERM ({grace:?} for requests in flight)", dir.display());
    describe_access(&config, &server);
    if config.fail_rate > 0.0 {
        eprintln!("fault injection: {} of generation requests get a 503 (seed {})", config.fail_rate, config.fail_seed);
    }
    println!("{LISTENING}{}", server.base_url());
    std::io::stdout().flush().context("cannot write to stdout")?;
    let stop = server.run_until_signalled(signals, grace, || {
        eprintln!("a second signal: stopping at once");
        std::process::exit(130);
    });
    eprintln!(
        "stopped: {} generation requests were in flight, {} of them cut off with 503 after the grace period",
        stop.in_flight, stop.cut_off
    );
    Ok(ExitCode::SUCCESS)
}

/// A duration given in seconds on the command line.
fn seconds(flag: &str, value: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|e| anyhow::anyhow!("{flag} {value}: {e}"))
}

/// The key from --api-key, else from WHALE_API_KEY (unset or empty: none).
fn api_key(flag: Option<String>) -> Result<Option<ApiKey>> {
    let key = match flag {
        Some(key) => Some(key),
        None => match std::env::var(API_KEY_ENV) {
            Ok(key) => Some(key).filter(|key| !key.is_empty()),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => bail!("{API_KEY_ENV} is not valid UTF-8"),
        },
    };
    key.map(ApiKey::new).transpose().with_context(|| format!("--api-key (or {API_KEY_ENV})"))
}

/// Says on stderr who may use the server: a warning when anyone who reaches a non-loopback
/// address may, and where runtime loads may read.
fn describe_access(config: &ServeConfig, server: &Server) {
    if config.api_key.is_none() && !server.addr().ip().to_canonical().is_loopback() {
        eprintln!(
            "warning: --insecure-no-auth: {} is served without an API key; anyone who reaches it can use it",
            server.addr()
        );
    }
    let loading = &config.runtime_loading;
    match (loading.enabled, loading.allowed_paths.is_empty()) {
        (false, _) => {}
        (true, true) => eprintln!("runtime loading is on, but without --allowed-path nothing can be loaded"),
        (true, false) => {
            let dirs: Vec<String> = loading.allowed_paths.iter().map(|dir| dir.display().to_string()).collect();
            eprintln!("runtime loading from: {}", dirs.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--model qwen2.5-coder-0.5b` (or a GGUF file) is served as written, a directory under its
    /// last component (the registry's own default), as vLLM serves `--model`.
    #[test]
    fn a_model_given_by_name_or_file_is_served_as_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(name_as_given(dir.path()), None);
        assert_eq!(name_as_given(std::path::Path::new("qwen2.5-coder-0.5b")).as_deref(), Some("qwen2.5-coder-0.5b"));
        assert_eq!(
            name_as_given(std::path::Path::new("/models/tiny.Q8_0.gguf")).as_deref(),
            Some("/models/tiny.Q8_0.gguf")
        );
    }
}
