//! Fixtures of the server tests: tiny random models on disk, a server on a free loopback port,
//! a client for it, and a raw HTTP helper for what the client never sends.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use candle_core::{DType, Device};
use whale_core::ChatMessage;
use whale_engine::{EngineConfig, LocalPolicy};
use whale_lm::qwen3_5::Qwen35Size;
use whale_lm::{save_model, save_qwen35, GenerationConfig, Qwen35Config, Qwen35Model, Qwen3Config, Qwen3Model};
use whale_policy::{ChatRequest, RemoteConfig, RemotePolicy, SamplingParams};
use whale_serve::{LoadSettings, ModelRegistry, RuntimeLoading, ServeConfig, Server};
use whale_text::{write_tokenizer_config, Tokenizer, CHATML_TEMPLATE, TOKENIZER_FILE};

/// The tiny models' context window.
pub const CONTEXT: usize = 256;

/// Writes a tiny random model (weights from `seed`) in the Hugging Face layout to `dir`. Its
/// weights are larger than the usual initialisation so that greedy outputs differ clearly
/// between seeds.
pub fn write_model(dir: &Path, seed: u64) {
    let corpus = whale_lm::random::synthetic_corpus(300, 1);
    let tokenizer = Tokenizer::train_bpe(corpus.iter().map(String::as_str), 400).expect("a tokenizer");
    let mut config = Qwen3Config::tiny(tokenizer.vocab_size());
    config.max_position_embeddings = CONTEXT;
    config.initializer_range = 0.2;
    let model = Qwen3Model::new_random(&config, seed, DType::F32, &Device::Cpu).expect("a model");
    save_model(&model, &GenerationConfig::for_model(model.config()), dir).expect("weights written");
    tokenizer.save(dir.join(TOKENIZER_FILE)).expect("tokenizer written");
    write_tokenizer_config(dir, CHATML_TEMPLATE, &tokenizer.specials(), CONTEXT).expect("tokenizer config written");
}

/// Writes a tiny random model (as [`write_model`]) whose chat template refuses a system
/// message after the first with its own `raise_exception`, as Qwen's templates do.
pub fn write_strict_model(dir: &Path, seed: u64) {
    write_model(dir, seed);
    let tokenizer = Tokenizer::from_file(dir.join(TOKENIZER_FILE)).expect("the tokenizer");
    let strict = format!(
        "{{%- for m in messages %}}{{%- if m.role == 'system' and not loop.first %}}\
         {{{{ raise_exception('System message must be at the beginning.') }}}}{{%- endif %}}{{%- endfor %}}{CHATML_TEMPLATE}"
    );
    write_tokenizer_config(dir, &strict, &tokenizer.specials(), CONTEXT).expect("tokenizer config written");
}

/// Writes a tiny random Qwen3.5 model (weights from `seed`, spread wider than the usual
/// initialisation) in the Hugging Face layout to `dir`.
pub fn write_qwen35_model(dir: &Path, seed: u64) {
    let corpus = whale_lm::random::synthetic_corpus(300, 1);
    let tokenizer = Tokenizer::train_bpe(corpus.iter().map(String::as_str), 400).expect("a tokenizer");
    let mut config = Qwen35Config::text(tokenizer.vocab_size(), Qwen35Size::TINY);
    config.max_position_embeddings = CONTEXT;
    let model = Qwen35Model::new_random(&config, seed, DType::F32, &Device::Cpu).expect("a model");
    for (_, var) in model.named_parameters() {
        var.set(&(var.as_tensor() * 10.0).expect("scaled")).expect("set");
    }
    save_qwen35(&model, dir).expect("weights written");
    tokenizer.save(dir.join(TOKENIZER_FILE)).expect("tokenizer written");
    write_tokenizer_config(dir, CHATML_TEMPLATE, &tokenizer.specials(), CONTEXT).expect("tokenizer config written");
}

/// A server on a free loopback port serving the model in `dir` as `base`.
pub fn start(dir: &Path, config: ServeConfig) -> Server {
    let registry =
        ModelRegistry::open(dir, Some("base".to_string()), LoadSettings::default()).expect("the model loads");
    Server::start(&ServeConfig { host: "127.0.0.1".into(), port: 0, ..config }, registry).expect("the server starts")
}

/// A server config with runtime loading on, reading under `dirs`.
pub fn loading_from(dirs: &[&Path]) -> ServeConfig {
    let allowed = dirs.iter().map(|dir| dir.to_path_buf()).collect();
    ServeConfig { runtime_loading: RuntimeLoading::allowed(allowed), ..ServeConfig::default() }
}

/// The same model in-process.
pub fn local(dir: &Path) -> LocalPolicy {
    LocalPolicy::load(dir, DType::F32, &Device::Cpu, EngineConfig::default()).expect("the model loads")
}

/// A client of `server` for `model`, with short backoffs.
pub fn remote(server: &Server, model: &str, max_retries: u32) -> RemotePolicy {
    RemotePolicy::new(RemoteConfig {
        base_url: server.base_url(),
        model: model.to_string(),
        api_key: Some("test".into()),
        max_retries,
        backoff_initial_ms: 5,
        backoff_max_ms: 100,
        request_timeout_s: 60.0,
        ..RemoteConfig::default()
    })
    .expect("a valid client")
}

pub fn request(question: &str, temperature: f32, seed: u64, max_tokens: usize) -> ChatRequest {
    ChatRequest {
        messages: vec![ChatMessage::new("user", question)],
        params: SamplingParams { temperature, seed, max_tokens, ..SamplingParams::default() },
    }
}

/// `(status, body)` of a raw POST.
pub fn post(server: &Server, path: &str, body: &str) -> (u16, serde_json::Value) {
    let response = http()
        .post(format!("http://{}{path}", server.addr()))
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .expect("the server answers");
    let status = response.status().as_u16();
    let text = response.text().expect("a body");
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

pub fn get(server: &Server, path: &str) -> (u16, serde_json::Value) {
    let response = http().get(format!("http://{}{path}", server.addr())).send().expect("the server answers");
    let status = response.status().as_u16();
    (status, response.json().expect("a JSON body"))
}

pub fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().expect("a client")
}

/// Writes to `dir` a PEFT LoRA adapter (rank 4 on every projection) for the model in
/// `base_dir`, with random B matrices so that it changes the model's outputs.
pub fn write_adapter(base_dir: &Path, dir: &Path, seed: u64) {
    use rand::{Rng, SeedableRng};
    let base = whale_lm::load_model(base_dir, DType::F32, &Device::Cpu).expect("the base loads");
    let config = whale_lm::LoraConfig { rank: 4, ..whale_lm::LoraConfig::default() };
    let adapter =
        whale_lm::LoraAdapter::new(config, base.config(), seed, DType::F32, &Device::Cpu).expect("an adapter");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (name, var) in adapter.named_parameters() {
        if name.contains("lora_B") {
            let values: Vec<f32> = (0..var.elem_count()).map(|_| rng.gen_range(-0.5..0.5)).collect();
            let tensor = candle_core::Tensor::from_vec(values, var.shape(), &Device::Cpu).expect("a tensor");
            var.set(&tensor).expect("B set");
        }
    }
    adapter.save_peft(dir, "base").expect("the adapter is written");
}

/// The model in `base_dir` with the adapter in `adapter_dir` applied, in-process.
pub fn local_with_adapter(base_dir: &Path, adapter_dir: &Path) -> LocalPolicy {
    let policy = local(base_dir);
    let base = policy.served_model::<Qwen3Model>("a LoRA adapter").expect("a Qwen3 model");
    let adapter = whale_lm::LoraAdapter::load_peft(adapter_dir, base.config(), DType::F32, &Device::Cpu)
        .expect("the adapter loads");
    policy.reload(base.with_adapter(&adapter).expect("it fits"), 0).expect("reloaded");
    policy
}

/// A chat completion body: one user turn, `sampling` (temperature, max_tokens, seed), and the
/// fields of `extra` over them.
pub fn chat_body_with(sampling: serde_json::Value, extra: serde_json::Value) -> String {
    let mut body = serde_json::json!({"model": "base", "messages": [{"role": "user", "content": "Tova has 3 cups."}]});
    for (key, value) in sampling.as_object().into_iter().chain(extra.as_object()).flatten() {
        body[key] = value.clone();
    }
    body.to_string()
}
