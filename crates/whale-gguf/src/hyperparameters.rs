//! The hyperparameters a GGUF stores under its architecture's prefix (`llama.*`, `qwen2.*`, the
//! same keys for both), read into the fields of a Hugging Face config. Defaults follow llama.cpp
//! where a key is optional (kv heads = heads, head size =
//! hidden / heads, rope theta 10,000); rope scaling other than none, linear or YaRN is refused, and
//! so are a head size that is not positive and even and a rope base, RMS epsilon or scaling factor
//! that is not finite and positive (each would reach `config.json` and every forward pass).

use crate::architecture::GgufArchitecture;
use crate::error::GgufError;
use crate::metadata::Metadata;

/// llama.cpp's default rope base when `<architecture>.rope.freq_base` is absent.
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
/// llama.cpp's default RMS-norm epsilon when the key is absent.
const DEFAULT_RMS_NORM_EPS: f64 = 1e-5;

/// Rope scaling stated in the metadata.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// YaRN over an original context of `original_context`.
    Yarn { factor: f64, original_context: usize },
}

/// The shape of a model as its GGUF states it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hyperparameters {
    pub architecture: GgufArchitecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub context_length: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// `<architecture>.vocab_size` when present (conversion refuses one other than the token count).
    pub vocab_size: Option<usize>,
}

impl Hyperparameters {
    pub fn read(metadata: &Metadata, architecture: GgufArchitecture) -> Result<Self, GgufError> {
        let key = |name: &str| architecture.key(name);
        let hidden_size = metadata.usize(&key("embedding_length"))?;
        let heads = positive(metadata, &key("attention.head_count"))?;
        let kv_heads = metadata.optional_usize(&key("attention.head_count_kv"))?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            let reason = format!("{kv_heads} key-value heads do not divide {heads} query heads");
            return Err(metadata.invalid(&key("attention.head_count_kv"), reason));
        }
        let head_dim = read_head_dim(metadata, architecture, heads, hidden_size)?;
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: metadata.usize(&key("feed_forward_length"))?,
            layers: positive(metadata, &key("block_count"))?,
            heads,
            kv_heads,
            head_dim,
            context_length: metadata.usize(&key("context_length"))?,
            rope_theta: optional_positive_f64(metadata, &key("rope.freq_base"))?.unwrap_or(DEFAULT_ROPE_THETA),
            rms_norm_eps: optional_positive_f64(metadata, &key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(DEFAULT_RMS_NORM_EPS),
            rope_scaling: read_rope_scaling(metadata, architecture)?,
            vocab_size: metadata.optional_usize(&key("vocab_size"))?,
        })
    }
}

fn positive(metadata: &Metadata, key: &str) -> Result<usize, GgufError> {
    match metadata.usize(key)? {
        0 => Err(metadata.invalid(key, "must be positive")),
        value => Ok(value),
    }
}

/// The head size: `rope.dimension_count`, or hidden / heads without it (the key blamed is then
/// `embedding_length`). Positive and even, since the rotary embedding pairs the halves of a head,
/// and small enough that the query heads' rows fit a `usize`.
fn read_head_dim(
    metadata: &Metadata,
    architecture: GgufArchitecture,
    heads: usize,
    hidden_size: usize,
) -> Result<usize, GgufError> {
    let stated_key = architecture.key("rope.dimension_count");
    let stated = metadata.optional_usize(&stated_key)?;
    let key = if stated.is_some() { stated_key } else { architecture.key("embedding_length") };
    let head_dim = stated.unwrap_or(hidden_size / heads);
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(metadata.invalid(&key, format!("head size {head_dim} is not positive and even")));
    }
    if heads.checked_mul(head_dim).is_none() {
        return Err(metadata.invalid(&key, format!("{heads} heads of size {head_dim} overflow a usize")));
    }
    Ok(head_dim)
}

/// A float that, when present, must be finite and positive.
fn optional_positive_f64(metadata: &Metadata, key: &str) -> Result<Option<f64>, GgufError> {
    match metadata.optional_f64(key)? {
        Some(value) if !(value.is_finite() && value > 0.0) => {
            Err(metadata.invalid(key, format!("{value} is not a finite positive number")))
        }
        value => Ok(value),
    }
}

fn read_rope_scaling(metadata: &Metadata, architecture: GgufArchitecture) -> Result<Option<RopeScaling>, GgufError> {
    let type_key = architecture.key("rope.scaling.type");
    let factor_key = architecture.key("rope.scaling.factor");
    let factor = || optional_positive_f64(metadata, &factor_key)?.ok_or_else(|| metadata.missing(&factor_key));
    match metadata.optional_string(&type_key)? {
        None | Some("none") => Ok(None),
        Some("linear") => Ok(Some(RopeScaling::Linear { factor: factor()? })),
        Some("yarn") => {
            let original_key = architecture.key("rope.scaling.original_context_length");
            Ok(Some(RopeScaling::Yarn { factor: factor()?, original_context: metadata.usize(&original_key)? }))
        }
        Some(other) => {
            Err(metadata.invalid(&type_key, format!("rope scaling {other:?} is not read (none, linear, yarn)")))
        }
    }
}
