//! `exp`, sums and dot products the compiler turns into vector instructions.
//!
//! The kernels' row loops (softmax, cross-entropy, SwiGLU) spend most of their time in `exp`
//! and in sums. libm's `expf` is a call per element, and a float sum written as one running
//! total is a chain the compiler may not reorder; both keep a loop scalar. Here `exp` is
//! inline arithmetic and sums run over eight independent lanes. The sampler uses them too
//! (whale-engine's `sampling.rs`): its scans over every logit of every row were most of a batched
//! decoding step's sampling.

/// Lanes of the sums: eight f32 fill one AVX register (two SSE registers).
const LANES: usize = 8;

/// Whether the CPU has AVX2. The build targets baseline x86-64, whose vectors are SSE's four
/// floats; a hot loop that is `#[inline(always)]` (with these functions) is compiled a second
/// time inside a `#[target_feature(enable = "avx2")]` function and called through this check.
/// Both copies do the same arithmetic lane for lane (no fused multiply-add: that feature is not
/// enabled), so they give the same bits; the second does it eight floats at a time.
#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// `e^x` to within 2e-7 relative error (libm's `expf` is within 1 ulp, 6e-8); 0 below
/// -87.33 (where `e^x` leaves the normal range) and for `-inf`, `e^88.37` above 88.37 (the
/// largest power of two it forms is 2^127), NaN for NaN.
///
/// `x = n ln 2 + r` with `|r| ≤ ln 2 / 2`; `e^r` by its Taylor polynomial to degree 7 (the
/// remainder is below `0.35^8 / 8!`); `2^n` written into the exponent bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOWEST: f32 = -87.33;
    const HIGHEST: f32 = 88.37;
    // ln 2 split in two so that `n · LN2_HIGH` is exact for the n that occur.
    const LN2_HIGH: f32 = 0.693_145_75;
    const LN2_LOW: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 · 2^23 rounds a float below 2^22 to the nearest integer.
    const ROUNDER: f32 = 12_582_912.0;
    // `rounded`'s low mantissa bits hold n itself, offset by ROUNDER's bits.
    const ROUNDER_BITS: u32 = 0x4B40_0000;
    let clamped = x.clamp(LOWEST, HIGHEST);
    let rounded = clamped * std::f32::consts::LOG2_E + ROUNDER;
    let n = rounded - ROUNDER;
    let r = (clamped - n * LN2_HIGH) - n * LN2_LOW;
    let polynomial = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^n from the bits of `rounded`: integer arithmetic the compiler keeps in vector lanes,
    // where `n as i32` (a saturating cast) is a scalar conversion per element.
    let scale = f32::from_bits(rounded.to_bits().wrapping_sub(ROUNDER_BITS).wrapping_add(127) << 23);
    let value = polynomial * scale;
    if x < LOWEST {
        0.0
    } else {
        value
    }
}

/// The sum of `values`, over eight lanes.
#[inline(always)]
pub(super) fn sum(values: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        lanes.iter_mut().zip(chunk).for_each(|(lane, v)| *lane += v);
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Σ e^(v_i − shift)`, over eight lanes.
#[inline(always)]
pub(super) fn sum_exp(values: &[f32], shift: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&v| exp(v - shift)).sum();
    for chunk in chunks {
        lanes.iter_mut().zip(chunk).for_each(|(lane, &v)| *lane += exp(v - shift));
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Σ e^(v_i − shift)` accumulated in f64, over eight lanes: a sum of thousands of terms
/// within `exp`'s own relative error.
#[inline(always)]
fn sum_exp_f64(values: &[f32], shift: f32) -> f64 {
    let mut lanes = [0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(exp(v - shift))).sum();
    for chunk in chunks {
        lanes.iter_mut().zip(chunk).for_each(|(lane, &v)| *lane += f64::from(exp(v - shift)));
    }
    lanes.iter().sum::<f64>() + tail
}

/// The largest of `values`, NaN passed over; `-inf` for none.
#[inline(always)]
pub fn max(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |best, &v| if v > best { v } else { best });
    for chunk in chunks {
        lanes.iter_mut().zip(chunk).for_each(|(lane, &v)| *lane = if v > *lane { v } else { *lane });
    }
    lanes.iter().fold(tail, |best, &v| if v > best { v } else { best })
}

/// The largest of `values` (NaN passed over, `-inf` for none) and, when it is finite,
/// `Σ e^(v_i − max)` in f64 (NaN if a value is NaN), in AVX2's registers where the CPU has
/// them ([`has_avx2`]): a sampler's normaliser.
pub fn max_and_sum_exp(values: &[f32]) -> (f32, f64) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2, the one feature `max_and_sum_exp_avx2` is compiled for.
        return unsafe { max_and_sum_exp_avx2(values) };
    }
    max_and_sum_exp_with(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn max_and_sum_exp_avx2(values: &[f32]) -> (f32, f64) {
    max_and_sum_exp_with(values)
}

#[inline(always)]
fn max_and_sum_exp_with(values: &[f32]) -> (f32, f64) {
    let max = max(values);
    let sum = if max.is_finite() { sum_exp_f64(values, max) } else { f64::NAN };
    (max, sum)
}

/// `Σ a_i b_i`, over eight lanes.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks.remainder().iter().zip(b_chunks.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for i in 0..LANES {
            lanes[i] += a[i] * b[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_parts_in_ten_million_of_libm_over_the_normal_range() {
        let mut worst = 0f64;
        for i in 0..=2_000_000 {
            let x = -87.0 + 175.3 * i as f32 / 2_000_000.0;
            let exact = f64::from(x).exp();
            worst = worst.max(((f64::from(exp(x)) - exact) / exact).abs());
        }
        assert!(worst < 2e-7, "{worst}");
    }

    /// `exp` as written before its `2^n` came from bits, with a saturating cast.
    fn exp_with_cast(x: f32) -> f32 {
        let clamped = x.clamp(-87.33, 88.37);
        let n = (clamped * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
        let r = (clamped - n * 0.693_145_75) - n * 1.428_606_8e-6;
        let polynomial = 1.0
            + r * (1.0
                + r * (1.0 / 2.0
                    + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
        let value = polynomial * f32::from_bits(((n as i32 + 127) as u32) << 23);
        if x < -87.33 {
            0.0
        } else {
            value
        }
    }

    /// Taking `2^n` from the bits changed no result of the kernels that use `exp`.
    #[test]
    fn exp_is_bit_for_bit_what_the_cast_gave() {
        for i in 0..=4_000_000 {
            let x = -100.0 + 200.0 * i as f32 / 4_000_000.0;
            assert_eq!(exp(x).to_bits(), exp_with_cast(x).to_bits(), "{x}");
        }
        for x in [f32::MIN, f32::MAX, f32::NEG_INFINITY, f32::INFINITY, -87.33, 88.37, 0.0, -0.0] {
            assert_eq!(exp(x).to_bits(), exp_with_cast(x).to_bits(), "{x}");
        }
    }

    /// The AVX2 copy gives the baseline's bits (where the CPU has AVX2; elsewhere both calls
    /// run the baseline).
    #[test]
    fn the_avx2_normaliser_gives_the_baselines_bits() {
        for len in [1, 7, 8, 9, 100, 8192, 151_937] {
            let values: Vec<f32> = (0..len).map(|i| ((i * 7919 % 2003) as f32 - 1000.0) / 37.0).collect();
            let (max, sum) = max_and_sum_exp(&values);
            let (base_max, base_sum) = max_and_sum_exp_with(&values);
            assert_eq!((max.to_bits(), sum.to_bits()), (base_max.to_bits(), base_sum.to_bits()), "{len}");
        }
    }

    #[test]
    fn max_passes_over_nan_and_keeps_the_infinities() {
        let mut values: Vec<f32> = (0..37).map(|i| i as f32 / 10.0).collect();
        values[20] = f32::NAN;
        assert_eq!(max(&values), 3.6);
        values[3] = f32::INFINITY;
        assert_eq!(max(&values), f32::INFINITY);
        assert_eq!(max(&[f32::NEG_INFINITY; 11]), f32::NEG_INFINITY);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn exp_keeps_the_edge_cases() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(f32::INFINITY).is_finite() && exp(f32::INFINITY) > 1e38);
    }

    #[test]
    fn sums_match_a_running_total_in_f64() {
        for len in [0, 1, 7, 8, 9, 100, 1001] {
            let a: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let b: Vec<f32> = (0..len).map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0).collect();
            let exact_sum: f64 = a.iter().map(|&v| f64::from(v)).sum();
            let exact_dot: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
            assert!((f64::from(sum(&a)) - exact_sum).abs() < 1e-3, "{len}");
            assert!((f64::from(dot(&a, &b)) - exact_dot).abs() < 1e-2, "{len}");
            let exact_sum_exp: f64 = a.iter().map(|&v| (f64::from(v) - 3.0).exp()).sum();
            assert!((f64::from(sum_exp(&a, 3.0)) - exact_sum_exp).abs() <= 1e-6 * exact_sum_exp.max(1.0), "{len}");
            assert!((sum_exp_f64(&a, 3.0) - exact_sum_exp).abs() <= 3e-7 * exact_sum_exp.max(1.0), "{len}");
            let exact_max = a.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&a), exact_max, "{len}");
        }
    }
}
