//! What a quantized base would buy SmolLM2's rollouts on this CPU: the products of its
//! decoding step timed in f32 and through candle's quantized kernels (`QMatMul`) on the same
//! weights quantized to each GGUF type that fits the shape, at 1 to 256 rows (concurrent
//! sequences). f32 is timed as whale multiplies SmolLM2's weights: from `W` as stored (its
//! projections pass the size up to which whale decodes from `W^T` copies; a product of one row
//! whale also splits over two threads, which this leaves out).
//!
//! `cargo run --release -p whale-lm --example quantized_products [-- ROWS,ROWS,...]`
//!
//! Prints one line per product shape (outputs x inputs) and row count with GFLOP/s per type and
//! the largest difference from the f32 product on unit-normal inputs, then for each row count
//! the time of one decoding step's products (30 layers of SmolLM2's seven projections and the
//! tied head) per type: the bound those products set on decoding tokens/s. Weights are drawn
//! with SmolLM2's spread (normal, sd 0.05); the timings do not depend on the values. The CPU
//! settings are the `whale` binary's (`whale_kernels::runtime::configure_cpu`), but for
//! candle's element-wise pool, on which its quantized products run: it gets every core.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use std::time::Instant;

/// SmolLM2-135M's products per layer (outputs, inputs): q, k, v, o, gate, up, down.
const LAYER: [(usize, usize); 7] =
    [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)];
const LAYERS: usize = 30;
/// The tied head: vocabulary x hidden.
const HEAD: (usize, usize) = (49152, 576);
const TYPES: [GgmlDType; 4] = [GgmlDType::Q8_0, GgmlDType::Q4_1, GgmlDType::Q4_0, GgmlDType::Q4K];
/// Multiply-adds each timing covers, at least (so that small products repeat enough).
const WORK: usize = 400_000_000;

type BoxError = Box<dyn std::error::Error>;

fn main() -> Result<(), BoxError> {
    // candle's quantized products run on its element-wise pool, which the `whale` binary keeps
    // at one thread (`configure_cpu`): give it every core, as a quantized base would need.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        std::env::set_var("CANDLE_NUM_THREADS", cores.to_string());
    }
    whale_kernels::runtime::configure_cpu();
    let rows: Vec<usize> = match std::env::args().nth(1) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 8, 64, 256],
    };
    let mut shapes: Vec<(usize, usize)> = Vec::new();
    for shape in LAYER.into_iter().chain([HEAD]) {
        if !shapes.contains(&shape) {
            shapes.push(shape);
        }
    }
    println!("{:>5} {:>13} {:>16} {}", "rows", "product", "f32 GFLOP/s", types_header());
    let mut step_seconds = Vec::new();
    for &m in &rows {
        let mut per_shape = Vec::new();
        for &(n, k) in &shapes {
            let timing = time_shape(m, n, k)?;
            println!("{m:>5} {:>13} {:>16.1} {}", format!("{n} x {k}"), timing.f32.1, timing.row());
            per_shape.push(((n, k), timing));
        }
        step_seconds.push((m, step_time(&per_shape)));
    }
    println!("\none decoding step's products (30 layers and the head), ms; f32 for shapes a type does not fit");
    println!("{:>5} {:>10} {}", "rows", "f32", types_header());
    for (m, seconds) in step_seconds {
        let cells: Vec<String> = seconds[1..].iter().map(|s| format!("{:>10.2}", s * 1e3)).collect();
        println!("{m:>5} {:>10.2} {}", seconds[0] * 1e3, cells.join(" "));
    }
    Ok(())
}

fn types_header() -> String {
    TYPES.iter().map(|t| format!("{:>10}", format!("{t:?}"))).collect::<Vec<_>>().join(" ")
}

/// One product shape at one row count: seconds and GFLOP/s in f32, and per type that fits,
/// GFLOP/s, seconds and the largest difference from f32.
struct Timing {
    f32: (f64, f64),
    quantized: Vec<Option<(f64, f64, f32)>>,
}

impl Timing {
    fn row(&self) -> String {
        let cell = |q: &Option<(f64, f64, f32)>| match q {
            Some((gflops, _, gap)) => format!("{gflops:>6.1} ±{gap:<5.2}"),
            None => format!("{:>10}", "-"),
        };
        self.quantized.iter().map(cell).collect::<Vec<_>>().join(" ")
    }
}

fn time_shape(m: usize, n: usize, k: usize) -> Result<Timing, BoxError> {
    let device = Device::Cpu;
    let weight = Tensor::randn(0f32, 0.05, (n, k), &device)?;
    let x = Tensor::randn(0f32, 1.0, (m, k), &device)?;
    let exact = x.matmul(&weight.t()?)?;
    let f32 = time(m, n, k, || x.matmul(&weight.t()?))?;
    let mut quantized = Vec::new();
    for dtype in TYPES {
        if !k.is_multiple_of(dtype.block_size()) {
            quantized.push(None);
            continue;
        }
        let product = QMatMul::from_qtensor(QTensor::quantize(&weight, dtype)?)?;
        let gap = (product.forward(&x)? - &exact)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let (seconds, gflops) = time(m, n, k, || product.forward(&x))?;
        quantized.push(Some((gflops, seconds, gap)));
    }
    Ok(Timing { f32, quantized })
}

/// Seconds per call and GFLOP/s of `product`, after one call to warm up.
fn time(
    m: usize,
    n: usize,
    k: usize,
    product: impl Fn() -> candle_core::Result<Tensor>,
) -> Result<(f64, f64), BoxError> {
    let repeats = (WORK / (m * n * k)).max(3);
    product()?;
    let started = Instant::now();
    for _ in 0..repeats {
        product()?;
    }
    let seconds = started.elapsed().as_secs_f64() / repeats as f64;
    Ok((seconds, 2.0 * (m * n * k) as f64 / seconds / 1e9))
}

/// Seconds of one decoding step's products: f32, then each type (f32 where it does not fit).
fn step_time(per_shape: &[((usize, usize), Timing)]) -> Vec<f64> {
    let of = |shape: (usize, usize)| &per_shape.iter().find(|(s, _)| *s == shape).expect("timed").1;
    let mut seconds = vec![0.0; TYPES.len() + 1];
    let products = LAYER.iter().map(|&s| (s, LAYERS)).chain([(HEAD, 1)]);
    for (shape, count) in products {
        let timing = of(shape);
        let f32_seconds = timing.f32.0;
        seconds[0] += f32_seconds * count as f64;
        for (t, q) in timing.quantized.iter().enumerate() {
            seconds[t + 1] += q.map_or(f32_seconds, |(_, s, _)| s) * count as f64;
        }
    }
    seconds
}
