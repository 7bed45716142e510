//! whale's local policy: Qwen3 and Qwen3.5 decoders in candle, their Hugging Face
//! checkpoints and the SFT trainer of the weight phase.
//!
//! Data flow:
//! - [`checkpoint::load_model`] reads `config.json` ([`config::Qwen3Config`]) and the
//!   safetensors weights into a [`model::Qwen3Model`], whose parameters live in a candle
//!   `VarMap` under their Hugging Face names; [`model::Qwen3Model::new_random`] makes a fresh one.
//! - Rollouts: [`engine::LocalPolicy`] implements whale-policy's [`Policy`]. Each rollout
//!   thread's [`Policy::chat`] renders the messages with the [`chat_template::ChatTemplate`],
//!   tokenizes them ([`tokenizer::Tokenizer`]) and hands the prompt to the engine's scheduler
//!   thread, which keeps one [`model::KvCache`] per live sequence and calls
//!   [`model::Qwen3Model::forward_step`] with a chunk of new tokens for each sequence it serves
//!   (prompts to prefill in one call, the last sampled tokens in another); it gets the
//!   next-token logits back, one row per sequence, samples each row with the request's own
//!   seeded [`sampling::Sampler`], and sends each finished [`Completion`] back. whale-lm's errors
//!   become [`PolicyError`]s by the conversions in `policy.rs`.
//! - Rollouts on a server: whale-policy's [`RemotePolicy`], re-exported here with the rest of the
//!   policy vocabulary for the crates that use both.
//! - Weight phase: the caller renders and tokenizes the accepted rollouts into
//!   [`train::SftExample`]s (prompt tokens, completion tokens); [`train::SftTrainer::step`] groups
//!   them into [`train::SftBatch`]es, computes the completion-only loss with
//!   [`model::Qwen3Model::packed_hidden`] (each micro-batch's sequences end to end, no padding),
//!   and updates the shared weights in place with AdamW,
//!   so every clone of the model (the one the rollout engine holds included) sees them.
//! - Policy gradient (GRPO, RLOO): the caller passes sampled completions with their advantage
//!   and the log-probabilities recorded at sampling ([`policy_gradient::PgExample`]);
//!   [`train::SftTrainer::policy_gradient_step`] takes one update on PPO's clipped surrogate,
//!   with the same micro-batching, clipping and AdamW as the supervised step.
//! - [`train::SftTrainer::save`] writes a Hugging Face checkpoint plus the optimizer state;
//!   [`train::SftTrainer::resume`] continues from it exactly.
//! - LoRA: a [`lora::LoraAdapter`] holds low-rank matrices under PEFT's tensor names in its own
//!   `VarMap`; [`model::Qwen3Model::with_adapter`] gives a model that shares the base weights and
//!   the adapter's variables and adds `scale * B A` to the targeted projections. A trainer over
//!   such a model optimizes the adapter only and saves it with [`train::SftTrainer::save_adapter`]
//!   ([`lora::LoraAdapter::save_peft`] / [`lora::LoraAdapter::load_peft`] read and write the
//!   PEFT directory that `peft`, vLLM and SGLang load); [`model::Qwen3Model::merged`] folds the
//!   adapter into a plain model for a full checkpoint.
//! - After a trainer step the owner calls [`engine::LocalPolicy::set_weights_version`], which
//!   bumps [`Policy::weights_version`] and rebuilds the caches of requests in flight.
//! - Qwen3.5 ([`qwen3_5`]): the hybrid Gated DeltaNet + gated-attention decoder, with its own
//!   checkpoints, cache and PEFT adapters ([`qwen3_5::Qwen35Lora`]); the engine serves it through
//!   [`decoder::Decoder`] and the trainer trains it as a [`train::TrainableModel`].
//! - Architectures: each is a folder ([`qwen3`], [`qwen3_5`]) whose model implements
//!   [`decoder::Architecture`] (what the engine asks) and [`train::TrainableModel`] (what the
//!   trainer asks, its checkpoints and adapters included), and whose `REGISTRATION` is one line of
//!   [`architectures::ARCHITECTURES`], by which [`decoder::Decoder::load`] picks a checkpoint's.
//! - GGUF ([`gguf`]): llama.cpp's one-file format read with candle's reader: metadata, every
//!   tensor dequantized to f32 or bf16, the tokenizer and chat template from the metadata, and
//!   [`gguf::convert_to_hf`], the Hugging Face directory of a Llama GGUF.
//! - [`bench::run_bench`] measures generation through the engine, SFT training steps and the
//!   machine's matmul ceiling in one run, as a [`bench::BenchTable`].

pub mod architectures;
pub mod bench;
pub mod chat_codec;
pub mod chat_template;
pub mod decoder;
pub mod engine;
pub mod gguf;
mod kernels;
mod parameters;
mod policy;
pub mod policy_gradient;
pub mod qwen3;
pub mod qwen3_5;
pub mod runtime;
pub mod sampling;
mod tensor_file;
pub mod tokenizer;
pub mod train;

/// Qwen3's modules also answer at the root, where the Hugging Face layout they hold (`config.json`,
/// checkpoint and adapter file names) is looked up by the crates above.
pub use qwen3::{checkpoint, config, lora, model};

pub use architectures::{WithTrainable, ARCHITECTURES};
pub use bench::{run_bench, BenchConfig, BenchError, BenchRow, BenchTable};
pub use chat_codec::{ChatCodec, ChatCodecError};
pub use chat_template::{ChatTemplate, ChatTemplateError, RenderOptions};
pub use decoder::{AdapterError, Architecture, Decoder, DecoderCache, DecoderStep, Registration};
pub use engine::{EngineConfig, EngineError, EngineStats, LocalPolicy};
pub use gguf::{GgufError, GgufFile};
pub use policy_gradient::{completion_logprobs, PgExample, PgObjective, PgStepStats};
pub use qwen3::checkpoint::{load_model, save_model, stored_dtype, CheckpointError, GenerationConfig};
pub use qwen3::config::{ConfigError, ConfigIssue, ModelSize, Qwen3Config};
pub use qwen3::lora::{LoraAdapter, LoraConfig, LoraError, LoraTarget};
pub use qwen3::model::{KvCache, ModelError, Qwen3Model, SeqStep};
pub use qwen3_5::{load_qwen35, save_qwen35, Qwen35Cache, Qwen35Config, Qwen35Lora, Qwen35Model, Qwen35Step};
pub use sampling::{SampledToken, Sampler};
pub use tokenizer::{SpecialTokens, TextStream, Tokenizer, TokenizerError};
pub use train::{
    LrSchedule, SftBatch, SftExample, SftTrainer, StepStats, TrainError, TrainableModel, TrainerConfig, TrainerState,
};
pub use whale_policy::{
    ChatRequest, Completion, FinishReason, Policy, PolicyError, RemoteConfig, RemoteError, RemotePolicy, SamplingParams,
};
