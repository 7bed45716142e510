//! Text to token ids and back: the tokenizer and the chat template.
//!
//! A model's prompt is made in two steps that know nothing of its layers: chat messages are
//! rendered into one string by the model's own Jinja chat template ([`ChatTemplate`], from its
//! `tokenizer_config.json` or `chat_template.jinja`, or ChatML), and the string is split into
//! token ids by its Hugging Face `tokenizer.json` ([`Tokenizer`], byte-level BPE that knows the
//! ChatML special tokens). Generated ids come back to text through [`Tokenizer::decode`], or
//! token by token through a [`TextStream`] for stop strings and streaming.
//!
//! Why a crate of its own: tokens and templates are needed without the models. A harness author
//! checking what prompt a chat becomes, or the GGUF reader (whale-gguf) parsing a file's
//! vocabulary and template, needs them and no decoder; and the tokenizer and template change
//! with a model family's text conventions, not with its layers. The models (whale-lm, whose
//! random models train a tokenizer here), the engine, the trainer and `whale serve` sit above.
//! Their errors become whale-policy's `PolicyError`s by the conversions in `policy.rs`, so the
//! layers that talk to a policy never see tokenizer or template types.

mod chat_template;
mod policy;
mod tokenizer;

pub use chat_template::{
    write_tokenizer_config, ChatTemplate, ChatTemplateError, RenderOptions, CHATML_TEMPLATE, CHAT_TEMPLATE_FILE,
    TOKENIZER_CONFIG_FILE,
};
pub use tokenizer::{
    SpecialTokens, TextStream, Tokenizer, TokenizerError, ENDOFTEXT, IM_END, IM_START, MIN_VOCAB_SIZE, TOKENIZER_FILE,
};
