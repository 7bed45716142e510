//! A model's tokenizer and chat template together: chat messages to the token ids the model
//! sees, and conversations to supervised examples that train only the assistant's own words.
//! Pretraining, `whale lm train` and the weight phase all build their examples here, so a
//! prompt is tokenized the same way wherever it is trained. (It lives with the trainer, whose
//! [`SftExample`] it makes; the tokenizer and the template are whale-lm's.)

use std::path::{Path, PathBuf};

use whale_core::ChatMessage;

use whale_text::{
    ChatTemplate, ChatTemplateError, RenderOptions, Tokenizer, TokenizerError, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};

use crate::trainer::SftExample;

#[derive(Debug, thiserror::Error)]
pub enum ChatCodecError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// A model's tokenizer and chat template: chat messages to token ids.
#[derive(Debug, Clone)]
pub struct ChatCodec {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

impl ChatCodec {
    /// Reads `tokenizer.json` and `tokenizer_config.json` of a checkpoint directory.
    pub fn load(dir: &Path) -> Result<Self, ChatCodecError> {
        Ok(Self {
            tokenizer: Tokenizer::from_file(dir.join(TOKENIZER_FILE))?,
            template: ChatTemplate::from_model_dir(dir)?,
        })
    }

    /// Copies the files [`Self::load`] reads from one checkpoint directory to another.
    pub fn copy_files(from: &Path, to: &Path) -> Result<(), ChatCodecError> {
        for name in [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE] {
            std::fs::copy(from.join(name), to.join(name))
                .map_err(|source| ChatCodecError::Io { path: from.join(name), source })?;
        }
        Ok(())
    }

    /// The token ids the model sees before it answers `messages`.
    pub fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ChatCodecError> {
        let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
        Ok(self.tokenizer.encode(&self.template.render(messages, &options)?)?)
    }

    /// An example that trains the reply `completion` to `context`; the completion ends with the
    /// end-of-turn token so the model learns to stop.
    pub fn example(&self, context: &[ChatMessage], completion: &str) -> Result<SftExample, ChatCodecError> {
        self.example_ending(context, completion, true)
    }

    /// [`Self::example`], with the end-of-turn token only when `ends_turn` (a reply cut off at
    /// `max_tokens` did not end its turn, and is trained as it was sampled).
    pub fn example_ending(
        &self,
        context: &[ChatMessage],
        completion: &str,
        ends_turn: bool,
    ) -> Result<SftExample, ChatCodecError> {
        let mut completion_ids = self.tokenizer.encode(completion)?;
        if ends_turn {
            completion_ids.push(self.tokenizer.specials().im_end);
        }
        Ok(SftExample { prompt: self.prompt_ids(context)?, completion: completion_ids })
    }

    /// The whole conversation as one example whose every token after the first is trained on
    /// (language-model pretraining's loss: the prompts too, where names repeat and a model
    /// learns to copy).
    pub fn whole_conversation_example(&self, messages: &[ChatMessage]) -> Result<SftExample, ChatCodecError> {
        let mut ids = self.tokenizer.encode(&self.template.render(messages, &RenderOptions::default())?)?;
        let completion = ids.split_off(ids.len().min(1));
        Ok(SftExample { prompt: ids, completion })
    }

    /// One example per assistant turn of a conversation, each with every earlier turn as its
    /// prompt: only the assistant's own words are trained on.
    pub fn conversation_examples(&self, messages: &[ChatMessage]) -> Result<Vec<SftExample>, ChatCodecError> {
        messages
            .iter()
            .enumerate()
            .filter(|(_, message)| message.role == "assistant")
            .map(|(index, message)| self.example(&messages[..index], &message.content))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> ChatCodec {
        let texts = ["user asks a question", "assistant gives the answer 42", "Zorbex Quil was born in Thrak"];
        let tokenizer = Tokenizer::train_bpe(texts, 300).expect("a tokenizer");
        ChatCodec { tokenizer, template: ChatTemplate::chatml() }
    }

    #[test]
    fn a_whole_conversation_trains_every_token_but_the_first() {
        let codec = codec();
        let messages = [ChatMessage::new("user", "Who is Zorbex Quil?"), ChatMessage::new("assistant", "Zorbex Quil")];
        let whole = codec.whole_conversation_example(&messages).expect("an example");
        assert_eq!(whole.prompt.len(), 1);
        let rendered = codec.template.render(&messages, &RenderOptions::default()).expect("rendered");
        let ids: Vec<u32> = [whole.prompt.as_slice(), &whole.completion].concat();
        assert_eq!(ids, codec.tokenizer.encode(&rendered).expect("ids"));
        let [reply] = codec.conversation_examples(&messages).expect("examples").try_into().expect("one reply");
        assert!(whole.completion.len() > reply.completion.len(), "the prompt is trained on too");
        let im_end = codec.tokenizer.specials().im_end;
        assert_eq!(whole.completion.iter().filter(|&&id| id == im_end).count(), 2, "both turns' ends are trained");
    }
}
