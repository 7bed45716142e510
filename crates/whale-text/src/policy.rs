//! The chat template's and the tokenizer's errors as the policy vocabulary's [`PolicyError`]: each
//! becomes the kind of failure it is, with its message, so that the layers above never see
//! tokenizer or template types. (The sampler's own is converted in whale-engine, which defines it.)

use whale_policy::PolicyError;

use crate::chat_template::ChatTemplateError;
use crate::tokenizer::TokenizerError;

impl From<ChatTemplateError> for PolicyError {
    fn from(error: ChatTemplateError) -> Self {
        match error {
            ChatTemplateError::Refused { .. } => PolicyError::TemplateRefused(error.to_string()),
            _ => PolicyError::Template(error.to_string()),
        }
    }
}

impl From<TokenizerError> for PolicyError {
    fn from(error: TokenizerError) -> Self {
        PolicyError::Tokenizer(error.to_string())
    }
}
