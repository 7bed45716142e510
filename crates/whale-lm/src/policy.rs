//! whale-lm's errors as the policy vocabulary's [`PolicyError`]: each becomes the kind of failure
//! it is, with its message, so that the layers above never see tokenizer or template types.

use whale_policy::PolicyError;

use crate::chat_template::ChatTemplateError;
use crate::sampling::SamplingError;
use crate::tokenizer::TokenizerError;

impl From<SamplingError> for PolicyError {
    fn from(error: SamplingError) -> Self {
        PolicyError::Sampling(error.to_string())
    }
}

impl From<ChatTemplateError> for PolicyError {
    fn from(error: ChatTemplateError) -> Self {
        PolicyError::Template(error.to_string())
    }
}

impl From<TokenizerError> for PolicyError {
    fn from(error: TokenizerError) -> Self {
        PolicyError::Tokenizer(error.to_string())
    }
}
