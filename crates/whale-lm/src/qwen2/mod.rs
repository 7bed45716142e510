//! Qwen2 (Qwen2.5 and Qwen2.5-Coder among its models): its `config.json` ([`Qwen2Config`]) and
//! its place in the registry ([`Qwen2Model`]).
//!
//! Why this folder holds no layers: Qwen2 is the dense grouped-query-attention decoder Qwen3 and
//! Llama run on, without Qwen3's per-head query and key norms and with a bias on the query, key
//! and value projections. Both are settings of that decoder
//! ([`crate::qwen3::dense::DenseSettings`]: `qk_norm`, `qkv_bias`), so [`Qwen2Model`] is the
//! decoder of [`crate::qwen3::model`] built from a [`Qwen2Config`], with its cache, training pass,
//! LoRA adapters and checkpoint layout. What is Qwen2's own is here: its names (a checkpoint or
//! adapter saved from it says `qwen2` and `Qwen2ForCausalLM`, for transformers, PEFT and vLLM),
//! its defaults and what it refuses (sliding-window attention, scaled rotary embeddings).

pub mod config;

pub use config::Qwen2Config;

use crate::qwen3::model::DenseModel;

/// The Qwen2 decoder: the dense decoder built from a [`Qwen2Config`].
pub type Qwen2Model = DenseModel<Qwen2Config>;
