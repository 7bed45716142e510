//! Why a GGUF could not be read or converted: every variant names the file and, where one is at
//! fault, the metadata key or the tensor, so that a refused file says what to look at.

use std::path::{Path, PathBuf};

use whale_lm::tensor_file::CheckpointError;
use whale_text::{ChatTemplateError, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
    #[error("{}: not a GGUF file candle can read: {reason}", file.display())]
    Header { file: PathBuf, reason: String },
    #[error("{}: `general.architecture` is {architecture:?}; whale reads {supported:?}", file.display())]
    Architecture { file: PathBuf, architecture: String, supported: Vec<&'static str> },
    #[error("{}: tensor `{tensor}` is {dtype}, a type whale does not read (it reads {})", file.display(), .supported.join(", "))]
    TensorType { file: PathBuf, tensor: String, dtype: String, supported: Vec<&'static str> },
    #[error("{}: metadata `{key}` is missing", file.display())]
    MissingKey { file: PathBuf, key: String },
    #[error("{}: metadata `{key}`: {reason}", file.display())]
    InvalidKey { file: PathBuf, key: String, reason: String },
    #[error("{}: tensor `{tensor}` is missing", file.display())]
    MissingTensor { file: PathBuf, tensor: String },
    #[error("{}: tensor `{tensor}`: {reason}", file.display())]
    Tensor { file: PathBuf, tensor: String, reason: String },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error(transparent)]
    Write(#[from] CheckpointError),
}

impl GgufError {
    pub(crate) fn io(file: &Path, source: std::io::Error) -> Self {
        Self::Io { file: file.to_path_buf(), source }
    }

    pub(crate) fn invalid_key(file: &Path, key: &str, reason: impl Into<String>) -> Self {
        Self::InvalidKey { file: file.to_path_buf(), key: key.to_string(), reason: reason.into() }
    }

    pub(crate) fn tensor(file: &Path, tensor: &str, reason: impl ToString) -> Self {
        Self::Tensor { file: file.to_path_buf(), tensor: tensor.to_string(), reason: reason.to_string() }
    }
}
