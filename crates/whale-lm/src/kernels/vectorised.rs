//! `exp`, sums and dot products the compiler turns into vector instructions.
//!
//! The kernels' row loops (softmax, cross-entropy, SwiGLU) spend most of their time in `exp`
//! and in sums. libm's `expf` is a call per element, and a float sum written as one running
//! total is a chain the compiler may not reorder; both keep a loop scalar. Here `exp` is
//! inline arithmetic and sums run over eight independent lanes.

/// Lanes of the sums: eight f32 fill one AVX register (two SSE registers).
const LANES: usize = 8;

/// `e^x` to within 2e-7 relative error (libm's `expf` is within 1 ulp, 6e-8); 0 below
/// -87.33 (where `e^x` leaves the normal range) and for `-inf`, `e^88.37` above 88.37 (the
/// largest power of two it forms is 2^127), NaN for NaN.
///
/// `x = n ln 2 + r` with `|r| ≤ ln 2 / 2`; `e^r` by its Taylor polynomial to degree 7 (the
/// remainder is below `0.35^8 / 8!`); `2^n` written into the exponent bits.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LOWEST: f32 = -87.33;
    const HIGHEST: f32 = 88.37;
    // ln 2 split in two so that `n · LN2_HIGH` is exact for the n that occur.
    const LN2_HIGH: f32 = 0.693_145_75;
    const LN2_LOW: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 · 2^23 rounds a float below 2^22 to the nearest integer.
    const ROUNDER: f32 = 12_582_912.0;
    let clamped = x.clamp(LOWEST, HIGHEST);
    let n = (clamped * std::f32::consts::LOG2_E + ROUNDER) - ROUNDER;
    let r = (clamped - n * LN2_HIGH) - n * LN2_LOW;
    let polynomial = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    let value = polynomial * scale;
    if x < LOWEST {
        0.0
    } else {
        value
    }
}

/// The sum of `values`, over eight lanes.
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
pub(super) fn sum_exp(values: &[f32], shift: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&v| exp(v - shift)).sum();
    for chunk in chunks {
        lanes.iter_mut().zip(chunk).for_each(|(lane, &v)| *lane += exp(v - shift));
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Σ a_i b_i`, over eight lanes.
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
        }
    }
}
