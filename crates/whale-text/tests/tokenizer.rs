use std::path::{Path, PathBuf};

use whale_text::{Tokenizer, TokenizerError, ENDOFTEXT, IM_END, IM_START, MIN_VOCAB_SIZE};

fn shared_data() -> PathBuf {
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if beside_repo.exists() {
        return beside_repo;
    }
    PathBuf::from(std::env::var("WHALE_SHARED_DATA").expect("shared data: set WHALE_SHARED_DATA"))
}

/// Question and answer texts of a GSM8K file.
fn gsm8k_texts(file: &str) -> Vec<String> {
    let path = shared_data().join("math/gsm8k").join(file);
    let text = std::fs::read_to_string(&path).expect("gsm8k file");
    text.lines()
        .flat_map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).expect("gsm8k json line");
            ["question", "answer"].map(|key| record[key].as_str().expect("string field").to_string())
        })
        .collect()
}

fn train_on_gsm8k_test(vocab_size: usize) -> Tokenizer {
    let corpus = gsm8k_texts("test.jsonl");
    Tokenizer::train_bpe(corpus.iter().map(String::as_str), vocab_size).expect("training")
}

#[test]
fn trained_bpe_fills_the_vocabulary_and_round_trips_every_text() {
    let tokenizer = train_on_gsm8k_test(1024);
    assert_eq!(tokenizer.vocab_size(), 1024);
    let specials = tokenizer.specials();
    assert_eq!((specials.endoftext, specials.im_start, specials.im_end), (0, 1, 2));

    let held_out = gsm8k_texts("train.jsonl");
    let sample = &held_out[..2000];
    let (mut bytes, mut tokens) = (0, 0);
    for text in sample {
        let ids = tokenizer.encode(text).expect("encode");
        assert_eq!(&tokenizer.decode(&ids, false).expect("decode"), text);
        bytes += text.len();
        tokens += ids.len();
    }
    let bytes_per_token = bytes as f64 / tokens as f64;
    assert!(
        bytes_per_token > 2.0,
        "merges should at least halve the token count of held-out text: {bytes_per_token:.2} bytes/token"
    );

    for text in ["naïve café 🐳 — ∫x dx", "tabs\tand\r\nnewlines  ", "", "\u{0}\u{7f}"] {
        let ids = tokenizer.encode(text).expect("encode");
        assert_eq!(tokenizer.decode(&ids, false).expect("decode"), text, "{text:?}");
    }
}

#[test]
fn chatml_markers_are_single_ids_and_can_be_skipped_on_decode() {
    let tokenizer = train_on_gsm8k_test(512);
    let specials = tokenizer.specials();
    assert_eq!(tokenizer.token_id(IM_START), Some(specials.im_start));
    assert_eq!(tokenizer.token_id(IM_END), Some(specials.im_end));
    assert_eq!(tokenizer.token_id(ENDOFTEXT), Some(specials.endoftext));

    let text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|><|endoftext|>";
    let ids = tokenizer.encode(text).expect("encode");
    assert_eq!(ids[0], specials.im_start);
    assert_eq!(ids.iter().filter(|&&id| id == specials.im_start).count(), 2);
    assert_eq!(ids.iter().filter(|&&id| id == specials.im_end).count(), 2);
    assert_eq!(ids.last(), Some(&specials.endoftext));
    assert_eq!(tokenizer.decode(&ids, false).expect("decode"), text);
    assert_eq!(tokenizer.decode(&ids, true).expect("decode"), "user\nWhat is 2+2?\nassistant\n4");

    // A marker's characters outside the exact marker are ordinary text, not the special id.
    let near_miss = tokenizer.encode("<|im_start |>").expect("encode");
    assert!(!near_miss.contains(&specials.im_start));
}

#[test]
fn training_is_deterministic_and_saved_files_load_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, second) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let trained = train_on_gsm8k_test(768);
    trained.save(&first).expect("save");
    train_on_gsm8k_test(768).save(&second).expect("save");
    let first_json = std::fs::read_to_string(&first).expect("read");
    assert_eq!(first_json, std::fs::read_to_string(&second).expect("read"));

    let loaded = Tokenizer::from_file(&first).expect("load");
    assert_eq!(loaded.vocab_size(), trained.vocab_size());
    assert_eq!(loaded.specials(), trained.specials());
    let text = "Natalia sold clips to 48 of her friends in April.<|im_end|>";
    assert_eq!(loaded.encode(text).expect("encode"), trained.encode(text).expect("encode"));
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope/tokenizer.json");
    let err = Tokenizer::from_file(&missing).expect_err("missing file");
    assert!(matches!(err, TokenizerError::Read { .. }));
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");

    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"model\": ").expect("write");
    let err = Tokenizer::from_file(&broken).expect_err("bad json");
    assert!(matches!(err, TokenizerError::Parse { .. }));
    assert!(err.to_string().contains("broken.json"), "{err}");

    let saved = dir.path().join("tokenizer.json");
    train_on_gsm8k_test(512).save(&saved).expect("save");
    let renamed = std::fs::read_to_string(&saved).expect("read").replace(IM_END, "<|im_stop|>");
    let without_im_end = dir.path().join("no_im_end.json");
    std::fs::write(&without_im_end, renamed).expect("write");
    let err = Tokenizer::from_file(&without_im_end).expect_err("no <|im_end|>");
    assert!(matches!(err, TokenizerError::MissingSpecial { token: IM_END, .. }), "{err}");
    assert!(err.to_string().contains("no_im_end.json"), "{err}");
}

#[test]
fn vocabulary_must_hold_bytes_and_specials() {
    let err = Tokenizer::train_bpe(["some text"], MIN_VOCAB_SIZE - 1).expect_err("too small");
    assert!(matches!(err, TokenizerError::VocabTooSmall { requested } if requested == MIN_VOCAB_SIZE - 1));
    let smallest = Tokenizer::train_bpe(["some text some text"], MIN_VOCAB_SIZE).expect("train");
    assert_eq!(smallest.vocab_size(), MIN_VOCAB_SIZE);
    let ids = smallest.encode("any bytes ✓").expect("encode");
    assert_eq!(smallest.decode(&ids, false).expect("decode"), "any bytes ✓");
}
