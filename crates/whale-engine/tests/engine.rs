//! The local batching engine: greedy output against a plain forward loop, seeded samples that
//! do not depend on the batch, stop strings, length limits, weight updates, loading a model
//! directory, and shutdown without hangs. Models are tiny and random; the tokenizer is a BPE
//! trained on GSM8K questions.

#[path = "../../whale-lm/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use common::{argmax, full_logits};
use whale_core::ChatMessage;
use whale_engine::{ChoiceEvent, EngineConfig, EngineError, LocalPolicy};
use whale_lm::{save_model, GenerationConfig, ModelSize, Qwen3Config, Qwen3Model, SeqStep};
use whale_policy::{ChatRequest, Completion, FinishReason, Policy, PolicyError, SamplingParams};
use whale_text::{write_tokenizer_config, ChatTemplate, Tokenizer, CHATML_TEMPLATE, TOKENIZER_FILE};

fn shared_data() -> PathBuf {
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if beside_repo.exists() {
        return beside_repo;
    }
    PathBuf::from(std::env::var("WHALE_SHARED_DATA").expect("shared data: set WHALE_SHARED_DATA"))
}

/// GSM8K test questions, in file order.
fn questions() -> &'static [String] {
    static QUESTIONS: OnceLock<Vec<String>> = OnceLock::new();
    QUESTIONS.get_or_init(|| {
        let text = std::fs::read_to_string(shared_data().join("math/gsm8k/test.jsonl")).expect("gsm8k file");
        text.lines()
            .map(|line| {
                let record: serde_json::Value = serde_json::from_str(line).expect("json line");
                record["question"].as_str().expect("question").to_string()
            })
            .collect()
    })
}

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::train_bpe(questions().iter().map(String::as_str), 384).expect("bpe"))
}

/// A tiny untied model over the test tokenizer, with weights large enough that its
/// distributions are far from uniform.
fn tiny_model(seed: u64) -> Qwen3Model {
    tiny_model_with_vocabulary(seed, tokenizer().vocab_size())
}

fn tiny_model_with_vocabulary(seed: u64, vocab_size: usize) -> Qwen3Model {
    let mut config = Qwen3Config::tiny(vocab_size);
    config.tie_word_embeddings = false;
    config.initializer_range = 0.2;
    config.rope_theta = 10_000.0;
    Qwen3Model::new_random(&config, seed, DType::F32, &Device::Cpu).expect("model")
}

/// A tiny model whose end-of-sequence logits are always 0 while the largest of the other
/// ~380 logits (std about 1.6) is near +5: greedy and top-20 sampling never end a completion,
/// so length limits and in-flight events can be tested deterministically.
fn model_without_eos(seed: u64) -> Qwen3Model {
    let model = tiny_model(seed);
    let mut tensors: HashMap<String, Tensor> =
        model.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
    let head = &tensors["lm_head.weight"];
    let (vocab, hidden) = head.dims2().expect("matrix");
    let mut values = head.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("values");
    let specials = tokenizer().specials();
    for id in [specials.endoftext, specials.im_end] {
        values[id as usize * hidden..(id as usize + 1) * hidden].fill(0.0);
    }
    tensors
        .insert("lm_head.weight".to_string(), Tensor::from_vec(values, (vocab, hidden), &Device::Cpu).expect("head"));
    Qwen3Model::from_tensors(model.config(), tensors, DType::F32, &Device::Cpu).expect("model")
}

fn engine(model: Qwen3Model, config: EngineConfig) -> LocalPolicy {
    LocalPolicy::new(model, tokenizer().clone(), ChatTemplate::chatml(), config).expect("engine")
}

fn ask(index: usize) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", questions()[index].clone())]
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams { temperature: 0.0, max_tokens, ..SamplingParams::default() }
}

fn sampled(seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams { seed, max_tokens, ..SamplingParams::default() }
}

fn chat(policy: &LocalPolicy, messages: Vec<ChatMessage>, params: SamplingParams) -> Result<Completion, PolicyError> {
    policy.chat(ChatRequest { messages, params })
}

/// Runs every request at once, each from its own thread, all released together.
fn concurrently(policy: &LocalPolicy, requests: &[ChatRequest]) -> Vec<Result<Completion, PolicyError>> {
    let start = Barrier::new(requests.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = requests
            .iter()
            .map(|request| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    policy.chat(request.clone())
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("request thread")).collect()
    })
}

/// The chat prompt rendered and tokenized here, independently of the engine.
fn prompt_of(messages: &[ChatMessage]) -> Vec<u32> {
    let text: String = messages.iter().map(|m| format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content)).collect();
    tokenizer().encode(&(text + "<|im_start|>assistant\n")).expect("encode")
}

/// Greedy decoding that recomputes the whole sequence each token through `forward_train`;
/// returns the tokens (up to and including an end token) and their log-probabilities.
fn reference_greedy(model: &Qwen3Model, prompt: &[u32], max_tokens: usize, eos: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let mut tokens = prompt.to_vec();
    let mut logprobs = Vec::new();
    while tokens.len() - prompt.len() < max_tokens {
        let row = full_logits(model, &tokens).pop().expect("a row");
        let next = argmax(&row);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_z = row.iter().map(|&x| f64::from(x - max).exp()).sum::<f64>().ln();
        logprobs.push((f64::from(row[next as usize] - max) - log_z) as f32);
        tokens.push(next);
        if eos.contains(&next) {
            break;
        }
    }
    (tokens[prompt.len()..].to_vec(), logprobs)
}

#[test]
fn greedy_chat_matches_a_plain_forward_loop_even_when_batched() {
    let model = tiny_model(1);
    let policy = engine(model.clone(), EngineConfig::default());
    let indices = [0, 5, 17, 40];
    let requests: Vec<ChatRequest> =
        indices.iter().map(|&i| ChatRequest { messages: ask(i), params: greedy(24) }).collect();
    let results = concurrently(&policy, &requests);
    let mut longest = 0;
    for (request, result) in requests.iter().zip(results) {
        let completion = result.expect("completion");
        let prompt = prompt_of(&request.messages);
        assert_eq!(policy.prompt_ids(&request.messages).expect("prompt"), prompt);
        let (tokens, logprobs) = reference_greedy(&model, &prompt, 24, policy.eos_token_ids());
        assert_eq!(completion.token_ids, tokens);
        for (got, want) in completion.logprobs.iter().zip(&logprobs) {
            assert!((got - want).abs() < 1e-3, "logprob {got} vs {want}");
        }
        let ended = tokens.last().is_some_and(|t| policy.eos_token_ids().contains(t));
        let body = if ended { &tokens[..tokens.len() - 1] } else { &tokens[..] };
        assert_eq!(completion.text, tokenizer().decode(body, false).expect("decode"));
        let expected_reason = if ended { FinishReason::Stop } else { FinishReason::Length };
        assert_eq!(completion.finish_reason, expected_reason);
        assert_eq!((completion.prompt_tokens, completion.completion_tokens), (prompt.len(), tokens.len()));
        longest = longest.max(tokens.len());
    }
    assert!(longest >= 8, "the model ends every reply at once, so the comparison proves little");
}

#[test]
fn samples_of_one_prompt_share_its_prefill_and_get_what_each_gets_alone() {
    // Two prompts, eight samples each, as a rollout group sends them: the engine feeds each
    // prompt once and every sample continues from a copy of that cache with its own seed.
    let model = tiny_model(4);
    let requests: Vec<ChatRequest> =
        (0..16).map(|i| ChatRequest { messages: ask(5 + i % 2), params: sampled(300 + i as u64, 12) }).collect();
    let alone = engine(model.clone(), EngineConfig::default());
    let expected: Vec<Completion> =
        requests.iter().map(|request| alone.chat(request.clone()).expect("completion")).collect();
    assert_eq!(alone.stats().prefill_shared, 0, "one request at a time has nothing to share");
    let distinct: std::collections::HashSet<&Vec<u32>> = expected.iter().map(|c| &c.token_ids).collect();
    assert!(distinct.len() > 2, "the seeds gave the same samples, so the comparison proves little");
    let policy = engine(model, EngineConfig::default());
    let batch: Vec<(Vec<u32>, SamplingParams)> = requests
        .iter()
        .map(|request| (policy.prompt_ids(&request.messages).expect("prompt"), request.params.clone()))
        .collect();
    for (index, (result, want)) in policy.generate_batch(&batch).into_iter().zip(&expected).enumerate() {
        let got = result.expect("completion");
        assert_eq!(got.token_ids, want.token_ids, "request {index}");
    }
    let stats = policy.stats();
    assert_eq!((stats.prefill_rows, stats.prefill_shared), (2, 14), "each prompt fed once: {stats:?}");
}

/// What each request of `requests`, sent one after another, gets from an engine that feeds
/// every prompt whole.
fn fed_whole(model: &Qwen3Model, requests: &[ChatRequest]) -> Vec<Completion> {
    let policy = engine(model.clone(), EngineConfig::default());
    let completions = requests.iter().map(|request| policy.chat(request.clone()).expect("completion")).collect();
    assert_eq!(policy.stats().prefix_reuses, 0, "{:?}", policy.stats());
    completions
}

fn reusing_prefixes() -> EngineConfig {
    EngineConfig { prefix_cache_tokens: 16_384, ..EngineConfig::default() }
}

fn assert_same_completion(got: &Completion, want: &Completion, what: &str) {
    assert_eq!(got.token_ids, want.token_ids, "{what}");
    for (a, b) in got.logprobs.iter().zip(&want.logprobs) {
        assert!((a - b).abs() < 1e-4, "{what}: logprob {a} against {b}");
    }
}

#[test]
fn a_later_turn_and_a_repeated_prompt_continue_from_a_finished_sequences_cache() {
    // A multi-turn rollout: the second call is the first prompt, its reply and a new turn; then
    // the second call is asked again (self-consistency), and a third prompt shares only the
    // long system turn: each starts from a copy of what a finished sequence fed, and gets what
    // a prompt fed whole gets.
    let model = model_without_eos(12);
    let policy = engine(model.clone(), reusing_prefixes());
    let system = ChatMessage::new("system", questions()[60].clone());
    let first = vec![system.clone(), ChatMessage::new("user", questions()[61].clone())];
    let reply = chat(&policy, first.clone(), greedy(16)).expect("completion");
    let mut second = first.clone();
    second.push(ChatMessage::new("assistant", reply.text.clone()));
    second.push(ChatMessage::new("user", questions()[62].clone()));
    let third = vec![system, ChatMessage::new("user", questions()[63].clone())];
    let requests = [
        ChatRequest { messages: first, params: greedy(16) },
        ChatRequest { messages: second.clone(), params: sampled(5, 16) },
        ChatRequest { messages: second.clone(), params: sampled(6, 16) },
        ChatRequest { messages: third.clone(), params: sampled(7, 16) },
    ];
    let before = policy.stats();
    let got: Vec<Completion> = requests[1..].iter().map(|r| policy.chat(r.clone()).expect("completion")).collect();
    let want = fed_whole(&model, &requests);
    assert_same_completion(&reply, &want[0], "the first turn");
    for (index, (got, want)) in got.iter().zip(&want[1..]).enumerate() {
        assert_same_completion(got, want, &format!("request {}", index + 1));
    }
    let stats = policy.stats();
    let (second_len, third_len) = (prompt_of(&second).len(), prompt_of(&third).len());
    assert_eq!(stats.prefix_reuses - before.prefix_reuses, 3, "{stats:?}");
    let reused = stats.prefix_reused_tokens - before.prefix_reused_tokens;
    // The second prompt shares with the first call's cache (its prompt, its reply but the last
    // token) as far as the reply re-tokenizes the same; the repeat all but its last token; the
    // third prompt the system turn.
    let shared = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let first_held = [&prompt_of(&requests[0].messages)[..], &reply.token_ids[..reply.token_ids.len() - 1]].concat();
    let expected = shared(&prompt_of(&second), &first_held)
        + (second_len - 1)
        + shared(&prompt_of(&third), &prompt_of(&requests[0].messages));
    assert_eq!(reused, expected as u64, "{stats:?}");
    // Every prompt token is copied or prefilled once, but the repeat's last, which a decode
    // call feeds (a chunk of one token).
    let prefilled = stats.prefill_tokens - before.prefill_tokens;
    assert_eq!(prefilled + reused, (2 * second_len + third_len - 1) as u64, "{stats:?}");
}

#[test]
fn a_new_prompt_continues_from_the_prompt_of_a_sequence_still_generating() {
    // A shares a long system turn with B. B arrives once A has been prefilled, while A still
    // generates (A asks for the whole context window and stops only when the test says so): B
    // copies the shared part of A's cache, not A's later tokens, and feeds the rest.
    let model = model_without_eos(13);
    let policy = engine(model.clone(), reusing_prefixes());
    let system = ChatMessage::new("system", format!("{} {}", questions()[70], questions()[71]));
    let a = vec![system.clone(), ChatMessage::new("user", questions()[72].clone())];
    let b =
        ChatRequest { messages: vec![system, ChatMessage::new("user", questions()[73].clone())], params: greedy(20) };
    let want = fed_whole(&model, std::slice::from_ref(&b));
    let b_done = std::sync::atomic::AtomicBool::new(false);
    let (a_outcome, got_b) = std::thread::scope(|scope| {
        let (started, first_token) = std::sync::mpsc::channel();
        let prompt_a = policy.prompt_ids(&a).expect("prompt");
        let (policy_a, b_done) = (&policy, &b_done);
        let generating = scope.spawn(move || {
            policy_a.generate_streaming(prompt_a, &greedy(4096), &mut |_| {
                // The test waits for the first; the rest queue up unread.
                let _ = started.send(());
                !b_done.load(std::sync::atomic::Ordering::SeqCst)
            })
        });
        first_token.recv_timeout(Duration::from_secs(60)).expect("A's first token");
        let got_b = policy.chat(b.clone()).expect("completion");
        b_done.store(true, std::sync::atomic::Ordering::SeqCst);
        (generating.join().expect("A's thread"), got_b)
    });
    assert!(matches!(a_outcome, Err(PolicyError::Cancelled)), "A ended before B did: {a_outcome:?}");
    assert_same_completion(&got_b, &want[0], "B");
    let stats = policy.stats();
    assert_eq!(stats.prefix_reuses, 1, "{stats:?}");
    let shared = prompt_of(&a).iter().zip(prompt_of(&b.messages)).take_while(|(x, y)| **x == *y).count();
    assert_eq!(stats.prefix_reused_tokens, shared as u64, "{stats:?}");
}

#[test]
fn a_seeded_sample_does_not_depend_on_what_shares_its_batch() {
    // Padded past the tokenizer, as real checkpoints are, and large enough that the scheduler
    // samples a full batch on several threads.
    let model = tiny_model_with_vocabulary(2, 16_384);
    let requests: Vec<ChatRequest> =
        (0..16).map(|i| ChatRequest { messages: ask(3 * i + 1), params: sampled(100 + i as u64, 10 + i) }).collect();
    let alone = engine(model.clone(), EngineConfig::default());
    let expected: Vec<Completion> =
        requests.iter().map(|request| alone.chat(request.clone()).expect("completion")).collect();
    assert_eq!(alone.stats().peak_decode_batch, 1);
    for max_batch_size in [64, 4] {
        let policy = engine(model.clone(), EngineConfig { max_batch_size, ..EngineConfig::default() });
        let results = concurrently(&policy, &requests);
        for (index, (result, want)) in results.into_iter().zip(&expected).enumerate() {
            let got = result.expect("completion");
            assert_eq!(got.token_ids, want.token_ids, "request {index}, batches of {max_batch_size}");
            assert_eq!(got.text, want.text);
        }
        let stats = policy.stats();
        assert!(stats.peak_decode_batch > 1, "requests were not batched: {stats:?}");
        assert!(stats.peak_decode_batch <= max_batch_size as u64, "{stats:?}");
        assert_eq!(stats.requests_done, 16);
    }
}

#[test]
fn different_seeds_give_different_samples() {
    let policy = engine(model_without_eos(3), EngineConfig::default());
    let samples: Vec<Vec<u32>> =
        (0..5).map(|seed| chat(&policy, ask(9), sampled(seed, 16)).expect("completion").token_ids).collect();
    for (i, a) in samples.iter().enumerate() {
        for b in &samples[i + 1..] {
            assert_ne!(a, b);
        }
    }
    let again = chat(&policy, ask(9), sampled(2, 16)).expect("completion");
    assert_eq!(again.token_ids, samples[2]);
}

#[test]
fn a_stop_string_cuts_the_text_and_ends_generation() {
    let policy = engine(model_without_eos(4), EngineConfig::default());
    let prompt = questions()[12].as_str();
    let free = policy.generate_text(prompt, &sampled(5, 40)).expect("completion");
    assert_eq!(free.finish_reason, FinishReason::Length);
    assert_eq!(free.prompt_tokens, tokenizer().encode(prompt).expect("encode").len());
    // Three ASCII letters or digits from the second half of the free text, as the stop string.
    let chars: Vec<(usize, char)> = free.text.char_indices().collect();
    let at = (chars.len() / 2..chars.len() - 2)
        .find(|&i| chars[i..i + 3].iter().all(|(_, c)| c.is_ascii_alphanumeric()))
        .expect("three ASCII alphanumerics in a row");
    let stop = free.text[chars[at].0..chars[at].0 + 3].to_string();
    let cut = free.text.find(&stop).expect("present");

    let params = SamplingParams { stop: vec!["never-generated".to_string(), stop.clone()], ..sampled(5, 40) };
    let stopped = policy.generate_text(prompt, &params).expect("completion");
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.text, free.text[..cut]);
    let n = stopped.token_ids.len();
    assert!(n < free.token_ids.len(), "generation went on after the stop string");
    assert_eq!(stopped.token_ids, free.token_ids[..n], "the same seed samples the same tokens");
    assert_eq!((stopped.completion_tokens, stopped.logprobs.len()), (n, n));
    // The last token completed the stop string: without it the text does not contain it yet.
    let before_last = tokenizer().decode(&stopped.token_ids[..n - 1], false).expect("decode");
    assert!(!before_last.contains(&stop));
    assert!(tokenizer().decode(&stopped.token_ids, false).expect("decode").contains(&stop));
}

#[test]
fn max_tokens_and_the_context_window_end_with_length() {
    let policy = engine(model_without_eos(5), EngineConfig { max_context: 160, ..EngineConfig::default() });
    let completion = chat(&policy, ask(2), sampled(1, 7)).expect("completion");
    assert_eq!(completion.finish_reason, FinishReason::Length);
    assert_eq!((completion.token_ids.len(), completion.logprobs.len(), completion.completion_tokens), (7, 7, 7));
    assert_eq!(completion.text, tokenizer().decode(&completion.token_ids, false).expect("decode"));

    let text = tokenizer().encode(&questions()[2]).expect("encode");
    let prompt: Vec<u32> = text.iter().cycle().take(150).copied().collect();
    let completion = policy.generate(prompt.clone(), &sampled(1, 1000)).expect("completion");
    assert_eq!(completion.finish_reason, FinishReason::Length);
    assert_eq!(completion.completion_tokens, 10, "prompt plus completion fill the window of 160");

    let long: Vec<u32> = text.iter().cycle().take(160).copied().collect();
    let error = policy.generate(long, &sampled(1, 5)).expect_err("too long");
    assert!(matches!(error, PolicyError::PromptTooLong { prompt_tokens: 160, context_window: 160 }), "{error}");
    let messages = vec![ChatMessage::new("user", questions()[..4].join(" "))];
    assert!(matches!(chat(&policy, messages, sampled(1, 5)), Err(PolicyError::PromptTooLong { .. })));
}

#[test]
fn bad_requests_fail_alone_without_stopping_the_engine() {
    let policy = engine(tiny_model(6), EngineConfig::default());
    let vocab = tokenizer().vocab_size() as u32;
    assert!(matches!(policy.generate(vec![], &sampled(1, 5)), Err(PolicyError::InvalidPrompt(_))));
    assert!(matches!(policy.generate_text("", &sampled(1, 5)), Err(PolicyError::InvalidPrompt(_))));
    assert!(matches!(policy.generate(vec![5, vocab], &sampled(1, 5)), Err(PolicyError::InvalidPrompt(_))));
    let negative = SamplingParams { temperature: -1.0, ..sampled(1, 5) };
    assert!(matches!(chat(&policy, ask(0), negative), Err(PolicyError::Sampling(_))));
    assert!(chat(&policy, ask(0), sampled(1, 5)).is_ok());
}

#[test]
fn a_batch_is_admitted_in_one_step_and_each_request_gets_what_it_gets_alone() {
    // Three prompts of at most `max_prefill_tokens / 2` tokens reach the engine together: two
    // share the first prefill call and the third the second, whatever the threads' timing. A
    // bad request in the batch fails alone.
    let model = tiny_model(9);
    let prompts: Vec<Vec<u32>> = [3, 8, 21].iter().map(|&i| prompt_of(&ask(i))).collect();
    let longest = prompts.iter().map(Vec::len).max().expect("prompts");
    let config = EngineConfig { max_prefill_tokens: 2 * longest, ..EngineConfig::default() };
    let alone = engine(model.clone(), config.clone());
    let expected: Vec<Completion> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| alone.generate(p.clone(), &sampled(i as u64, 6)).expect("alone"))
        .collect();
    let policy = engine(model, config);
    let mut batch: Vec<(Vec<u32>, SamplingParams)> =
        prompts.iter().enumerate().map(|(i, p)| (p.clone(), sampled(i as u64, 6))).collect();
    batch.insert(1, (vec![], sampled(7, 6)));
    let before = policy.stats();
    let mut results = policy.generate_batch(&batch);
    let after = policy.stats();
    let bad = results.remove(1);
    assert!(matches!(bad, Err(PolicyError::InvalidPrompt(_))), "{bad:?}");
    let got: Vec<Completion> = results.into_iter().map(|r| r.expect("a valid request completes")).collect();
    for (index, (got, want)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(got.token_ids, want.token_ids, "request {index}");
    }
    assert_eq!(after.prefill_calls - before.prefill_calls, 2, "{after:?}");
    assert_eq!(after.prefill_rows - before.prefill_rows, 3, "{after:?}");
}

/// A prompt longer than the prefill budget is fed in chunks of the budget, one a step: the
/// greedy reply and its log-probabilities are those of a plain forward loop, and the k samples
/// of one long prompt still share every chunk, each then getting what it gets fed whole.
#[test]
fn a_long_prompt_is_prefilled_in_chunks_and_gets_what_it_gets_fed_whole() {
    let model = tiny_model(12);
    let messages: Vec<ChatMessage> = (0..6).flat_map(|i| ask(i * 7)).collect();
    let prompt = prompt_of(&messages);
    let chunk = 16;
    assert!(prompt.len() > 5 * chunk, "a prompt of {} tokens is not long", prompt.len());
    let chunked = engine(model.clone(), EngineConfig { max_prefill_tokens: chunk, ..EngineConfig::default() });

    let completion = chat(&chunked, messages.clone(), greedy(16)).expect("completion");
    let (tokens, logprobs) = reference_greedy(&model, &prompt, 16, chunked.eos_token_ids());
    assert_eq!(completion.token_ids, tokens);
    for (got, want) in completion.logprobs.iter().zip(&logprobs) {
        assert!((got - want).abs() < 1e-3, "logprob {got} vs {want}");
    }
    // A prefill feeds the next chunk while two or more tokens are left; a last single token
    // is fed by a decode step.
    let (mut left, mut chunks) = (prompt.len(), 0);
    while left >= 2 {
        left -= left.min(chunk);
        chunks += 1;
    }
    let stats = chunked.stats();
    assert_eq!(stats.prefill_rows, chunks, "{stats:?}");

    let whole = engine(model, EngineConfig { max_prefill_tokens: 4096, ..EngineConfig::default() });
    let samples: Vec<(Vec<u32>, SamplingParams)> = (0..4).map(|seed| (prompt.clone(), sampled(seed, 10))).collect();
    let before = chunked.stats();
    let got = chunked.generate_batch(&samples);
    let after = chunked.stats();
    for (index, (got, want)) in got.into_iter().zip(whole.generate_batch(&samples)).enumerate() {
        assert_same_completion(&got.expect("chunked"), &want.expect("whole"), &format!("sample {index}"));
    }
    assert_eq!(after.prefill_rows - before.prefill_rows, chunks, "the four samples share each chunk: {after:?}");
}

#[test]
fn sixty_four_concurrent_requests_all_complete() {
    let policy = engine(tiny_model(7), EngineConfig::default());
    let requests: Vec<ChatRequest> =
        (0..64).map(|i| ChatRequest { messages: ask(i), params: sampled(i as u64, 12) }).collect();
    let results = concurrently(&policy, &requests);
    for result in results {
        let completion = result.expect("completion");
        assert!((1..=12).contains(&completion.completion_tokens));
        assert_eq!(completion.token_ids.len(), completion.completion_tokens);
    }
    let stats = policy.stats();
    assert_eq!(stats.requests_done, 64);
    assert!(stats.peak_decode_batch >= 2, "{stats:?}");
    assert!(stats.decode_calls < stats.decode_rows, "decode steps served several sequences: {stats:?}");
}

#[test]
fn weight_updates_in_place_and_new_models_take_effect() {
    let model = model_without_eos(8);
    // Kept caches too must not outlive the weights they were computed with.
    let policy = engine(model.clone(), reusing_prefixes());
    assert_eq!(policy.weights_version(), 0);
    let prompt = prompt_of(&ask(20));
    let eos = policy.eos_token_ids().to_vec();
    let before = chat(&policy, ask(20), greedy(12)).expect("completion");
    assert_eq!(before.token_ids, reference_greedy(&model, &prompt, 12, &eos).0);

    // A trainer would do this: change the shared weights in place, then tell the engine.
    let (_, down) =
        model.named_parameters().into_iter().find(|(name, _)| name.ends_with("0.mlp.down_proj.weight")).expect("var");
    down.set(&down.as_tensor().affine(-3.0, 0.0).expect("scaled")).expect("set");
    policy.set_weights_version(1).expect("running");
    assert_eq!(policy.weights_version(), 1);
    let after = chat(&policy, ask(20), greedy(12)).expect("completion");
    assert_eq!(after.token_ids, reference_greedy(&model, &prompt, 12, &eos).0);
    assert_ne!(after.token_ids, before.token_ids);

    let mut wider = Qwen3Config::tiny(tokenizer().vocab_size() + 1);
    wider.tie_word_embeddings = false;
    let other = Qwen3Model::new_random(&wider, 1, DType::F32, &Device::Cpu).expect("model");
    assert!(matches!(policy.reload(other, 2), Err(EngineError::Mismatch { .. })));
    assert_eq!(policy.weights_version(), 1);
}

#[test]
fn a_request_in_flight_continues_under_reloaded_weights() {
    const LENGTH: usize = 800;
    let (first, second) = (model_without_eos(9), model_without_eos(10));
    let policy = engine(first.clone(), EngineConfig::default());
    let prompt = prompt_of(&ask(30));
    let eos = policy.eos_token_ids().to_vec();
    // 800 tokens leave the reload hundreds of decode steps to arrive in, on a loaded machine too;
    // it must land before the last one.
    let completion = std::thread::scope(|scope| {
        let request = scope.spawn(|| chat(&policy, ask(30), greedy(LENGTH)));
        wait_for(|| policy.stats().decode_calls >= 10);
        policy.reload(second.clone(), 7).expect("reload");
        request.join().expect("request thread").expect("completion")
    });
    assert_eq!(policy.weights_version(), 7);
    let tokens = &completion.token_ids;
    assert_eq!(tokens.len(), LENGTH);
    let (under_first, _) = reference_greedy(&first, &prompt, LENGTH, &eos);
    let switch = tokens.iter().zip(&under_first).take_while(|(a, b)| a == b).count();
    assert!((10..LENGTH).contains(&switch), "the new weights took effect at token {switch}");
    let resumed = [&prompt[..], &tokens[..switch]].concat();
    let (under_second, _) = reference_greedy(&second, &resumed, LENGTH - switch, &eos);
    assert_eq!(&tokens[switch..], &under_second[..], "after the reload, tokens come from the new weights only");
}

fn wait_for(condition: impl Fn() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn shutdown_fails_pending_and_later_requests_without_hanging() {
    let config = EngineConfig { max_batch_size: 4, max_context: 4096, ..EngineConfig::default() };
    let policy = Arc::new(engine(model_without_eos(11), config));
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let policy = Arc::clone(&policy);
                scope.spawn(move || chat(&policy, ask(i), sampled(i as u64, 100_000)))
            })
            .collect();
        wait_for(|| policy.stats().decode_calls >= 5);
        assert!(policy.is_running());
        let start = Instant::now();
        policy.shutdown();
        assert!(!policy.is_running());
        assert!(start.elapsed() < Duration::from_secs(5), "shutdown took {:?}", start.elapsed());
        handles.into_iter().map(|handle| handle.join().expect("request thread")).collect::<Vec<_>>()
    });
    // Four requests were decoding and four were queued; none could have finished.
    for result in results {
        assert!(matches!(result, Err(PolicyError::EngineStopped)), "{result:?}");
    }
    assert!(matches!(chat(&policy, ask(0), sampled(0, 4)), Err(PolicyError::EngineStopped)));
    assert!(matches!(policy.set_weights_version(3), Err(EngineError::Stopped)));
    let policy = Arc::into_inner(policy).expect("sole owner");
    drop(policy);

    // Dropping an engine that is idle or has just served requests returns too.
    let policy = engine(tiny_model(12), EngineConfig::default());
    chat(&policy, ask(1), sampled(1, 3)).expect("completion");
    drop(policy);
}

#[test]
fn a_model_directory_loads_with_its_tokenizer_template_and_end_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(13);
    let mut generation = GenerationConfig::for_model(model.config());
    let extra_eos = tokenizer().token_id("?").expect("a token for '?'");
    generation.eos_token_id = vec![tokenizer().specials().im_end, extra_eos];
    save_model(&model, &generation, dir.path()).expect("save");
    tokenizer().save(dir.path().join(TOKENIZER_FILE)).expect("tokenizer");
    write_tokenizer_config(dir.path(), CHATML_TEMPLATE, &tokenizer().specials(), 4096).expect("tokenizer config");

    let loaded = LocalPolicy::load(dir.path(), DType::F32, &Device::Cpu, EngineConfig::default()).expect("load");
    assert_eq!(loaded.name(), dir.path().display().to_string());
    assert!(loaded.eos_token_ids().contains(&extra_eos));
    let in_memory = engine(model, EngineConfig { eos_token_ids: vec![extra_eos], ..EngineConfig::default() });
    for index in [3, 4] {
        let want = chat(&in_memory, ask(index), greedy(30)).expect("completion");
        let got = chat(&loaded, ask(index), greedy(30)).expect("completion");
        assert_eq!(got, want);
        if let Some(at) = got.token_ids.iter().position(|&id| id == extra_eos) {
            assert_eq!((at + 1, got.finish_reason), (got.token_ids.len(), FinishReason::Stop));
        }
    }

    std::fs::remove_file(dir.path().join(TOKENIZER_FILE)).expect("remove");
    let error = LocalPolicy::load(dir.path(), DType::F32, &Device::Cpu, EngineConfig::default()).err().expect("error");
    assert!(matches!(error, EngineError::Tokenizer(_)), "{error}");
}

#[test]
fn streaming_hands_over_every_token_of_the_completion_as_it_is_sampled() {
    let policy = engine(tiny_model(9), EngineConfig::default());
    let prompt = prompt_of(&ask(0));
    let mut streamed = Vec::new();
    let completion = policy
        .generate_streaming(prompt.clone(), &sampled(4, 24), &mut |token| {
            streamed.push(token);
            true
        })
        .expect("a completion");
    assert_eq!(streamed.iter().map(|token| token.id).collect::<Vec<_>>(), completion.token_ids);
    assert_eq!(streamed.iter().map(|token| token.logprob).collect::<Vec<_>>(), completion.logprobs);
    assert_eq!(completion, policy.generate(prompt, &sampled(4, 24)).expect("the same request unstreamed"));
}

#[test]
fn the_choices_of_one_request_are_waited_on_together_and_get_what_each_gets_alone() {
    let policy = engine(tiny_model(9), EngineConfig::default());
    let prompt = prompt_of(&ask(2));
    let choices: Vec<SamplingParams> = (0..6).map(|i| sampled(40 + i, 10 + i as usize)).collect();
    let alone: Vec<Completion> =
        choices.iter().map(|params| policy.generate(prompt.clone(), params).expect("alone")).collect();
    let distinct: std::collections::HashSet<&Vec<u32>> = alone.iter().map(|c| &c.token_ids).collect();
    assert!(distinct.len() > 2, "the seeds gave the same samples, so the comparison proves little");
    let mut streamed = vec![Vec::new(); choices.len()];
    let mut done: Vec<Option<Completion>> = vec![None; choices.len()];
    policy
        .generate_choices(prompt, &choices, &mut |event| {
            match event {
                ChoiceEvent::Token { index, token } => {
                    assert!(done[index].is_none(), "a token of choice {index} after its end");
                    streamed[index].push(token.id);
                }
                ChoiceEvent::Done { index, outcome } => done[index] = Some(outcome.expect("a completion")),
            }
            true
        })
        .expect("every choice ends");
    for (index, want) in alone.iter().enumerate() {
        // The same tokens; the log-probabilities up to a batched forward pass's rounding.
        let got = done[index].as_ref().expect("each choice ends once");
        assert_eq!((&got.token_ids, &got.text, got.finish_reason), (&want.token_ids, &want.text, want.finish_reason));
        assert!(got.logprobs.iter().zip(&want.logprobs).all(|(a, b)| (a - b).abs() < 1e-4), "choice {index}");
        assert_eq!(streamed[index], want.token_ids, "choice {index}'s tokens as streamed");
    }
}

#[test]
fn choices_stop_together_when_their_caller_answers_false() {
    let policy = engine(model_without_eos(5), EngineConfig::default());
    let max_tokens = 4000;
    let choices: Vec<SamplingParams> = (0..8).map(|i| sampled(i, max_tokens)).collect();
    let mut received = 0;
    let outcome = policy.generate_choices(prompt_of(&ask(0)), &choices, &mut |_| {
        received += 1;
        received < 20
    });
    assert!(matches!(outcome, Err(PolicyError::Cancelled)), "{outcome:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while policy.stats().requests_done < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = policy.stats();
    assert_eq!(stats.requests_done, 8, "the engine did not retire every cancelled choice");
    assert!(
        stats.tokens_generated < 8 * max_tokens as u64 / 4,
        "generated {} tokens for a caller that left after 20",
        stats.tokens_generated
    );
    let invalid = [sampled(1, 4), SamplingParams { temperature: -1.0, ..sampled(2, 4) }];
    let refused = policy.generate_choices(prompt_of(&ask(1)), &invalid, &mut |_| true);
    assert!(matches!(refused, Err(PolicyError::Sampling(_))), "{refused:?}");
    // One more request, answered after anything the refused one might have queued.
    policy.generate(prompt_of(&ask(2)), &sampled(3, 4)).expect("the engine still serves");
    assert_eq!(policy.stats().requests_done, 9, "a request with one invalid choice starts none");
}

#[test]
fn choices_pending_when_the_engine_shuts_down_end_with_engine_stopped() {
    let policy = Arc::new(engine(model_without_eos(11), EngineConfig { max_batch_size: 2, ..EngineConfig::default() }));
    let caller = Arc::clone(&policy);
    // A thread of its own, not a scoped one: a caller that never returns must fail the test,
    // not hang it.
    let (answered, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let choices: Vec<SamplingParams> = (0..4).map(|i| sampled(i, 100_000)).collect();
        let _ = answered.send(caller.generate_choices(prompt_of(&ask(0)), &choices, &mut |_| true));
    });
    wait_for(|| policy.stats().decode_calls >= 3);
    policy.shutdown();
    let outcome = answer.recv_timeout(Duration::from_secs(10)).expect("the caller still waits on dropped choices");
    assert!(matches!(outcome, Err(PolicyError::EngineStopped)), "{outcome:?}");
}

#[test]
fn a_cancelled_stream_stops_generating_at_its_next_token() {
    let policy = engine(model_without_eos(5), EngineConfig::default());
    let mut received = 0;
    let max_tokens = 4000;
    let outcome = policy.generate_streaming(prompt_of(&ask(0)), &sampled(3, max_tokens), &mut |_| {
        received += 1;
        received < 3
    });
    assert!(matches!(outcome, Err(PolicyError::Cancelled)), "{outcome:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while policy.stats().requests_done == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stats = policy.stats();
    assert_eq!(stats.requests_done, 1, "the engine never retired the cancelled request");
    // The engine samples on while the caller's thread catches up with the tokens already sent
    // (a few, or more on a loaded machine); it must stop long before the request's limit.
    assert!(
        stats.tokens_generated < max_tokens as u64 / 4,
        "generated {} tokens for a caller that left after 3",
        stats.tokens_generated
    );
    let after = policy.generate(prompt_of(&ask(1)), &sampled(3, 8)).expect("the engine still serves");
    assert_eq!(after.completion_tokens, 8);
}

#[test]
fn ignore_eos_generates_to_max_tokens_past_the_end_of_sequence_tokens() {
    let probe = engine(model_without_eos(5), EngineConfig::default());
    let first = chat(&probe, ask(0), greedy(12)).expect("completion");
    // Make the first token greedy decoding picks an end-of-sequence token: the reply stops at once.
    let eos = first.token_ids[0];
    let policy = engine(model_without_eos(5), EngineConfig { eos_token_ids: vec![eos], ..EngineConfig::default() });
    let stopped = chat(&policy, ask(0), greedy(12)).expect("completion");
    assert_eq!((stopped.token_ids.clone(), stopped.finish_reason), (vec![eos], FinishReason::Stop));
    assert_eq!(stopped.text, "", "the end-of-sequence token is not text");
    let params = SamplingParams { ignore_eos: true, ..greedy(12) };
    let full = chat(&policy, ask(0), params).expect("completion");
    assert_eq!(full.token_ids, first.token_ids, "the same tokens, the end-of-sequence ones included");
    assert_eq!((full.completion_tokens, full.finish_reason), (12, FinishReason::Length));
    let eos_text = tokenizer().decode(&[eos], false).expect("decode");
    assert!(eos_text.is_empty() || !full.text.contains(&eos_text), "end-of-sequence tokens are left out of the text");
}

/// Greedy tokens from `model`'s own cached decoding step, one sequence alone.
fn greedy_alone(model: &Qwen3Model, prompt: &[u32], max_tokens: usize, eos: &[u32]) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut logits = model.forward_step(&mut [SeqStep { tokens: prompt, cache: &mut cache }]).expect("prefill");
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let next = argmax(&logits.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("row"));
        out.push(next);
        if eos.contains(&next) {
            break;
        }
        logits = model.forward_step(&mut [SeqStep { tokens: &[next], cache: &mut cache }]).expect("step");
    }
    out
}

#[test]
fn a_quantized_engine_decodes_from_8_bit_copies_batched_as_alone_and_remakes_them_after_an_update() {
    // 256 wide: the copies are made for inputs that are (or pad with little work to) a multiple of 256.
    let mut config = Qwen3Config::with_size(tokenizer().vocab_size(), ModelSize::BASE);
    config.tie_word_embeddings = false;
    config.initializer_range = 0.1;
    let model = Qwen3Model::new_random(&config, 1, DType::F32, &Device::Cpu).expect("model");
    let quantized = EngineConfig { quantized: true, ..EngineConfig::default() };
    if let Err(error) = model.for_quantized_decoding() {
        assert!(error.to_string().contains("VNNI"), "only a CPU without VNNI refuses: {error}");
        let refused = LocalPolicy::new(model, tokenizer().clone(), ChatTemplate::chatml(), quantized).err();
        assert!(refused.expect("refused").to_string().contains("VNNI"));
        return;
    }
    let policy = engine(model.clone(), quantized);
    let indices = [0, 5, 17, 40];
    let requests: Vec<ChatRequest> =
        indices.iter().map(|&i| ChatRequest { messages: ask(i), params: greedy(16) }).collect();
    let check = |model: &Qwen3Model| {
        let quantized = model.for_quantized_decoding().expect("an f32 model on the CPU");
        let mut moved = 0.0f32;
        for (request, result) in requests.iter().zip(concurrently(&policy, &requests)) {
            let completion = result.expect("completion");
            let prompt = prompt_of(&request.messages);
            let eos = policy.eos_token_ids();
            assert_eq!(completion.token_ids, greedy_alone(&quantized, &prompt, 16, eos), "batched as alone");
            let (_, exact) = reference_greedy(model, &prompt, 1, eos);
            moved = moved.max((completion.logprobs[0] - exact[0]).abs());
        }
        assert!(moved > 0.0, "the first tokens' log-probabilities come from the 8-bit copies, not f32");
    };
    check(&model);
    let (_, head) = model.named_parameters().into_iter().find(|(name, _)| name == "lm_head.weight").expect("head");
    head.set(&head.as_tensor().affine(-1.0, 0.0).expect("negated")).expect("set");
    policy.set_weights_version(1).expect("running");
    check(&model);
}
