//! Qwen3 (and Llama, which is Qwen3 without the q/k norm: [`config::Qwen3Config::has_qk_norm`]):
//! its `config.json`, the decoder, its Hugging Face checkpoints and its PEFT LoRA adapters, in
//! one folder as Qwen3.5 has [`crate::qwen3_5`].
//!
//! Some pieces here are shared with the other architectures: the JSON helpers and errors of
//! [`config`], the checkpoint layout of [`checkpoint`] (file names, shards, the generation
//! config), the projections and LoRA updates of [`model`] and the PEFT layout of [`lora`].

pub mod architecture;
pub mod checkpoint;
pub mod config;
pub mod lora;
pub mod model;
