//! The tensor types whale reads and their dequantization. candle's `QTensor::dequantize` does the
//! arithmetic (the same block formats llama.cpp writes); this file only says which types are
//! accepted, spells them as llama.cpp does, and turns a tensor into f32 or bf16.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

/// The types whale dequantizes: every one candle reads. candle also knows Q8_1 and Q8_K, the
/// types llama.cpp uses for activations inside its matmuls, but cannot load them from a file.
pub const READ_TYPES: [GgmlDType; 13] = [
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

pub fn is_read(dtype: GgmlDType) -> bool {
    READ_TYPES.contains(&dtype)
}

/// llama.cpp's name of a type (`Q4_K`, not candle's `Q4K`).
pub fn type_name(dtype: GgmlDType) -> &'static str {
    match dtype {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// The names of [`READ_TYPES`], for messages.
pub fn read_type_names() -> Vec<&'static str> {
    READ_TYPES.iter().map(|dtype| type_name(*dtype)).collect()
}

/// Names of ggml's type ids that candle does not know, so that a refusal can say what the file
/// holds (ids from ggml.h; unlisted ids are reported as numbers).
pub fn unknown_type_name(id: u32) -> Option<&'static str> {
    let name = match id {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    };
    Some(name)
}

/// The bytes a tensor of `dtype` and `dims` takes in the file, computed checked (candle's own
/// arithmetic wraps on a hostile shape); refuses a shape that is not whole blocks of the type.
pub fn stored_bytes(dtype: GgmlDType, dims: &[usize]) -> Result<u64, String> {
    let elements = dims.iter().try_fold(1usize, |product, dim| product.checked_mul(*dim));
    let elements = elements.ok_or_else(|| format!("shape {dims:?} overflows its element count"))?;
    let block = dtype.block_size();
    if elements % block != 0 {
        return Err(format!("{elements} elements are not whole {} blocks of {block}", type_name(dtype)));
    }
    let bytes = (elements / block).checked_mul(dtype.type_size()).and_then(|bytes| u64::try_from(bytes).ok());
    bytes.ok_or_else(|| format!("shape {dims:?} overflows its byte size"))
}

/// The tensor's values in `dtype` (f32, or bf16 rounded from f32), on the CPU.
pub fn dequantize(tensor: &QTensor, dtype: DType) -> candle_core::Result<Tensor> {
    let values = tensor.dequantize(&Device::Cpu)?;
    if dtype == DType::F32 {
        Ok(values)
    } else {
        values.to_dtype(dtype)
    }
}
