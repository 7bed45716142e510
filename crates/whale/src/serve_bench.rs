//! `whale serve bench`: what serving over HTTP costs against calling the engine in-process, or
//! how `whale serve` compares with another server (`--peer`: vLLM, llama.cpp's `llama-server`)
//! serving the same checkpoint.
//!
//! The server runs as a child process (`whale serve` on a free loopback port), so the client's
//! threads, JSON and sockets compete for the machine as a real second process would. Each round
//! fires the same `requests` concurrent chat requests at both paths, `whale serve` first and
//! then the other (the in-process [`LocalPolicy`] on the same model directory, or the peer);
//! rounds alternate between the two so that a moment of contention on a shared machine hits
//! both. With `ignore_eos` every reply runs to `max_tokens` on both, so both generate the same
//! number of tokens. Tokens/s is the completion tokens of all rounds over their wall time;
//! latencies are per request, p50 and p99 by nearest rank. A request is one synthetic question,
//! after `prompt_words` words of synthetic context when that is set (a longer prompt puts
//! prefill in the measurement); the table gives the mean prompt length each server counted.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use whale_core::ChatMessage;
use whale_engine::{EngineConfig, LocalPolicy};
use whale_lm::{save_model, GenerationConfig};
use whale_policy::{ChatRequest, Completion, Policy, PolicyError, RemoteConfig, RemotePolicy, SamplingParams};
use whale_text::{write_tokenizer_config, CHATML_TEMPLATE, TOKENIZER_FILE};

/// The line `whale serve` prints first on stdout, followed by the API's base URL.
pub const LISTENING: &str = "listening on ";

/// The model name the bench's server serves.
const SERVED_NAME: &str = "bench";

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeBenchSettings {
    /// A model directory; `None` writes a random [`ModelSize::BASE`] model to a temporary one.
    pub model_dir: Option<PathBuf>,
    /// Concurrent requests per round.
    pub requests: usize,
    pub rounds: usize,
    /// Completion tokens each request asks for (fewer when it samples an end token).
    pub max_tokens: usize,
    /// Generate to `max_tokens` past end-of-sequence tokens (vLLM's and llama.cpp's
    /// `ignore_eos`), so every reply has the same length on both paths.
    pub ignore_eos: bool,
    /// Words of synthetic context before each question (0: the question alone).
    pub prompt_words: usize,
    /// Compare with this server instead of the in-process engine.
    pub peer: Option<Peer>,
    /// The `whale` executable to start the server with.
    pub whale: PathBuf,
}

/// Another OpenAI-compatible server, already serving the same checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// Its API's base URL, like `http://127.0.0.1:8001/v1`.
    pub base_url: String,
    /// The model name it serves the checkpoint under.
    pub model: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeBenchError {
    #[error("bench setting `{0}` must be positive")]
    Setting(&'static str),
    #[error("cannot prepare the random model: {0}")]
    Model(String),
    #[error("the server process: {0}")]
    Server(String),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("a request thread panicked")]
    ThreadPanicked,
}

/// One path's measurements over every round.
#[derive(Debug, Clone, PartialEq)]
pub struct PathRow {
    pub path: String,
    pub requests: usize,
    pub tokens: usize,
    /// Prompt tokens per request, as the server counted them (0 when it does not say).
    pub mean_prompt_tokens: f64,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The result of [`run`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServeBenchTable {
    pub model: String,
    pub requests: usize,
    pub rounds: usize,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    /// `whale serve` over HTTP.
    pub whale: PathRow,
    /// The in-process engine, or the peer.
    pub other: PathRow,
    pub against_peer: bool,
}

impl ServeBenchTable {
    /// `whale serve`'s tokens/s over the other path's.
    pub fn ratio(&self) -> f64 {
        self.whale.tokens_per_second / self.other.tokens_per_second
    }
}

impl fmt::Display for ServeBenchTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "model: {}; {} rounds of {} concurrent chat requests, {} {} tokens each",
            self.model,
            self.rounds,
            self.requests,
            if self.ignore_eos { "exactly" } else { "up to" },
            self.max_tokens
        )?;
        writeln!(
            f,
            "| path | requests | prompt tokens (mean) | tokens | seconds | tokens/s | p50 latency (ms) | p99 latency (ms) |"
        )?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
        for row in [&self.whale, &self.other] {
            writeln!(
                f,
                "| {} | {} | {:.0} | {} | {:.2} | {:.1} | {:.0} | {:.0} |",
                row.path,
                row.requests,
                row.mean_prompt_tokens,
                row.tokens,
                row.seconds,
                row.tokens_per_second,
                row.p50_ms,
                row.p99_ms
            )?;
        }
        if self.against_peer {
            writeln!(f, "whale serve / peer: {:.2}x the tokens/s.", self.ratio())
        } else {
            writeln!(f, "HTTP keeps {:.1}% of the in-process tokens/s.", 100.0 * self.ratio())
        }
    }
}

/// Starts the server, runs the rounds on both paths and stops the server.
pub fn run(settings: &ServeBenchSettings) -> Result<ServeBenchTable, ServeBenchError> {
    for (name, value) in
        [("requests", settings.requests), ("rounds", settings.rounds), ("max_tokens", settings.max_tokens)]
    {
        if value == 0 {
            return Err(ServeBenchError::Setting(name));
        }
    }
    let scratch = tempfile::tempdir().map_err(|e| ServeBenchError::Model(e.to_string()))?;
    let (dir, model) = match &settings.model_dir {
        Some(dir) => (dir.clone(), dir.display().to_string()),
        None => {
            let description = write_random_model(scratch.path())?;
            (scratch.path().to_path_buf(), description)
        }
    };
    let server = ServerProcess::start(&settings.whale, &dir, settings.requests)?;
    let remote = served(&server.base_url, SERVED_NAME, settings.requests)?;
    let (other, other_label): (Box<dyn Policy>, String) = match &settings.peer {
        Some(peer) => {
            let label = format!("peer: {} (`{}`)", peer.base_url, peer.model);
            (Box::new(served(&peer.base_url, &peer.model, settings.requests)?), label)
        }
        None => {
            let engine = EngineConfig { max_batch_size: settings.requests, ..EngineConfig::default() };
            let local = LocalPolicy::load(&dir, DType::F32, &Device::Cpu, engine)
                .map_err(|e| ServeBenchError::Model(e.to_string()))?;
            (Box::new(local), "in-process `LocalPolicy`".to_string())
        }
    };
    let warm_up = requests(1, 0, settings.max_tokens.min(4), settings);
    for policy in [&remote as &dyn Policy, other.as_ref()] {
        round(policy, &warm_up)?;
    }
    let (mut whale, mut others) = (Samples::default(), Samples::default());
    for index in 0..settings.rounds {
        let batch = requests(settings.requests, index * settings.requests, settings.max_tokens, settings);
        whale.add(round(&remote, &batch)?);
        others.add(round(other.as_ref(), &batch)?);
    }
    drop(server);
    Ok(ServeBenchTable {
        model,
        requests: settings.requests,
        rounds: settings.rounds,
        max_tokens: settings.max_tokens,
        ignore_eos: settings.ignore_eos,
        whale: whale.row("`whale serve` over HTTP, a second process".to_string()),
        other: others.row(other_label),
        against_peer: settings.peer.is_some(),
    })
}

/// A client of the server at `base_url` that sends every request of a round at once and never
/// retries (a failure is a failed bench, not a slow one).
fn served(base_url: &str, model: &str, requests: usize) -> Result<RemotePolicy, ServeBenchError> {
    let config = RemoteConfig {
        base_url: base_url.to_string(),
        model: model.to_string(),
        max_concurrency: requests,
        max_retries: 0,
        ..RemoteConfig::default()
    };
    Ok(RemotePolicy::new(config).map_err(PolicyError::from)?)
}

/// Writes a random BASE-shape model with a BPE trained on the synthetic corpus (as
/// `whale lm bench --random` serves) and returns its description (`whale lm random` too).
pub fn write_random_model(dir: &Path) -> Result<String, ServeBenchError> {
    let model_error = |e: &dyn std::fmt::Display| ServeBenchError::Model(e.to_string());
    let vocab_size = crate::lm_bench::BenchConfig::default().random_vocab_size;
    let (tokenizer, model, description) =
        whale_lm::random::random_model(vocab_size, &Device::Cpu).map_err(|e| model_error(&e))?;
    let config = model.config();
    save_model(&model, &GenerationConfig::for_model(config), dir).map_err(|e| model_error(&e))?;
    tokenizer.save(dir.join(TOKENIZER_FILE)).map_err(|e| model_error(&e))?;
    write_tokenizer_config(dir, CHATML_TEMPLATE, &tokenizer.specials(), config.max_position_embeddings)
        .map_err(|e| model_error(&e))?;
    Ok(description)
}

/// `count` chat requests with distinct questions (each after its own context of
/// `settings.prompt_words` words) and seeds from `first`.
fn requests(count: usize, first: usize, max_tokens: usize, settings: &ServeBenchSettings) -> Vec<ChatRequest> {
    let lines = whale_lm::random::synthetic_corpus(first + count, 13);
    let mut context_lines = whale_lm::random::SyntheticText::new(29 + first as u64);
    lines[first..]
        .iter()
        .enumerate()
        .map(|(index, line)| {
            let question = line.split_inclusive('?').next().unwrap_or(line);
            let context = words_of(&mut context_lines, settings.prompt_words);
            let content = if context.is_empty() { question.to_string() } else { format!("{context}\n\n{question}") };
            ChatRequest {
                messages: vec![ChatMessage::new("user", &content)],
                params: SamplingParams {
                    max_tokens,
                    seed: (first + index) as u64,
                    ignore_eos: settings.ignore_eos,
                    ..SamplingParams::default()
                },
            }
        })
        .collect()
}

/// Whole lines of `text` until they hold at least `words` words (none for 0).
fn words_of(text: &mut whale_lm::random::SyntheticText, words: usize) -> String {
    let mut taken: Vec<String> = Vec::new();
    let mut count = 0;
    while count < words {
        let Some(line) = text.next() else { break };
        count += line.split_whitespace().count();
        taken.push(line);
    }
    taken.join(" ")
}

/// One round's outcome.
struct RoundResult {
    seconds: f64,
    completions: Vec<(Completion, f64)>,
}

/// Sends every request at once, each from its own thread; returns the wall time and each
/// completion with its latency in milliseconds.
fn round(policy: &dyn Policy, batch: &[ChatRequest]) -> Result<RoundResult, ServeBenchError> {
    let start = Instant::now();
    let completions = std::thread::scope(|scope| {
        let handles: Vec<_> = batch
            .iter()
            .map(|request| {
                scope.spawn(move || {
                    let sent = Instant::now();
                    policy.chat(request.clone()).map(|completion| (completion, sent.elapsed().as_secs_f64() * 1e3))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().map_err(|_| ServeBenchError::ThreadPanicked)?.map_err(ServeBenchError::from))
            .collect::<Result<Vec<_>, _>>()
    })?;
    Ok(RoundResult { seconds: start.elapsed().as_secs_f64(), completions })
}

#[derive(Default)]
struct Samples {
    seconds: f64,
    tokens: usize,
    prompt_tokens: usize,
    latencies_ms: Vec<f64>,
}

impl Samples {
    fn add(&mut self, round: RoundResult) {
        self.seconds += round.seconds;
        for (completion, latency) in round.completions {
            self.tokens += completion.completion_tokens;
            self.prompt_tokens += completion.prompt_tokens;
            self.latencies_ms.push(latency);
        }
    }

    fn row(mut self, path: String) -> PathRow {
        self.latencies_ms.sort_by(f64::total_cmp);
        PathRow {
            path,
            requests: self.latencies_ms.len(),
            tokens: self.tokens,
            mean_prompt_tokens: self.prompt_tokens as f64 / self.latencies_ms.len().max(1) as f64,
            seconds: self.seconds,
            tokens_per_second: self.tokens as f64 / self.seconds,
            p50_ms: nearest_rank(&self.latencies_ms, 0.50),
            p99_ms: nearest_rank(&self.latencies_ms, 0.99),
        }
    }
}

/// The `q` quantile of sorted values by nearest rank (0 when there are none).
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.saturating_sub(1)).copied().unwrap_or(0.0)
}

/// `whale serve` as a child process, killed when dropped.
struct ServerProcess {
    child: Child,
    base_url: String,
}

impl ServerProcess {
    fn start(whale: &Path, dir: &Path, max_batch_size: usize) -> Result<Self, ServeBenchError> {
        let mut child = Command::new(whale)
            .arg("serve")
            .arg("--model")
            .arg(dir)
            .args(["--port", "0", "--served-model-name", SERVED_NAME])
            .args(["--max-batch-size", &max_batch_size.to_string()])
            // On loopback it needs no key, and the bench's client sends none.
            .env_remove("WHALE_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| ServeBenchError::Server(format!("cannot start {}: {e}", whale.display())))?;
        let line = child.stdout.take().map_or_else(String::new, first_line_within);
        match line.trim().strip_prefix(LISTENING).map(str::to_string) {
            Some(base_url) => Ok(Self { child, base_url }),
            None => {
                let _ = child.kill();
                let status = child.wait().map(|status| status.to_string()).unwrap_or_default();
                Err(ServeBenchError::Server(format!(
                    "it did not report its address ({status}); its first line: {line:?}"
                )))
            }
        }
    }
}

/// How long the child may take to load its model and report its address.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(300);

/// The first line the child prints, or what has arrived of it when it has not finished the
/// line within [`STARTUP_TIMEOUT`] (a server hung while loading does not hang the bench).
fn first_line_within(stdout: ChildStdout) -> String {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    receiver.recv_timeout(STARTUP_TIMEOUT).unwrap_or_default()
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // It may have exited already; then there is nothing to stop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((nearest_rank(&values, 0.5), nearest_rank(&values, 0.99)), (50.0, 99.0));
        assert_eq!(nearest_rank(&[7.0], 0.99), 7.0);
        assert_eq!(nearest_rank(&[], 0.5), 0.0);
    }

    #[test]
    fn bench_requests_differ_and_are_reproducible() {
        let settings = |prompt_words| ServeBenchSettings {
            model_dir: None,
            requests: 4,
            rounds: 1,
            max_tokens: 16,
            ignore_eos: true,
            prompt_words,
            peer: None,
            whale: PathBuf::new(),
        };
        let batch = requests(4, 8, 16, &settings(0));
        assert_eq!(batch, requests(4, 8, 16, &settings(0)));
        assert!(batch.iter().all(|r| r.params.ignore_eos));
        assert_eq!(batch.iter().map(|r| r.params.seed).collect::<Vec<_>>(), [8, 9, 10, 11]);
        assert!(batch.iter().all(|r| r.messages[0].content.ends_with('?') && r.params.max_tokens == 16));
        assert_ne!(batch[0].messages, batch[1].messages);
        let long = requests(4, 8, 16, &settings(150));
        assert_eq!(long, requests(4, 8, 16, &settings(150)));
        for (short, long) in batch.iter().zip(&long) {
            let (short, long) = (&short.messages[0].content, &long.messages[0].content);
            assert!(
                long.ends_with(short.as_str())
                    && long.split_whitespace().count() >= 150 + short.split_whitespace().count()
            );
        }
        assert_ne!(long[0].messages, long[1].messages);
    }
}
