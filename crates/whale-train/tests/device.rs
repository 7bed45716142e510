//! A device against the CPU: the logits of tiny random Qwen3 and Qwen3.5 models (and of a
//! checkpoint, given) in f32 and bf16, and the losses of full-weight and LoRA training steps.
//! Both sides start from the same weights: the models' random values are drawn on the CPU
//! from a seed, whatever the device.
//!
//! `WHALE_CHECK_DEVICE=cuda` compares CUDA device 0 (a `--features cuda` build; what
//! scripts/gpu-check.sh runs). Without it the device is the CPU itself, so that every build
//! runs the same code, where each difference is 0. `WHALE_CHECK_MODEL=DIR` adds a Qwen3
//! checkpoint (the base model); `WHALE_CHECK_TABLE=FILE` gets one tab-separated row per check
//! (check, difference, tolerance, ok). Every check is measured before the test fails, so one
//! run gives the whole table.

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::io::Write;
use whale_lm::qwen3_5::Qwen35Size;
use whale_lm::{
    LoraAdapter, LoraConfig, Qwen35Config, Qwen35Lora, Qwen35Model, Qwen3Config, Qwen3Model, TrainableModel,
};
use whale_train::{SftExample, SftTrainer, TrainerConfig};

const VOCAB: usize = 97;

/// Largest difference of the device's f32 logits from the CPU's, over the largest CPU logit:
/// room for another summation order (cuBLAS, reductions).
const F32_LOGITS: f64 = 1e-4;
/// bf16 keeps 8 bits, rounded after every operation, and its error grows through the layers
/// (measured on the CPU against its f32: 2.6e-2 of the largest logit on the tiny Qwen3, 1.5e-1 on
/// the tiny Qwen3.5, whose recurrences carry it along): so the device's bf16 logits are held to
/// this multiple of the CPU's own bf16 error against the same f32 logits.
const BF16_LOGITS: f64 = 2.0;
/// Relative difference of a training step's loss: the first step's is a forward pass; the
/// second's comes after one AdamW update made on the device, whose first step moves each weight
/// by about the learning rate whatever the gradient's size.
const F32_LOSS: f64 = 1e-4;
const F32_LOSS_AFTER_UPDATE: f64 = 1e-3;

fn device() -> Device {
    match std::env::var("WHALE_CHECK_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).unwrap_or_else(|e| panic!("WHALE_CHECK_DEVICE=cuda: {e}")),
        Ok("cpu") | Err(_) => Device::Cpu,
        Ok(other) => panic!("WHALE_CHECK_DEVICE={other}: expected cpu or cuda"),
    }
}

/// The checks' rows, written to `WHALE_CHECK_TABLE` as they are measured.
struct Table {
    failed: Vec<String>,
}

impl Table {
    fn row(&mut self, check: &str, difference: f64, tolerance: f64) {
        let ok = difference <= tolerance;
        if !ok {
            self.failed.push(format!("{check}: {difference:.2e} > {tolerance:.1e}"));
        }
        self.write(&format!("{check}\t{difference:.2e}\t{tolerance:.1e}\t{}\n", if ok { "ok" } else { "FAIL" }));
    }

    /// Runs a group of checks; a panic in it (an operation the device lacks, say) becomes a failed
    /// row, and the groups after it still run.
    fn group(&mut self, name: &str, checks: impl FnOnce(&mut Table)) {
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| checks(self))) {
            let message = match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
                (Some(message), _) => message.clone(),
                (None, Some(message)) => message.to_string(),
                (None, None) => "a panic".to_string(),
            };
            let message = message.lines().next().unwrap_or_default().replace('\t', " ");
            self.failed.push(format!("{name}: {message}"));
            self.write(&format!("{name}\tpanicked: {message}\t-\tFAIL\n"));
        }
    }

    fn write(&self, line: &str) {
        eprint!("{line}");
        if let Ok(path) = std::env::var("WHALE_CHECK_TABLE") {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("the table");
            file.write_all(line.as_bytes()).expect("the table");
        }
    }

    fn finish(self) {
        assert!(self.failed.is_empty(), "failed: {}", self.failed.join("; "));
    }
}

fn tokens(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

fn to_f32_rows(tensor: &Tensor) -> Vec<f32> {
    tensor.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// The largest difference over the largest reference value.
fn relative_difference(reference: &[f32], got: &[f32]) -> f64 {
    assert_eq!(reference.len(), got.len());
    let scale = reference.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs())).max(1e-6);
    reference.iter().zip(got).fold(0f64, |m, (&a, &b)| m.max((f64::from(a) - f64::from(b)).abs())) / scale
}

fn qwen3_config() -> Qwen3Config {
    let mut config = Qwen3Config::tiny(VOCAB);
    config.initializer_range = 0.2;
    config
}

fn qwen3_logits(model: &Qwen3Model, tokens: &[u32]) -> Vec<f32> {
    let device = model.device();
    let ids = Tensor::from_vec(tokens.to_vec(), (1, tokens.len()), device).unwrap();
    let mask = Tensor::ones((1, tokens.len()), DType::U8, device).unwrap();
    to_f32_rows(&model.forward_train(&ids, &mask).unwrap())
}

/// The tiny Qwen3.5's weights moved off their initial values, so that norms, gates and decays
/// all matter to the output.
fn qwen35_tensors(config: &Qwen35Config, seed: u64) -> HashMap<String, Tensor> {
    let model = Qwen35Model::new_random(config, seed, DType::F32, &Device::Cpu).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    model
        .named_parameters()
        .into_iter()
        .map(|(name, var)| {
            let spread = if name.ends_with("A_log") || name.contains("norm") { 0.5 } else { 0.15 };
            let noise: Vec<f32> = (0..var.elem_count()).map(|_| rng.gen_range(-spread..spread)).collect();
            let noise = Tensor::from_vec(noise, var.shape(), &Device::Cpu).unwrap();
            (name, (var.as_tensor() + noise).unwrap())
        })
        .collect()
}

fn qwen35_model(config: &Qwen35Config, dtype: DType, device: &Device) -> Qwen35Model {
    Qwen35Model::from_tensors(config, qwen35_tensors(config, 3), dtype, device).unwrap()
}

fn qwen35_logits(model: &Qwen35Model, tokens: &[u32]) -> Vec<f32> {
    to_f32_rows(&model.logits(&model.packed_hidden(&[tokens]).unwrap()).unwrap())
}

fn examples(vocab: usize) -> Vec<SftExample> {
    (0..6)
        .map(|i| SftExample {
            prompt: tokens(3 + i % 4, vocab, 100 + i as u64),
            completion: tokens(4 + (2 * i) % 7, vocab, 200 + i as u64),
        })
        .collect()
}

fn trainer_config() -> TrainerConfig {
    TrainerConfig { learning_rate: 1e-3, warmup_steps: 0, micro_batch_size: 3, max_seq_len: 64, ..Default::default() }
}

fn lora() -> LoraConfig {
    LoraConfig { rank: 4, alpha: 8.0, ..LoraConfig::default() }
}

/// The losses of two steps on the same examples: before any update, and after one.
fn two_losses<M: TrainableModel>(model: M) -> [f64; 2] {
    let mut trainer = SftTrainer::new(model, trainer_config()).unwrap();
    let data = examples(VOCAB);
    [trainer.step(&data).unwrap().loss, trainer.step(&data).unwrap().loss]
}

fn loss_rows(table: &mut Table, name: &str, cpu: [f64; 2], device: [f64; 2]) {
    let relative = |i: usize| (cpu[i] - device[i]).abs() / cpu[i].abs().max(1e-6);
    table.row(&format!("{name} loss, step 1"), relative(0), F32_LOSS);
    table.row(&format!("{name} loss, step 2"), relative(1), F32_LOSS_AFTER_UPDATE);
}

/// The f32 logits against the CPU's; the bf16 logits against the CPU's f32, no further from them
/// than twice the CPU's own bf16 logits are.
fn logit_rows(table: &mut Table, name: &str, logits: impl Fn(DType, &Device) -> Vec<f32>, device: &Device) {
    let reference = logits(DType::F32, &Device::Cpu);
    table.row(&format!("{name} logits f32"), relative_difference(&reference, &logits(DType::F32, device)), F32_LOGITS);
    let cpu_error = relative_difference(&reference, &logits(DType::BF16, &Device::Cpu));
    let device_error = relative_difference(&reference, &logits(DType::BF16, device));
    table.row(&format!("{name} logits bf16 (CPU's: {cpu_error:.1e})"), device_error, BF16_LOGITS * cpu_error);
}

#[test]
fn a_device_computes_the_cpus_logits_and_training_losses() {
    let device = device();
    let mut table = Table { failed: Vec::new() };
    let config = qwen3_config();
    let config35 = Qwen35Config::text(VOCAB, Qwen35Size::TINY);
    table.group("qwen3 tiny logits", |table| {
        let input = tokens(40, VOCAB, 1);
        let logits =
            |dtype, device: &Device| qwen3_logits(&Qwen3Model::new_random(&config, 7, dtype, device).unwrap(), &input);
        logit_rows(table, "qwen3 tiny", logits, &device);
    });
    // 150 tokens: past the delta rule's first chunk.
    table.group("qwen3.5 tiny logits", |table| {
        let input = tokens(150, VOCAB, 2);
        let logits = |dtype, device: &Device| qwen35_logits(&qwen35_model(&config35, dtype, device), &input);
        logit_rows(table, "qwen3.5 tiny", logits, &device);
    });
    if let Ok(dir) = std::env::var("WHALE_CHECK_MODEL") {
        table.group("checkpoint logits", |table| {
            let dir = std::path::Path::new(&dir);
            let vocab = whale_lm::load_model(dir, DType::F32, &Device::Cpu).unwrap().config().vocab_size;
            let input = tokens(64, vocab, 3);
            let logits =
                |dtype, device: &Device| qwen3_logits(&whale_lm::load_model(dir, dtype, device).unwrap(), &input);
            logit_rows(table, "checkpoint", logits, &device);
        });
    }
    table.group("qwen3 tiny full-weight loss", |table| {
        let losses = |device: &Device| two_losses(Qwen3Model::new_random(&config, 11, DType::F32, device).unwrap());
        loss_rows(table, "qwen3 tiny full-weight", losses(&Device::Cpu), losses(&device));
    });
    table.group("qwen3 tiny LoRA loss", |table| {
        let losses = |device: &Device| {
            let base = Qwen3Model::new_random(&config, 11, DType::F32, device).unwrap();
            let adapter = LoraAdapter::new(lora(), &config, 5, DType::F32, device).unwrap();
            two_losses(base.with_adapter(&adapter).unwrap())
        };
        loss_rows(table, "qwen3 tiny LoRA", losses(&Device::Cpu), losses(&device));
    });
    table.group("qwen3.5 tiny full-weight loss", |table| {
        let losses = |device: &Device| two_losses(qwen35_model(&config35, DType::F32, device));
        loss_rows(table, "qwen3.5 tiny full-weight", losses(&Device::Cpu), losses(&device));
    });
    table.group("qwen3.5 tiny LoRA loss", |table| {
        let losses = |device: &Device| {
            let adapter = Qwen35Lora::new(lora(), &config35, 5, DType::F32, device).unwrap();
            two_losses(qwen35_model(&config35, DType::F32, device).with_adapter(&adapter).unwrap())
        };
        loss_rows(table, "qwen3.5 tiny LoRA", losses(&Device::Cpu), losses(&device));
    });
    table.finish();
}
