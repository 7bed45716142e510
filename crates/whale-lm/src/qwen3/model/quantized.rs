//! 8-bit copies of the weights for decoding (`[model] quantized`): the products of the engine's
//! prefill and decoding steps read Q8_0 blocks (a byte a weight and a scale per 32) through
//! candle's quantized kernels instead of f32. At Qwen2.5-Coder-1.5B's widths a decoding step's
//! products at 64 rows took a third of the f32 time on an AVX-512 Xeon (`quantized_products`,
//! docs/benchmarks.md). candle's fast x86 kernels need VNNI and inputs that are a multiple of
//! 256; elsewhere its Q8_0 products ran 2-4x slower than f32 at 64 rows. So a weight whose inputs
//! are not such a multiple is copied with zero columns up to the next one, where that adds at
//! most a quarter to its work (the 0.5B's 896 inputs become 1,024), and its inputs get as many
//! zeros before each product; the zero blocks add nothing to any dot product. Weights that would
//! need more padding (SmolLM2's 576 inputs) keep f32, and a CPU without VNNI is refused.
//!
//! Only sampling reads the copies: training passes, scoring and the trainer's log-probabilities
//! keep the f32 weights, so a quantized run samples from a slightly different policy than the
//! one it trains (a policy-gradient step reports the gap as its sampler deviation). The copies
//! are made from the weights of now, and remade after every update with the engine's decoding
//! model. candle runs its quantized kernels on its element-wise pool, which whale keeps at one
//! thread (`whale_kernels::runtime`), so each copy is cut into parts of its outputs, one per
//! rayon thread, each multiplied on its own thread (two parts go to the one-row products' helper
//! thread instead, [`super::helper_thread`], which wakes faster). Every output is the same dot
//! product whichever part holds it, so a row's result does not depend on the rows beside it.

use super::helper_thread;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};
use rayon::prelude::*;

/// The block type of the copies: of candle's types the most exact, and batch-invariant (a
/// sequence's logits do not depend on which others share its step; a test holds that).
const BLOCK_TYPE: GgmlDType = GgmlDType::Q8_0;

/// Inputs of the copies are a multiple of this: those candle's fast x86 kernels (repacked,
/// VNNI) take.
const FAST_INPUT_MULTIPLE: usize = 256;

/// A weight gets a copy only where the zero columns that pad its inputs to
/// [`FAST_INPUT_MULTIPLE`] add at most this share of its work.
const MAX_PADDING: f64 = 0.25;

/// Outputs of each part are a multiple of this (the fast kernels take outputs in tiles of 16),
/// but for the last part's.
const PART_ALIGN: usize = 64;

/// Whether this CPU has the VNNI instructions candle's fast Q8_0 kernels need.
pub(crate) fn fast_kernels() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni"))
            || is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A weight `[out, in]` as Q8_0 blocks, in parts of its outputs, its inputs padded with zero
/// columns to `padded_inputs`.
#[derive(Clone)]
pub(crate) struct QuantizedWeight {
    pub(super) parts: Vec<QMatMul>,
    inputs: usize,
    padded_inputs: usize,
}

impl QuantizedWeight {
    /// The copy of `weight` in up to `parts` parts, or `None` where it would not pay or cannot
    /// be made: a weight that is not f32 on the CPU, whose inputs need more than
    /// [`MAX_PADDING`] to reach a multiple of [`FAST_INPUT_MULTIPLE`] or whose outputs are not a
    /// multiple of 16, or a candle told to dequantize its quantized tensors
    /// (`CANDLE_DEQUANTIZE_ALL`).
    pub(crate) fn of(weight: &Tensor, parts: usize) -> candle_core::Result<Option<Self>> {
        let (out_dim, in_dim) = weight.dims2()?;
        let padded_inputs = in_dim.next_multiple_of(FAST_INPUT_MULTIPLE);
        let pays = in_dim > 0 && (padded_inputs - in_dim) as f64 <= MAX_PADDING * in_dim as f64;
        if !weight.device().is_cpu() || weight.dtype() != DType::F32 || !pays || !out_dim.is_multiple_of(16) {
            return Ok(None);
        }
        let step = (out_dim / parts.max(1)).div_ceil(PART_ALIGN).max(1) * PART_ALIGN;
        let mut copies = Vec::new();
        for start in (0..out_dim).step_by(step) {
            let rows = weight.narrow(0, start, step.min(out_dim - start))?;
            let copy = quantized(&rows.pad_with_zeros(1, 0, padded_inputs - in_dim)?)?;
            if !matches!(copy, QMatMul::QTensor(_)) {
                return Ok(None);
            }
            copies.push(copy);
        }
        Ok(Some(Self { parts: copies, inputs: in_dim, padded_inputs }))
    }

    /// `x @ w^T` of a matrix `x` `[rows, in]`, from the copy.
    pub(crate) fn product(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = match self.padded_inputs - self.inputs {
            0 => x.contiguous()?,
            zeros => x.pad_with_zeros(1, 0, zeros)?,
        };
        let products = match self.parts.as_slice() {
            [one] => return one.forward(&x),
            [first, second] => {
                let (row, second) = (x.clone(), second.clone());
                let (first, second) = helper_thread::join(|| first.forward(&x), Box::new(move || second.forward(&row)));
                vec![first?, second?]
            }
            parts => parts.par_iter().map(|part| part.forward(&x)).collect::<candle_core::Result<Vec<_>>>()?,
        };
        Tensor::cat(&products, 1)
    }
}

/// `rows` as a Q8_0 product. `QTensor::quantize` reads its input's storage from the start,
/// whatever the view's offset, so the rows are copied into a storage of their own first.
fn quantized(rows: &Tensor) -> candle_core::Result<QMatMul> {
    let own = Tensor::from_vec(rows.flatten_all()?.to_vec1::<f32>()?, rows.shape(), rows.device())?;
    QMatMul::from_qtensor(QTensor::quantize(&own, BLOCK_TYPE)?)
}
