//! Prints the `whale lm bench` performance table on the CPU:
//! `cargo run --release -p whale --example lm_bench [MODEL_DIR]` (no directory: a random
//! `ModelSize::BASE` model).

use std::path::PathBuf;

use candle_core::Device;
use whale::lm_bench::{run_bench, BenchConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    whale_kernels::runtime::configure_cpu();
    let config = BenchConfig { model_dir: std::env::args().nth(1).map(PathBuf::from), ..BenchConfig::default() };
    let table = run_bench(&config, &Device::Cpu)?;
    println!("{table}");
    Ok(())
}
