//! Attention of a decoding step read straight from each sequence's cached keys and values.
//!
//! The sequences of a batched step have caches of different lengths. Attending with matrix
//! products needs them padded into one tensor: a copy of every cached key and value at every
//! step, a mask, and products over the padding (together about a fifth of a 64-sequence decode
//! step of the 5.25M model, measured). Here each (sequence, key-value head) pair reads its own
//! cache where it lies, once the step's chunk has been written into it, and the pairs run on
//! rayon's pool (a prefill of one prompt has as few pairs as key-value heads, so its pairs are
//! cut into ranges of queries). No gradient: decoding only.

use super::vectorised::{self, dot, exp};
use rayon::prelude::*;
use std::ops::Range;

/// Multiply-adds (of scores and of values) below which a call stays on the calling thread:
/// a one-sequence decoding step's few pairs cost less than waking another thread.
const PARALLEL_PRODUCTS: usize = 1 << 17;

/// Pieces of work per thread a parallel call aims for at least: a prefill of one sequence has
/// as few (sequence, key-value head) pairs as the model has key-value heads (3 for SmolLM2),
/// which two threads share unevenly, so each pair's queries are then cut into ranges of about
/// equal work ([`query_ranges`]).
const PIECES_PER_THREAD: usize = 4;

/// One sequence's cached keys and values of one layer, `[kv_heads, capacity, head_dim]` each,
/// holding `past + chunk` tokens: the `chunk` tokens this step feeds come last.
pub struct CachedSequence<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub capacity: usize,
    pub past: usize,
    pub chunk: usize,
}

/// Shapes of one call: queries are `[B, heads, steps, head_dim]`, `steps` the longest chunk.
#[derive(Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub steps: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// Causal grouped-query attention of `queries` over `sequences` (row `b` of the queries for
/// sequence `b`): query `t` of a sequence sits at position `past + t` and attends to the keys
/// at positions `0..=past + t`. Returns `[B, heads, steps, head_dim]`; the rows of padded
/// queries (`t >= chunk`) are zeros.
pub fn cached_attention(queries: &[f32], sequences: &[CachedSequence<'_>], shape: AttentionShape) -> Vec<f32> {
    let products: usize =
        sequences.iter().map(|s| s.chunk * (s.past + s.chunk)).sum::<usize>() * shape.heads * shape.head_dim;
    if products < PARALLEL_PRODUCTS {
        return attention_in_pieces(queries, sequences, shape, None);
    }
    let pairs = sequences.len() * shape.kv_heads;
    let pieces = (PIECES_PER_THREAD * rayon::current_num_threads()).div_ceil(pairs.max(1));
    attention_in_pieces(queries, sequences, shape, Some(pieces))
}

/// [`cached_attention`] on this thread (`None`), or on rayon's pool with each pair's queries cut
/// into `Some(pieces)` ranges. Every query's output is computed alone, by the same arithmetic
/// in the same order, so the pieces change no bit (a unit test holds them there).
fn attention_in_pieces(
    queries: &[f32],
    sequences: &[CachedSequence<'_>],
    shape: AttentionShape,
    pieces: Option<usize>,
) -> Vec<f32> {
    let AttentionShape { heads, kv_heads, steps, head_dim, .. } = shape;
    let per_pair = heads / kv_heads * steps;
    let block = per_pair * head_dim;
    let mut out = vec![0f32; sequences.len() * heads * steps * head_dim];
    let attend = |pair: usize, first: usize, out: &mut [f32]| {
        let (row, kv_head) = (pair / kv_heads, pair % kv_heads);
        let queries = &queries[pair * block..(pair + 1) * block];
        attend_pair(queries, &sequences[row], kv_head, shape, first, out);
    };
    let Some(pieces) = pieces else {
        out.chunks_mut(block).enumerate().for_each(|(pair, out)| attend(pair, 0, out));
        return out;
    };
    let mut items = Vec::new();
    let mut rest = out.as_mut_slice();
    for pair in 0..sequences.len() * kv_heads {
        for range in query_ranges(&sequences[pair / kv_heads], per_pair, steps, pieces) {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(range.len() * head_dim);
            items.push((pair, range.start, piece));
            rest = tail;
        }
    }
    items.into_par_iter().for_each(|(pair, first, out)| attend(pair, first, out));
    out
}

/// The queries `0..per_pair` of one pair (`[groups, steps]` in order) cut into about `pieces`
/// contiguous ranges of equal work: query `(g, t)` reads `past + t + 1` keys, or none
/// when `t` is past the sequence's chunk (padding).
fn query_ranges(sequence: &CachedSequence<'_>, per_pair: usize, steps: usize, pieces: usize) -> Vec<Range<usize>> {
    let work = |index: usize| {
        let step = index % steps;
        if step < sequence.chunk {
            sequence.past + step + 1
        } else {
            0
        }
    };
    let total: usize = (0..per_pair).map(work).sum();
    let share = total.div_ceil(pieces.max(1)).max(1);
    let mut ranges = Vec::new();
    let (mut start, mut done) = (0, 0);
    for index in 0..per_pair {
        done += work(index);
        if done >= share * (ranges.len() + 1) && index + 1 < per_pair {
            ranges.push(start..index + 1);
            start = index + 1;
        }
    }
    ranges.push(start..per_pair);
    ranges
}

/// The `groups` query heads that share key-value head `kv_head` of one sequence, in AVX2's
/// eight-float registers where the CPU has them ([`vectorised::has_avx2`]).
/// `out` holds the outputs of the pair's queries from index `first` on.
fn attend_pair(
    queries: &[f32],
    sequence: &CachedSequence<'_>,
    kv_head: usize,
    shape: AttentionShape,
    first: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if vectorised::has_avx2() {
        // SAFETY: the CPU has AVX2, the one feature `attend_pair_avx2` is compiled for.
        return unsafe { attend_pair_avx2(queries, sequence, kv_head, shape, first, out) };
    }
    attend_pair_with::<false>(queries, sequence, kv_head, shape, first, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_pair_avx2(
    queries: &[f32],
    sequence: &CachedSequence<'_>,
    kv_head: usize,
    shape: AttentionShape,
    first: usize,
    out: &mut [f32],
) {
    attend_pair_with::<true>(queries, sequence, kv_head, shape, first, out)
}

/// Plain loops only: an iterator adapter's `fold` (`extend`, `sum`) is a function of its own
/// that the compiler may leave out of line, and then compiled without AVX2 (the scores' dot
/// products once ran in SSE that way). The exponentials are a pass of their own and their
/// total another, in order, so that the first is vectorised and the second adds as before.
#[inline(always)]
fn attend_pair_with<const AVX2: bool>(
    queries: &[f32],
    sequence: &CachedSequence<'_>,
    kv_head: usize,
    shape: AttentionShape,
    first: usize,
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let start = kv_head * sequence.capacity * d;
    let keys = &sequence.keys[start..start + (sequence.past + sequence.chunk) * d];
    let values = &sequence.values[start..start + (sequence.past + sequence.chunk) * d];
    let mut weights = vec![0f32; sequence.past + sequence.chunk];
    let queries = queries[first * d..].chunks_exact(d);
    for (index, (query, out)) in (first..).zip(queries.zip(out.chunks_exact_mut(d))) {
        let step = index % shape.steps;
        if step >= sequence.chunk {
            continue;
        }
        let seen = sequence.past + step + 1;
        let weights = &mut weights[..seen];
        let max = scores_in::<AVX2>(query, keys, shape.scale, weights);
        for weight in weights.iter_mut() {
            *weight = exp(*weight - max);
        }
        let mut total = 0f32;
        for weight in weights.iter() {
            total += weight;
        }
        let inverse = 1.0 / total;
        match d {
            64 => accumulate::<64>(weights, inverse, values, out),
            _ => accumulate_in_place(weights, inverse, values, out),
        }
    }
}

/// [`scores`], eight keys a round in the AVX2 copy for 64-wide heads ([`scores_64_avx2`]).
#[inline(always)]
fn scores_in<const AVX2: bool>(query: &[f32], keys: &[f32], scale: f32, weights: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX2 && query.len() == 64 {
        // SAFETY: AVX2 is true only inside `attend_pair_avx2`, called where the CPU has AVX2.
        return unsafe { scores_64_avx2(query, keys, scale, weights) };
    }
    scores(query, keys, scale, weights)
}

/// `weights[j] = dot(query, key j) * scale` for each key, and the largest of them.
#[inline(always)]
fn scores(query: &[f32], keys: &[f32], scale: f32, weights: &mut [f32]) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for (weight, key) in weights.iter_mut().zip(keys.chunks_exact(query.len())) {
        *weight = dot(query, key) * scale;
        max = max.max(*weight);
    }
    max
}

/// [`scores`] for 64-wide heads, eight keys a round: each key's eight lanes as [`dot`] sums
/// them, then the eight keys' lanes transposed so that one vector addition per lane adds that
/// lane for all eight keys, in `dot`'s order (lane 0 first; its sum never starts from -0, so
/// `dot`'s empty tail adds nothing). The same bits, without a horizontal sum per key.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scores_64_avx2(query: &[f32], keys: &[f32], scale: f32, weights: &mut [f32]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY (every load and store below): each reads or writes eight floats that lie inside
    // the 64-float query or key, or the eight weights of the round, which the slicing checks.
    let query = &query[..64];
    let q: [__m256; 8] = std::array::from_fn(|c| unsafe { _mm256_loadu_ps(query[c * 8..].as_ptr()) });
    let rounds = weights.len() / 8;
    let mut max = f32::NEG_INFINITY;
    for round in 0..rounds {
        let keys = &keys[round * 8 * 64..(round + 1) * 8 * 64];
        let lanes: [__m256; 8] = std::array::from_fn(|k| {
            let key = &keys[k * 64..(k + 1) * 64];
            let mut sum = _mm256_setzero_ps();
            for (c, q) in q.iter().enumerate() {
                let product = _mm256_mul_ps(*q, unsafe { _mm256_loadu_ps(key[c * 8..].as_ptr()) });
                sum = _mm256_add_ps(sum, product);
            }
            sum
        });
        let by_lane = transpose(lanes);
        let mut total = by_lane[0];
        for lane in &by_lane[1..] {
            total = _mm256_add_ps(total, *lane);
        }
        let scaled = _mm256_mul_ps(total, _mm256_set1_ps(scale));
        let out = &mut weights[round * 8..(round + 1) * 8];
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), scaled) };
        for weight in out.iter() {
            max = max.max(*weight);
        }
    }
    let rest = rounds * 8;
    let tail = scores(query, &keys[rest * 64..], scale, &mut weights[rest..]);
    max.max(tail)
}

/// The 8 × 8 transpose: lane `i` of row `j` becomes lane `j` of row `i`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose(rows: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let [r0, r1, r2, r3, r4, r5, r6, r7] = rows;
    let (a0, a1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
    let (a2, a3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
    let (a4, a5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
    let (a6, a7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
    let b0 = _mm256_shuffle_ps::<0x44>(a0, a2);
    let b1 = _mm256_shuffle_ps::<0xEE>(a0, a2);
    let b2 = _mm256_shuffle_ps::<0x44>(a1, a3);
    let b3 = _mm256_shuffle_ps::<0xEE>(a1, a3);
    let b4 = _mm256_shuffle_ps::<0x44>(a4, a6);
    let b5 = _mm256_shuffle_ps::<0xEE>(a4, a6);
    let b6 = _mm256_shuffle_ps::<0x44>(a5, a7);
    let b7 = _mm256_shuffle_ps::<0xEE>(a5, a7);
    [
        _mm256_permute2f128_ps::<0x20>(b0, b4),
        _mm256_permute2f128_ps::<0x20>(b1, b5),
        _mm256_permute2f128_ps::<0x20>(b2, b6),
        _mm256_permute2f128_ps::<0x20>(b3, b7),
        _mm256_permute2f128_ps::<0x31>(b0, b4),
        _mm256_permute2f128_ps::<0x31>(b1, b5),
        _mm256_permute2f128_ps::<0x31>(b2, b6),
        _mm256_permute2f128_ps::<0x31>(b3, b7),
    ]
}

/// `out[i] += weights[j] * inverse * values[j][i]` for each value row `j` in order.
#[inline(always)]
fn accumulate_in_place(weights: &[f32], inverse: f32, values: &[f32], out: &mut [f32]) {
    for (weight, value) in weights.iter().zip(values.chunks_exact(out.len())) {
        let weight = weight * inverse;
        out.iter_mut().zip(value).for_each(|(o, v)| *o += weight * v);
    }
}

/// [`accumulate_in_place`] for rows of `D` floats, in an accumulator that stays in registers:
/// written in place, each row's sums went to memory and came back for the next row.
#[inline(always)]
fn accumulate<const D: usize>(weights: &[f32], inverse: f32, values: &[f32], out: &mut [f32]) {
    let mut sums: [f32; D] = std::array::from_fn(|i| out[i]);
    for (weight, value) in weights.iter().zip(values.chunks_exact(D)) {
        let weight = weight * inverse;
        for (sum, v) in sums.iter_mut().zip(value) {
            *sum += weight * v;
        }
    }
    out.copy_from_slice(&sums);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The same attention in f64, one query at a time, written the plain way.
    fn reference(queries: &[f32], sequences: &[CachedSequence<'_>], shape: AttentionShape) -> Vec<f64> {
        let AttentionShape { heads, kv_heads, steps, head_dim: d, scale } = shape;
        let mut out = vec![0f64; sequences.len() * heads * steps * d];
        for (b, sequence) in sequences.iter().enumerate() {
            for h in 0..heads {
                let kv = h / (heads / kv_heads);
                let row = |values: &[f32], j: usize| values[(kv * sequence.capacity + j) * d..][..d].to_vec();
                for t in 0..sequence.chunk {
                    let q = &queries[((b * heads + h) * steps + t) * d..][..d];
                    let scores: Vec<f64> = (0..=sequence.past + t)
                        .map(|j| {
                            let key = row(sequence.keys, j);
                            q.iter().zip(&key).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for (j, s) in scores.iter().enumerate() {
                        let p = (s - max).exp() / total;
                        for (i, v) in row(sequence.values, j).iter().enumerate() {
                            out[((b * heads + h) * steps + t) * d + i] += p * *v as f64;
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn a_prefill_s_queries_are_cut_into_contiguous_ranges_of_about_equal_work() {
        // One sequence's prefill of 40 tokens into a cache of 64, 3 query heads a key-value head,
        // queries padded to 48 steps.
        let (keys, values) = (vec![0f32; 64 * 4], vec![0f32; 64 * 4]);
        let sequence = CachedSequence { keys: &keys, values: &values, capacity: 64, past: 0, chunk: 40 };
        let work =
            |range: &Range<usize>| range.clone().map(|i| if i % 48 < 40 { i % 48 + 1 } else { 0 }).sum::<usize>();
        for pieces in [1, 2, 3, 8] {
            let ranges = query_ranges(&sequence, 3 * 48, 48, pieces);
            assert_eq!(ranges.first().map(|r| r.start), Some(0));
            assert_eq!(ranges.last().map(|r| r.end), Some(3 * 48));
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start), "{ranges:?}");
            assert!(ranges.iter().all(|r| !r.is_empty()), "{ranges:?}");
            let busy: Vec<usize> = ranges.iter().map(work).filter(|&w| w > 0).collect();
            assert_eq!(busy.len(), pieces, "{pieces} pieces: {ranges:?}");
            let share = (3 * 820usize).div_ceil(pieces);
            assert!(busy.iter().all(|&w| w < share + 40), "{pieces} pieces of {share}: {busy:?}");
        }
    }

    /// SmolLM2's 64-wide heads sum in registers: the same additions in the same order.
    #[test]
    fn sums_held_in_registers_give_the_bits_of_sums_written_in_place() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for rows in [1, 2, 9, 300] {
            let weights: Vec<f32> = (0..rows).map(|_| rng.gen_range(0.0..1.0)).collect();
            let values: Vec<f32> = (0..rows * 64).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let start: Vec<f32> = (0..64).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let (mut held, mut in_place) = (start.clone(), start);
            accumulate::<64>(&weights, 0.37, &values, &mut held);
            accumulate_in_place(&weights, 0.37, &values, &mut in_place);
            assert_eq!(
                held.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                in_place.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn attention_over_caches_of_different_lengths_matches_a_plain_f64_computation() {
        // SmolLM2's 64-wide heads take their own accumulation path.
        for d in [20, 64] {
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            let shape = AttentionShape { heads: 4, kv_heads: 2, steps: 3, head_dim: d, scale: 0.3 };
            // (capacity, past, chunk): a prefill, a decode, a continuation, one at capacity, and one
            // long enough that the pairs run on several threads.
            let layout = [(16, 0, 3), (32, 17, 1), (8, 5, 2), (9, 6, 3), (2048, 2000, 2)];
            let mut random = |count: usize| (0..count).map(|_| rng.gen_range(-2.0..2.0)).collect::<Vec<f32>>();
            let storage: Vec<(Vec<f32>, Vec<f32>)> =
                layout.iter().map(|&(capacity, _, _)| (random(2 * capacity * d), random(2 * capacity * d))).collect();
            let queries = random(layout.len() * 4 * 3 * d);
            let sequences: Vec<CachedSequence<'_>> = storage
                .iter()
                .zip(layout)
                .map(|((keys, values), (capacity, past, chunk))| CachedSequence { keys, values, capacity, past, chunk })
                .collect();
            let ours = cached_attention(&queries, &sequences, shape);
            let expected = reference(&queries, &sequences, shape);
            let worst = ours.iter().zip(&expected).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-5, "{d}-wide heads: largest difference {worst}");
            // Padded queries (past a sequence's chunk) are zeros.
            let padded = &ours[((4 + 1) * 3 + 1) * d..][..d];
            assert!(padded.iter().all(|&v| v == 0.0));
            assert!(expected.iter().any(|v| v.abs() > 0.5), "the outputs are not trivially small");
            let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for pieces in [None, Some(1), Some(2), Some(5)] {
                let cut = attention_in_pieces(&queries, &sequences, shape, pieces);
                assert_eq!(bits(&cut), bits(&ours), "{pieces:?} pieces a pair");
            }
            // The AVX2 copy (where the CPU has AVX2) gives the baseline's bits.
            for (row, sequence) in sequences.iter().enumerate() {
                for kv_head in 0..2 {
                    let block = &queries[(row * 2 + kv_head) * 2 * 3 * d..][..2 * 3 * d];
                    let (mut dispatched, mut baseline) = (vec![0f32; block.len()], vec![0f32; block.len()]);
                    attend_pair(block, sequence, kv_head, shape, 0, &mut dispatched);
                    attend_pair_with::<false>(block, sequence, kv_head, shape, 0, &mut baseline);
                    assert_eq!(
                        dispatched.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        baseline.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}
