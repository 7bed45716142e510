//! Text <-> token ids, in the Hugging Face `tokenizer.json` format so checkpoints stay loadable by
//! other tools. Real Qwen3 tokenizers load as they are; the tiny CPU model gets a byte-level BPE
//! trained here on the task corpus, with the ChatML markers as atomic special tokens so a chat
//! template's `<|im_start|>`/`<|im_end|>` always become single ids and can serve as stop tokens.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

/// File name of the Hugging Face tokenizer in a model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// End of a document; the padding token.
pub const ENDOFTEXT: &str = "<|endoftext|>";
/// Opens a ChatML turn.
pub const IM_START: &str = "<|im_start|>";
/// Closes a ChatML turn; the end-of-sequence token of chat models.
pub const IM_END: &str = "<|im_end|>";

/// Number of distinct byte symbols the byte-level alphabet needs.
const BYTE_ALPHABET: usize = 256;
/// The smallest vocabulary that holds every byte and the three ChatML specials.
pub const MIN_VOCAB_SIZE: usize = BYTE_ALPHABET + 3;

/// Ids of the ChatML special tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecialTokens {
    pub endoftext: u32,
    pub im_start: u32,
    pub im_end: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: cannot read: {reason}", file.display())]
    Read { file: PathBuf, reason: String },
    #[error("{}: not a valid tokenizer.json: {reason}", file.display())]
    Parse { file: PathBuf, reason: String },
    #[error("{}: special token {token} is not in the vocabulary", file.display())]
    MissingSpecial { file: PathBuf, token: &'static str },
    #[error("{}: cannot write: {reason}", file.display())]
    Write { file: PathBuf, reason: String },
    #[error("vocabulary size {requested} is below the minimum {MIN_VOCAB_SIZE} (256 bytes + 3 specials)")]
    VocabTooSmall { requested: usize },
    #[error("training the BPE failed: {0}")]
    Train(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
}

/// A loaded or trained tokenizer that knows the ChatML special tokens.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    specials: SpecialTokens,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`; it must contain the three ChatML special tokens.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let file = path.as_ref();
        let json = std::fs::read_to_string(file)
            .map_err(|e| TokenizerError::Read { file: file.to_path_buf(), reason: e.to_string() })?;
        Self::from_json(&json, file)
    }

    /// Parses the text of a `tokenizer.json` (made in memory, e.g. from a GGUF's metadata);
    /// `source` names where it came from in errors. It must contain the three ChatML specials.
    pub fn from_json(json: &str, source: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_str(json)
            .map_err(|e| TokenizerError::Parse { file: source.to_path_buf(), reason: e.to_string() })?;
        let specials = resolve_specials(&inner)
            .map_err(|token| TokenizerError::MissingSpecial { file: source.to_path_buf(), token })?;
        Ok(Self { inner, specials })
    }

    /// Trains a byte-level BPE (GPT-2 pre-tokenization without a prefix space) of at most
    /// `vocab_size` entries on `texts`; a small corpus may run out of merges earlier. The ChatML
    /// specials take ids 0, 1, 2 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), the 256 byte
    /// symbols follow, so any text is encodable. The same corpus gives the same tokenizer.
    pub fn train_bpe<'a>(texts: impl IntoIterator<Item = &'a str>, vocab_size: usize) -> Result<Self, TokenizerError> {
        if vocab_size < MIN_VOCAB_SIZE {
            return Err(TokenizerError::VocabTooSmall { requested: vocab_size });
        }
        let mut trainer = TrainerWrapper::BpeTrainer(
            BpeTrainerBuilder::new()
                .vocab_size(vocab_size)
                .min_frequency(2)
                .show_progress(false)
                .special_tokens(
                    [ENDOFTEXT, IM_START, IM_END].iter().map(|token| AddedToken::from(*token, true)).collect(),
                )
                .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
                .build(),
        );
        let mut inner = tokenizers::Tokenizer::new(BPE::default());
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
        inner.with_decoder(Some(ByteLevel::new(false, false, true)));
        let corpus: Vec<&str> = texts.into_iter().collect();
        inner.train(&mut trainer, corpus.into_iter()).map_err(|e| TokenizerError::Train(e.to_string()))?;
        let specials = resolve_specials(&inner)
            .map_err(|token| TokenizerError::Train(format!("special token {token} missing after training")))?;
        Ok(Self { inner, specials })
    }

    /// Writes the tokenizer as a (pretty-printed) `tokenizer.json`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TokenizerError> {
        let file = path.as_ref();
        self.inner
            .save(file, true)
            .map_err(|e| TokenizerError::Write { file: file.to_path_buf(), reason: e.to_string() })
    }

    /// Token ids of `text`; special tokens written in the text are recognised as single ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self.inner.encode_fast(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, with or without the special tokens among them. Ids outside the vocabulary
    /// are dropped, as Hugging Face tokenizers do (model embeddings are often padded past it).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    pub fn specials(&self) -> SpecialTokens {
        self.specials
    }

    /// Id of one token string (ordinary or added), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of distinct token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

fn resolve_specials(inner: &tokenizers::Tokenizer) -> Result<SpecialTokens, &'static str> {
    let id = |token: &'static str| inner.token_to_id(token).ok_or(token);
    Ok(SpecialTokens { endoftext: id(ENDOFTEXT)?, im_start: id(IM_START)?, im_end: id(IM_END)? })
}

/// Generated text decoded as tokens arrive, for stop-string checks and streaming. Each step
/// decodes only the tokens since the last settled piece, and text is appended only once its
/// last character is complete (a byte-level token may end inside a UTF-8 character).
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    text: String,
    /// Start of the window re-decoded each step: the last appended piece.
    prefix_offset: usize,
    /// End of the last appended piece.
    read_offset: usize,
}

impl TextStream {
    /// Appends what `tokens` (every generated token, the newest last) add to the text and
    /// returns the byte offset where the new text starts.
    pub fn extend(&mut self, tokenizer: &Tokenizer, tokens: &[u32]) -> Result<usize, TokenizerError> {
        let start = self.text.len();
        let settled = tokenizer.decode(&tokens[self.prefix_offset..self.read_offset], false)?;
        let current = tokenizer.decode(&tokens[self.prefix_offset..], false)?;
        if let Some(new) = current.get(settled.len()..) {
            if !new.is_empty() && !new.ends_with(char::REPLACEMENT_CHARACTER) {
                self.text.push_str(new);
                self.prefix_offset = self.read_offset;
                self.read_offset = tokens.len();
            }
        }
        Ok(start)
    }

    /// The text of the complete characters so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_stream_holds_back_split_characters_and_ends_with_the_full_text() {
        let text = "naïve café 🐳 — ∫x dx, then plain ascii text.";
        let tokenizer = Tokenizer::train_bpe([text, text], MIN_VOCAB_SIZE + 8).expect("bpe");
        let ids = tokenizer.encode(text).expect("encode");
        let mut stream = TextStream::default();
        let mut held_back = 0;
        for end in 1..=ids.len() {
            let before = stream.text().len();
            let new_from = stream.extend(&tokenizer, &ids[..end]).expect("decode");
            assert_eq!(new_from, before);
            assert!(text.starts_with(stream.text()), "{:?} is not a prefix", stream.text());
            held_back += usize::from(stream.text().len() == before);
        }
        assert_eq!(stream.text(), text);
        assert!(held_back > 0, "no token ended inside a character, so nothing was tested");
    }
}
