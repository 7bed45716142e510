//! Choosing the next token from logits, and cutting generated text at stop strings.
//!
//! Every rollout must be reproducible from its seed alone, whatever else runs in the same batch:
//! each request owns a ChaCha8 stream seeded from its `seed` and consumes exactly one uniform
//! draw per generated token, greedy or not, so the draw for token i never depends on other
//! requests, on earlier settings or on the vocabulary size. The parameters themselves are the
//! policy vocabulary's [`SamplingParams`].

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use whale_kernels::vectorised;
use whale_policy::{PolicyError, SamplingParams, SamplingParamsError};

/// Why a row of logits could not be sampled from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("no logits to sample from")]
    EmptyLogits,
    #[error("logit {index} is {value} (only finite values and -inf are allowed)")]
    BadLogit { index: usize, value: f32 },
    #[error("every logit is -inf")]
    AllMasked,
}

/// A sampling failure as the policy vocabulary's kind of failure, with its message.
impl From<SamplingError> for PolicyError {
    fn from(error: SamplingError) -> Self {
        PolicyError::Sampling(error.to_string())
    }
}

/// One sampled token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    /// Natural log of the token's probability under the model's full distribution: softmax of
    /// the raw logits at temperature 1 over the whole vocabulary, before temperature, top-k and
    /// top-p. This is the policy's own probability, the one training and importance ratios need.
    pub logprob: f32,
}

/// Samples tokens for one request: temperature, then top-k, then top-p, then a draw.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Result<Self, SamplingParamsError> {
        params.validate()?;
        Ok(Self {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
        })
    }

    /// Picks the next token from `logits` (one per vocabulary entry; -inf masks an entry).
    pub fn sample(&mut self, logits: &[f32]) -> Result<SampledToken, SamplingError> {
        let uniform: f64 = self.rng.gen();
        let log_normalizer = log_sum_exp(logits)?;
        let id = if self.temperature == 0.0 || self.top_k == 1 { argmax(logits) } else { self.draw(logits, uniform) };
        let logprob = (f64::from(logits[id]) - log_normalizer) as f32;
        Ok(SampledToken { id: id as u32, logprob })
    }

    fn draw(&self, logits: &[f32], uniform: f64) -> usize {
        let candidates = self.candidates(logits);
        // The largest logit, not the first: unranked candidates (no top-k, no top-p) would
        // otherwise overflow `exp` at a low temperature and always draw the first overflowing one.
        let best = f64::from(candidates.iter().map(|&(_, logit)| logit).fold(f32::NEG_INFINITY, f32::max));
        let temperature = f64::from(self.temperature);
        let weights: Vec<f64> =
            candidates.iter().map(|&(_, logit)| ((f64::from(logit) - best) / temperature).exp()).collect();
        let kept = nucleus_len(&weights, f64::from(self.top_p));
        let kept_mass: f64 = weights[..kept].iter().sum();
        let target = uniform * kept_mass;
        let mut cumulative = 0.0;
        for (&(index, _), weight) in candidates[..kept].iter().zip(&weights) {
            cumulative += weight;
            if target < cumulative {
                return index;
            }
        }
        candidates[kept - 1].0
    }

    /// Unmasked (index, logit) pairs after top-k, most likely first (ties: lower index first)
    /// whenever top-k or top-p needs a ranking.
    fn candidates(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let mut candidates = if self.top_k > 0 {
            best(logits, self.top_k)
        } else {
            logits.iter().copied().enumerate().filter(|&(_, logit)| logit > f32::NEG_INFINITY).collect()
        };
        if self.top_k > 0 || self.top_p < 1.0 {
            candidates.sort_unstable_by(by_rank);
        }
        candidates
    }
}

/// The ranking of (index, logit) pairs: higher logits first, then lower indices. A total order,
/// so the best `k` and their order are the same however they are found.
fn by_rank(a: &(usize, f32), b: &(usize, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Logits [`best`] passes over at once when none beats the worst kept.
const BEST_BLOCK: usize = 32;

/// The `k` best unmasked (index, logit) pairs by [`by_rank`] (all of them when there are
/// fewer), in no particular order, from logits that are not NaN (the sampler refuses those
/// first). One pass that keeps the best so far: after the first few hundred logits a new one
/// rarely beats the worst kept, so a block of logits whose largest does not beat it is passed
/// over after a vectorised max, and the pass costs little more than reading the logits
/// (collecting every pair and selecting among them cost most of a 64-sequence step's
/// sampling). The pairs are read in index order, so a logit beats the worst kept only when it
/// is strictly larger: an equal one has the higher index. A `k` past the vocabulary keeps every
/// pair; the room reserved is bounded by the logits, since a client may send any `k`.
fn best(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut kept: Vec<(usize, f32)> = Vec::with_capacity(k.min(logits.len()));
    let mut worst = 0;
    let worst_of = |kept: &[(usize, f32)]| (0..kept.len()).max_by(|&a, &b| by_rank(&kept[a], &kept[b])).unwrap_or(0);
    for (block_index, block) in logits.chunks(BEST_BLOCK).enumerate() {
        if kept.len() == k && vectorised::max(block) <= kept[worst].1 {
            continue;
        }
        for (offset, &logit) in block.iter().enumerate() {
            if logit == f32::NEG_INFINITY {
                continue;
            }
            let pair = (block_index * BEST_BLOCK + offset, logit);
            if kept.len() < k {
                kept.push(pair);
                if kept.len() == k {
                    worst = worst_of(&kept);
                }
            } else if logit > kept[worst].1 {
                kept[worst] = pair;
                worst = worst_of(&kept);
            }
        }
    }
    kept
}

/// How many of the ranked `weights` form the smallest prefix holding at least `top_p` of the mass.
fn nucleus_len(weights: &[f64], top_p: f64) -> usize {
    let threshold = top_p * weights.iter().sum::<f64>();
    let mut cumulative = 0.0;
    for (i, weight) in weights.iter().enumerate() {
        cumulative += weight;
        if cumulative >= threshold {
            return i + 1;
        }
    }
    weights.len()
}

/// log(sum(exp(logits))), rejecting NaN, +inf and all-masked logits. Two vectorised passes
/// (the max, then the sum of `exp` in f64; within 2e-7 of libm's, [`vectorised::exp`]): a NaN
/// shows in the sum and a +inf in the max, and only then is the offending logit looked for.
fn log_sum_exp(logits: &[f32]) -> Result<f64, SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    let (max, sum) = vectorised::max_and_sum_exp(logits);
    if max.is_finite() && !sum.is_nan() {
        return Ok(f64::from(max) + sum.ln());
    }
    match logits.iter().enumerate().find(|(_, l)| l.is_nan() || **l == f32::INFINITY) {
        Some((index, &value)) => Err(SamplingError::BadLogit { index, value }),
        None => Err(SamplingError::AllMasked),
    }
}

/// Index of the largest logit, the lowest index among equals.
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &logit) in logits.iter().enumerate() {
        if logit > logits[best] {
            best = i;
        }
    }
    best
}

/// Where a stop string first occurs in a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMatch {
    /// Byte offset of the match; the completion is the text before it.
    pub start: usize,
    /// Which stop string matched (its position in the list given to [`StopMatcher::new`]).
    pub stop: usize,
}

/// Finds the earliest occurrence of any stop string in decoded text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMatcher {
    stops: Vec<String>,
    longest: usize,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        Self { stops, longest }
    }

    /// The earliest match in `text` (among stops matching at the same place, the first listed).
    pub fn find(&self, text: &str) -> Option<StopMatch> {
        self.find_from(text, 0)
    }

    /// Like [`find`](Self::find) for text that grew since an earlier search found nothing: only
    /// matches that end after byte `new_from` (where the new text starts) are looked for.
    pub fn find_since(&self, text: &str, new_from: usize) -> Option<StopMatch> {
        let mut window = new_from.saturating_sub(self.longest.saturating_sub(1)).min(text.len());
        while !text.is_char_boundary(window) {
            window -= 1;
        }
        self.find_from(text, window)
    }

    /// `text` cut before its earliest stop string, or `None` when no stop string occurs.
    pub fn truncate<'a>(&self, text: &'a str) -> Option<&'a str> {
        self.find(text).map(|found| &text[..found.start])
    }

    fn find_from(&self, text: &str, from: usize) -> Option<StopMatch> {
        let haystack = text.get(from..)?;
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(stop, pattern)| {
                haystack.find(pattern.as_str()).map(|at| StopMatch { start: from + at, stop })
            })
            .min_by_key(|found| (found.start, found.stop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass selection keeps exactly what sorting every unmasked pair and cutting at `k`
    /// keeps: ties (equal logits, kept by lower index), masked logits, fewer pairs than `k`, and
    /// the best ones late in the vocabulary (where whole blocks are passed over before them).
    #[test]
    fn the_best_k_are_those_a_full_sort_ranks_first() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for (vocab, k) in [(8192, 20), (8192, 64), (50, 20), (20, 20), (7, 20), (1000, 1), (300, 299), (70, 5)] {
            // Few distinct values, so many ties; some masked; rising, so late blocks hold the best.
            let logits: Vec<f32> = (0..vocab)
                .map(|i| match rng.gen_range(0u8..50) {
                    0..=4 => f32::NEG_INFINITY,
                    value => f32::from(value) / 4.0 + (i / 1000) as f32,
                })
                .collect();
            let mut ours = best(&logits, k);
            ours.sort_unstable_by(by_rank);
            let mut sorted: Vec<(usize, f32)> =
                logits.iter().copied().enumerate().filter(|&(_, logit)| logit > f32::NEG_INFINITY).collect();
            sorted.sort_unstable_by(by_rank);
            sorted.truncate(k);
            assert_eq!(ours, sorted, "vocab {vocab}, k {k}");
        }
    }

    /// A `top_k` past the vocabulary, up to `usize::MAX`, truncates nothing: it samples as
    /// `top_k` = the vocabulary does, rather than reserving room for `k` pairs.
    #[test]
    fn a_top_k_past_the_vocabulary_is_the_vocabulary() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let logits: Vec<f32> = (0..1000).map(|_| rng.gen_range(-5.0f32..5.0)).collect();
        let draws = |top_k: usize| {
            let params = SamplingParams { top_k, seed: 7, ..SamplingParams::default() };
            let mut sampler = Sampler::new(&params).expect("valid parameters");
            (0..50).map(|_| sampler.sample(&logits).expect("a token")).collect::<Vec<_>>()
        };
        let whole = draws(logits.len());
        assert_eq!(draws(usize::MAX), whole);
        assert_eq!(draws(1 << 40), whole);
    }

    /// Without top-k or top-p the candidates are unranked; at a low temperature the draw must
    /// still weigh them from the largest logit (token 2 holds e^1 times token 1's mass).
    #[test]
    fn a_low_temperature_without_top_k_draws_in_proportion() {
        let logits = [0.0f32, 9.99, 10.0];
        let params = SamplingParams { top_k: 0, temperature: 0.01, seed: 3, ..SamplingParams::default() };
        let mut sampler = Sampler::new(&params).expect("valid parameters");
        let draws: Vec<u32> = (0..1000).map(|_| sampler.sample(&logits).expect("a token").id).collect();
        let twos = draws.iter().filter(|&&token| token == 2).count();
        assert!(draws.iter().all(|&token| token != 0), "token 0 is e^-999 times as likely");
        assert!((650..850).contains(&twos), "token 2 drawn {twos} of 1000 times, expected about 731");
    }

    /// The vectorised normaliser agrees with the f64 running sum of libm's `exp` it replaced,
    /// and still names the first bad logit.
    #[test]
    fn the_normaliser_agrees_with_libm_and_refuses_bad_logits() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for vocab in [1, 3, 8, 9, 8192, 151_936] {
            let mut logits: Vec<f32> = (0..vocab).map(|_| rng.gen_range(-30.0f32..30.0)).collect();
            if vocab > 3 {
                logits[2] = f32::NEG_INFINITY;
            }
            let max = f64::from(logits.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            let exact = max + logits.iter().map(|&l| (f64::from(l) - max).exp()).sum::<f64>().ln();
            let ours = log_sum_exp(&logits).unwrap();
            assert!((ours - exact).abs() < 3e-7, "vocab {vocab}: {ours} against {exact}");
        }
        let mut logits = vec![0.5f32; 100];
        logits[70] = f32::INFINITY;
        assert_eq!(log_sum_exp(&logits), Err(SamplingError::BadLogit { index: 70, value: f32::INFINITY }));
        logits[40] = f32::NAN;
        assert!(matches!(log_sum_exp(&logits), Err(SamplingError::BadLogit { index: 40, value }) if value.is_nan()));
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY; 9]), Err(SamplingError::AllMasked));
        assert!(matches!(log_sum_exp(&[f32::NEG_INFINITY, f32::NAN]), Err(SamplingError::BadLogit { index: 1, .. })));
        assert_eq!(log_sum_exp(&[]), Err(SamplingError::EmptyLogits));
    }
}
