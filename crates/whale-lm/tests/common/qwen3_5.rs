//! Shared helpers of the Qwen3.5 tests (here, in whale-engine and in whale-train): tiny random
//! models with every parameter moved off its initial value, and random token ids.

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use whale_lm::{Qwen35Config, Qwen35Model};

pub const VOCAB: usize = 97;

/// A tiny model whose every parameter is moved off its initial value, so that norms, gates and
/// decays all matter to the output.
pub fn model(config: &Qwen35Config, seed: u64) -> Qwen35Model {
    let model = Qwen35Model::new_random(config, seed, DType::F32, &Device::Cpu).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    for (name, var) in model.named_parameters() {
        let count = var.elem_count();
        let spread = if name.ends_with("A_log") || name.contains("norm") { 0.5 } else { 0.15 };
        let noise: Vec<f32> = (0..count).map(|_| rng.gen_range(-spread..spread)).collect();
        let noise = Tensor::from_vec(noise, var.shape(), &Device::Cpu).unwrap();
        var.set(&(var.as_tensor() + noise).unwrap()).unwrap();
    }
    model
}

pub fn tokens(len: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(0..VOCAB as u32)).collect()
}

pub fn max_difference(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}
