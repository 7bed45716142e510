//! The dense decoder (Qwen3, Llama, Qwen2): numbers against an independent reference, padding, and cached / batched
//! decoding agreeing with the plain forward pass. (Gradients reaching every parameter through
//! the trainer's loss: whale-train's `tests/train.rs`.)

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use whale_lm::{DenseConfig, DenseModel, LlamaModel, ModelError, Qwen3Config, Qwen3Model, RopeScaling, SeqStep};

/// The logits of 9 random tokens through the training pass agree with the reference to 1e-4,
/// and are far from uniform (so that the comparison means something).
fn check_against_the_reference<C: DenseConfig>(model: &DenseModel<C>, what: &str) {
    let tokens = random_tokens(&mut rng(1), 9);
    let ours = full_logits(model, &tokens);
    let reference = reference_logits(model.settings(), &weights_of(model), &tokens);
    for (row, expected) in ours.iter().zip(&reference) {
        let expected: Vec<f32> = expected.iter().map(|&x| x as f32).collect();
        let diff = max_abs_diff(row, &expected);
        assert!(diff < 1e-4, "{what}: max difference {diff}");
    }
    let spread = ours[8].iter().cloned().fold(f32::MIN, f32::max) - ours[8].iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 1.0, "{what}: spread {spread}");
}

#[test]
fn matches_an_independent_reference_implementation() {
    for tied in [true, false] {
        check_against_the_reference(&tiny_model(tied, 11), &format!("Qwen3, tied={tied}"));
        check_against_the_reference(&tiny_llama(tied, 11), &format!("Llama, tied={tied}"));
        check_against_the_reference(&tiny_qwen2(tied, 11), &format!("Qwen2, tied={tied}"));
    }
}

/// A Llama whose config scales the rotary frequencies runs with the scaled ones: it matches
/// the reference rotating by them, and differs from the same weights unscaled.
#[test]
fn a_llama_with_scaled_rotary_frequencies_rotates_by_them() {
    let unscaled = tiny_llama(false, 13);
    let mut config = unscaled.config().clone();
    config.own.rope_scaling = Some(RopeScaling::Linear { factor: 4.0 });
    let weights = unscaled.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor()));
    let scaled = LlamaModel::from_tensors(&config, weights.collect(), DType::F32, &Device::Cpu).unwrap();
    check_against_the_reference(&scaled, "Llama with linear scaling");
    let tokens = random_tokens(&mut rng(2), 9);
    let (plain, stretched) = (full_logits(&unscaled, &tokens), full_logits(&scaled, &tokens));
    assert!(max_abs_diff(&plain[8], &stretched[8]) > 1e-3, "the scaling changes the logits");
    assert!(max_abs_diff(&plain[0], &stretched[0]) < 1e-5, "position 0 is not rotated");
}

fn check_parameters<C: DenseConfig>(model: &DenseModel<C>, tied: bool) {
    let params = model.named_parameters();
    let count: usize = params.iter().map(|(_, var)| var.elem_count()).sum();
    assert_eq!(count, model.settings().parameter_count());
    let has_head = params.iter().any(|(name, _)| name == "lm_head.weight");
    assert_eq!(has_head, !tied);
    assert_eq!(params.len(), model.varmap().all_vars().len());
    let norms = params.iter().filter(|(name, _)| name.ends_with("q_norm.weight")).count();
    assert_eq!(norms, if model.settings().qk_norm { model.settings().num_hidden_layers } else { 0 });
}

#[test]
fn parameters_match_the_configuration() {
    for tied in [true, false] {
        check_parameters(&tiny_model(tied, 3), tied);
        check_parameters(&tiny_llama(tied, 3), tied);
        check_parameters(&tiny_qwen2(tied, 3), tied);
    }
    assert!(tiny_model(true, 3).settings().qk_norm && !tiny_llama(true, 3).settings().qk_norm);
}

#[test]
fn padding_on_either_side_leaves_real_tokens_unchanged() {
    let model = tiny_model(false, 7);
    let short = random_tokens(&mut rng(3), 5);
    let long = random_tokens(&mut rng(4), 8);
    let alone = full_logits(&model, &short);
    for left_padded in [false, true] {
        let pad = [9u32; 3];
        let (row, mask_row): (Vec<u32>, Vec<u8>) = if left_padded {
            ([&pad[..], &short].concat(), [vec![0; 3], vec![1; 5]].concat())
        } else {
            ([&short[..], &pad].concat(), [vec![1; 5], vec![0; 3]].concat())
        };
        let ids = Tensor::from_vec([row, long.clone()].concat(), (2, 8), &Device::Cpu).unwrap();
        let mask = Tensor::from_vec([mask_row, vec![1; 8]].concat(), (2, 8), &Device::Cpu).unwrap();
        let logits = model.forward_train(&ids, &mask).unwrap().to_vec3::<f32>().unwrap();
        let offset = if left_padded { 3 } else { 0 };
        for t in 0..5 {
            let diff = max_abs_diff(&logits[0][offset + t], &alone[t]);
            assert!(diff < 1e-4, "left_padded={left_padded} t={t}: {diff}");
        }
        let long_alone = full_logits(&model, &long);
        assert!(max_abs_diff(&logits[1][7], &long_alone[7]) < 1e-4);
    }
}

#[test]
fn packed_sequences_each_run_as_if_alone() {
    let model = tiny_model(false, 8);
    let (first, second) = (random_tokens(&mut rng(6), 7), random_tokens(&mut rng(7), 70));
    let packed = model.packed_hidden(&[&first, &[], &second]).unwrap();
    assert_eq!(packed.dims(), [77, model.config().hidden_size]);
    for (rows, tokens) in [(0..7, &first), (7..77, &second)] {
        let alone = model.packed_hidden(&[tokens]).unwrap().to_vec2::<f32>().unwrap();
        let part = packed.narrow(0, rows.start, rows.len()).unwrap().to_vec2::<f32>().unwrap();
        for (a, b) in part.iter().zip(&alone) {
            assert!(max_abs_diff(a, b) < 1e-5, "{}", max_abs_diff(a, b));
        }
    }
    let error = model.packed_hidden(&[&[], &[]]).unwrap_err();
    assert!(error.to_string().contains("no tokens"), "{error}");
}

#[test]
fn padded_positions_read_zero_logits() {
    let model = tiny_model(true, 9);
    let ids = Tensor::from_vec(vec![5u32, 6, 7, 9, 1, 2], (2, 3), &Device::Cpu).unwrap();
    let mask = Tensor::from_vec(vec![1u8, 1, 0, 0, 1, 1], (2, 3), &Device::Cpu).unwrap();
    let logits = model.forward_train(&ids, &mask).unwrap().to_vec3::<f32>().unwrap();
    for (row, t) in [(0, 2), (1, 0)] {
        assert!(logits[row][t].iter().all(|&x| x == 0.0), "row {row} step {t}");
    }
    assert!(logits[1][1].iter().any(|&x| x != 0.0));
    let none = Tensor::zeros((2, 3), DType::U8, &Device::Cpu).unwrap();
    assert!(model.forward_train(&ids, &none).unwrap_err().to_string().contains("no real token"));
}

#[test]
fn greedy_decoding_with_and_without_the_cache_agree() {
    check_greedy_decoding(&tiny_model(true, 13));
    check_greedy_decoding(&tiny_qwen2(false, 13));
}

fn check_greedy_decoding<C: DenseConfig>(model: &DenseModel<C>) {
    let prompt = random_tokens(&mut rng(5), 6);
    let (plain, plain_logits) = greedy_without_cache(model, &prompt, 12);
    let (cached, cached_logits) = greedy_with_cache(model, &prompt, 12);
    assert_eq!(plain, cached);
    for (a, b) in plain_logits.iter().zip(&cached_logits) {
        let diff = max_abs_diff(a, b);
        assert!(diff < 1e-4, "{diff}");
    }
    // Not a degenerate loop on one token.
    let distinct: std::collections::HashSet<_> = plain.iter().collect();
    assert!(distinct.len() > 1, "{plain:?}");
}

#[test]
fn a_batched_step_matches_each_sequence_alone() {
    let model = tiny_model(false, 17);
    let mut rng = rng(6);
    let prompts: Vec<Vec<u32>> = [3, 7, 1, 5].iter().map(|&len| random_tokens(&mut rng, len)).collect();
    let continuations: Vec<Vec<u32>> = [1, 1, 4, 2].iter().map(|&len| random_tokens(&mut rng, len)).collect();

    // Alone: each sequence prefilled, then continued, with its own cache.
    let mut expected = Vec::new();
    for (prompt, more) in prompts.iter().zip(&continuations) {
        let mut cache = model.new_cache();
        let first = step_one(&model, prompt, &mut cache);
        let second = step_one(&model, more, &mut cache);
        expected.push((first, second));
    }

    // Batched: sequences 0 and 1 prefill together; then 0 and 1 decode while 2 joins with its
    // prompt; sequence 1 leaves; 3 joins while 2 continues with a chunk.
    let mut caches = [(); 4].map(|_| model.new_cache());
    let [c0, c1, c2, c3] = caches.each_mut();
    let first = batched(&model, &mut [(&prompts[0], &mut *c0), (&prompts[1], &mut *c1)]);
    let second =
        batched(&model, &mut [(&continuations[0], &mut *c0), (&continuations[1], &mut *c1), (&prompts[2], &mut *c2)]);
    let third = batched(&model, &mut [(&continuations[2], &mut *c2), (&prompts[3], &mut *c3)]);
    let fourth = batched(&model, &mut [(&continuations[3], &mut *c3)]);
    let got = [(&first[0], &second[0]), (&first[1], &second[1]), (&second[2], &third[0]), (&third[1], &fourth[0])];
    for (index, ((a, b), (x, y))) in got.iter().zip(&expected).enumerate() {
        let diff = max_abs_diff(a, x).max(max_abs_diff(b, y));
        assert!(diff < 1e-4, "sequence {index}: {diff}");
    }
    let lengths: Vec<usize> = caches.iter().map(|c| c.len()).collect();
    let expected_lengths: Vec<usize> = prompts.iter().zip(&continuations).map(|(p, c)| p.len() + c.len()).collect();
    assert_eq!(lengths, expected_lengths);
    assert!(caches.iter().all(|c| c.allocated_bytes() > 0));
}

/// On the CPU in f32 a step attends straight over the caches; in other dtypes (and on GPUs)
/// it gathers the caches into padded buffers. The same weights in f16 take the second path:
/// both give the same logits, to f16's rounding, over a schedule of joins, decodes and chunks
/// of mixed lengths.
#[test]
fn attention_read_from_the_caches_agrees_with_the_gathered_path() {
    let single = tiny_model(false, 23);
    let tensors = single.named_parameters().into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
    let double = Qwen3Model::from_tensors(single.config(), tensors, DType::F16, &Device::Cpu).unwrap();
    let mut rng = rng(8);
    let chunks: Vec<Vec<u32>> = [5, 9, 1, 1, 3, 1, 2].iter().map(|&len| random_tokens(&mut rng, len)).collect();
    let mut logits = Vec::new();
    for model in [&single, &double] {
        let mut caches = [(); 3].map(|_| model.new_cache());
        let [c0, c1, c2] = caches.each_mut();
        let mut rows = batched(model, &mut [(&chunks[0], &mut *c0), (&chunks[1], &mut *c1)]);
        rows.extend(batched(model, &mut [(&chunks[2], &mut *c0), (&chunks[3], &mut *c1), (&chunks[4], &mut *c2)]));
        rows.extend(batched(model, &mut [(&chunks[5], &mut *c0), (&chunks[6], &mut *c2)]));
        logits.push(rows);
    }
    for (row, (a, b)) in logits[0].iter().zip(&logits[1]).enumerate() {
        let diff = max_abs_diff(a, b);
        assert!(diff < 0.05, "row {row}: {diff}");
    }
    // f16's rounding moves these logits by about 0.01; one sequence's logits attended over
    // another's keys would be far outside that.
    assert!(max_abs_diff(&logits[0][0], &logits[0][1]) > 1.0);
    assert!(max_abs_diff(&logits[0][2], &logits[0][5]) > 1.0);
}

fn batched(model: &Qwen3Model, work: &mut [(&Vec<u32>, &mut whale_lm::KvCache)]) -> Vec<Vec<f32>> {
    let mut steps: Vec<SeqStep> = work.iter_mut().map(|(tokens, cache)| SeqStep { tokens, cache }).collect();
    let logits = model.forward_step(&mut steps).unwrap();
    assert_eq!(logits.dims(), &[work.len(), VOCAB]);
    logits.to_vec2::<f32>().unwrap()
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let model = tiny_model(true, 19);
    let mut cache = model.new_cache();
    let outside = [VOCAB as u32];
    let mut steps = [SeqStep { tokens: &outside, cache: &mut cache }];
    assert!(matches!(model.forward_step(&mut steps), Err(ModelError::Input(_))));
    let mut steps = [SeqStep { tokens: &[], cache: &mut cache }];
    assert!(matches!(model.forward_step(&mut steps), Err(ModelError::Input(_))));
    assert!(matches!(model.forward_step(&mut []), Err(ModelError::Input(_))));
    assert!(cache.is_empty());

    let mut other_config = Qwen3Config::tiny(VOCAB);
    other_config.num_hidden_layers = 1;
    let other = Qwen3Model::new_random(&other_config, 1, DType::F32, &Device::Cpu).unwrap();
    let mut foreign = other.new_cache();
    let mut steps = [SeqStep { tokens: &[1], cache: &mut foreign }];
    assert!(matches!(model.forward_step(&mut steps), Err(ModelError::Input(_))));

    let ids = Tensor::from_vec(vec![1u32, 2, 3], (1, 3), &Device::Cpu).unwrap();
    let mask = Tensor::ones((1, 2), DType::U8, &Device::Cpu).unwrap();
    assert!(matches!(model.forward_train(&ids, &mask), Err(ModelError::Input(_))));

    let mut broken = Qwen3Config::tiny(VOCAB);
    broken.num_key_value_heads = 3;
    let error = Qwen3Model::new_random(&broken, 1, DType::F32, &Device::Cpu).err().unwrap();
    assert!(error.to_string().contains("num_key_value_heads"), "{error}");
}

#[test]
fn random_initialisation_is_reproducible_from_the_seed() {
    let a = weights_of(&tiny_model(true, 23));
    let b = weights_of(&tiny_model(true, 23));
    let c = weights_of(&tiny_model(true, 24));
    assert_eq!(a, b);
    assert_ne!(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"]);
    assert!(a["model.norm.weight"].iter().all(|&x| x == 1.0));
}

#[test]
fn forked_and_truncated_caches_continue_like_fresh_ones() {
    let model = tiny_model(true, 73);
    let mut rng = rng(10);
    let prompt = random_tokens(&mut rng, 6);
    let (a, b) = (random_tokens(&mut rng, 2), random_tokens(&mut rng, 3));
    let fresh = |tokens: &[u32]| step_one(&model, tokens, &mut model.new_cache());

    let mut shared = model.new_cache();
    step_one(&model, &prompt, &mut shared);
    let mut first = shared.fork().unwrap();
    let mut second = shared.fork().unwrap();
    let mut steps = [SeqStep { tokens: &a, cache: &mut first }, SeqStep { tokens: &b, cache: &mut second }];
    let logits = model.forward_step(&mut steps).unwrap().to_vec2::<f32>().unwrap();
    assert!(max_abs_diff(&logits[0], &fresh(&[prompt.clone(), a.clone()].concat())) < 1e-4);
    assert!(max_abs_diff(&logits[1], &fresh(&[prompt.clone(), b.clone()].concat())) < 1e-4);
    assert_eq!((shared.len(), first.len(), second.len()), (6, 8, 9));

    // Back to the first four prompt tokens, then a different continuation.
    second.truncate(4);
    assert_eq!(second.len(), 4);
    let continued = step_one(&model, &a, &mut second);
    assert!(max_abs_diff(&continued, &fresh(&[&prompt[..4], &a].concat())) < 1e-4);
    second.truncate(100);
    assert_eq!(second.len(), 6);
}

#[test]
fn models_and_caches_can_cross_threads() {
    fn shared_across_threads<T: Send + Sync>() {}
    fn moved_across_threads<T: Send>() {}
    shared_across_threads::<Qwen3Model>();
    moved_across_threads::<whale_lm::KvCache>();
}
