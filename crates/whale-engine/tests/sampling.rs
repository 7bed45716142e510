use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use whale_engine::sampling::{SampledToken, Sampler, SamplingError, StopMatch, StopMatcher};
use whale_policy::{SamplingParams, SamplingParamsError};

fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, seed, ..SamplingParams::default() }
}

fn random_logits(rng: &mut ChaCha8Rng, vocab: usize) -> Vec<f32> {
    (0..vocab).map(|_| rng.gen_range(-8.0..8.0)).collect()
}

/// softmax(logits / temperature) computed directly, in f64.
fn softmax(logits: &[f32], temperature: f64) -> Vec<f64> {
    let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l) / temperature).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

fn counts(sampler: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut counts = vec![0; logits.len()];
    for _ in 0..draws {
        counts[sampler.sample(logits).expect("sample").id as usize] += 1;
    }
    counts
}

/// Pearson's chi-square statistic of observed counts against expected probabilities (cells
/// with zero expected probability must be empty).
fn chi_square(observed: &[usize], expected: &[f64]) -> f64 {
    let draws: usize = observed.iter().sum();
    observed
        .iter()
        .zip(expected)
        .map(|(&seen, &p)| {
            if p == 0.0 {
                assert_eq!(seen, 0, "a token of probability 0 was drawn");
                return 0.0;
            }
            let want = p * draws as f64;
            (seen as f64 - want).powi(2) / want
        })
        .sum()
}

/// Upper 0.1% points of chi-square with 1..=7 degrees of freedom.
const CHI_SQUARE_999: [f64; 7] = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32];

fn assert_fits(observed: &[usize], expected: &[f64]) {
    let df = expected.iter().filter(|&&p| p > 0.0).count() - 1;
    let statistic = chi_square(observed, expected);
    assert!(
        statistic < CHI_SQUARE_999[df - 1],
        "chi-square {statistic:.2} with {df} dof: observed {observed:?}, expected {expected:?}"
    );
}

#[test]
fn defaults_are_the_papers_sampling_settings() {
    let defaults = SamplingParams::default();
    assert_eq!((defaults.temperature, defaults.top_p, defaults.top_k), (1.0, 1.0, 20));
    let from_json: SamplingParams = serde_json::from_str(r#"{"seed": 9}"#).expect("json");
    assert_eq!(from_json, SamplingParams { seed: 9, ..defaults });
}

#[test]
fn greedy_and_top_k_one_pick_the_argmax_with_its_full_logprob() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut greedy = Sampler::new(&params(0.0, 0, 1.0, 5)).expect("params");
    let mut top_one = Sampler::new(&params(1.0, 1, 1.0, 6)).expect("params");
    for _ in 0..200 {
        let logits = random_logits(&mut rng, 97);
        let best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).expect("non-empty");
        let expected_logprob = softmax(&logits, 1.0)[best].ln();
        for sampler in [&mut greedy, &mut top_one] {
            let SampledToken { id, logprob } = sampler.sample(&logits).expect("sample");
            assert_eq!(id as usize, best);
            assert!((f64::from(logprob) - expected_logprob).abs() < 1e-5, "{logprob} vs {expected_logprob}");
        }
    }
    let tied = [1.0, 3.0, 3.0, -2.0];
    assert_eq!(greedy.sample(&tied).expect("sample").id, 1, "ties go to the lowest index");
}

#[test]
fn draws_follow_the_tempered_softmax() {
    let logits = [1.5, 0.2, -0.7, 0.9, -2.0, 0.0];
    for (temperature, seed) in [(1.0, 11), (0.5, 12), (2.0, 13)] {
        let mut sampler = Sampler::new(&params(temperature, 0, 1.0, seed)).expect("params");
        let observed = counts(&mut sampler, &logits, 60_000);
        assert_fits(&observed, &softmax(&logits, f64::from(temperature)));
    }
}

#[test]
fn top_k_renormalizes_over_the_k_most_likely() {
    let logits = [0.3, 2.0, -1.0, 1.1, 1.6, -0.2, 0.8];
    let mut sampler = Sampler::new(&params(1.0, 3, 1.0, 21)).expect("params");
    let observed = counts(&mut sampler, &logits, 40_000);
    let kept = [1, 3, 4];
    let full = softmax(&logits, 1.0);
    let mass: f64 = kept.iter().map(|&i| full[i]).sum();
    let expected: Vec<f64> = (0..logits.len()).map(|i| if kept.contains(&i) { full[i] / mass } else { 0.0 }).collect();
    assert_fits(&observed, &expected);
}

#[test]
fn top_p_keeps_the_smallest_nucleus_reaching_the_mass() {
    let probabilities = [0.05, 0.5, 0.15, 0.3];
    let logits: Vec<f32> = probabilities.iter().map(|p: &f64| p.ln() as f32).collect();
    // Ranked: 0.5 (id 1), 0.3 (id 3), 0.15 (id 2), 0.05 (id 0).
    for (top_p, kept) in [(0.4, vec![1]), (0.7, vec![1, 3]), (0.9, vec![1, 3, 2]), (1.0, vec![1, 3, 2, 0])] {
        let mut sampler = Sampler::new(&params(1.0, 0, top_p, 31)).expect("params");
        let observed = counts(&mut sampler, &logits, 30_000);
        let mass: f64 = kept.iter().map(|&i| probabilities[i]).sum();
        let expected: Vec<f64> =
            (0..4).map(|i| if kept.contains(&i) { probabilities[i] / mass } else { 0.0 }).collect();
        if kept.len() == 1 {
            assert_eq!(observed, vec![0, 30_000, 0, 0], "top_p {top_p}");
        } else {
            assert_fits(&observed, &expected);
        }
    }
}

#[test]
fn logprob_is_under_the_untempered_untruncated_distribution() {
    let logits = [2.0, 1.0, 0.5, -1.0, 0.0];
    let full = softmax(&logits, 1.0);
    let mut sampler = Sampler::new(&params(0.3, 2, 0.9, 41)).expect("params");
    for _ in 0..100 {
        let token = sampler.sample(&logits).expect("sample");
        assert!(token.id < 2, "top_k 2 keeps ids 0 and 1");
        assert!((f64::from(token.logprob) - full[token.id as usize].ln()).abs() < 1e-5);
    }
}

#[test]
fn masked_tokens_are_never_drawn() {
    let logits = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
    let mut sampler = Sampler::new(&params(1.0, 0, 1.0, 51)).expect("params");
    let observed = counts(&mut sampler, &logits, 10_000);
    assert_fits(&observed, &[0.0, 0.5, 0.0, 0.5]);
    let token = sampler.sample(&logits).expect("sample");
    assert!((token.logprob - 0.5f32.ln()).abs() < 1e-6);
}

#[test]
fn the_seed_alone_fixes_the_sequence() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let steps: Vec<Vec<f32>> = (0..300).map(|_| random_logits(&mut rng, 50)).collect();
    let run = |seed: u64| {
        let mut sampler = Sampler::new(&params(1.0, 20, 0.95, seed)).expect("params");
        steps.iter().map(|logits| sampler.sample(logits).expect("sample").id).collect::<Vec<u32>>()
    };
    let first = run(7);
    assert_eq!(first, run(7));
    assert_ne!(first, run(8));

    // Interleaving another request's sampling changes nothing for this one.
    let mut mine = Sampler::new(&params(1.0, 20, 0.95, 7)).expect("params");
    let mut other = Sampler::new(&params(0.7, 5, 1.0, 7)).expect("params");
    let interleaved: Vec<u32> = steps
        .iter()
        .map(|logits| {
            other.sample(logits).expect("sample");
            mine.sample(logits).expect("sample").id
        })
        .collect();
    assert_eq!(interleaved, first);
}

#[test]
fn bad_parameters_and_logits_are_errors() {
    for (bad, expected) in [
        (params(-0.1, 20, 1.0, 0), SamplingParamsError::Temperature(-0.1)),
        (params(f32::NAN, 20, 1.0, 0), SamplingParamsError::Temperature(f32::NAN)),
        (params(1.0, 20, 0.0, 0), SamplingParamsError::TopP(0.0)),
        (params(1.0, 20, 1.5, 0), SamplingParamsError::TopP(1.5)),
        (SamplingParams { max_tokens: 0, ..SamplingParams::default() }, SamplingParamsError::MaxTokens),
    ] {
        let err = Sampler::new(&bad).expect_err("invalid");
        assert_eq!(std::mem::discriminant(&err), std::mem::discriminant(&expected), "{err}");
    }
    let mut sampler = Sampler::new(&SamplingParams::default()).expect("params");
    assert_eq!(sampler.sample(&[]), Err(SamplingError::EmptyLogits));
    assert_eq!(sampler.sample(&[f32::NEG_INFINITY; 3]), Err(SamplingError::AllMasked));
    assert!(matches!(sampler.sample(&[0.0, f32::NAN]), Err(SamplingError::BadLogit { index: 1, .. })));
    assert!(matches!(
        sampler.sample(&[f32::INFINITY, 0.0]),
        Err(SamplingError::BadLogit { index: 0, value }) if value == f32::INFINITY
    ));
}

#[test]
fn stop_matcher_truncates_at_the_earliest_stop() {
    let stops: Vec<String> = ["</answer>", "\n\n", "", "STOP"].map(String::from).to_vec();
    let matcher = StopMatcher::new(&stops);
    let text = "The answer is 4.\n\nSTOP</answer>";
    assert_eq!(matcher.find(text), Some(StopMatch { start: 16, stop: 1 }));
    assert_eq!(matcher.truncate(text), Some("The answer is 4."));
    assert_eq!(matcher.truncate("no stop here"), None);
    assert_eq!(matcher.truncate("STOP first"), Some(""));
    assert_eq!(StopMatcher::new(&[]).find(text), None);

    let overlapping = StopMatcher::new(&["abc".to_string(), "b".to_string()]);
    assert_eq!(overlapping.find("xabc"), Some(StopMatch { start: 1, stop: 0 }));
    assert_eq!(overlapping.truncate("xabc"), Some("x"));
}

#[test]
fn incremental_search_agrees_with_a_full_search() {
    let stops: Vec<String> = ["éé", "aéb", "bbbb"].map(String::from).to_vec();
    let matcher = StopMatcher::new(&stops);
    let alphabet = ['a', 'b', 'é', ' '];
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..500 {
        let mut text = String::new();
        let mut incremental = None;
        for _ in 0..20 {
            let searched_up_to = text.len();
            let chunk_len = rng.gen_range(1..4);
            text.extend((0..chunk_len).map(|_| alphabet[rng.gen_range(0..alphabet.len())]));
            incremental = matcher.find_since(&text, searched_up_to);
            if incremental.is_some() {
                break;
            }
        }
        assert_eq!(incremental, matcher.find(&text), "{text:?}");
    }
}
