//! whale's models: the Qwen3, Qwen2, Llama and Qwen3.5 decoders in candle, their Hugging Face checkpoints and
//! PEFT adapters, behind one seam that the engine, the trainer, `whale serve`, `whale lm` and the
//! loop use without naming an architecture.
//!
//! Why a crate of its own: what a model is (its layers and files) changes with each
//! architecture, while how it is served (whale-engine), trained (whale-train) or reached over
//! HTTP (whale-policy's `RemotePolicy`) does not; the numeric kernels its passes are built from
//! are whale-kernels', and GGUF files are imported into its checkpoint layout by whale-gguf.
//!
//! Data flow:
//! - [`Decoder::load`] reads a checkpoint directory's `config.json`, picks the architecture
//!   registered for its `model_type` ([`architectures::ARCHITECTURES`]) and loads the weights:
//!   [`checkpoint::load_dense`] into a [`Qwen3Model`], a [`Qwen2Model`] or a [`LlamaModel`] (the
//!   one dense decoder, [`DenseModel`], built from any of their configs; parameters in a candle `VarMap` under their
//!   Hugging Face names), or [`load_qwen35`] into a [`Qwen35Model`]. The [`Decoder`] holds it as
//!   a boxed [`Architecture`].
//! - Decoding: the engine asks the [`Decoder`] for a per-sequence [`DecoderCache`] and calls
//!   [`Decoder::forward_step`] with a chunk of new tokens per sequence; it gets the next-token
//!   logits back, one row per sequence. Messages become prompt ids, and ids text, by
//!   whale-text's tokenizer and chat template, which know nothing of the model.
//! - Training: a trainer runs any [`TrainableModel`] (its differentiable pass
//!   [`TrainableModel::packed_hidden`], its trained parameters, its checkpoints and adapters);
//!   [`Decoder::with_trainable`] hands the model a [`Decoder`] holds to such generic code.
//! - LoRA: a [`lora::LoraAdapter`] holds low-rank matrices under PEFT's tensor names in its own
//!   `VarMap`; [`model::DenseModel::with_adapter`] gives a model that shares the base weights and
//!   the adapter's variables and adds `scale * B A` to the targeted projections
//!   ([`lora::LoraAdapter::save_peft`] / [`lora::LoraAdapter::load_peft`] read and write the
//!   PEFT directory that `peft`, vLLM and SGLang load); [`model::DenseModel::merged`] folds the
//!   adapter into a plain model for a full checkpoint. [`Qwen35Lora`] is Qwen3.5's.
//! - Architectures: each is a folder ([`qwen3`], [`qwen2`], [`llama`], [`qwen3_5`]) whose model implements
//!   [`Architecture`] (what a loaded model is asked, parameter and FLOP counts included) and
//!   [`TrainableModel`] (the model as a type: its `model_type`s, checkpoints, training pass and
//!   adapters), and whose type is one line of the registry ([`architectures`]). Llama's and
//!   Qwen2's models are Qwen3's dense decoder built from their own configs ([`DenseConfig`]).
//! - [`random`]: seeded random models over a BPE trained on generated text, for benches and
//!   tests that need no download.

pub mod architectures;
pub mod decoder;
pub mod llama;
mod parameters;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod random;
pub mod tensor_file;
pub mod trainable;

/// Qwen3's modules also answer at the root, where the Hugging Face layout they hold (`config.json`,
/// checkpoint and adapter file names) is looked up by the crates above.
pub use qwen3::{checkpoint, config, lora, model};

pub use architectures::{Registration, WithTrainable, ARCHITECTURES};
pub use decoder::{ActivationCounts, AdapterError, Architecture, Decoder, DecoderCache, DecoderStep, FlopCounts};
pub use llama::{LlamaConfig, LlamaModel, RopeScaling};
pub use qwen2::{Qwen2Config, Qwen2Model};
pub use qwen3::checkpoint::{load_dense, load_model, save_model, stored_dtype, CheckpointError, GenerationConfig};
pub use qwen3::config::{ConfigError, ConfigIssue, ModelSize, Qwen3Config};
pub use qwen3::dense::{DenseConfig, DenseSettings};
pub use qwen3::lora::{LoraAdapter, LoraConfig, LoraError, LoraTarget};
pub use qwen3::model::{DenseModel, KvCache, ModelError, Qwen3Model, SeqStep};
pub use qwen3_5::{load_qwen35, save_qwen35, Qwen35Cache, Qwen35Config, Qwen35Lora, Qwen35Model, Qwen35Step};
pub use trainable::{TrainableError, TrainableModel};
