//! The in-process policy: many rollout threads call [`LocalPolicy::chat`] at once and one
//! scheduler thread serves them all with continuous batching over per-sequence KV caches.
//!
//! Why one scheduler: a decode step reads every weight once however many sequences it serves,
//! so throughput comes from decoding all live requests together. Callers render and tokenize in
//! their own threads, send the prompt over a channel and block on their own reply channel (the
//! choices of one served request share one, so that one thread waits on all of them).
//! Between steps the scheduler admits waiting requests (at most `max_batch_size` live), prefills
//! new prompts together in one [`Decoder::forward_step`] call — apart from the one-token
//! decodes, since a long chunk in a decode batch would pad every row to its length — then
//! decodes one token for every other live sequence in a second call, samples each row with the
//! request's own seeded [`Sampler`] and retires what finished. A request's tokens thus depend on
//! its prompt, parameters and seed only, never on what shares its batch (up to the float
//! rounding of a batched forward pass).
//!
//! Shared prefills: the k samples of one task arrive with the same prompt, so new sequences
//! whose prompts are equal are fed once, in one row, and the others start from a copy of that
//! row's cache ([`Decoder::fork_cache`]) and sample from its logits with their own seeds. A
//! prompt of several hundred tokens costs far more to prefill than its few answer tokens to
//! decode (measured: `qa/passages` on SmolLM2, 16 tasks x 4 samples, 125 s to 47 s, the same
//! tokens).
//!
//! Shared prefixes: a new prompt that begins with tokens some cache already holds starts from a
//! copy of them and feeds only the rest. The cache is a live sequence's (its prompt) or one kept
//! from a finished sequence (the `prefixes` module; a multi-turn rollout's next call, the repeats
//! of self-consistency, a harness's fixed instructions and examples), up to
//! `prefix_cache_tokens` (0 by default: off). A copy holds what feeding would, up to the
//! rounding of a pass of another shape, so it is opt-in: off, a request sent alone gets the
//! same log-probabilities, bit for bit, every time (concurrent requests' last bits already move
//! with what shares their steps). Where the architecture cannot cut a cache short (Qwen3.5's
//! recurrent states) prompts are fed whole.
//!
//! Threads: the scheduler runs inside a rayon pool of its own, one thread per core, and the
//! matrix products and the sampling of many rows run on that pool. The scheduler being one of
//! its threads, handing work to the others is cheap: it goes on working meanwhile instead of
//! sleeping until they finish (measured: a 64-sequence decode on the 5.25M model went from
//! about 2,900 to 3,300 tokens/s). A one-sequence step's products each hand half their outputs
//! to a helper thread instead (`model/helper_thread.rs`).
//!
//! Weights: the SFT trainer updates the parameters in place and the engine's model shares them,
//! so after a trainer step the owner calls [`LocalPolicy::set_weights_version`] (which also
//! remakes the scheduler's transposed copies of the projections, [`Decoder::for_decoding`], or
//! its 8-bit copies of the weights, [`EngineConfig::quantized`]);
//! a different model (a loaded checkpoint) comes in through [`LocalPolicy::reload`]. Either way the
//! scheduler drops the KV caches of the requests in flight and rebuilds them from each prompt
//! and the tokens sampled so far, so every later token comes from the new weights alone (the
//! tokens already sampled stay). Do not step the trainer while requests are in flight: a
//! forward pass running during the update reads a mix of old and new weights.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use candle_core::{DType, Device};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use whale_core::ChatMessage;
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError, SamplingParams};

use whale_lm::checkpoint::{CheckpointError, GenerationConfig};
use whale_lm::decoder::{Architecture, Decoder, DecoderCache, DecoderStep};
use whale_lm::model::ModelError;
use whale_text::{
    ChatTemplate, ChatTemplateError, RenderOptions, TextStream, Tokenizer, TokenizerError, TOKENIZER_FILE,
};

use crate::prefixes::{shared_prefix, PrefixStore};
use crate::sampling::{SampledToken, Sampler, StopMatcher};

/// How the scheduler batches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// Most sequences generating at once; later requests wait in arrival order.
    pub max_batch_size: usize,
    /// Most tokens of prompt plus completion; capped by the model's `max_position_embeddings`.
    pub max_context: usize,
    /// Most cells (sequences x longest prompt, padding included) of one prefill call; a prompt
    /// longer than this is prefilled alone, in chunks of this many tokens, one chunk a step
    /// (each chunk attends to those before it in the cache), so that its attention needs
    /// chunk x prompt cells rather than prompt² (a 6,000-token prompt of Qwen2.5-Coder-1.5B
    /// fed whole ran a 24 GB machine out of memory). The default suits a CPU: there a larger
    /// batch gains little and padding costs a lot (64 GSM8K prompts with a 1M-parameter model
    /// prefill 2-3x faster at 512 than at 8192); a GPU wants several thousand.
    pub max_prefill_tokens: usize,
    /// Most tokens of finished sequences' caches kept for later prompts that begin with their
    /// tokens (each kept cache cut to them). 0, the default, feeds every prompt whole, live
    /// sequences' shared prefixes included, so that a request sent alone gets the same
    /// log-probabilities, bit for bit, every time; 16,384 holds the last turn of a few dozen
    /// rollouts, about 0.75 GB of SmolLM2-135M's keys and values in f32.
    pub prefix_cache_tokens: usize,
    /// End-of-sequence ids besides `<|im_end|>`, `<|endoftext|>` and the model config's
    /// `eos_token_id` (e.g. those of `generation_config.json`).
    pub eos_token_ids: Vec<u32>,
    /// Decode from 8-bit (Q8_0) copies of the weights, remade after every update
    /// ([`Decoder::for_quantized_decoding`]): faster batched decoding where the products are
    /// wide (Qwen2.5-Coder-1.5B), at the cost of sampling from a slightly different policy
    /// than the f32 one the trainer scores. Off by default; only f32 dense models on the CPU.
    pub quantized: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_batch_size: 64,
            max_context: 4096,
            max_prefill_tokens: 512,
            prefix_cache_tokens: 0,
            eos_token_ids: Vec::new(),
            quantized: false,
        }
    }
}

impl EngineConfig {
    fn validate(&self) -> Result<(), EngineError> {
        let sizes = [
            ("max_batch_size", self.max_batch_size),
            ("max_context", self.max_context),
            ("max_prefill_tokens", self.max_prefill_tokens),
        ];
        match sizes.iter().find(|(_, value)| *value == 0) {
            Some((key, _)) => Err(EngineError::Config { key, reason: "must be positive".to_string() }),
            None => Ok(()),
        }
    }
}

/// Why an engine could not be built or updated.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("engine config `{key}`: {reason}")]
    Config { key: &'static str, reason: String },
    #[error("{reason}")]
    Mismatch { reason: String },
    /// The engine serves an architecture the operation does not support.
    #[error("the engine serves a {architecture} model; {operation} needs a Qwen3 model")]
    Architecture { architecture: &'static str, operation: &'static str },
    #[error("cannot start the scheduler thread: {0}")]
    Spawn(std::io::Error),
    #[error("cannot start the engine's threads: {0}")]
    Pool(String),
    #[error("the generation engine has stopped")]
    Stopped,
}

/// Counters of the scheduler's work since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests answered, with a completion or an error.
    pub requests_done: u64,
    /// Tokens sampled for the requests answered.
    pub tokens_generated: u64,
    /// `forward_step` calls that fed prompts, and the sequences they fed.
    pub prefill_calls: u64,
    pub prefill_rows: u64,
    /// Prompts that took a copy of another sequence's prefill instead of a row of their own.
    pub prefill_shared: u64,
    /// Prompt tokens fed by prefill calls (each shared row counted once).
    pub prefill_tokens: u64,
    /// Prompt tokens not fed because a copied cache held them ([`EngineConfig::prefix_cache_tokens`]),
    /// and the prompts that copied one.
    pub prefix_reused_tokens: u64,
    pub prefix_reuses: u64,
    /// `forward_step` calls that fed one sampled token per sequence, and the sequences they fed.
    pub decode_calls: u64,
    pub decode_rows: u64,
    /// The most sequences one decode call fed.
    pub peak_decode_batch: u64,
}

/// A model of any architecture ([`Decoder`]) served in-process to concurrent callers; see the
/// module documentation.
pub struct LocalPolicy {
    name: String,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    eos: Vec<u32>,
    vocab_size: usize,
    context_window: usize,
    model: RwLock<Decoder>,
    weights_version: AtomicU64,
    stats: Arc<Mutex<EngineStats>>,
    commands: Sender<Command>,
    scheduler: Mutex<Option<JoinHandle<()>>>,
}

impl LocalPolicy {
    /// Starts the scheduler thread for `model`. The end-of-sequence ids are `<|im_end|>`,
    /// `<|endoftext|>`, the model config's `eos_token_id` and `config.eos_token_ids`.
    pub fn new(
        model: impl Into<Decoder>,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        let model = model.into();
        let vocab_size = model.vocab_size();
        if tokenizer.vocab_size() > vocab_size {
            return Err(EngineError::Mismatch {
                reason: format!("the tokenizer has {} ids, the model only {vocab_size}", tokenizer.vocab_size()),
            });
        }
        let context_window = config.max_context.min(model.max_position_embeddings());
        let specials = tokenizer.specials();
        let mut eos = vec![specials.im_end, specials.endoftext];
        eos.extend(model.eos_token_id());
        eos.extend(&config.eos_token_ids);
        eos.sort_unstable();
        eos.dedup();
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let (commands, inbox) = mpsc::channel();
        let reuses_prefixes = config.prefix_cache_tokens > 0 && model.forks_cache_prefixes()?;
        let scheduler = Scheduler {
            model: decoding_model(&model, config.quantized)?,
            quantized: config.quantized,
            tokenizer: tokenizer.clone(),
            eos: eos.clone(),
            context_window,
            max_batch_size: config.max_batch_size,
            max_prefill_tokens: config.max_prefill_tokens,
            reuses_prefixes,
            prefixes: PrefixStore::new(config.prefix_cache_tokens),
            inbox,
            waiting: VecDeque::new(),
            live: Vec::new(),
            stats: Arc::clone(&stats),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .thread_name(|index| format!("whale-lm-{index}"))
            .build()
            .map_err(|error| EngineError::Pool(error.to_string()))?;
        let handle = std::thread::Builder::new()
            .name("whale-lm-scheduler".to_string())
            .spawn(move || pool.install(|| scheduler.run()))
            .map_err(EngineError::Spawn)?;
        Ok(Self {
            name: "local".to_string(),
            tokenizer,
            template,
            eos,
            vocab_size,
            context_window,
            model: RwLock::new(model),
            weights_version: AtomicU64::new(0),
            stats,
            commands,
            scheduler: Mutex::new(Some(handle)),
        })
    }

    /// Serves a Hugging Face model directory (Qwen3 or Qwen3.5): `config.json` and the safetensors weights,
    /// `tokenizer.json`, `tokenizer_config.json` (its `chat_template` is required) and, when
    /// present, `generation_config.json`, whose `eos_token_id`s end generation too.
    pub fn load(dir: &Path, dtype: DType, device: &Device, mut config: EngineConfig) -> Result<Self, EngineError> {
        let model = Decoder::load(dir, dtype, device)?;
        let tokenizer = Tokenizer::from_file(dir.join(TOKENIZER_FILE))?;
        let template = ChatTemplate::from_model_dir(dir)?;
        if let Some(generation) = GenerationConfig::load(dir)? {
            config.eos_token_ids.extend(generation.eos_token_id);
        }
        Ok(Self::new(model, tokenizer, template, config)?.with_name(dir.display().to_string()))
    }

    /// Sets the name [`Policy::name`] reports.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The model being served; a clone shares its weights.
    pub fn decoder(&self) -> Decoder {
        self.model.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The served model as its own architecture `M`, for `operation` (a trainer built on it
    /// updates the served weights); an error naming the operation when the engine serves another
    /// architecture.
    pub fn served_model<M: Architecture + Clone>(&self, operation: &'static str) -> Result<M, EngineError> {
        let decoder = self.decoder();
        decoder
            .downcast_ref::<M>()
            .cloned()
            .ok_or(EngineError::Architecture { architecture: decoder.architecture(), operation })
    }

    /// Most tokens of prompt plus completion.
    pub fn context_window(&self) -> usize {
        self.context_window
    }

    /// The ids that end a completion with [`FinishReason::Stop`], sorted.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    pub fn stats(&self) -> EngineStats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The prompt of a chat call: `messages` rendered with the chat template and its generation
    /// prompt, then tokenized. The weight phase builds its training prompts with this too.
    pub fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, PolicyError> {
        let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
        let text = self.template.render(messages, &options)?;
        Ok(self.tokenizer.encode(&text)?)
    }

    /// [`Self::prompt_ids`] with `tools` (OpenAI function schemas) rendered by the chat template,
    /// and `opening`, the text the assistant turn begins with, after the generation prompt
    /// (`whale serve`'s tool calling).
    pub fn tool_prompt_ids(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        opening: &str,
    ) -> Result<Vec<u32>, PolicyError> {
        let options =
            RenderOptions { add_generation_prompt: true, tools: tools.map(<[_]>::to_vec), ..RenderOptions::default() };
        let text = self.template.render(messages, &options)? + opening;
        Ok(self.tokenizer.encode(&text)?)
    }

    /// Whether the chat template renders tools at all: a one-message chat comes out the same with
    /// a tool as without under a template that has no tools part (SmolLM2's).
    pub fn template_renders_tools(&self) -> Result<bool, PolicyError> {
        let messages = [ChatMessage::new("user", "x")];
        let probe = serde_json::json!({"type": "function", "function": {"name": "probe", "parameters": {}}});
        let with = RenderOptions { tools: Some(vec![probe]), ..RenderOptions::default() };
        Ok(self.template.render(&messages, &with)? != self.template.render(&messages, &RenderOptions::default())?)
    }

    /// Continues raw text, without the chat template (`whale lm generate --prompt`).
    pub fn generate_text(&self, prompt: &str, params: &SamplingParams) -> Result<Completion, PolicyError> {
        self.generate(self.tokenizer.encode(prompt)?, params)
    }

    /// Continues `prompt` token ids; blocks until the scheduler has finished the request.
    ///
    /// Generation ends with [`FinishReason::Stop`] at an end-of-sequence token or when the text
    /// contains a stop string, and with [`FinishReason::Length`] after `max_tokens` tokens or when
    /// prompt plus completion fill the context window. `token_ids` and `logprobs` hold every
    /// sampled token, the end-of-sequence token and the tokens that completed a stop string
    /// included; `text` is cut before the stop string and leaves the end-of-sequence token out.
    pub fn generate(&self, prompt: Vec<u32>, params: &SamplingParams) -> Result<Completion, PolicyError> {
        self.submit(prompt, params, None)
    }

    /// Like [`generate`](Self::generate), and calls `on_token` with each token as the scheduler
    /// samples it (in this thread, while the request is still generating), so a server can
    /// stream the reply. The tokens are exactly those of the returned completion's `token_ids`.
    pub fn generate_streaming(
        &self,
        prompt: Vec<u32>,
        params: &SamplingParams,
        on_token: &mut dyn FnMut(SampledToken) -> bool,
    ) -> Result<Completion, PolicyError> {
        self.submit(prompt, params, Some(on_token))
    }

    /// Continues `prompt` once for each entry of `choices` (the choices of one request, each
    /// with its own parameters and seed), all waited on in this thread: `on_event` gets each
    /// choice's tokens as they are sampled and its outcome when it ends. Returns once every
    /// choice has ended, or [`PolicyError::Cancelled`] at the first event `on_event` answers
    /// false (the choices still running then stop at their next token). A request of n choices
    /// thus holds one thread, not n.
    pub fn generate_choices(
        &self,
        prompt: Vec<u32>,
        choices: &[SamplingParams],
        on_event: &mut dyn FnMut(ChoiceEvent) -> bool,
    ) -> Result<(), PolicyError> {
        choices.iter().try_for_each(SamplingParams::validate)?;
        self.check_prompt(&prompt)?;
        let prompt_tokens = prompt.len();
        let (reply, answer) = mpsc::channel();
        let jobs = choices
            .iter()
            .enumerate()
            .map(|(choice, params)| {
                let reply = ReplyTo { choice, channel: reply.clone() };
                Job { prompt: prompt.clone(), params: params.clone(), stream: true, reply }
            })
            .collect();
        self.commands.send(Command::Generate(jobs)).map_err(|_| PolicyError::EngineStopped)?;
        // Only the jobs hold senders now, so a scheduler that stops with choices pending ends
        // the wait below with `EngineStopped` instead of leaving it blocked.
        drop(reply);
        let mut running = choices.len();
        while running > 0 {
            let (index, message) = answer.recv().map_err(|_| PolicyError::EngineStopped)?;
            let event = match message {
                Reply::Token(token) => ChoiceEvent::Token { index, token },
                Reply::Done(generated) => {
                    running -= 1;
                    let outcome = generated.and_then(|g| self.completion(g, prompt_tokens, &choices[index].stop));
                    ChoiceEvent::Done { index, outcome }
                }
            };
            if !on_event(event) {
                return Err(PolicyError::Cancelled);
            }
        }
        Ok(())
    }

    /// Continues each prompt with its own parameters, all handed to the scheduler at once, so
    /// that it admits them in the same step (up to `max_batch_size`) whatever the threads'
    /// timing: the batches a benchmark measures are then the batches it asked for. Returns each
    /// request's outcome, in order.
    pub fn generate_batch(&self, requests: &[(Vec<u32>, SamplingParams)]) -> Vec<Result<Completion, PolicyError>> {
        let mut outcomes: Vec<Option<Result<Completion, PolicyError>>> = requests
            .iter()
            .map(|(prompt, params)| {
                let valid = params.validate().map_err(PolicyError::from).and_then(|()| self.check_prompt(prompt));
                valid.err().map(Err)
            })
            .collect();
        let (reply, answer) = mpsc::channel();
        let jobs: Vec<Job> = requests
            .iter()
            .enumerate()
            .filter(|(index, _)| outcomes[*index].is_none())
            .map(|(choice, (prompt, params))| {
                let reply = ReplyTo { choice, channel: reply.clone() };
                Job { prompt: prompt.clone(), params: params.clone(), stream: false, reply }
            })
            .collect();
        let mut running = jobs.len();
        drop(reply);
        if running > 0 && self.commands.send(Command::Generate(jobs)).is_err() {
            running = 0;
        }
        while running > 0 {
            let Ok((index, reply)) = answer.recv() else { break };
            if let Reply::Done(generated) = reply {
                running -= 1;
                let (prompt, params) = &requests[index];
                outcomes[index] = Some(generated.and_then(|g| self.completion(g, prompt.len(), &params.stop)));
            }
        }
        outcomes.into_iter().map(|outcome| outcome.unwrap_or(Err(PolicyError::EngineStopped))).collect()
    }

    fn submit(
        &self,
        prompt: Vec<u32>,
        params: &SamplingParams,
        mut on_token: Option<&mut dyn FnMut(SampledToken) -> bool>,
    ) -> Result<Completion, PolicyError> {
        params.validate()?;
        self.check_prompt(&prompt)?;
        let prompt_tokens = prompt.len();
        let (reply, answer) = mpsc::channel();
        let reply = ReplyTo { choice: 0, channel: reply };
        let job = Job { prompt, params: params.clone(), stream: on_token.is_some(), reply };
        self.commands.send(Command::Generate(vec![job])).map_err(|_| PolicyError::EngineStopped)?;
        loop {
            match answer.recv().map_err(|_| PolicyError::EngineStopped)?.1 {
                Reply::Token(token) => {
                    // Returning drops `answer`; the scheduler then retires the sequence at its
                    // next token instead of generating on for nobody.
                    if on_token.as_mut().is_some_and(|on_token| !on_token(token)) {
                        return Err(PolicyError::Cancelled);
                    }
                }
                Reply::Done(generated) => return self.completion(generated?, prompt_tokens, &params.stop),
            }
        }
    }

    fn check_prompt(&self, prompt: &[u32]) -> Result<(), PolicyError> {
        if prompt.is_empty() {
            return Err(PolicyError::InvalidPrompt("no token to continue".to_string()));
        }
        if let Some(id) = prompt.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(PolicyError::InvalidPrompt(format!(
                "token id {id} is outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        if prompt.len() >= self.context_window {
            return Err(PolicyError::PromptTooLong {
                prompt_tokens: prompt.len(),
                context_window: self.context_window,
            });
        }
        Ok(())
    }

    fn completion(
        &self,
        generated: Generated,
        prompt_tokens: usize,
        stops: &[String],
    ) -> Result<Completion, PolicyError> {
        let Generated { token_ids, logprobs, finish_reason } = generated;
        // The end-of-sequence token ends the text; with `ignore_eos` there may be several.
        let body: Vec<u32> = token_ids.iter().copied().filter(|token| !self.eos.contains(token)).collect();
        let mut text = self.tokenizer.decode(&body, false)?;
        if let Some(found) = StopMatcher::new(stops).find(&text) {
            text.truncate(found.start);
        }
        let completion_tokens = token_ids.len();
        Ok(Completion { text, token_ids, logprobs, finish_reason, prompt_tokens, completion_tokens })
    }

    /// Records that the shared weights changed in place (after a trainer step): requests from
    /// now on are answered by weights `version`, and the requests in flight have their caches
    /// rebuilt with the new weights.
    pub fn set_weights_version(&self, version: u64) -> Result<(), EngineError> {
        self.weights_version.store(version, Ordering::SeqCst);
        self.commands.send(Command::NewWeights(None)).map_err(|_| EngineError::Stopped)
    }

    /// Serves `model` (same vocabulary size, a context at least as long) as weights `version`
    /// from now on; the requests in flight have their caches rebuilt with it.
    pub fn reload(&self, model: impl Into<Decoder>, version: u64) -> Result<(), EngineError> {
        let model = model.into();
        let (vocab_size, positions) = (model.vocab_size(), model.max_position_embeddings());
        if vocab_size != self.vocab_size || positions < self.context_window {
            return Err(EngineError::Mismatch {
                reason: format!(
                    "the new model has a vocabulary of {} and {} positions; the engine needs {} and {}",
                    vocab_size, positions, self.vocab_size, self.context_window
                ),
            });
        }
        *self.model.write().unwrap_or_else(PoisonError::into_inner) = model.clone();
        self.weights_version.store(version, Ordering::SeqCst);
        self.commands.send(Command::NewWeights(Some(Box::new(model)))).map_err(|_| EngineError::Stopped)
    }

    /// Whether the scheduler thread still serves requests: false once [`shutdown`](Self::shutdown)
    /// has stopped it or it has panicked, after which every request fails.
    pub fn is_running(&self) -> bool {
        let scheduler = self.scheduler.lock().unwrap_or_else(PoisonError::into_inner);
        scheduler.as_ref().is_some_and(|handle| !handle.is_finished())
    }

    /// Stops the scheduler and waits for its thread: requests in flight or queued, and every
    /// later one, fail with [`PolicyError::EngineStopped`]. Dropping the policy does this too.
    pub fn shutdown(&self) {
        // A send error means the scheduler is gone already.
        let _ = self.commands.send(Command::Shutdown);
        let handle = self.scheduler.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(handle) = handle {
            // A scheduler that panicked has dropped its reply channels; nothing more to do.
            let _ = handle.join();
        }
    }
}

impl Drop for LocalPolicy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Policy for LocalPolicy {
    fn chat(&self, request: ChatRequest) -> Result<Completion, PolicyError> {
        let prompt = self.prompt_ids(&request.messages)?;
        self.generate(prompt, &request.params)
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn weights_version(&self) -> u64 {
        self.weights_version.load(Ordering::SeqCst)
    }
}

enum Command {
    /// Requests to admit together, in order.
    Generate(Vec<Job>),
    /// The weights changed: in place (`None`) or to a new model.
    NewWeights(Option<Box<Decoder>>),
    Shutdown,
}

/// One request as the caller hands it over.
struct Job {
    prompt: Vec<u32>,
    params: SamplingParams,
    /// Whether the caller wants each token as it is sampled.
    stream: bool,
    reply: ReplyTo,
}

/// Where a sequence's replies go: its caller's channel, tagged with its choice's index.
struct ReplyTo {
    choice: usize,
    channel: Sender<(usize, Reply)>,
}

impl ReplyTo {
    /// False when the caller has gone away (it cancelled).
    fn send(&self, reply: Reply) -> bool {
        self.channel.send((self.choice, reply)).is_ok()
    }
}

/// What the scheduler sends a caller: each sampled token (streaming requests only), then the
/// outcome.
enum Reply {
    Token(SampledToken),
    Done(Result<Generated, PolicyError>),
}

/// What [`LocalPolicy::generate_choices`] tells its caller of choice `index`.
#[derive(Debug)]
pub enum ChoiceEvent {
    Token { index: usize, token: SampledToken },
    Done { index: usize, outcome: Result<Completion, PolicyError> },
}

/// The scheduler's answer; the caller decodes the text in its own thread.
struct Generated {
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    finish_reason: FinishReason,
}

/// The prompt tokens a fresh sequence's cache holds already, and the tokens it feeds:
/// [`Sequence::prefill_key`].
type PrefillKey<'a> = (&'a [u32], &'a [u32]);

/// Where a new prompt's shared prefix is copied from.
#[derive(Clone, Copy)]
enum PrefixSource {
    /// The live sequence of this index (its prompt).
    Live(usize),
    /// The kept cache of this index in the [`PrefixStore`].
    Kept(usize),
}

/// A request being generated.
struct Sequence {
    prompt: Vec<u32>,
    stream: bool,
    reply: ReplyTo,
    sampler: Sampler,
    stops: Option<StopMatcher>,
    /// Sample past end-of-sequence tokens.
    ignore_eos: bool,
    /// Most tokens to sample: `max_tokens`, or fewer where the context window ends first.
    limit: usize,
    cache: DecoderCache,
    /// Whether nothing has been fed into `cache` yet (since the sequence started or the weights
    /// changed): such a sequence may copy the cache of another with the same tokens to feed.
    fresh: bool,
    /// Tokens of the prompt a fresh sequence's cache holds already, copied from another cache
    /// ([`Scheduler::reuse_prefixes`]) or fed in earlier chunks of a long prompt; `feed` is the
    /// rest of the prompt. A sequence stays fresh until its whole prompt is held.
    reused: usize,
    /// Tokens to feed next: the prompt (or, after a weight change, prompt plus completion so
    /// far), then the last sampled token.
    feed: Vec<u32>,
    generated: Vec<u32>,
    logprobs: Vec<f32>,
    text: TextStream,
    outcome: Option<Result<FinishReason, PolicyError>>,
}

impl Sequence {
    fn new(job: Job, sampler: Sampler, cache: DecoderCache, context_window: usize) -> Self {
        let stops = job.params.stop.iter().any(|stop| !stop.is_empty()).then(|| StopMatcher::new(&job.params.stop));
        Self {
            ignore_eos: job.params.ignore_eos,
            limit: job.params.max_tokens.min(context_window.saturating_sub(job.prompt.len())),
            feed: job.prompt.clone(),
            prompt: job.prompt,
            stream: job.stream,
            reply: job.reply,
            sampler,
            stops,
            cache,
            fresh: true,
            reused: 0,
            generated: Vec::new(),
            logprobs: Vec::new(),
            text: TextStream::default(),
            outcome: None,
        }
    }

    /// Samples the next token from this sequence's logits row and decides whether it is done.
    fn accept(&mut self, logits: &[f32], tokenizer: &Tokenizer, eos: &[u32]) {
        let token = match self.sampler.sample(logits) {
            Ok(token) => token,
            Err(error) => {
                self.outcome = Some(Err(error.into()));
                return;
            }
        };
        if self.stream && !self.reply.send(Reply::Token(token)) {
            // The caller went away (it cancelled): nobody waits for the rest.
            self.outcome = Some(Err(PolicyError::Cancelled));
            return;
        }
        self.generated.push(token.id);
        self.logprobs.push(token.logprob);
        self.feed.clear();
        self.feed.push(token.id);
        self.outcome = self.finish_reason(token.id, tokenizer, eos).transpose();
    }

    fn finish_reason(
        &mut self,
        token: u32,
        tokenizer: &Tokenizer,
        eos: &[u32],
    ) -> Result<Option<FinishReason>, PolicyError> {
        if eos.contains(&token) && !self.ignore_eos {
            return Ok(Some(FinishReason::Stop));
        }
        if let Some(stops) = &self.stops {
            let new_from = self.text.extend(tokenizer, &self.generated)?;
            if stops.find_since(self.text.text(), new_from).is_some() {
                return Ok(Some(FinishReason::Stop));
            }
        }
        Ok((self.generated.len() >= self.limit).then_some(FinishReason::Length))
    }

    /// Takes a chunk of a long prompt, now in the cache, off what is left to feed; the logits of
    /// its last token are not sampled. While the cache holds only prompt tokens the sequence
    /// stays fresh, so that the k samples of one long prompt keep sharing its chunks; past the
    /// prompt (a prompt and completion refed after a weight change) it is fed on its own.
    fn fed_chunk(&mut self, chunk: usize) {
        self.feed.drain(..chunk);
        if self.fresh && self.reused + chunk <= self.prompt.len() {
            self.reused += chunk;
        } else {
            self.fresh = false;
        }
    }

    /// What a fresh sequence's prefill would leave in its cache, told apart from every other
    /// fresh sequence's: equal keys, equal caches after the step.
    fn prefill_key(&self) -> PrefillKey<'_> {
        (&self.prompt[..self.reused], &self.feed)
    }

    /// The tokens a finished sequence's cache holds: the prompt and every sampled token but the
    /// last, which was never fed. None for a sequence that failed (its cache may be partial).
    fn held_tokens(&self, outcome: &Result<FinishReason, PolicyError>) -> Option<Vec<u32>> {
        let (_, fed) = self.generated.split_last()?;
        outcome.is_ok().then(|| [&self.prompt[..], fed].concat())
    }

    /// Tells the caller how the sequence ended, and gives back its cache.
    fn answer(self, outcome: Result<FinishReason, PolicyError>) -> DecoderCache {
        let Sequence { generated, logprobs, reply, cache, .. } = self;
        let message = outcome.map(|finish_reason| Generated { token_ids: generated, logprobs, finish_reason });
        // The caller may have gone away; nobody is left to tell.
        reply.send(Reply::Done(message));
        cache
    }
}

/// Logits one sampling thread should get at least: below that, starting a thread costs more
/// than it saves (sampling costs about 10 ns per logit).
const LOGITS_PER_SAMPLING_THREAD: usize = 1 << 17;

/// Samples every row, on the engine's threads when there is enough work: with a real
/// vocabulary of 150k ids, sampling 64 rows on one thread takes longer than the decode step
/// itself. Each row is sampled by its own sequence's sampler, so the threads change nothing.
fn accept_rows(mut rows: Vec<(&mut Sequence, &Vec<f32>)>, tokenizer: &Tokenizer, eos: &[u32]) {
    let logits: usize = rows.iter().map(|(_, row)| row.len()).sum();
    let threads = rayon::current_num_threads().min(logits / LOGITS_PER_SAMPLING_THREAD).clamp(1, rows.len().max(1));
    if threads == 1 {
        for (sequence, row) in rows {
            sequence.accept(row, tokenizer, eos);
        }
        return;
    }
    let per_thread = rows.len().div_ceil(threads);
    rows.par_iter_mut().with_min_len(per_thread).for_each(|(sequence, row)| sequence.accept(row, tokenizer, eos));
}

/// Which row of a step's logits each live sequence samples from: the fed members have a row
/// each, in order, and a sharing member reads the row of the member it copies (0 for a
/// sequence not in the step, which is never read).
fn logits_rows(fed: &[bool], shared: &[Option<usize>]) -> Vec<usize> {
    let mut rows = vec![0; fed.len()];
    let mut next = 0;
    for (index, &fed) in fed.iter().enumerate() {
        if fed {
            rows[index] = next;
            next += 1;
        }
    }
    for (index, source) in shared.iter().enumerate() {
        if let Some(source) = *source {
            rows[index] = rows[source];
        }
    }
    rows
}

/// Fewest shared tokens worth a copied cache: every prompt opens with the chat template's few
/// tokens, and a copy costs an allocation per layer.
const MIN_REUSED_TOKENS: usize = 8;

#[derive(Clone, Copy)]
enum Phase {
    Prefill,
    Decode,
}

/// The scheduler's clone of `model` to decode with: with the f32 products' transposed copies,
/// or with 8-bit copies of the weights.
fn decoding_model(model: &Decoder, quantized: bool) -> Result<Decoder, ModelError> {
    if quantized {
        model.for_quantized_decoding()
    } else {
        Ok(model.for_decoding())
    }
}

/// The scheduler thread's state: the model, the queue and the live sequences.
struct Scheduler {
    model: Decoder,
    /// Whether `model` decodes from 8-bit copies ([`EngineConfig::quantized`]).
    quantized: bool,
    tokenizer: Tokenizer,
    eos: Vec<u32>,
    context_window: usize,
    max_batch_size: usize,
    max_prefill_tokens: usize,
    /// Whether new prompts start from copies of prefixes held ([`EngineConfig::prefix_cache_tokens`]
    /// is positive and the architecture can cut its caches).
    reuses_prefixes: bool,
    /// Finished sequences' caches, for later prompts that begin with their tokens.
    prefixes: PrefixStore,
    inbox: Receiver<Command>,
    waiting: VecDeque<Job>,
    live: Vec<Sequence>,
    stats: Arc<Mutex<EngineStats>>,
}

impl Scheduler {
    /// Serves until shut down; dropping `self` then drops every reply channel, which wakes the
    /// callers still waiting with [`PolicyError::EngineStopped`].
    fn run(mut self) {
        while self.receive() {
            self.admit();
            self.step();
            self.retire();
        }
    }

    /// Applies every pending command, blocking while there is nothing to generate. Returns
    /// false when the engine is shutting down.
    fn receive(&mut self) -> bool {
        if self.live.is_empty() && self.waiting.is_empty() {
            let Ok(command) = self.inbox.recv() else { return false };
            if !self.apply(command) {
                return false;
            }
        }
        loop {
            match self.inbox.try_recv() {
                Ok(command) => {
                    if !self.apply(command) {
                        return false;
                    }
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn apply(&mut self, command: Command) -> bool {
        match command {
            Command::Generate(jobs) => self.waiting.extend(jobs),
            Command::NewWeights(model) => {
                // The decoding copies of the projections are remade from the new weights, the
                // old 8-bit ones dropped first (a plain clone holds none).
                if self.quantized {
                    self.model = self.model.for_decoding();
                }
                let source = model.as_deref().unwrap_or(&self.model);
                self.model = match decoding_model(source, self.quantized) {
                    Ok(model) => model,
                    Err(error) => {
                        // Never sample from stale copies: every live sequence fails with the
                        // reason, and the engine stops (later callers get `Stopped`).
                        let reason = format!("cannot remake the decoding weights: {error}");
                        for sequence in &mut self.live {
                            sequence.outcome = Some(Err(PolicyError::Model(reason.clone())));
                        }
                        self.reuses_prefixes = false;
                        self.retire();
                        return false;
                    }
                };
                self.prefixes.clear();
                self.reuses_prefixes =
                    self.prefixes.budget() > 0 && self.model.forks_cache_prefixes().is_ok_and(|forks| forks);
                for sequence in &mut self.live {
                    match self.model.new_cache() {
                        Ok(cache) => {
                            sequence.cache = cache;
                            sequence.fresh = true;
                            sequence.reused = 0;
                        }
                        Err(error) => sequence.outcome = Some(Err(PolicyError::Model(error.to_string()))),
                    }
                    sequence.feed = [&sequence.prompt[..], &sequence.generated[..]].concat();
                }
            }
            Command::Shutdown => return false,
        }
        true
    }

    fn admit(&mut self) {
        while self.live.len() < self.max_batch_size {
            let Some(job) = self.waiting.pop_front() else { break };
            let started = Sampler::new(&job.params).map_err(PolicyError::from).and_then(|sampler| {
                Ok((sampler, self.model.new_cache().map_err(|e| PolicyError::Model(e.to_string()))?))
            });
            match started {
                Ok((sampler, cache)) => self.live.push(Sequence::new(job, sampler, cache, self.context_window)),
                Err(error) => {
                    job.reply.send(Reply::Done(Err(error)));
                    self.stats().requests_done += 1;
                }
            }
        }
    }

    /// One prefill call for the prompts that fit the prefill budget, then one decode call for
    /// every sequence waiting on a single token.
    fn step(&mut self) {
        if self.reuses_prefixes {
            self.reuse_prefixes();
        }
        let prefill = self.prefill_members();
        let decode: Vec<bool> = self.live.iter().map(|sequence| sequence.feed.len() == 1).collect();
        for (members, phase) in [(prefill, Phase::Prefill), (decode, Phase::Decode)] {
            if members.contains(&true) {
                self.forward(&members, phase);
            }
        }
    }

    /// Sequences with a prompt to feed, shortest first, while the padded batch stays within
    /// `max_prefill_tokens` (the first always goes, however long). Taking similar lengths
    /// together keeps padding low: a padded prefill pays for `rows x longest` tokens in the
    /// projections and `rows x longest²` cells in attention. Every prompt still gets its turn
    /// within a few steps, since no new sequence is admitted while the batch is full. Fresh
    /// sequences with equal prompts (the k samples of one task) take one row between them
    /// ([`Self::shared_prefills`]).
    fn prefill_members(&self) -> Vec<bool> {
        let mut waiting: Vec<(usize, PrefillKey<'_>, usize)> = (self.live.iter().enumerate())
            .filter(|(_, sequence)| sequence.feed.len() >= 2)
            .map(|(index, sequence)| (self.prefill_chunk(sequence), sequence.prefill_key(), index))
            .collect();
        waiting.sort_unstable();
        let mut members = vec![false; self.live.len()];
        let mut rows = 0;
        let mut last_fresh = None;
        for &(len, key, index) in &waiting {
            let fresh = self.live[index].fresh;
            if !(fresh && last_fresh == Some(key)) {
                if rows > 0 && (rows + 1) * len > self.max_prefill_tokens {
                    break;
                }
                rows += 1;
            }
            if fresh {
                last_fresh = Some(key);
            }
            members[index] = true;
        }
        members
    }

    /// How many of `sequence`'s tokens to feed now if it is prefilled: all, or the next chunk of a
    /// prompt longer than the prefill budget.
    fn prefill_chunk(&self, sequence: &Sequence) -> usize {
        sequence.feed.len().min(self.max_prefill_tokens)
    }

    /// Starts each new prompt that begins with at least [`MIN_REUSED_TOKENS`] tokens a cache
    /// holds from a copy of them ([`Self::prefix_source`]). The last prompt token is always
    /// fed, for its logits.
    fn reuse_prefixes(&mut self) {
        for index in 0..self.live.len() {
            let sequence = &self.live[index];
            if !(sequence.fresh && sequence.reused == 0 && sequence.generated.is_empty() && sequence.feed.len() >= 2) {
                continue;
            }
            let Some((shared, source)) = self.prefix_source(index) else { continue };
            let cache = match source {
                PrefixSource::Live(donor) => Some(&self.live[donor].cache),
                PrefixSource::Kept(entry) => self.prefixes.use_entry(entry),
            };
            let Some(cache) = cache else { continue };
            match self.model.fork_cache_prefix(cache, shared) {
                Ok(Some(cache)) => {
                    let sequence = &mut self.live[index];
                    sequence.cache = cache;
                    sequence.reused = shared;
                    sequence.feed.drain(..shared);
                    let mut stats = self.stats();
                    stats.prefix_reused_tokens += shared as u64;
                    stats.prefix_reuses += 1;
                }
                Ok(None) => {}
                Err(error) => self.live[index].outcome = Some(Err(PolicyError::Model(error.to_string()))),
            }
        }
    }

    /// The cache sharing the longest prefix with the prompt of live sequence `index`, and how
    /// many tokens it shares (all but the prompt's last at most, and [`MIN_REUSED_TOKENS`] at
    /// least): a live sequence's prompt (one already fed and not failed), or a kept cache;
    /// the live one where they tie.
    fn prefix_source(&self, index: usize) -> Option<(usize, PrefixSource)> {
        let feed = &self.live[index].feed;
        let most = feed.len() - 1;
        let live = (self.live.iter().enumerate())
            .filter(|(_, donor)| !donor.fresh && donor.outcome.is_none())
            .map(|(donor, other)| (shared_prefix(&other.prompt, feed).min(most), PrefixSource::Live(donor)))
            .max_by_key(|&(shared, _)| shared);
        let kept =
            (self.prefixes.longest_prefix(feed)).map(|(entry, shared)| (shared.min(most), PrefixSource::Kept(entry)));
        let best = match (live, kept) {
            (Some(live), Some(kept)) => Some(if live.0 >= kept.0 { live } else { kept }),
            (live, kept) => live.or(kept),
        };
        best.filter(|&(shared, _)| shared >= MIN_REUSED_TOKENS)
    }

    /// For each member of a prefill, the live index of the member whose prefill it copies: the
    /// first fresh member with the same tokens held and to feed, whose cache after the step holds
    /// exactly what this one's would. None for a member fed itself.
    fn shared_prefills(&self, members: &[bool]) -> Vec<Option<usize>> {
        let mut first_with: HashMap<PrefillKey<'_>, usize> = HashMap::new();
        (self.live.iter().enumerate())
            .map(|(index, sequence)| {
                if !members[index] || !sequence.fresh {
                    return None;
                }
                let first = *first_with.entry(sequence.prefill_key()).or_insert(index);
                (first != index).then_some(first)
            })
            .collect()
    }

    /// Feeds the members' chunks in one batched step and samples a token for each. A member that
    /// shares another's prefill is not fed: it copies that member's cache after the step and
    /// samples, with its own sampler, from the same logits row.
    fn forward(&mut self, members: &[bool], phase: Phase) {
        let shared = match phase {
            Phase::Prefill => self.shared_prefills(members),
            Phase::Decode => vec![None; self.live.len()],
        };
        let fed: Vec<bool> = members.iter().zip(&shared).map(|(&member, copy)| member && copy.is_none()).collect();
        let chunks: Vec<usize> = (self.live.iter())
            .map(|sequence| match phase {
                Phase::Prefill => self.prefill_chunk(sequence),
                Phase::Decode => sequence.feed.len(),
            })
            .collect();
        let mut steps: Vec<DecoderStep<'_>> = (self.live.iter_mut().zip(&fed).zip(&chunks))
            .filter(|((_, &fed), _)| fed)
            .map(|((sequence, _), &chunk)| {
                let Sequence { feed, cache, .. } = sequence;
                DecoderStep { tokens: &feed[..chunk], cache }
            })
            .collect();
        let rows = steps.len();
        let tokens: usize = steps.iter().map(|step| step.tokens.len()).sum();
        let logits =
            self.model.forward_step(&mut steps).and_then(|logits| logits.to_vec2::<f32>().map_err(ModelError::from));
        drop(steps);
        let row_of = logits_rows(&fed, &shared);
        self.copy_shared_caches(&shared);
        let batch = (self.live.iter_mut().zip(members).zip(row_of).zip(&chunks))
            .filter(|(((_, &member), _), _)| member)
            .map(|(((sequence, _), row), &chunk)| (sequence, row, chunk));
        match logits {
            Ok(logits) => {
                let rows = batch
                    .filter(|(sequence, _, _)| sequence.outcome.is_none())
                    .filter_map(|(sequence, row, chunk)| {
                        if chunk < sequence.feed.len() {
                            sequence.fed_chunk(chunk);
                            return None;
                        }
                        sequence.fresh = false;
                        Some((sequence, &logits[row]))
                    })
                    .collect();
                accept_rows(rows, &self.tokenizer, &self.eos);
            }
            Err(error) => {
                for (sequence, _, _) in batch {
                    sequence.outcome = Some(Err(PolicyError::Model(error.to_string())));
                }
            }
        }
        self.record(phase, rows as u64, tokens as u64, shared.iter().flatten().count() as u64);
    }

    /// Gives each sharing member a copy of the cache its prefill came from.
    fn copy_shared_caches(&mut self, shared: &[Option<usize>]) {
        for (index, source) in shared.iter().enumerate() {
            let Some(source) = *source else { continue };
            match self.model.fork_cache(&self.live[source].cache) {
                Ok(cache) => self.live[index].cache = cache,
                Err(error) => self.live[index].outcome = Some(Err(PolicyError::Model(error.to_string()))),
            }
        }
    }

    fn record(&self, phase: Phase, rows: u64, tokens: u64, shared: u64) {
        let mut stats = self.stats();
        match phase {
            Phase::Prefill => {
                stats.prefill_calls += 1;
                stats.prefill_rows += rows;
                stats.prefill_tokens += tokens;
                stats.prefill_shared += shared;
            }
            Phase::Decode => {
                stats.decode_calls += 1;
                stats.decode_rows += rows;
                stats.peak_decode_batch = stats.peak_decode_batch.max(rows);
            }
        }
    }

    /// Answers and removes the sequences that finished or failed, keeping the caches of those
    /// that finished for later prompts.
    fn retire(&mut self) {
        let mut index = 0;
        while index < self.live.len() {
            match self.live[index].outcome.take() {
                Some(outcome) => {
                    let sequence = self.live.remove(index);
                    let mut stats = self.stats();
                    stats.requests_done += 1;
                    stats.tokens_generated += sequence.generated.len() as u64;
                    drop(stats);
                    let held = self.reuses_prefixes.then(|| sequence.held_tokens(&outcome)).flatten();
                    let cache = sequence.answer(outcome);
                    if let Some(tokens) = held {
                        self.keep(tokens, &cache);
                    }
                }
                None => index += 1,
            }
        }
    }

    /// Keeps a copy of a finished sequence's cache, cut to the `tokens` it holds: a cache may
    /// have grown well past them (by doubling, or on a GPU to the longest cache of its steps),
    /// and the store's budget counts tokens. A copy that fails is not kept: the store only
    /// saves time.
    fn keep(&mut self, tokens: Vec<u32>, cache: &DecoderCache) {
        if let Ok(Some(copy)) = self.model.fork_cache_prefix(cache, tokens.len()) {
            self.prefixes.insert(tokens, copy);
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, EngineStats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
