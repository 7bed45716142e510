//! Why a model could not be built or run; its own file so that the checkpoint readers can name
//! it without importing the model.

use crate::qwen3::config::ConfigIssue;

/// Why a model could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigIssue),
    #[error("tensor `{name}` is missing")]
    MissingTensor { name: String },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("invalid input: {0}")]
    Input(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
