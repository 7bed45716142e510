//! The GGUF architectures whale converts, and what each means for the conversion: the Hugging
//! Face model it becomes, the prefix of its hyperparameters, whether llama.cpp's converter
//! reordered its rotary rows, and which tensors a block has.
//!
//! Why a type of its own: llama.cpp writes a Llama and a Qwen2 with the same tensor names and
//! the same metadata keys under their own prefix (`llama.*`, `qwen2.*`), but converts them
//! differently. A Llama's query and key rows are interleaved for llama.cpp's adjacent-pair rotary
//! embedding and must be put back; a Qwen2 rotates halves (llama.cpp's NEOX rotation, the
//! Hugging Face one) and is stored as it is, with biases on its query, key and value projections.

/// An architecture whale reads from a GGUF's `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufArchitecture {
    Llama,
    Qwen2,
}

impl GgufArchitecture {
    pub const ALL: [GgufArchitecture; 2] = [GgufArchitecture::Llama, GgufArchitecture::Qwen2];

    /// The `general.architecture` value, which also prefixes the hyperparameters' keys.
    pub fn name(self) -> &'static str {
        match self {
            GgufArchitecture::Llama => "llama",
            GgufArchitecture::Qwen2 => "qwen2",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|architecture| architecture.name() == name)
    }

    /// The `architectures` entry of the Hugging Face checkpoint it converts to.
    pub fn hf_architecture(self) -> &'static str {
        match self {
            GgufArchitecture::Llama => "LlamaForCausalLM",
            GgufArchitecture::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// The checkpoint's `model_type`.
    pub fn model_type(self) -> &'static str {
        self.name()
    }

    /// Whether llama.cpp's converter interleaved each head's rotary halves in `attn_q` and
    /// `attn_k` ([`crate::names::unpermute_rotary_rows`] undoes it).
    pub fn interleaves_rotary_rows(self) -> bool {
        self == GgufArchitecture::Llama
    }

    /// Whether every block has `attn_q.bias`, `attn_k.bias` and `attn_v.bias`.
    pub fn has_qkv_bias(self) -> bool {
        self == GgufArchitecture::Qwen2
    }

    /// A metadata key of this architecture's hyperparameters (`qwen2.block_count`).
    pub fn key(self, name: &str) -> String {
        format!("{}.{name}", self.name())
    }
}

/// The names of every architecture read, for messages.
pub fn names() -> Vec<&'static str> {
    GgufArchitecture::ALL.iter().map(|architecture| architecture.name()).collect()
}
