//! GGUF reading on files the tests write with candle's own GGUF writer: every read tensor type
//! dequantizes within its tolerance (and exactly as candle dequantizes in memory), unsupported
//! architectures and types are refused naming the key or tensor, the tokenizer rebuilt from
//! `tokenizer.ggml.*` gives the ids of the same tokenizer loaded from its `tokenizer.json`,
//! `convert_to_hf` undoes llama.cpp's rotary row order, and hostile or malformed files are refused
//! naming the key or tensor (never a panic, an abort or an allocation the file does not justify).
//! The last tests read the real SmolLM2-135M-Instruct GGUF and are opt-in
//! (`WHALE_SMOLLM2_GGUF=FILE cargo test --release -p whale-gguf --test gguf -- --ignored`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use whale_core::ChatMessage;
use whale_gguf::{convert_to_hf, tensors, ConvertProgress, GgufArchitecture, GgufError, GgufFile};
use whale_lm::decoder::Decoder;
use whale_text::{ChatTemplate, RenderOptions, Tokenizer, ENDOFTEXT, IM_END, IM_START, MIN_VOCAB_SIZE};

/// Each read type with the largest relative RMS error its round trip may have on Gaussian
/// values (about twice what candle's quantizers give).
const TOLERANCES: [(GgmlDType, f64); 13] = [
    (GgmlDType::F32, 0.0),
    (GgmlDType::F16, 1e-3),
    (GgmlDType::BF16, 8e-3),
    (GgmlDType::Q8_0, 1e-2),
    (GgmlDType::Q5_0, 0.08),
    (GgmlDType::Q5_1, 0.08),
    (GgmlDType::Q4_0, 0.15),
    (GgmlDType::Q4_1, 0.15),
    (GgmlDType::Q6K, 0.03),
    (GgmlDType::Q5K, 0.08),
    (GgmlDType::Q4K, 0.15),
    (GgmlDType::Q3K, 0.3),
    (GgmlDType::Q2K, 0.6),
];

fn gaussian(rows: usize, columns: usize, seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<f32> = (0..rows * columns)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect();
    Tensor::from_vec(values, (rows, columns), &Device::Cpu).unwrap()
}

fn string(text: &str) -> Value {
    Value::String(text.to_string())
}

fn strings<'a>(items: impl IntoIterator<Item = &'a str>) -> Value {
    Value::Array(items.into_iter().map(string).collect())
}

fn write_gguf(path: &Path, metadata: &[(&str, Value)], tensors: &[(&str, &QTensor)]) {
    let mut file = std::fs::File::create(path).unwrap();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(key, value)| (*key, value)).collect();
    gguf_file::write(&mut file, &metadata, tensors).unwrap();
}

fn llama_architecture() -> (&'static str, Value) {
    ("general.architecture", string("llama"))
}

fn relative_rms_error(actual: &Tensor, expected: &Tensor) -> f64 {
    let squared = |t: Tensor| t.sqr().unwrap().mean_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    (squared(actual.sub(expected).unwrap()) / squared(expected.clone())).sqrt()
}

fn type_label(dtype: GgmlDType) -> String {
    format!("t.{}", tensors::type_name(dtype))
}

#[test]
fn gguf_tensors_of_every_read_type_dequantize_within_their_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("types.gguf");
    let original = gaussian(4, 512, 1);
    let quantized: Vec<(GgmlDType, QTensor)> =
        TOLERANCES.iter().map(|(dtype, _)| (*dtype, QTensor::quantize(&original, *dtype).unwrap())).collect();
    let labels: Vec<String> = quantized.iter().map(|(dtype, _)| type_label(*dtype)).collect();
    let named: Vec<(&str, &QTensor)> =
        labels.iter().zip(&quantized).map(|(label, (_, tensor))| (label.as_str(), tensor)).collect();
    write_gguf(&path, &[llama_architecture()], &named);
    let gguf = GgufFile::open(&path).unwrap();
    assert_eq!(gguf.tensors().len(), TOLERANCES.len());
    for ((dtype, tolerance), (_, in_memory)) in TOLERANCES.iter().zip(&quantized) {
        let name = type_label(*dtype);
        let entry = gguf.tensors().into_iter().find(|entry| entry.name == name).unwrap();
        assert_eq!((entry.dtype, entry.shape.as_slice()), (*dtype, [4, 512].as_slice()), "{name}");
        let read = gguf.dequantize(&name, DType::F32).unwrap();
        let expected = in_memory.dequantize(&Device::Cpu).unwrap();
        let error = relative_rms_error(&read, &original);
        eprintln!("{name}: relative RMS error {error:.2e} (tolerance {tolerance:.0e})");
        assert!(error <= *tolerance, "{name}: relative RMS error {error} above {tolerance}");
        assert_eq!(relative_rms_error(&read, &expected), 0.0, "{name}: the file's values differ from candle's");
        let bf16 = gguf.dequantize(&name, DType::BF16).unwrap();
        assert_eq!(bf16.dtype(), DType::BF16);
        let widened = bf16.to_dtype(DType::F32).unwrap();
        assert!(relative_rms_error(&widened, &read) < 4e-3, "{name}: bf16 is not the f32 values rounded");
    }
}

#[test]
fn a_gguf_of_another_architecture_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma3.gguf");
    write_gguf(&path, &[("general.architecture", string("gemma3"))], &[]);
    let error = GgufFile::open(&path).unwrap_err();
    assert!(matches!(error, GgufError::Architecture { .. }), "{error}");
    let message = error.to_string();
    for part in ["general.architecture", "gemma3", "llama", "qwen2"] {
        assert!(message.contains(part), "{message} does not name {part}");
    }
}

/// Rewrites bytes of a written file.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    edit(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

/// Where the bytes after a length-prefixed string (a key or a tensor name) start.
fn after_string(bytes: &[u8], text: &str) -> usize {
    let mut prefixed = (text.len() as u64).to_le_bytes().to_vec();
    prefixed.extend(text.as_bytes());
    bytes.windows(prefixed.len()).position(|window| window == prefixed).unwrap() + prefixed.len()
}

/// Where tensor `name`'s dimensions (GGUF order, columns first), type id and offset are.
struct TensorInfoAt {
    dimensions: Vec<usize>,
    type_id: usize,
    offset: usize,
}

fn tensor_info_at(bytes: &[u8], name: &str) -> TensorInfoAt {
    let at = after_string(bytes, name);
    let count = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let dimensions = (0..count).map(|index| at + 4 + 8 * index).collect();
    let type_id = at + 4 + 8 * count;
    TensorInfoAt { dimensions, type_id, offset: type_id + 4 }
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Writes one Q8_0 tensor named `name` and rewrites its type id to `type_id`.
fn gguf_with_type_id(path: &Path, name: &str, type_id: u32) {
    let tensor = QTensor::quantize(&gaussian(2, 64, 2), GgmlDType::Q8_0).unwrap();
    write_gguf(path, &[llama_architecture()], &[(name, &tensor)]);
    rewrite(path, |bytes| {
        let at = tensor_info_at(bytes, name).type_id;
        bytes[at..at + 4].copy_from_slice(&type_id.to_le_bytes());
    });
}

#[test]
fn a_gguf_tensor_of_an_unread_type_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    // Q8_1: candle parses the type but cannot load it; IQ4_NL (20): candle's reader stops at it.
    for (type_id, type_name) in [(9, "Q8_1"), (20, "IQ4_NL"), (77, "type 77")] {
        let path = dir.path().join(format!("type{type_id}.gguf"));
        gguf_with_type_id(&path, "blk.3.ffn_up.weight", type_id);
        let error = GgufFile::open(&path).unwrap_err();
        assert!(matches!(error, GgufError::TensorType { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("blk.3.ffn_up.weight") && message.contains(type_name), "{message}");
    }
}

/// A byte-level BPE trained by whale, as `tokenizer.json` and as the GGUF metadata llama.cpp's
/// converter would write for it.
struct TrainedTokenizer {
    json_file: PathBuf,
    tokens: Vec<String>,
    merges: Vec<String>,
}

const TRAINING_TEXTS: [&str; 6] = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? 48 + 24 = 72 clips in 2024.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Le café était très bon ; naïve façade, 東京 and 🐳 whales in the sea, 1234567890.",
    "def solve(x):\n    return x * 2  # doubling\n\n\tprint(solve(21))",
    "The answer is 42. #### 42",
];

fn train_tokenizer(dir: &Path) -> TrainedTokenizer {
    let corpus: Vec<&str> = TRAINING_TEXTS.iter().cycle().take(60).copied().collect();
    let tokenizer = Tokenizer::train_bpe(corpus, MIN_VOCAB_SIZE + 300).unwrap();
    let json_file = dir.join("tokenizer.json");
    tokenizer.save(&json_file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (token, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = token.clone();
    }
    let merges = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|merge| match merge {
            serde_json::Value::String(pair) => pair.clone(),
            pair => format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()),
        })
        .collect();
    TrainedTokenizer { json_file, tokens, merges }
}

fn tokenizer_metadata(trained: &TrainedTokenizer, pre: &str) -> Vec<(&'static str, Value)> {
    let id = |token: &str| Value::U32(trained.tokens.iter().position(|t| t == token).unwrap() as u32);
    let specials = [ENDOFTEXT, IM_START, IM_END];
    let types = trained.tokens.iter().map(|t| Value::I32(if specials.contains(&t.as_str()) { 3 } else { 1 }));
    vec![
        llama_architecture(),
        ("tokenizer.ggml.model", string("gpt2")),
        ("tokenizer.ggml.pre", string(pre)),
        ("tokenizer.ggml.tokens", strings(trained.tokens.iter().map(String::as_str))),
        ("tokenizer.ggml.merges", strings(trained.merges.iter().map(String::as_str))),
        ("tokenizer.ggml.token_type", Value::Array(types.collect())),
        ("tokenizer.ggml.bos_token_id", id(IM_START)),
        ("tokenizer.ggml.eos_token_id", id(IM_END)),
        ("tokenizer.ggml.padding_token_id", id(IM_END)),
        ("tokenizer.ggml.unknown_token_id", id(ENDOFTEXT)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.chat_template", string(whale_text::CHATML_TEMPLATE)),
    ]
}

const PROBES: [&str; 7] = [
    "Natalia sold 48 clips in April and 24 in May: 72 altogether.",
    "naïve café — 東京タワー 🐳🐋 ∫x dx",
    "<|im_start|>user\nWhat is 12 * 12?<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces,\ttabs\n\nand   runs   of spaces  ",
    "unseen words: zyzzyva quixotic Ærøskøbing",
    "1234567890 123 4 56",
    "",
];

#[test]
fn a_gguf_tokenizer_gives_the_ids_of_the_same_tokenizer_from_its_json() {
    let dir = tempfile::tempdir().unwrap();
    let trained = train_tokenizer(dir.path());
    let path = dir.path().join("vocab.gguf");
    write_gguf(&path, &tokenizer_metadata(&trained, "gpt-2"), &[]);
    let gguf = GgufFile::open(&path).unwrap();
    let from_gguf = gguf.tokenizer().unwrap();
    let from_json = Tokenizer::from_file(&trained.json_file).unwrap();
    assert_eq!(from_gguf.vocab_size(), from_json.vocab_size());
    assert_eq!(from_gguf.specials(), from_json.specials());
    for probe in PROBES {
        let ids = from_gguf.encode(probe).unwrap();
        assert_eq!(ids, from_json.encode(probe).unwrap(), "{probe:?}");
        assert_eq!(from_gguf.decode(&ids, false).unwrap(), probe);
    }
    let vocabulary = gguf.vocabulary().unwrap();
    assert_eq!(vocabulary.eos.map(|t| t.content).as_deref(), Some(IM_END));
    assert_eq!(vocabulary.added_tokens.iter().filter(|t| t.special).count(), 3);
}

#[test]
fn a_smollm_gguf_tokenizer_splits_every_digit_and_a_gpt2_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let trained = train_tokenizer(dir.path());
    assert!(trained.merges.iter().any(|merge| merge.chars().all(|c| c.is_ascii_digit() || c == ' ')), "no digit merge");
    let tokenizer = |pre: &str| {
        let path = dir.path().join(format!("{pre}.gguf"));
        write_gguf(&path, &tokenizer_metadata(&trained, pre), &[]);
        GgufFile::open(&path).unwrap().tokenizer().unwrap()
    };
    let (smollm, gpt2) = (tokenizer("smollm"), tokenizer("gpt-2"));
    let digits = "1234567890";
    assert_eq!(smollm.encode(digits).unwrap().len(), digits.len());
    assert!(gpt2.encode(digits).unwrap().len() < digits.len());
    assert_eq!(smollm.encode("Natalia sold clips").unwrap(), gpt2.encode("Natalia sold clips").unwrap());
}

#[test]
fn a_gguf_tokenizer_with_an_unknown_pre_tokenizer_or_model_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let trained = train_tokenizer(dir.path());
    let mut metadata = tokenizer_metadata(&trained, "mystery-pre");
    let path = dir.path().join("pre.gguf");
    write_gguf(&path, &metadata, &[]);
    let message = GgufFile::open(&path).unwrap().tokenizer().unwrap_err().to_string();
    assert!(message.contains("tokenizer.ggml.pre") && message.contains("mystery-pre"), "{message}");
    metadata[1].1 = string("llama");
    write_gguf(&path, &metadata, &[]);
    let message = GgufFile::open(&path).unwrap().tokenizer().unwrap_err().to_string();
    assert!(message.contains("tokenizer.ggml.model"), "{message}");
}

#[test]
fn a_gguf_chat_template_renders_with_the_file_s_special_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let trained = train_tokenizer(dir.path());
    let path = dir.path().join("template.gguf");
    let mut metadata = tokenizer_metadata(&trained, "gpt-2");
    metadata.pop();
    metadata.push(("tokenizer.chat_template", string("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}")));
    write_gguf(&path, &metadata, &[]);
    let template = GgufFile::open(&path).unwrap().chat_template().unwrap();
    let rendered = template.render(&[ChatMessage::new("user", "hi")], &RenderOptions::default()).unwrap();
    assert_eq!(rendered, format!("{IM_START}hi{IM_END}"));
}

/// A tiny Llama: hidden 64 (one Q8_0 block is 32 wide), 4 query heads and 2 key-value heads of 16.
const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const INNER: usize = 96;
const LAYERS: usize = 2;

/// llama.cpp's converter (`LlamaModel.permute`): each head's two halves interleaved row by row.
fn llama_cpp_permute(weight: &Tensor, heads: usize) -> Tensor {
    let (rows, columns) = weight.dims2().unwrap();
    let half = rows / heads / 2;
    weight
        .reshape((heads, 2, half, columns))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((rows, columns))
        .unwrap()
}

/// Hugging Face tensors of a tiny Llama and the GGUF names and F32 tensors llama.cpp writes for them.
fn tiny_llama(vocab: usize, tied: bool) -> (HashMap<String, Tensor>, Vec<(String, QTensor)>) {
    tiny_model(vocab, tied, GgufArchitecture::Llama)
}

/// [`tiny_llama`] of either architecture: a Qwen2's rotary rows are stored as they are, and its
/// blocks have query, key and value biases.
fn tiny_model(
    vocab: usize,
    tied: bool,
    architecture: GgufArchitecture,
) -> (HashMap<String, Tensor>, Vec<(String, QTensor)>) {
    let mut hf = HashMap::new();
    let mut gguf = Vec::new();
    let mut seed = 10;
    let mut add = |hf_name: String, gguf_name: String, shape: (usize, usize), permute_heads: Option<usize>| {
        seed += 1;
        let values = gaussian(shape.0, shape.1, seed);
        let values = if shape.0 == 1 { values.flatten_all().unwrap() } else { values };
        let permute_heads = permute_heads.filter(|_| architecture.interleaves_rotary_rows());
        let stored = permute_heads.map_or_else(|| values.clone(), |heads| llama_cpp_permute(&values, heads));
        gguf.push((gguf_name, QTensor::quantize(&stored, GgmlDType::F32).unwrap()));
        hf.insert(hf_name, values);
    };
    add("model.embed_tokens.weight".into(), "token_embd.weight".into(), (vocab, HIDDEN), None);
    add("model.norm.weight".into(), "output_norm.weight".into(), (1, HIDDEN), None);
    if !tied {
        add("lm_head.weight".into(), "output.weight".into(), (vocab, HIDDEN), None);
    }
    for layer in 0..LAYERS {
        let layer_tensors = [
            ("input_layernorm", "attn_norm", (1, HIDDEN), None),
            ("post_attention_layernorm", "ffn_norm", (1, HIDDEN), None),
            ("self_attn.q_proj", "attn_q", (HEADS * HEAD_DIM, HIDDEN), Some(HEADS)),
            ("self_attn.k_proj", "attn_k", (KV_HEADS * HEAD_DIM, HIDDEN), Some(KV_HEADS)),
            ("self_attn.v_proj", "attn_v", (KV_HEADS * HEAD_DIM, HIDDEN), None),
            ("self_attn.o_proj", "attn_output", (HIDDEN, HEADS * HEAD_DIM), None),
            ("mlp.gate_proj", "ffn_gate", (INNER, HIDDEN), None),
            ("mlp.up_proj", "ffn_up", (INNER, HIDDEN), None),
            ("mlp.down_proj", "ffn_down", (HIDDEN, INNER), None),
        ];
        for (hf_leaf, gguf_leaf, shape, heads) in layer_tensors {
            add(
                format!("model.layers.{layer}.{hf_leaf}.weight"),
                format!("blk.{layer}.{gguf_leaf}.weight"),
                shape,
                heads,
            );
        }
        if architecture.has_qkv_bias() {
            let biases = [("q_proj", "attn_q", HEADS), ("k_proj", "attn_k", KV_HEADS), ("v_proj", "attn_v", KV_HEADS)];
            for (hf_leaf, gguf_leaf, heads) in biases {
                let (hf_name, gguf_name) =
                    (format!("model.layers.{layer}.self_attn.{hf_leaf}.bias"), format!("blk.{layer}.{gguf_leaf}.bias"));
                add(hf_name, gguf_name, (1, heads * HEAD_DIM), None);
            }
        }
    }
    (hf, gguf)
}

fn llama_metadata() -> Vec<(&'static str, Value)> {
    model_metadata(GgufArchitecture::Llama)
}

/// The hyperparameters of the tiny model under the architecture's prefix.
fn model_metadata(architecture: GgufArchitecture) -> Vec<(&'static str, Value)> {
    let key = |name: &str| -> &'static str { Box::leak(architecture.key(name).into_boxed_str()) };
    vec![
        (key("block_count"), Value::U32(LAYERS as u32)),
        (key("context_length"), Value::U32(2048)),
        (key("embedding_length"), Value::U32(HIDDEN as u32)),
        (key("feed_forward_length"), Value::U32(INNER as u32)),
        (key("attention.head_count"), Value::U32(HEADS as u32)),
        (key("attention.head_count_kv"), Value::U32(KV_HEADS as u32)),
        (key("rope.freq_base"), Value::F32(100_000.0)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("rope.dimension_count"), Value::U32(HEAD_DIM as u32)),
    ]
}

fn write_tiny_llama(dir: &Path, tied: bool) -> (PathBuf, HashMap<String, Tensor>) {
    write_tiny_llama_with(dir, tied, Vec::new())
}

/// [`write_tiny_llama`] with more metadata (replacing the value of a key already there).
fn write_tiny_llama_with(
    dir: &Path,
    tied: bool,
    extra: Vec<(&'static str, Value)>,
) -> (PathBuf, HashMap<String, Tensor>) {
    write_tiny_llama_edited(dir, tied, extra, |_| {})
}

/// [`write_tiny_llama_with`], its GGUF tensors changed by `edit` before they are written.
fn write_tiny_llama_edited(
    dir: &Path,
    tied: bool,
    extra: Vec<(&'static str, Value)>,
    edit: impl FnOnce(&mut Vec<(String, QTensor)>),
) -> (PathBuf, HashMap<String, Tensor>) {
    let trained = train_tokenizer(dir);
    let (hf, mut gguf_tensors) = tiny_llama(trained.tokens.len(), tied);
    edit(&mut gguf_tensors);
    let mut metadata = tokenizer_metadata(&trained, "gpt-2");
    metadata.extend(llama_metadata());
    let metadata = with_metadata(metadata, extra);
    let path = dir.join("tiny-llama.gguf");
    let named: Vec<(&str, &QTensor)> = gguf_tensors.iter().map(|(name, tensor)| (name.as_str(), tensor)).collect();
    write_gguf(&path, &metadata, &named);
    (path, hf)
}

/// `metadata` with each of `extra` replacing the value of its key, or added.
fn with_metadata(
    mut metadata: Vec<(&'static str, Value)>,
    extra: Vec<(&'static str, Value)>,
) -> Vec<(&'static str, Value)> {
    for (key, value) in extra {
        match metadata.iter_mut().find(|(existing, _)| *existing == key) {
            Some(entry) => entry.1 = value,
            None => metadata.push((key, value)),
        }
    }
    metadata
}

fn read_json(file: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

#[test]
fn a_converted_gguf_is_the_hugging_face_llama_it_was_made_from() {
    for tied in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (path, hf) = write_tiny_llama(dir.path(), tied);
        let gguf = GgufFile::open(&path).unwrap();
        let out = dir.path().join("hf");
        let mut steps = 0;
        let report = convert_to_hf(&gguf, &out, DType::F32, &mut |_| steps += 1).unwrap();
        assert_eq!((report.tensors, report.tied_embeddings), (hf.len(), tied));
        assert_eq!(steps, hf.len() + 5);
        let written = candle_core::safetensors::load(out.join("model.safetensors"), &Device::Cpu).unwrap();
        let mut names: Vec<_> = written.keys().cloned().collect();
        names.sort();
        let mut expected_names: Vec<_> = hf.keys().cloned().collect();
        expected_names.sort();
        assert_eq!(names, expected_names);
        for (name, values) in &hf {
            let diff = written[name].sub(values).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(diff, 0.0, "{name} differs from the Hugging Face tensor");
        }
        let config = read_json(&out.join("config.json"));
        assert_eq!(config["architectures"][0], "LlamaForCausalLM");
        assert_eq!(config["tie_word_embeddings"], tied);
        assert_eq!(config["num_key_value_heads"], KV_HEADS);
        assert_eq!(config["head_dim"], HEAD_DIM);
        assert_eq!(config["rms_norm_eps"], 1e-5);
        assert_eq!(config["rope_theta"], 100_000.0);
        assert_eq!(config["vocab_size"], hf["model.embed_tokens.weight"].dims()[0]);
        let from_dir = Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
        let from_gguf = gguf.tokenizer().unwrap();
        for probe in PROBES {
            assert_eq!(from_dir.encode(probe).unwrap(), from_gguf.encode(probe).unwrap(), "{probe:?}");
        }
        let messages = [ChatMessage::new("user", "What is 6 * 7?")];
        let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
        let rendered = ChatTemplate::from_model_dir(&out).unwrap().render(&messages, &options).unwrap();
        assert_eq!(rendered, gguf.chat_template().unwrap().render(&messages, &options).unwrap());
        let tokenizer_config = read_json(&out.join("tokenizer_config.json"));
        assert_eq!(
            (tokenizer_config["eos_token"].as_str(), tokenizer_config["add_bos_token"].as_bool()),
            (Some(IM_END), Some(false))
        );
        assert_eq!(read_json(&out.join("generation_config.json"))["eos_token_id"], from_gguf.specials().im_end);
    }
}

#[test]
fn a_converted_gguf_in_bf16_holds_the_f32_values_rounded() {
    let dir = tempfile::tempdir().unwrap();
    let (path, hf) = write_tiny_llama(dir.path(), true);
    let out = dir.path().join("hf");
    convert_to_hf(&GgufFile::open(&path).unwrap(), &out, DType::BF16, &mut |_| {}).unwrap();
    let written = candle_core::safetensors::load(out.join("model.safetensors"), &Device::Cpu).unwrap();
    let q_proj = &written["model.layers.1.self_attn.q_proj.weight"];
    assert_eq!(q_proj.dtype(), DType::BF16);
    let rounded = hf["model.layers.1.self_attn.q_proj.weight"].to_dtype(DType::BF16).unwrap();
    assert_eq!(
        q_proj.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap(),
        rounded.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap()
    );
    assert_eq!(read_json(&out.join("config.json"))["torch_dtype"], "bfloat16");
}

/// A Qwen2 GGUF (rows as stored, q/k/v biases, `qwen2.*` sizes, Qwen2's split) converts to the
/// Hugging Face `Qwen2ForCausalLM` it was made from, which whale-lm loads as a Qwen2 and runs
/// with its biases: equal logits from the converted directory and from the original tensors.
#[test]
fn a_converted_qwen2_gguf_is_the_hugging_face_qwen2_it_was_made_from() {
    let dir = tempfile::tempdir().unwrap();
    let trained = train_tokenizer(dir.path());
    let (hf, gguf_tensors) = tiny_model(trained.tokens.len(), false, GgufArchitecture::Qwen2);
    let mut metadata = tokenizer_metadata(&trained, "qwen2");
    metadata.extend(model_metadata(GgufArchitecture::Qwen2));
    metadata[0] = ("general.architecture", string("qwen2"));
    let path = dir.path().join("tiny-qwen2.gguf");
    let named: Vec<(&str, &QTensor)> = gguf_tensors.iter().map(|(name, tensor)| (name.as_str(), tensor)).collect();
    write_gguf(&path, &metadata, &named);
    let gguf = GgufFile::open(&path).unwrap();
    assert_eq!(gguf.architecture().unwrap(), GgufArchitecture::Qwen2);
    let out = dir.path().join("hf");
    let report = convert_to_hf(&gguf, &out, DType::F32, &mut |_| {}).unwrap();
    assert_eq!((report.tensors, report.tied_embeddings), (hf.len(), false));
    let written = candle_core::safetensors::load(out.join("model.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(written.len(), hf.len());
    for (name, values) in &hf {
        let diff = written[name].sub(values).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(diff, 0.0, "{name} differs from the Hugging Face tensor");
    }
    let config = read_json(&out.join("config.json"));
    assert_eq!(
        (config["architectures"][0].as_str(), config["model_type"].as_str()),
        (Some("Qwen2ForCausalLM"), Some("qwen2"))
    );
    assert_eq!((config["use_sliding_window"].as_bool(), config.get("attention_bias")), (Some(false), None));
    let tokenizer = read_json(&out.join("tokenizer.json"));
    assert_eq!(tokenizer["normalizer"]["type"], "NFC");
    let decoder = Decoder::load(&out, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(decoder.architecture(), "Qwen2");
    let config = whale_lm::Qwen2Config::from_file(&out.join("config.json")).unwrap();
    let original = whale_lm::Qwen2Model::from_tensors(&config, hf, DType::F32, &Device::Cpu).unwrap();
    let ids = [3u32, 17, 42, 5, 9, 11];
    let converted = <whale_lm::Qwen2Model as whale_lm::TrainableModel>::load(&out, DType::F32, &Device::Cpu).unwrap();
    let logits = |model: &whale_lm::Qwen2Model| -> Vec<f32> {
        model.logits(&model.packed_hidden(&[&ids]).unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    };
    assert_eq!(logits(&converted), logits(&original));
}

#[test]
fn a_gguf_missing_a_layer_tensor_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let trained = train_tokenizer(dir.path());
    let (_, gguf_tensors) = tiny_llama(trained.tokens.len(), true);
    let mut metadata = tokenizer_metadata(&trained, "gpt-2");
    metadata.extend(llama_metadata());
    let kept: Vec<(&str, &QTensor)> = gguf_tensors
        .iter()
        .filter(|(name, _)| name != "blk.1.attn_k.weight")
        .map(|(name, tensor)| (name.as_str(), tensor))
        .collect();
    let path = dir.path().join("missing.gguf");
    write_gguf(&path, &metadata, &kept);
    let error =
        convert_to_hf(&GgufFile::open(&path).unwrap(), &dir.path().join("hf"), DType::F32, &mut |_| {}).unwrap_err();
    assert!(error.to_string().contains("blk.1.attn_k.weight"), "{error}");
}

/// The real SmolLM2-135M-Instruct GGUF (`whale lm fetch smollm2` puts it in $WHALE_HOME/models).
fn smollm2() -> GgufFile {
    let path =
        std::env::var_os("WHALE_SMOLLM2_GGUF").expect("set WHALE_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
    GgufFile::open(path).unwrap()
}

#[test]
#[ignore = "needs WHALE_SMOLLM2_GGUF"]
fn the_smollm2_gguf_reads_as_its_model_card_says() {
    let gguf = smollm2();
    let shape = gguf.hyperparameters().unwrap();
    assert_eq!((shape.layers, shape.hidden_size, shape.heads, shape.kv_heads), (30, 576, 9, 3));
    assert_eq!((shape.head_dim, shape.intermediate_size, shape.context_length), (64, 1536, 8192));
    assert_eq!((shape.rope_theta, shape.rms_norm_eps), (100_000.0, 1e-5));
    let entries = gguf.tensors();
    let count = |dtype| entries.iter().filter(|entry| entry.dtype == dtype).count();
    assert_eq!((count(GgmlDType::Q4_1), count(GgmlDType::Q8_0), count(GgmlDType::F32)), (210, 1, 61));
    assert!(!gguf.has_tensor("output.weight"), "SmolLM2 ties its embeddings");
    let shape_of = |name: &str| entries.iter().find(|entry| entry.name == name).unwrap().shape.clone();
    assert_eq!(shape_of("token_embd.weight"), [49_152, 576]);
    assert_eq!(shape_of("blk.0.attn_q.weight"), [576, 576]);
    assert_eq!(shape_of("blk.29.attn_k.weight"), [192, 576]);
    assert_eq!(shape_of("blk.7.ffn_down.weight"), [576, 1536]);
    assert_eq!(shape_of("output_norm.weight"), [576]);
    let embedding = gguf.dequantize("token_embd.weight", DType::F32).unwrap();
    assert_eq!(embedding.dims(), [49_152, 576]);
    let rms = embedding.sqr().unwrap().mean_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
    assert!(rms > 0.01 && rms < 1.0, "embedding RMS {rms}");
}

#[test]
#[ignore = "needs WHALE_SMOLLM2_GGUF"]
fn the_smollm2_gguf_tokenizer_and_chat_template_are_smollm2_s() {
    let gguf = smollm2();
    let tokenizer = gguf.tokenizer().unwrap();
    assert_eq!(tokenizer.vocab_size(), 49_152);
    let specials = tokenizer.specials();
    assert_eq!((specials.endoftext, specials.im_start, specials.im_end), (0, 1, 2));
    // SmolLM2's own tokenizer.json splits every digit before GPT-2's split (as llama.cpp's
    // "smollm" pre-tokenizer does): "x   1" is x, two spaces, 1. transformers' GGUF loader
    // leaves out the digit split and gives x, one space, one space, 1 ([104, 256, 216, 33]).
    assert_eq!(tokenizer.encode("Hello, world! 2024 was a good year.").unwrap(), SMOLLM2_HELLO_IDS);
    assert_eq!(tokenizer.encode("x   1").unwrap(), [104, 333, 33]);
    let text = "naïve café — 東京 🐳, 12 + 30 = 42";
    assert_eq!(tokenizer.decode(&tokenizer.encode(text).unwrap(), false).unwrap(), text);
    let vocabulary = gguf.vocabulary().unwrap();
    assert_eq!(vocabulary.eos.unwrap().content, IM_END);
    assert_eq!(vocabulary.pad.unwrap().content, IM_END);
    assert!(!vocabulary.add_bos_token);
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let rendered = gguf.chat_template().unwrap().render(&[ChatMessage::new("user", "Hi")], &options).unwrap();
    let system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
    assert_eq!(rendered, format!("{system}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
}

/// "Hello, world! 2024 was a good year." in SmolLM2's vocabulary (the same ids from
/// transformers' tokenizer of the GGUF and from a tokenizer of SmolLM2's own pre-tokenizer).
const SMOLLM2_HELLO_IDS: [u32; 14] = [19556, 28, 905, 17, 216, 34, 32, 34, 36, 436, 253, 1123, 713, 30];

#[test]
#[ignore = "needs WHALE_SMOLLM2_GGUF"]
fn the_smollm2_gguf_converts_to_a_tied_llama_directory_whale_reads_back() {
    let gguf = smollm2();
    let dir = tempfile::tempdir().unwrap();
    let report = convert_to_hf(&gguf, dir.path(), DType::F32, &mut |_| {}).unwrap();
    assert_eq!((report.tensors, report.parameters, report.tied_embeddings), (272, 134_515_008, true));
    let config = read_json(&dir.path().join("config.json"));
    assert_eq!((config["num_hidden_layers"].as_u64(), config["vocab_size"].as_u64()), (Some(30), Some(49_152)));
    assert_eq!((config["eos_token_id"].as_u64(), config["pad_token_id"].as_u64()), (Some(2), Some(2)));
    let written = candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(!written.contains_key("lm_head.weight"));
    let stored = gguf.dequantize("blk.0.attn_k.weight", DType::F32).unwrap();
    let k_proj = &written["model.layers.0.self_attn.k_proj.weight"];
    assert_eq!(llama_cpp_permute(k_proj, 3).to_vec2::<f32>().unwrap(), stored.to_vec2::<f32>().unwrap());
    let from_dir = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let from_gguf = gguf.tokenizer().unwrap();
    for probe in PROBES {
        assert_eq!(from_dir.encode(probe).unwrap(), from_gguf.encode(probe).unwrap(), "{probe:?}");
    }
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let messages = [ChatMessage::new("user", "Hi")];
    let rendered = ChatTemplate::from_model_dir(dir.path()).unwrap().render(&messages, &options).unwrap();
    assert_eq!(rendered, gguf.chat_template().unwrap().render(&messages, &options).unwrap());
}

#[test]
fn a_converted_gguf_runs_in_whale_as_the_llama_it_was_made_from() {
    use whale_lm::decoder::DecoderStep;
    use whale_text::TOKENIZER_FILE;
    let dir = tempfile::tempdir().unwrap();
    let (path, hf) = write_tiny_llama(dir.path(), true);
    let out = dir.path().join("hf");
    convert_to_hf(&GgufFile::open(&path).unwrap(), &out, DType::F32, &mut |_| {}).unwrap();
    let decoder = Decoder::load(&out, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(decoder.architecture(), "Llama");
    let model = whale_lm::load_dense::<whale_lm::LlamaConfig>(&out, DType::F32, &Device::Cpu).unwrap();
    assert!(!model.settings().qk_norm, "Llama has no per-head query and key norms");
    let loaded = model.named_parameters();
    assert_eq!(loaded.len(), hf.len());
    for (name, var) in loaded {
        let diff = var.as_tensor().sub(&hf[&name]).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{name}");
    }
    // What the engine reads of the directory (whale-engine's `LocalPolicy::load`): the model
    // through the registry, the tokenizer and the chat template; then one decoding step.
    let tokenizer = Tokenizer::from_file(out.join(TOKENIZER_FILE)).unwrap();
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let prompt = ChatTemplate::from_model_dir(&out).unwrap().render(&[ChatMessage::new("user", "6 * 7?")], &options);
    let ids = tokenizer.encode(&prompt.unwrap()).unwrap();
    let mut cache = decoder.new_cache().unwrap();
    let logits = decoder.forward_step(&mut [DecoderStep { tokens: &ids, cache: &mut cache }]).unwrap();
    assert_eq!(logits.dims(), [1, decoder.vocab_size()]);
    assert!(logits.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
}

/// A GGUF's rope scaling is written into `config.json` as whale-lm's Llama config reads it:
/// linear scaling loads with its factor; YaRN, which whale does not compute, is written for the
/// tools that do and refused at load, naming the field and the value.
#[test]
fn a_gguf_s_rope_scaling_reaches_the_config_as_whale_reads_it() {
    let scaled = |kind: &str, extra: Vec<(&'static str, Value)>| {
        let dir = tempfile::tempdir().unwrap();
        let mut metadata =
            vec![("llama.rope.scaling.type", string(kind)), ("llama.rope.scaling.factor", Value::F32(4.0))];
        metadata.extend(extra);
        let (path, _) = write_tiny_llama_with(dir.path(), true, metadata);
        let out = dir.path().join("hf");
        convert_to_hf(&GgufFile::open(&path).unwrap(), &out, DType::F32, &mut |_| {}).unwrap();
        (dir, out)
    };
    let (_linear_dir, linear) = scaled("linear", Vec::new());
    assert_eq!(
        read_json(&linear.join("config.json"))["rope_scaling"],
        serde_json::json!({"rope_type": "linear", "factor": 4.0})
    );
    let config = whale_lm::LlamaConfig::from_file(&linear.join("config.json")).unwrap();
    assert_eq!(config.own.rope_scaling, Some(whale_lm::RopeScaling::Linear { factor: 4.0 }));
    assert_eq!(Decoder::load(&linear, DType::F32, &Device::Cpu).unwrap().architecture(), "Llama");

    let (_yarn_dir, yarn) = scaled("yarn", vec![("llama.rope.scaling.original_context_length", Value::U32(512))]);
    assert_eq!(read_json(&yarn.join("config.json"))["rope_scaling"]["rope_type"], "yarn");
    let error = Decoder::load(&yarn, DType::F32, &Device::Cpu).err().expect("YaRN is refused").to_string();
    for part in ["config.json", "`rope_scaling.rope_type`", "\"yarn\""] {
        assert!(error.contains(part), "{error:?} does not name {part}");
    }
}

// Hostile or malformed files: each is refused with an error naming the key or the tensor, never
// a panic, an abort or an allocation the file's size does not justify.

/// A GGUF whose one metadata value is `depth` arrays, each holding the next.
fn gguf_of_nested_arrays(path: &Path, depth: usize) {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend(4u64.to_le_bytes());
    bytes.extend(b"deep");
    bytes.extend(9u32.to_le_bytes());
    for _ in 0..depth {
        bytes.extend(9u32.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
    }
    bytes.extend(4u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_gguf_of_deeply_nested_arrays_is_refused_without_overflowing_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep.gguf");
    // 2^20 levels (12 MiB): a walk recursing without a limit overflows any thread's stack.
    gguf_of_nested_arrays(&path, 1 << 20);
    let error = GgufFile::open(&path).unwrap_err();
    assert!(matches!(error, GgufError::Header { .. }) && error.to_string().contains("depth"), "{error}");
}

/// candle stops at the bad bool before it reaches the tensor's unknown type: the refusal is
/// candle's, not a tensor type found by a walk that reads past the bool.
#[test]
fn a_gguf_refused_by_candle_for_another_reason_is_not_blamed_on_a_tensor_type() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bool.gguf");
    let tensor = QTensor::quantize(&gaussian(2, 64, 2), GgmlDType::Q8_0).unwrap();
    write_gguf(&path, &[llama_architecture(), ("flag", Value::Bool(true))], &[("t.weight", &tensor)]);
    rewrite(&path, |bytes| {
        let at = after_string(bytes, "flag") + 4;
        bytes[at] = 2;
        let at = tensor_info_at(bytes, "t.weight").type_id;
        bytes[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
    });
    let error = GgufFile::open(&path).unwrap_err();
    assert!(matches!(error, GgufError::Header { .. }) && error.to_string().contains("bool"), "{error}");
}

#[test]
fn a_gguf_alignment_of_zero_not_a_power_of_two_or_not_an_integer_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alignment.gguf");
    let tensor = QTensor::quantize(&gaussian(2, 64, 2), GgmlDType::F32).unwrap();
    // candle drops a key's trailing NULs: "general.alignment\0" is the same key.
    let cases =
        [("", Value::U32(0)), ("", Value::U8(0)), ("", Value::I32(0)), ("", Value::U32(48)), ("\0", Value::U32(0))];
    for (nul, alignment) in cases {
        let key = format!("general.alignment{nul}");
        let metadata = [llama_architecture(), (key.as_str(), alignment.clone())];
        write_gguf(&path, &metadata, &[("t.weight", &tensor)]);
        let error = GgufFile::open(&path).unwrap_err();
        assert!(matches!(error, GgufError::InvalidKey { .. }), "{alignment:?}: {error}");
        assert!(error.to_string().contains("general.alignment"), "{error}");
    }
    // candle ignores an alignment of another type and reads the tensors at 32 bytes.
    for (alignment, name) in [
        (Value::U64(64), "u64"),
        (Value::I64(-32), "i64"),
        (Value::F32(32.0), "f32"),
        (Value::String("32".into()), "string"),
    ] {
        let metadata = [llama_architecture(), ("general.alignment", alignment.clone())];
        write_gguf(&path, &metadata, &[("t.weight", &tensor)]);
        let error = GgufFile::open(&path).unwrap_err();
        assert!(matches!(error, GgufError::InvalidKey { .. }), "{alignment:?}: {error}");
        assert!(error.to_string().contains(&format!("general.alignment`: a {name} value")), "{error}");
    }
    // A 32 of those types is what candle reads at, so those files read.
    for alignment in [Value::U32(32), Value::U64(32), Value::I64(32)] {
        write_gguf(&path, &[llama_architecture(), ("general.alignment", alignment.clone())], &[("t.weight", &tensor)]);
        let weight = GgufFile::open(&path).unwrap().dequantize("t.weight", DType::F32).unwrap();
        assert_eq!(weight.to_vec2::<f32>().unwrap(), gaussian(2, 64, 2).to_vec2::<f32>().unwrap(), "{alignment:?}");
    }
}

#[test]
fn a_gguf_block_count_beyond_its_tensors_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_tiny_llama_with(dir.path(), true, vec![("llama.block_count", Value::U64(1_000_000_000_000))]);
    let gguf = GgufFile::open(&path).unwrap();
    let error = convert_to_hf(&gguf, &dir.path().join("hf"), DType::F32, &mut |_| {}).unwrap_err();
    assert!(
        matches!(error, GgufError::InvalidKey { .. }) && error.to_string().contains("llama.block_count"),
        "{error}"
    );
}

#[test]
fn a_gguf_tensor_whose_size_overflows_or_passes_the_file_end_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sizes.gguf");
    let f32 = QTensor::quantize(&gaussian(2, 64, 3), GgmlDType::F32).unwrap();
    let q8 = QTensor::quantize(&gaussian(2, 64, 3), GgmlDType::Q8_0).unwrap();
    type Patch = fn(&mut [u8], &TensorInfoAt);
    let cases: [(&str, &QTensor, Patch); 5] = [
        ("2^62 columns (2^65 bytes, 0 wrapped)", &f32, |b, at| put_u64(b, at.dimensions[0], 1 << 62)),
        ("2^32 x 2^32 elements (0 wrapped)", &f32, |b, at| {
            put_u64(b, at.dimensions[0], 1 << 32);
            put_u64(b, at.dimensions[1], 1 << 32);
        }),
        ("past the file end", &f32, |b, at| put_u64(b, at.dimensions[0], 4096)),
        ("offset past the file end", &f32, |b, at| put_u64(b, at.offset, u64::MAX - 8)),
        ("not whole Q8_0 blocks", &q8, |b, at| put_u64(b, at.dimensions[0], 40)),
    ];
    for (case, tensor, patch) in cases {
        write_gguf(&path, &[llama_architecture()], &[("t.weight", tensor)]);
        rewrite(&path, |bytes| {
            let at = tensor_info_at(bytes, "t.weight");
            patch(bytes, &at);
        });
        let error = GgufFile::open(&path).unwrap_err();
        assert!(matches!(error, GgufError::Tensor { .. }) && error.to_string().contains("t.weight"), "{case}: {error}");
    }
}

#[test]
fn a_gguf_tensor_of_the_wrong_shape_is_refused_before_any_tensor_is_dequantized() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_tiny_llama(dir.path(), true);
    // ffn_down is [hidden, inner]; swapped it holds the same bytes as [inner, hidden].
    rewrite(&path, |bytes| {
        let at = tensor_info_at(bytes, "blk.1.ffn_down.weight");
        put_u64(bytes, at.dimensions[0], HIDDEN as u64);
        put_u64(bytes, at.dimensions[1], INNER as u64);
    });
    let mut dequantized = 0;
    let mut count = |step: ConvertProgress| dequantized += usize::from(matches!(step, ConvertProgress::Tensor { .. }));
    let error = convert_to_hf(&GgufFile::open(&path).unwrap(), &dir.path().join("hf"), DType::F32, &mut count);
    let error = error.unwrap_err().to_string();
    assert!(error.contains("blk.1.ffn_down.weight"), "{error}");
    assert_eq!(dequantized, 0, "tensors were dequantized before the shape was checked");
}

/// A metadata-only Llama GGUF, `llama_metadata` with `extra` keys replaced or added.
fn llama_hyperparameters_with(extra: Vec<(&'static str, Value)>) -> Result<whale_gguf::Hyperparameters, GgufError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hyper.gguf");
    let mut metadata = vec![llama_architecture()];
    metadata.extend(llama_metadata());
    write_gguf(&path, &with_metadata(metadata, extra), &[]);
    GgufFile::open(&path).unwrap().hyperparameters()
}

#[test]
fn a_gguf_head_size_of_zero_odd_or_overflowing_is_refused_naming_the_key() {
    for head_dim in [0, 15, 1 << 62] {
        let error = llama_hyperparameters_with(vec![("llama.rope.dimension_count", Value::U64(head_dim))]).unwrap_err();
        assert!(error.to_string().contains("llama.rope.dimension_count"), "{head_dim}: {error}");
    }
    assert_eq!(llama_hyperparameters_with(Vec::new()).unwrap().head_dim, HEAD_DIM);
}

#[test]
fn a_gguf_float_hyperparameter_not_finite_and_positive_is_refused_naming_the_key() {
    let linear = || ("llama.rope.scaling.type", string("linear"));
    for key in ["llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "llama.rope.scaling.factor"] {
        for value in [f32::NAN, -1.0, 0.0, f32::INFINITY] {
            let error = llama_hyperparameters_with(vec![linear(), (key, Value::F32(value))]).unwrap_err();
            assert!(error.to_string().contains(key), "{key} = {value}: {error}");
        }
    }
    let scaled = llama_hyperparameters_with(vec![linear(), ("llama.rope.scaling.factor", Value::F32(2.0))]).unwrap();
    assert_eq!(scaled.rope_scaling, Some(whale_gguf::RopeScaling::Linear { factor: 2.0 }));
}

/// The error of converting a tiny Llama with `extra` metadata and its tensors changed by `edit`.
fn convert_error(
    tied: bool,
    extra: Vec<(&'static str, Value)>,
    edit: impl FnOnce(&mut Vec<(String, QTensor)>),
) -> (GgufError, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_tiny_llama_edited(dir.path(), tied, extra, edit);
    let gguf = GgufFile::open(&path).unwrap();
    (convert_to_hf(&gguf, &dir.path().join("hf"), DType::F32, &mut |_| {}).unwrap_err(), dir)
}

fn replace_tensor(tensors: &mut [(String, QTensor)], name: &str, rows: usize) {
    let entry = tensors.iter_mut().find(|(existing, _)| existing == name).unwrap();
    entry.1 = QTensor::quantize(&gaussian(rows, HIDDEN, 4), GgmlDType::F32).unwrap();
}

#[test]
fn a_gguf_whose_vocabulary_sizes_disagree_is_refused_naming_the_key_or_tensor() {
    let tokens = train_tokenizer(tempfile::tempdir().unwrap().path()).tokens.len();
    let (error, _dir) = convert_error(true, vec![("llama.vocab_size", Value::U32(tokens as u32 + 1))], |_| {});
    assert!(error.to_string().contains("llama.vocab_size"), "{error}");
    let (error, _dir) = convert_error(true, Vec::new(), |t| replace_tensor(t, "token_embd.weight", tokens - 1));
    assert!(error.to_string().contains("token_embd.weight"), "{error}");
    let (error, _dir) = convert_error(false, Vec::new(), |t| replace_tensor(t, "output.weight", tokens + 1));
    assert!(error.to_string().contains("output.weight"), "{error}");
}

#[test]
fn a_gguf_merge_of_unknown_tokens_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut merges = train_tokenizer(dir.path()).merges;
    merges.push("zzq zzr".to_string());
    let merges = ("tokenizer.ggml.merges", strings(merges.iter().map(String::as_str)));
    let (path, _) = write_tiny_llama_with(dir.path(), true, vec![merges]);
    let out = dir.path().join("hf");
    let error = convert_to_hf(&GgufFile::open(&path).unwrap(), &out, DType::F32, &mut |_| {}).unwrap_err();
    assert!(error.to_string().contains("tokenizer.ggml.merges"), "{error}");
    assert!(!out.exists(), "a refused conversion wrote {}", out.display());
}

#[test]
fn a_gguf_layer_number_not_in_canonical_decimal_is_refused_naming_the_tensor() {
    for name in ["blk.01.attn_norm.weight", "blk.+1.attn_norm.weight"] {
        let norm = QTensor::quantize(&gaussian(1, HIDDEN, 5).flatten_all().unwrap(), GgmlDType::F32).unwrap();
        let (error, _dir) = convert_error(true, Vec::new(), |t| t.push((name.to_string(), norm)));
        assert!(error.to_string().contains(name), "{error}");
    }
}
