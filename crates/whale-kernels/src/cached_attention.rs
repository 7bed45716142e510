//! Attention of a decoding step read straight from each sequence's cached keys and values.
//!
//! The sequences of a batched step have caches of different lengths. Attending with matrix
//! products needs them padded into one tensor: a copy of every cached key and value at every
//! step, a mask, and products over the padding (together about a fifth of a 64-sequence decode
//! step of the 5.25M model, measured). Here each (sequence, key-value head) pair reads its own
//! cache where it lies, once the step's chunk has been written into it, and the pairs run on
//! rayon's pool. No gradient: decoding only.

use super::vectorised::{self, dot, exp};
use rayon::prelude::*;

/// Multiply-adds (of scores and of values) below which a call stays on the calling thread:
/// a one-sequence decoding step's few pairs cost less than waking another thread.
const PARALLEL_PRODUCTS: usize = 1 << 17;

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
    let AttentionShape { heads, kv_heads, steps, head_dim, .. } = shape;
    let groups = heads / kv_heads;
    let block = groups * steps * head_dim;
    let mut out = vec![0f32; sequences.len() * heads * steps * head_dim];
    let attend = |(pair, out): (usize, &mut [f32])| {
        let (row, kv_head) = (pair / kv_heads, pair % kv_heads);
        let queries = &queries[pair * block..(pair + 1) * block];
        attend_pair(queries, &sequences[row], kv_head, shape, out);
    };
    let products: usize = sequences.iter().map(|s| s.chunk * (s.past + s.chunk)).sum::<usize>() * heads * head_dim;
    if products < PARALLEL_PRODUCTS {
        out.chunks_mut(block).enumerate().for_each(attend);
    } else {
        out.par_chunks_mut(block).enumerate().for_each(attend);
    }
    out
}

/// The `groups` query heads that share key-value head `kv_head` of one sequence, in AVX2's
/// eight-float registers where the CPU has them ([`vectorised::has_avx2`]).
fn attend_pair(queries: &[f32], sequence: &CachedSequence<'_>, kv_head: usize, shape: AttentionShape, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if vectorised::has_avx2() {
        // SAFETY: the CPU has AVX2, the one feature `attend_pair_avx2` is compiled for.
        return unsafe { attend_pair_avx2(queries, sequence, kv_head, shape, out) };
    }
    attend_pair_with(queries, sequence, kv_head, shape, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_pair_avx2(
    queries: &[f32],
    sequence: &CachedSequence<'_>,
    kv_head: usize,
    shape: AttentionShape,
    out: &mut [f32],
) {
    attend_pair_with(queries, sequence, kv_head, shape, out)
}

#[inline(always)]
fn attend_pair_with(
    queries: &[f32],
    sequence: &CachedSequence<'_>,
    kv_head: usize,
    shape: AttentionShape,
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let start = kv_head * sequence.capacity * d;
    let keys = &sequence.keys[start..start + (sequence.past + sequence.chunk) * d];
    let values = &sequence.values[start..start + (sequence.past + sequence.chunk) * d];
    let mut weights = Vec::with_capacity(sequence.past + sequence.chunk);
    for (index, (query, out)) in queries.chunks_exact(d).zip(out.chunks_exact_mut(d)).enumerate() {
        let step = index % shape.steps;
        if step >= sequence.chunk {
            continue;
        }
        let seen = sequence.past + step + 1;
        weights.clear();
        weights.extend(keys[..seen * d].chunks_exact(d).map(|key| dot(query, key) * shape.scale));
        let max = weights.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0f32;
        for weight in weights.iter_mut() {
            *weight = exp(*weight - max);
            total += *weight;
        }
        let inverse = 1.0 / total;
        for (weight, value) in weights.iter().zip(values.chunks_exact(d)) {
            let weight = weight * inverse;
            out.iter_mut().zip(value).for_each(|(o, v)| *o += weight * v);
        }
    }
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
    fn attention_over_caches_of_different_lengths_matches_a_plain_f64_computation() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let shape = AttentionShape { heads: 4, kv_heads: 2, steps: 3, head_dim: 20, scale: 0.3 };
        // (capacity, past, chunk): a prefill, a decode, a continuation, one at capacity, and one
        // long enough that the pairs run on several threads.
        let layout = [(16, 0, 3), (32, 17, 1), (8, 5, 2), (9, 6, 3), (2048, 2000, 2)];
        let mut random = |count: usize| (0..count).map(|_| rng.gen_range(-2.0..2.0)).collect::<Vec<f32>>();
        let storage: Vec<(Vec<f32>, Vec<f32>)> =
            layout.iter().map(|&(capacity, _, _)| (random(2 * capacity * 20), random(2 * capacity * 20))).collect();
        let queries = random(layout.len() * 4 * 3 * 20);
        let sequences: Vec<CachedSequence<'_>> = storage
            .iter()
            .zip(layout)
            .map(|((keys, values), (capacity, past, chunk))| CachedSequence { keys, values, capacity, past, chunk })
            .collect();
        let ours = cached_attention(&queries, &sequences, shape);
        let expected = reference(&queries, &sequences, shape);
        let worst = ours.iter().zip(&expected).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-5, "largest difference {worst}");
        // Padded queries (past a sequence's chunk) are zeros.
        let padded = &ours[((4 + 1) * 3 + 1) * 20..][..20];
        assert!(padded.iter().all(|&v| v == 0.0));
        assert!(expected.iter().any(|v| v.abs() > 0.5), "the outputs are not trivially small");
        // The AVX2 copy (where the CPU has AVX2) gives the baseline's bits.
        for (row, sequence) in sequences.iter().enumerate() {
            for kv_head in 0..2 {
                let block = &queries[(row * 2 + kv_head) * 2 * 3 * 20..][..2 * 3 * 20];
                let (mut dispatched, mut baseline) = (vec![0f32; block.len()], vec![0f32; block.len()]);
                attend_pair(block, sequence, kv_head, shape, &mut dispatched);
                attend_pair_with(block, sequence, kv_head, shape, &mut baseline);
                assert_eq!(
                    dispatched.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    baseline.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                );
            }
        }
    }
}
