//! Named parameters in a candle `VarMap`: how the models and the adapters keep their weights,
//! so that an optimizer step on a variable is seen by every clone that shares the map. One
//! place for making such a map from named tensors (checked against the shapes an architecture
//! expects), listing it in a stable order, and drawing the random values a fresh one starts from.

use crate::qwen3::model::error::ModelError;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::PoisonError;

/// Whether parameters can be kept in `dtype`: the float types candle trains and decodes in.
pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F64 | DType::F32 | DType::BF16 | DType::F16)
}

/// A map of the `expected` tensors taken from `tensors` (each checked against its shape),
/// converted to `dtype` on `device`, with the variables' tensors by name. Tensors not expected
/// are left in `tensors`.
pub(crate) fn checked_variables(
    expected: Vec<(String, Vec<usize>)>,
    tensors: &mut HashMap<String, Tensor>,
    dtype: DType,
    device: &Device,
) -> Result<(VarMap, HashMap<String, Tensor>), ModelError> {
    if !is_float(dtype) {
        return Err(ModelError::Input(format!("model dtype {dtype:?} is not a float type")));
    }
    let mut taken = Vec::with_capacity(expected.len());
    for (name, shape) in expected {
        let tensor = tensors.remove(&name).ok_or_else(|| ModelError::MissingTensor { name: name.clone() })?;
        if tensor.dims() != shape.as_slice() {
            return Err(ModelError::ShapeMismatch { name, expected: shape, found: tensor.dims().to_vec() });
        }
        taken.push((name, tensor));
    }
    let varmap = variables(taken, dtype, device)?;
    let params = sorted(&varmap).into_iter().map(|(name, var)| (name, var.as_tensor().clone())).collect();
    Ok((varmap, params))
}

/// A map of variables holding copies of `tensors`, converted to `dtype` on `device`. Detached,
/// so that a variable always owns its copy, even of another model's variable.
pub(crate) fn variables(
    tensors: impl IntoIterator<Item = (String, Tensor)>,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<VarMap> {
    let varmap = VarMap::new();
    {
        let mut data = varmap.data().lock().unwrap_or_else(PoisonError::into_inner);
        for (name, tensor) in tensors {
            data.insert(name, Var::from_tensor(&tensor.to_dtype(dtype)?.to_device(device)?.detach())?);
        }
    }
    Ok(varmap)
}

/// Every variable of `varmap` with its name, sorted by name.
pub(crate) fn sorted(varmap: &VarMap) -> Vec<(String, Var)> {
    let data = varmap.data().lock().unwrap_or_else(PoisonError::into_inner);
    let mut params: Vec<(String, Var)> = data.iter().map(|(name, var)| (name.clone(), var.clone())).collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    params
}

/// A fresh LoRA pair on the CPU in f32: A `[rank, in]` uniform in `±1/sqrt(in)` (PEFT's
/// Kaiming-uniform with `a = √5`), B `[out, rank]` zero.
pub(crate) fn fresh_lora_pair(
    rng: &mut ChaCha8Rng,
    rank: usize,
    in_dim: usize,
    out_dim: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    let bound = 1.0 / (in_dim as f64).sqrt();
    let values: Vec<f32> = (0..rank * in_dim).map(|_| rng.gen_range(-bound..bound) as f32).collect();
    let a = Tensor::from_vec(values, (rank, in_dim), &Device::Cpu)?;
    Ok((a, Tensor::zeros((out_dim, rank), DType::F32, &Device::Cpu)?))
}

/// A standard normal sample (Box-Muller).
pub(crate) fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}
