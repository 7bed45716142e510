//! `x Wᵀ` with a frozen `W`: the product of a LoRA pass's base weights and of a tied head.
//!
//! candle's backward pass of a matmul computes the gradient of both operands whatever they
//! track, so every product with a constant weight still paid its `xᵀ·dy`, as large as the
//! product itself: a LoRA step of SmolLM2 cost as much as a full-weight one. This op runs the
//! same storage product forward (the same kernel call as `x.matmul(&w.t())`, so the same bits)
//! and gives a gradient to `x` alone.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

/// `x Wᵀ` of a matrix `x` `[m, k]` and a weight `[n, k]` that takes no gradient; on the CPU
/// the backward pass skips `W`'s gradient, elsewhere it is candle's matmul.
pub fn frozen_weight_product(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    let (rows, inputs) = x.dims2()?;
    let (outputs, weight_inputs) = weight.dims2()?;
    let empty = rows == 0 || inputs == 0 || outputs == 0;
    if x.device().is_cpu() && weight.device().is_cpu() && inputs == weight_inputs && !empty {
        return x.apply_op2(weight, FrozenWeightProduct);
    }
    x.matmul(&weight.t()?)
}

struct FrozenWeightProduct;

impl CustomOp2 for FrozenWeightProduct {
    fn name(&self) -> &'static str {
        "whale-frozen-weight-product"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        weight: &CpuStorage,
        weight_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, k) = x_layout.shape().dims2()?;
        let (n, weight_k) = weight_layout.shape().dims2()?;
        if k != weight_k {
            candle_core::bail!(
                "{}: x {:?} and weight {:?} differ in k",
                self.name(),
                x_layout.dims(),
                weight_layout.dims()
            );
        }
        let product = x.matmul(weight, (1, m, n, k), x_layout, &weight_layout.transpose(0, 1)?)?;
        Ok((product, Shape::from((m, n))))
    }

    /// `dx = dy W`, as candle's matmul computes it (`dy (Wᵀ)ᵀ`); no gradient for `W`.
    fn bwd(
        &self,
        _x: &Tensor,
        weight: &Tensor,
        _product: &Tensor,
        d_product: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(d_product.matmul(&weight.t()?.t()?)?), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
        let values = (0..shape.0 * shape.1)
            .map(|i| (((i as u64 + 1) * (seed * 2 + 1) * 2_654_435_761 % 1_000) as f32 - 500.0) / 250.0)
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).expect("tensor")
    }

    /// Output and `x`'s gradient of `sum(product(x) * probe)`, and whether `w` got one.
    fn pass(
        product: impl Fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>,
        x: &Var,
        w: &Var,
        probe: &Tensor,
    ) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, bool) {
        let y = product(x.as_tensor(), w.as_tensor()).expect("product");
        let grads = (&y * probe).and_then(|l| l.sum_all()).and_then(|l| l.backward()).expect("backward");
        let dx = grads.get(x.as_tensor()).expect("x has a gradient").to_vec2().expect("dx");
        (y.to_vec2().expect("y"), dx, grads.get(w.as_tensor()).is_some())
    }

    #[test]
    fn equals_candles_matmul_to_the_bit_and_leaves_the_weight_without_gradient() {
        for (m, k, n) in [(1, 8, 4), (5, 7, 3), (33, 64, 48), (130, 96, 200)] {
            let x = Var::from_tensor(&random((m, k), 1)).expect("x");
            let w = Var::from_tensor(&random((n, k), 2)).expect("w");
            let probe = random((m, n), 3);
            let (y, dx, w_grad) = pass(|x, w| x.matmul(&w.t()?), &x, &w, &probe);
            let (frozen_y, frozen_dx, frozen_w_grad) = pass(frozen_weight_product, &x, &w, &probe);
            assert_eq!(frozen_y, y, "forward of {m}x{k} by {n}x{k}");
            assert_eq!(frozen_dx, dx, "x gradient of {m}x{k} by {n}x{k}");
            assert!(w_grad && !frozen_w_grad, "only candle's matmul gives the weight a gradient");
        }
    }

    #[test]
    fn a_transposed_or_mismatched_weight_is_handled() {
        let x = random((6, 10), 4);
        let w = random((10, 12), 5).t().expect("transposed");
        let expected = x.matmul(&w.t().expect("t")).expect("matmul").to_vec2::<f32>().expect("y");
        assert_eq!(frozen_weight_product(&x, &w).expect("product").to_vec2::<f32>().expect("y"), expected);
        let wrong = random((4, 9), 6);
        assert!(frozen_weight_product(&x, &wrong).is_err(), "k of 10 against 9 is an error");
        let half = x.to_dtype(DType::F64).expect("f64");
        assert!(frozen_weight_product(&half, &random((3, 10), 7)).is_err(), "mixed dtypes are an error");
    }
}
