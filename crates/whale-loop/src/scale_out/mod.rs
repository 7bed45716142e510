//! Scale-out: rollouts on an inference server and weight updates by an external trainer.
//!
//! [`server`] sends every rollout to an OpenAI-compatible server and hot-loads the weights each
//! step produces; [`trainer_command`] runs the user's trainer as a child process with a bounded,
//! killable lifetime; [`external_weights`] is the weight step built from the two: the samples it
//! writes for the trainer, and how their output becomes the next weights version.

pub mod external_weights;
pub mod server;
pub mod trainer_command;
