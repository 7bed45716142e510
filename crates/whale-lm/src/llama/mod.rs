//! Llama (SmolLM2 among its models): its `config.json` ([`LlamaConfig`]), its scaled rotary
//! embeddings ([`RopeScaling`]) and its place in the registry ([`LlamaModel`]).
//!
//! Why this folder holds no layers: Llama is the dense grouped-query-attention decoder Qwen3
//! runs on, without Qwen3's per-head query and key norms and with its own rotary scaling. Both
//! are settings of that decoder ([`crate::qwen3::dense::DenseSettings`]: `qk_norm`, the inverse
//! frequencies), so [`LlamaModel`] is the decoder of [`crate::qwen3::model`] built from a
//! [`LlamaConfig`], and its layers, key/value cache, training pass, LoRA adapters and
//! checkpoint layout are the ones Qwen3 uses, written once. What is Llama's own is here: the
//! keys of its config that Qwen3's has not ([`config::LlamaKeys`]; the shared ones are read and
//! written back by [`crate::qwen3::config::DenseHfConfig`], and a checkpoint or adapter saved
//! from it says `llama` and `LlamaForCausalLM`), what it refuses, and how it scales the rotary
//! frequencies.

pub mod config;
pub mod rope_scaling;

pub use config::LlamaConfig;
pub use rope_scaling::RopeScaling;

use crate::qwen3::model::DenseModel;

/// The Llama decoder: the dense decoder built from a [`LlamaConfig`].
pub type LlamaModel = DenseModel<LlamaConfig>;
