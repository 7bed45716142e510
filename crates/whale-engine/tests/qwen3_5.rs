//! The batching engine serves Qwen3.5 as each sequence alone (tiny random models).

#[path = "../../whale-lm/tests/common/mod.rs"]
mod common;

use candle_core::D;
use common::qwen3_5::{model, tokens};
use whale_engine::{EngineConfig, LocalPolicy};
use whale_lm::qwen3_5::Qwen35Size;
use whale_lm::random::synthetic_corpus;
use whale_lm::{Qwen35Config, Qwen35Model, Qwen35Step, Qwen3Model};
use whale_policy::SamplingParams;
use whale_text::{ChatTemplate, Tokenizer};

/// Greedy tokens from the model's own decoding step, one sequence alone.
fn greedy_alone(model: &Qwen35Model, prompt: &[u32], count: usize) -> Vec<u32> {
    let mut cache = model.new_cache().unwrap();
    let mut logits = model.forward_step(&mut [Qwen35Step { tokens: prompt, cache: &mut cache }]).unwrap();
    let mut out = Vec::new();
    for _ in 0..count {
        let next = logits.argmax(D::Minus1).unwrap().to_vec1::<u32>().unwrap()[0];
        out.push(next);
        logits = model.forward_step(&mut [Qwen35Step { tokens: &[next], cache: &mut cache }]).unwrap();
    }
    out
}

#[test]
fn the_batching_engine_serves_qwen3_5_as_each_sequence_alone() {
    let corpus = synthetic_corpus(200, 1);
    let tokenizer = Tokenizer::train_bpe(corpus.iter().map(String::as_str), 300).unwrap();
    let config = Qwen35Config::text(tokenizer.vocab_size(), Qwen35Size::TINY);
    let model = model(&config, 21);
    let engine = EngineConfig { max_batch_size: 4, prefix_cache_tokens: 16_384, ..EngineConfig::default() };
    let policy = LocalPolicy::new(model.clone(), tokenizer, ChatTemplate::chatml(), engine).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| tokens(5 + 7 * i, 30 + i as u64)).collect();
    let params = SamplingParams { temperature: 0.0, max_tokens: 12, ignore_eos: true, ..SamplingParams::default() };
    let batch: Vec<_> = prompts.iter().map(|prompt| (prompt.clone(), params.clone())).collect();
    for (prompt, completion) in prompts.iter().zip(policy.generate_batch(&batch)) {
        assert_eq!(completion.unwrap().token_ids, greedy_alone(&model, prompt, 12), "prompt of {}", prompt.len());
    }
    assert_eq!(policy.stats().peak_decode_batch, 4, "six requests at once fill the batch: {:?}", policy.stats());
    let again = policy.generate(prompts[5].clone(), &params).unwrap().token_ids;
    assert_eq!(again, greedy_alone(&model, &prompts[5], 12), "a prompt asked again");
    assert_eq!(policy.stats().prefix_reuses, 0, "a recurrent state cannot be cut short: {:?}", policy.stats());
    let error = policy.served_model::<Qwen3Model>("the trainer").err().expect("not a Qwen3 model").to_string();
    assert!(error.contains("Qwen3.5") && error.contains("the trainer"), "{error}");
    assert!(policy.served_model::<Qwen35Model>("the trainer").is_ok(), "the served Qwen3.5 model");
    let quantized = EngineConfig { quantized: true, ..EngineConfig::default() };
    let tokenizer = Tokenizer::train_bpe(corpus.iter().map(String::as_str), 300).unwrap();
    let error = LocalPolicy::new(model, tokenizer, ChatTemplate::chatml(), quantized).err().expect("refused");
    assert!(error.to_string().contains("quantized"), "{error}");
}
