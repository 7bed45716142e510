//! Qwen3: its `config.json`, the dense decoder it runs on, its Hugging Face checkpoints and its
//! PEFT LoRA adapters, in one folder as Qwen3.5 has [`crate::qwen3_5`].
//!
//! Some pieces here are shared with the other architectures: the JSON helpers, errors and key
//! checks of [`config`], the checkpoint layout of [`checkpoint`] (file names, shards, the
//! generation config), the projections and LoRA updates of [`model`] and the PEFT layout of
//! [`lora`]. Llama ([`crate::llama`]) shares the whole decoder: [`model::DenseModel`] is built
//! from any config implementing [`dense::DenseConfig`], Qwen3's and Llama's, and
//! [`architecture`] puts it behind the seam once for both.

pub mod architecture;
pub mod checkpoint;
pub mod config;
pub mod dense;
pub mod lora;
pub mod model;
