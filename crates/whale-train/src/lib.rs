//! whale's trainer: supervised fine-tuning and the policy-gradient update (GRPO, RLOO) of any
//! whale-lm architecture, full weights or a LoRA adapter, with exact resume.
//!
//! Why a crate of its own: training (losses, AdamW, micro-batching, optimizer state on disk)
//! is the same for every architecture and is needed by the weight phase, pretraining and
//! `whale lm train`, while serving is not. The trainer is generic over whale-lm's
//! [`TrainableModel`], which each architecture's folder implements, so it never names one; it
//! updates the model's weights in place, and a whale-engine `LocalPolicy` that shares them sees
//! the update once its owner bumps the weights version.
//!
//! Data flow:
//! - The caller renders and tokenizes conversations into [`SftExample`]s (prompt tokens,
//!   completion tokens) with a [`ChatCodec`]; [`SftTrainer::step`] groups them into
//!   [`trainer::SftBatch`]es, computes the completion-only loss with the model's
//!   [`TrainableModel::packed_hidden`] (each micro-batch's sequences end to end, no padding) and
//!   whale-kernels' cross-entropy, and updates the shared weights in place with AdamW.
//! - Policy gradient: the caller passes sampled completions with their advantage and the
//!   log-probabilities recorded at sampling ([`PgExample`]); [`SftTrainer::policy_gradient_step`]
//!   takes one update on PPO's clipped surrogate, with the same micro-batching, clipping and
//!   AdamW as the supervised step.
//! - Before either takes a pass, [`StepMemory`] refuses a step that cannot fit in the memory
//!   available (on a CPU), naming what it would need.
//! - [`SftTrainer::save_checkpoint`] (or [`SftTrainer::save`] with a generation config) writes
//!   the architecture's checkpoint plus the optimizer state; [`SftTrainer::resumed`] (or
//!   [`SftTrainer::resume`], which loads the checkpoint too) continues from it exactly. A trainer of an adapter saves a PEFT
//!   directory with [`SftTrainer::save_adapter`] and continues with
//!   [`SftTrainer::resume_adapter`].
//!
//! [`TrainableModel`]: whale_lm::TrainableModel
//! [`TrainableModel::packed_hidden`]: whale_lm::TrainableModel::packed_hidden

pub mod chat_codec;
pub mod memory;
pub mod policy_gradient;
pub mod trainer;

pub use chat_codec::{ChatCodec, ChatCodecError};
pub use memory::{MemoryShortfall, PassTokens, StepMemory};
pub use policy_gradient::{completion_logprobs, PgExample, PgObjective, PgStepStats};
pub use trainer::{LrSchedule, SftBatch, SftExample, SftTrainer, StepStats, TrainError, TrainerConfig, TrainerState};
