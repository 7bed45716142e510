//! 8-bit copies of the weights for decoding (`[model] quantized`): the products of a batched
//! decoding step read Q8_0 blocks (a byte a weight and a scale per 32) through candle's
//! quantized kernels instead of f32. At Qwen2.5-Coder-1.5B's widths a decoding step's products
//! at 64 rows took a third of the f32 time on an AVX-512 Xeon (`quantized_products`,
//! docs/benchmarks.md). candle's fast x86 kernels take only inputs that are a multiple of 256;
//! elsewhere its Q8_0 products ran 2-4x slower than f32 at 64 rows, so only such weights get a
//! copy (all of the 1.5B's; of SmolLM2's and the 0.5B's, the down projections).
//!
//! Only sampling reads the copies: training passes, scoring and the trainer's log-probabilities
//! keep the f32 weights, so a quantized run samples from a slightly different policy than the
//! one it trains (a policy-gradient step reports the gap as its sampler deviation). The copies
//! are made from the weights of now, and remade after every update with the engine's decoding
//! model. Each product's outputs are split in two halves computed on two threads, as the
//! one-row f32 products are ([`super::helper_thread`]): candle runs its quantized kernels on
//! its element-wise pool, which whale keeps at one thread (`whale_kernels::runtime`).

use super::helper_thread;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};

/// The block type of the copies: of candle's types the most exact, and batch-invariant (a
/// sequence's logits do not depend on which others share its step; a test holds that).
const BLOCK_TYPE: GgmlDType = GgmlDType::Q8_0;

/// Inputs of the weights that get a copy are a multiple of this: those candle's fast x86
/// kernels (repacked, VNNI) take.
const FAST_INPUT_MULTIPLE: usize = 256;

/// Outputs of each half are a multiple of this, so that both halves start on the kernels'
/// groups of columns.
const SPLIT_ALIGN: usize = 64;

/// A weight `[out, in]` as Q8_0 blocks, in two halves of its outputs.
#[derive(Clone)]
pub(crate) struct QuantizedWeight {
    first: QMatMul,
    second: Option<QMatMul>,
}

impl QuantizedWeight {
    /// The copy of `weight`, or `None` where it would not pay or cannot be made: a weight that
    /// is not f32 on the CPU, or whose inputs are not a multiple of [`FAST_INPUT_MULTIPLE`].
    pub(crate) fn of(weight: &Tensor) -> candle_core::Result<Option<Self>> {
        let (out_dim, in_dim) = weight.dims2()?;
        if !weight.device().is_cpu() || weight.dtype() != DType::F32 || !in_dim.is_multiple_of(FAST_INPUT_MULTIPLE) {
            return Ok(None);
        }
        // `QTensor::quantize` reads its input's storage from the start, whatever the view's
        // offset: each half is copied out into a storage of its own first.
        let quantize = |rows: Tensor| -> candle_core::Result<QMatMul> {
            let own = Tensor::from_vec(rows.flatten_all()?.to_vec1::<f32>()?, rows.shape(), rows.device())?;
            QMatMul::from_qtensor(QTensor::quantize(&own, BLOCK_TYPE)?)
        };
        let half = (out_dim / 2) / SPLIT_ALIGN * SPLIT_ALIGN;
        if half == 0 {
            return Ok(Some(Self { first: quantize(weight.clone())?, second: None }));
        }
        let first = quantize(weight.narrow(0, 0, half)?)?;
        let second = quantize(weight.narrow(0, half, out_dim - half)?)?;
        Ok(Some(Self { first, second: Some(second) }))
    }

    /// `x @ w^T` of a matrix `x` `[rows, in]`, from the copy.
    pub(crate) fn product(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = x.contiguous()?;
        let Some(second) = &self.second else { return self.first.forward(&x) };
        let (row, second) = (x.clone(), second.clone());
        let (first, second) = helper_thread::join(|| self.first.forward(&x), Box::new(move || second.forward(&row)));
        Tensor::cat(&[first?, second?], 1)
    }
}
