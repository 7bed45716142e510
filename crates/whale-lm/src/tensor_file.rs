//! Reading and writing the files a checkpoint or an adapter is made of: JSON objects and
//! safetensors files, every problem naming the file and the key or tensor at fault, and atomic
//! writes (a temporary file, then a rename). Its own file so that the model, LoRA adapters and the
//! trainer's state share these readers without importing one another.

use crate::qwen3::config::ConfigError;
use crate::qwen3::model::error::ModelError;
use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as StDtype, Metadata};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// Why a checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A key of a JSON file or a tensor of a safetensors file is missing or wrong.
    #[error("{}: `{key}`: {reason}", file.display())]
    Invalid { file: PathBuf, key: String, reason: String },
    #[error("{}: not a valid file: {reason}", file.display())]
    Format { file: PathBuf, reason: String },
    #[error("{}: neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX_FILE} exists", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("{}: {source}", dir.display())]
    Model { dir: PathBuf, source: ModelError },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl CheckpointError {
    /// A key of `file` that is missing or wrong, and why.
    pub fn invalid(file: &Path, key: &str, reason: impl Into<String>) -> Self {
        Self::Invalid { file: file.to_path_buf(), key: key.to_string(), reason: reason.into() }
    }

    pub(crate) fn io(file: &Path, source: std::io::Error) -> Self {
        Self::Io { file: file.to_path_buf(), source }
    }
}

pub(crate) fn read_json_object(file: &Path) -> Result<Map<String, Value>, CheckpointError> {
    let text = std::fs::read_to_string(file).map_err(|e| CheckpointError::io(file, e))?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(CheckpointError::Format {
            file: file.to_path_buf(),
            reason: "the top level is not an object".to_string(),
        }),
        Err(e) => Err(CheckpointError::Format { file: file.to_path_buf(), reason: e.to_string() }),
    }
}

/// The tensor names in a safetensors file's header (eight bytes of little-endian length, then
/// that much JSON), read without the tensors' data.
pub(crate) fn tensor_names(file: &Path) -> Result<Vec<String>, CheckpointError> {
    let format = |reason: String| CheckpointError::Format { file: file.to_path_buf(), reason };
    let mut reader = std::fs::File::open(file).map_err(|e| CheckpointError::io(file, e))?;
    let file_length = reader.metadata().map_err(|e| CheckpointError::io(file, e))?.len();
    let (_, metadata) = read_header(&mut reader, file_length).map_err(format)?;
    Ok(metadata.tensors().into_keys().collect())
}

/// Reads the named float tensors of one safetensors file onto the CPU, checking each shape.
pub fn read_tensors(file: &Path, wanted: &[(String, Vec<usize>)]) -> Result<HashMap<String, Tensor>, CheckpointError> {
    read_tensors_checked(file, wanted, false)
}

/// [`read_tensors`] for a file that must hold exactly the wanted tensors: any other tensor is
/// an error naming it.
pub(crate) fn read_exact_tensors(
    file: &Path,
    wanted: &[(String, Vec<usize>)],
) -> Result<HashMap<String, Tensor>, CheckpointError> {
    read_tensors_checked(file, wanted, true)
}

/// Reads the header, then each wanted tensor's bytes on their own, so that loading holds one
/// tensor's bytes at a time beside the tensors made so far, not the whole file beside them (a
/// 7 GB checkpoint would otherwise peak at 14 GB while it loads).
fn read_tensors_checked(
    file: &Path,
    wanted: &[(String, Vec<usize>)],
    exact: bool,
) -> Result<HashMap<String, Tensor>, CheckpointError> {
    let format = |reason: String| CheckpointError::Format { file: file.to_path_buf(), reason };
    let mut reader = std::fs::File::open(file).map_err(|e| CheckpointError::io(file, e))?;
    let file_length = reader.metadata().map_err(|e| CheckpointError::io(file, e))?.len();
    let (header_length, metadata) = read_header(&mut reader, file_length).map_err(format)?;
    if exact {
        let mut names: Vec<String> = metadata.tensors().into_keys().collect();
        names.sort_unstable();
        if let Some(unexpected) = names.into_iter().find(|name| !wanted.iter().any(|(w, _)| w == name)) {
            return Err(CheckpointError::invalid(file, &unexpected, "unexpected tensor"));
        }
    }
    let mut tensors = HashMap::with_capacity(wanted.len());
    for (name, shape) in wanted {
        let info = metadata.info(name).ok_or_else(|| CheckpointError::invalid(file, name, "missing"))?;
        if info.shape != *shape {
            return Err(CheckpointError::invalid(file, name, format!("shape {:?}, expected {shape:?}", info.shape)));
        }
        let dtype = match info.dtype {
            StDtype::F32 => DType::F32,
            StDtype::BF16 => DType::BF16,
            StDtype::F16 => DType::F16,
            StDtype::F64 => DType::F64,
            other => return Err(CheckpointError::invalid(file, name, format!("dtype {other:?} is not a float type"))),
        };
        let (begin, end) = info.data_offsets;
        let expected = shape.iter().product::<usize>() * dtype.size_in_bytes();
        if end.checked_sub(begin) != Some(expected) {
            return Err(CheckpointError::invalid(
                file,
                name,
                format!("data offsets {begin}..{end} hold no {shape:?} {dtype:?}"),
            ));
        }
        let mut bytes = vec![0u8; expected];
        reader
            .seek(SeekFrom::Start(8 + header_length + begin as u64))
            .and_then(|_| reader.read_exact(&mut bytes))
            .map_err(|e| CheckpointError::io(file, e))?;
        tensors.insert(name.clone(), Tensor::from_raw_buffer(&bytes, dtype, shape, &Device::Cpu)?);
    }
    Ok(tensors)
}

/// The safetensors format's own bound on its JSON header.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The header's length and its tensors' descriptions, checked to lie inside the file.
fn read_header(reader: &mut std::fs::File, file_length: u64) -> Result<(u64, Metadata), String> {
    let mut length = [0u8; 8];
    reader.read_exact(&mut length).map_err(|e| format!("no header: {e}"))?;
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER_BYTES {
        return Err(format!("a header of {length} bytes, past the format's limit of {MAX_HEADER_BYTES}"));
    }
    if 8 + length > file_length {
        return Err(format!("a header of {length} bytes does not fit the file of {file_length}"));
    }
    let mut header = vec![0u8; length as usize];
    reader.read_exact(&mut header).map_err(|e| format!("header: {e}"))?;
    let metadata: Metadata = serde_json::from_slice(&header).map_err(|e| format!("header: {e}"))?;
    if 8 + length + metadata.data_len() as u64 > file_length {
        return Err(format!("the header's {} bytes of data pass the file's end", metadata.data_len()));
    }
    Ok((length, metadata))
}

/// Writes named tensors as one safetensors file with the `{"format": "pt"}` metadata that
/// `transformers` requires.
pub fn write_tensors(file: &Path, tensors: Vec<(String, Tensor)>) -> Result<(), CheckpointError> {
    let on_cpu = tensors
        .into_iter()
        .map(|(name, tensor)| Ok((name, tensor.to_device(&Device::Cpu)?)))
        .collect::<Result<Vec<_>, candle_core::Error>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::tensor::serialize(on_cpu, Some(metadata))
        .map_err(|e| CheckpointError::Format { file: file.to_path_buf(), reason: e.to_string() })?;
    write_atomic(file, &bytes)
}

/// Writes `bytes` to a temporary file beside `file`, then renames it over `file`.
pub fn write_atomic(file: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let name = file.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = file.with_file_name(format!(".{name}.partial"));
    std::fs::write(&temporary, bytes).map_err(|e| CheckpointError::io(&temporary, e))?;
    std::fs::rename(&temporary, file).map_err(|e| CheckpointError::io(file, e))
}
