//! What a quantized base would buy a model's rollouts on this CPU: the products of its decoding
//! step timed in f32 and through candle's quantized kernels (`QMatMul`) on the same weights
//! quantized to each GGUF type that fits the shape, at 1 to 256 rows (concurrent sequences). f32
//! is timed as whale multiplies these models' weights: from `W` as stored (their projections pass
//! the size up to which whale decodes from `W^T` copies; a product of one row whale also splits
//! over two threads, which this leaves out).
//!
//! `cargo run --release -p whale-lm --example quantized_products [-- MODEL [ROWS,ROWS,...]]`
//!
//! MODEL is `smollm2` (SmolLM2-135M, the default), `qwen2.5-0.5b` or `qwen2.5-1.5b`
//! (Qwen2.5-Coder-Instruct's shapes). Prints one line per product shape (outputs x inputs) and row
//! count with GFLOP/s per type and the largest difference from the f32 product on unit-normal
//! inputs, then for each row count the time of one decoding step's products (every layer's seven
//! projections and the head) per type: the bound those products set on decoding tokens/s. Weights
//! are drawn normal with sd 0.05; the timings do not depend on the values. The CPU settings are
//! the `whale` binary's (`whale_kernels::runtime::configure_cpu`), but for candle's element-wise
//! pool, on which its quantized products run: it gets every core.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use std::time::Instant;

/// A model's decoding-step products.
struct Shapes {
    /// Per layer (outputs, inputs): q, k, v, o, gate, up, down.
    layer: [(usize, usize); 7],
    layers: usize,
    /// The head: vocabulary x hidden.
    head: (usize, usize),
}

impl Shapes {
    fn named(name: &str) -> Option<Self> {
        // (hidden, key/value outputs, intermediate, layers, vocabulary)
        let (h, kv, i, layers, vocab) = match name {
            "smollm2" => (576, 192, 1536, 30, 49152),
            "qwen2.5-0.5b" => (896, 128, 4864, 24, 151936),
            "qwen2.5-1.5b" => (1536, 256, 8960, 28, 151936),
            _ => return None,
        };
        Some(Self { layer: [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)], layers, head: (vocab, h) })
    }
}

/// The types of the GGUF files whale reads: SmolLM2's Q4_1, the Qwen2.5 0.5B's Q5_0 and Q8_0,
/// the 1.5B's Q4_K and Q6_K, and Q4_0.
const TYPES: [GgmlDType; 6] =
    [GgmlDType::Q8_0, GgmlDType::Q6K, GgmlDType::Q5_0, GgmlDType::Q4K, GgmlDType::Q4_1, GgmlDType::Q4_0];
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
    let name = std::env::args().nth(1).unwrap_or_else(|| "smollm2".into());
    let model = Shapes::named(&name).ok_or(format!("unknown model {name:?}: smollm2, qwen2.5-0.5b or qwen2.5-1.5b"))?;
    let rows: Vec<usize> = match std::env::args().nth(2) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 8, 64, 256],
    };
    let mut shapes: Vec<(usize, usize)> = Vec::new();
    for shape in model.layer.into_iter().chain([model.head]) {
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
        step_seconds.push((m, step_time(&model, &per_shape)));
    }
    println!(
        "\none decoding step's products ({} layers and the head), ms; f32 for shapes a type does not fit",
        model.layers
    );
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
fn step_time(model: &Shapes, per_shape: &[((usize, usize), Timing)]) -> Vec<f64> {
    let of = |shape: (usize, usize)| &per_shape.iter().find(|(s, _)| *s == shape).expect("timed").1;
    let mut seconds = vec![0.0; TYPES.len() + 1];
    let products = model.layer.iter().map(|&s| (s, model.layers)).chain([(model.head, 1)]);
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
