//! The tokenizer a GGUF describes in its `tokenizer.ggml.*` metadata, rebuilt as a Hugging Face
//! `tokenizer.json`. A GGUF carries no tokenizer file: llama.cpp's converter stores the vocabulary,
//! the merges, each token's type and the special token ids as metadata, and names the
//! pre-tokenizer (how text is split before the merges apply) in `tokenizer.ggml.pre`. Building
//! the JSON (rather than a `tokenizers` object directly) gives one description that both whale's
//! [`crate::Tokenizer`] parses and `whale lm convert` writes out.
//!
//! Read: `tokenizer.ggml.model` "gpt2" (byte-level BPE) with the pre-tokenizers of
//! [`pre_tokenizer`]. Anything else is refused, naming the key, rather than guessed: a wrong split
//! gives plausible but different token ids.

use serde_json::{json, Map, Value};

use crate::error::GgufError;
use crate::metadata::Metadata;

pub const MODEL_KEY: &str = "tokenizer.ggml.model";
pub const PRE_KEY: &str = "tokenizer.ggml.pre";
pub const TOKENS_KEY: &str = "tokenizer.ggml.tokens";
pub const MERGES_KEY: &str = "tokenizer.ggml.merges";
pub const TOKEN_TYPE_KEY: &str = "tokenizer.ggml.token_type";
pub const BOS_KEY: &str = "tokenizer.ggml.bos_token_id";
pub const EOS_KEY: &str = "tokenizer.ggml.eos_token_id";
pub const PAD_KEY: &str = "tokenizer.ggml.padding_token_id";
pub const UNK_KEY: &str = "tokenizer.ggml.unknown_token_id";
pub const ADD_BOS_KEY: &str = "tokenizer.ggml.add_bos_token";
pub const ADD_EOS_KEY: &str = "tokenizer.ggml.add_eos_token";

/// The only `tokenizer.ggml.model` read: GPT-2's byte-level BPE.
const BYTE_LEVEL_BPE: &str = "gpt2";
/// llama.cpp's token types (`llama_token_type`): a control token (`<|im_end|>`) is special, a
/// user-defined one (`<think>`) is matched whole in text but not special.
const CONTROL_TOKEN: i64 = 3;
const USER_DEFINED_TOKEN: i64 = 4;

/// One special token: its id and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    pub id: u32,
    pub content: String,
}

/// A token matched whole in text before the BPE runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedToken {
    pub id: u32,
    pub content: String,
    pub special: bool,
}

/// Everything a GGUF says about its tokenizer.
#[derive(Debug, Clone)]
pub struct GgufVocabulary {
    /// The Hugging Face `tokenizer.json`.
    pub tokenizer_json: Value,
    /// Number of tokens (ids 0..size).
    pub size: usize,
    pub added_tokens: Vec<AddedToken>,
    pub bos: Option<SpecialToken>,
    pub eos: Option<SpecialToken>,
    pub pad: Option<SpecialToken>,
    pub unk: Option<SpecialToken>,
    /// Whether the model expects a BOS token before every text (llama.cpp's default: false for
    /// a byte-level BPE).
    pub add_bos_token: bool,
    pub add_eos_token: bool,
}

/// Reads the vocabulary of a byte-level BPE GGUF.
pub fn read_vocabulary(metadata: &Metadata) -> Result<GgufVocabulary, GgufError> {
    let model = metadata.string(MODEL_KEY)?;
    if model != BYTE_LEVEL_BPE {
        let reason = format!("tokenizer model {model:?} is not read; whale reads {BYTE_LEVEL_BPE:?} (byte-level BPE)");
        return Err(metadata.invalid(MODEL_KEY, reason));
    }
    let pre_name = metadata.string(PRE_KEY)?;
    let pre = pre_tokenizer(pre_name).ok_or_else(|| {
        metadata
            .invalid(PRE_KEY, format!("pre-tokenizer {pre_name:?} is not known; whale knows {KNOWN_PRE_TOKENIZERS:?}"))
    })?;
    let tokens = metadata.strings(TOKENS_KEY)?;
    let merges = read_merges(metadata)?;
    let added_tokens = read_added_tokens(metadata, &tokens)?;
    let special = |key: &str| special_token(metadata, key, &tokens);
    let (bos, eos, pad, unk) = (special(BOS_KEY)?, special(EOS_KEY)?, special(PAD_KEY)?, special(UNK_KEY)?);
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens.iter().map(added_token_json).collect::<Vec<_>>(),
        "normalizer": normalizer(pre_name),
        "pre_tokenizer": pre,
        "post_processor": byte_level(false),
        "decoder": byte_level(true),
        "model": bpe_json(vocab_json(metadata, &tokens)?, merges),
    });
    Ok(GgufVocabulary {
        tokenizer_json,
        size: tokens.len(),
        added_tokens,
        bos,
        eos,
        pad,
        unk,
        add_bos_token: metadata.optional_bool(ADD_BOS_KEY)?.unwrap_or(false),
        add_eos_token: metadata.optional_bool(ADD_EOS_KEY)?.unwrap_or(false),
    })
}

/// The `tokenizer.ggml.pre` values whale maps, each to the split its `tokenizer.json` had.
pub const KNOWN_PRE_TOKENIZERS: [&str; 5] = ["gpt-2", "smollm", "starcoder", "refact", "qwen2"];

/// Qwen2's split (Qwen2.5's `tokenizer.json`): GPT-2's, except that digits go one at a time
/// (`\p{N}`), a letter run may take one leading non-letter, and contractions match in any case.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Hugging Face pre-tokenizer of a `tokenizer.ggml.pre` value:
/// - "gpt-2": GPT-2's regex split, then bytes to symbols (`ByteLevel` with its regex);
/// - "smollm", "starcoder", "refact" (one family in llama.cpp, which splits with `\p{N}` first):
///   every digit alone (`Digits`), then GPT-2's split;
/// - "qwen2": Qwen2's own regex ([`QWEN2_SPLIT`]), then bytes to symbols without GPT-2's regex.
pub fn pre_tokenizer(pre: &str) -> Option<Value> {
    let gpt2 = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    match pre {
        "gpt-2" => Some(gpt2),
        "smollm" | "starcoder" | "refact" => Some(json!({
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": true}, gpt2],
        })),
        "qwen2" => Some(json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            ],
        })),
        _ => None,
    }
}

/// The normalizer of a `tokenizer.ggml.pre` value: Qwen2's own `tokenizer.json` composes text to
/// NFC first (transformers' GGUF loader leaves that out); the others change nothing.
fn normalizer(pre: &str) -> Value {
    match pre {
        "qwen2" => json!({"type": "NFC"}),
        _ => Value::Null,
    }
}

fn byte_level(trim_offsets: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": true})
}

fn bpe_json(vocab: Map<String, Value>, merges: Vec<[&str; 2]>) -> Value {
    json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": null,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": false,
        "byte_fallback": false,
        "ignore_merges": false,
        "vocab": vocab,
        "merges": merges,
    })
}

/// Token -> id; a token listed twice is refused (a JSON vocabulary cannot hold both ids).
fn vocab_json(metadata: &Metadata, tokens: &[&str]) -> Result<Map<String, Value>, GgufError> {
    let mut vocab = Map::new();
    for (id, token) in tokens.iter().enumerate() {
        if let Some(first) = vocab.insert(token.to_string(), json!(id)) {
            let reason = format!("token {token:?} is listed twice (ids {first} and {id})");
            return Err(metadata.invalid(TOKENS_KEY, reason));
        }
    }
    Ok(vocab)
}

/// Merges are stored as "left right".
fn read_merges<'a>(metadata: &Metadata<'a>) -> Result<Vec<[&'a str; 2]>, GgufError> {
    let merges = metadata.strings(MERGES_KEY)?;
    merges
        .iter()
        .enumerate()
        .map(|(index, merge)| match merge.split_once(' ') {
            Some((left, right)) if !left.is_empty() && !right.is_empty() => Ok([left, right]),
            _ => Err(metadata.invalid(MERGES_KEY, format!("merge {index} ({merge:?}) is not \"left right\""))),
        })
        .collect()
}

/// Control tokens (special) and user-defined tokens (not special), in id order.
fn read_added_tokens(metadata: &Metadata, tokens: &[&str]) -> Result<Vec<AddedToken>, GgufError> {
    let Some(types) = metadata.optional_integers(TOKEN_TYPE_KEY)? else { return Ok(Vec::new()) };
    if types.len() != tokens.len() {
        let reason = format!("{} token types for {} tokens", types.len(), tokens.len());
        return Err(metadata.invalid(TOKEN_TYPE_KEY, reason));
    }
    let added = tokens.iter().zip(types).enumerate().filter_map(|(id, (token, token_type))| {
        let special = match token_type {
            CONTROL_TOKEN => true,
            USER_DEFINED_TOKEN => false,
            _ => return None,
        };
        Some(AddedToken { id: id as u32, content: token.to_string(), special })
    });
    Ok(added.collect())
}

fn added_token_json(token: &AddedToken) -> Value {
    json!({
        "id": token.id,
        "content": token.content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": token.special,
    })
}

fn special_token(metadata: &Metadata, key: &str, tokens: &[&str]) -> Result<Option<SpecialToken>, GgufError> {
    let Some(id) = metadata.optional_u32(key)? else { return Ok(None) };
    match tokens.get(id as usize) {
        Some(content) => Ok(Some(SpecialToken { id, content: content.to_string() })),
        None => Err(metadata.invalid(key, format!("id {id} is past the {} tokens", tokens.len()))),
    }
}
