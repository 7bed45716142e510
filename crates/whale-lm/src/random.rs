//! Models that need no download: random weights over a byte-level BPE trained on text generated
//! here (arithmetic word problems over made-up names and items, [`synthetic_corpus`]).
//!
//! `whale lm bench` serves one when given no model directory, `whale lm random` and
//! `whale serve bench` write one as a checkpoint, and tests train tokenizers on the text. Every
//! piece is seeded, so every caller gets the same tokenizer and weights.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::qwen3::config::{ModelSize, Qwen3Config};
use crate::qwen3::model::{ModelError, Qwen3Model};
use crate::qwen3_5::{Qwen35Config, Qwen35Model, Qwen35Size};
use candle_core::{DType, Device};
use whale_text::{Tokenizer, TokenizerError};

/// Why a random model could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RandomModelError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The byte-level BPE of `vocab_size` ids that every random model uses, trained on the
/// synthetic text (seeded, so every bench and `whale lm random` get the same one).
fn random_tokenizer(vocab_size: usize) -> Result<Tokenizer, RandomModelError> {
    let corpus = synthetic_corpus(20_000, 7);
    Ok(Tokenizer::train_bpe(corpus.iter().map(String::as_str), vocab_size)?)
}

/// [`ModelSize::BASE`] with random weights (seed 7) and [`random_tokenizer`]'s BPE, and its
/// description: the model a bench measures when given none.
pub fn random_model(vocab_size: usize, device: &Device) -> Result<(Tokenizer, Qwen3Model, String), RandomModelError> {
    let tokenizer = random_tokenizer(vocab_size)?;
    let config = Qwen3Config::with_size(tokenizer.vocab_size(), ModelSize::BASE);
    let model = Qwen3Model::new_random(&config, 7, DType::F32, device)?;
    let name = format!("random ModelSize::BASE, vocabulary {}", tokenizer.vocab_size());
    Ok((tokenizer, model, name))
}

/// [`random_tokenizer`]'s BPE under a random Qwen3.5 of `size` (seed 7) in `dtype`, as long a
/// context as [`random_model`]'s, and its description: what `whale lm random --shape qwen3.5-tiny`
/// (or `qwen3.5-0.8b`) writes. Only the vocabulary is whale's: Qwen3.5-0.8B's layers sit on
/// this BPE instead of their own 248,320 tokens.
pub fn random_qwen35(
    vocab_size: usize,
    size: Qwen35Size,
    dtype: DType,
    device: &Device,
) -> Result<(Tokenizer, Qwen35Model, String), RandomModelError> {
    let tokenizer = random_tokenizer(vocab_size)?;
    let mut config = Qwen35Config::text(tokenizer.vocab_size(), size);
    config.max_position_embeddings =
        Qwen3Config::with_size(tokenizer.vocab_size(), ModelSize::BASE).max_position_embeddings;
    let model = Qwen35Model::new_random(&config, 7, dtype, device)?;
    let shape = if size == Qwen35Size::QWEN3_5_0_8B { "Qwen3.5-0.8B's layer shape: " } else { "" };
    let name = format!(
        "random Qwen3.5 ({shape}{} wide, {} layers), vocabulary {}",
        size.hidden_size,
        size.num_hidden_layers,
        tokenizer.vocab_size()
    );
    Ok((tokenizer, model, name))
}

/// `lines` lines of generated text: arithmetic word problems with their
/// worked answers, over made-up names and items, reproducible from `seed`. The made-up words
/// give a byte-level BPE thousands of merges to learn.
pub fn synthetic_corpus(lines: usize, seed: u64) -> Vec<String> {
    SyntheticText::new(seed).take(lines).collect()
}

/// The endless stream of lines [`synthetic_corpus`] takes from.
pub struct SyntheticText {
    rng: ChaCha8Rng,
}

const SYLLABLES: [&str; 32] = [
    "ka", "lo", "mi", "ra", "ten", "vo", "shi", "ne", "pa", "dor", "el", "qu", "an", "bri", "sol", "ta", "ve", "ny",
    "ost", "ru", "li", "gar", "po", "emb", "ci", "fa", "hu", "jo", "wen", "zi", "ard", "um",
];
const VERBS: [(&str, &str); 4] = [("buys", "+"), ("finds", "+"), ("gives away", "-"), ("sells", "-")];

impl SyntheticText {
    pub fn new(seed: u64) -> Self {
        Self { rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    fn word(&mut self) -> String {
        let syllables = self.rng.gen_range(2..=4);
        (0..syllables).map(|_| *SYLLABLES.choose(&mut self.rng).unwrap_or(&"a")).collect()
    }

    fn capitalized(&mut self) -> String {
        let word = self.word();
        let mut chars = word.chars();
        chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or(word)
    }
}

impl Iterator for SyntheticText {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        let (name, item) = (self.capitalized(), self.word());
        let (verb, sign) = *VERBS.choose(&mut self.rng).unwrap_or(&VERBS[0]);
        let first: u32 = self.rng.gen_range(10..1000);
        let second: u32 = self.rng.gen_range(1..first);
        let answer = if sign == "+" { first + second } else { first - second };
        Some(format!(
            "{name} has {first} {item}s. {name} {verb} {second} {item}s. How many {item}s does {name} have now? \
             {first} {sign} {second} = {answer}. The answer is {answer}."
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_corpus_is_reproducible_and_its_sums_are_right() {
        let corpus = synthetic_corpus(200, 3);
        assert_eq!(corpus, synthetic_corpus(200, 3));
        assert_ne!(corpus, synthetic_corpus(200, 4));
        for line in &corpus {
            let worked = line.split("? ").nth(1).and_then(|rest| rest.split('.').next()).expect("worked answer");
            let parts: Vec<&str> = worked.split(' ').collect();
            let [first, sign, second, "=", answer] = parts[..] else { panic!("unexpected line {line:?}") };
            let (first, second, answer): (i64, i64, i64) =
                (first.parse().expect("number"), second.parse().expect("number"), answer.parse().expect("number"));
            let expected = if sign == "+" { first + second } else { first - second };
            assert_eq!(answer, expected, "{line}");
            assert!(answer >= 0 && line.ends_with(&format!("The answer is {answer}.")));
        }
    }
}
