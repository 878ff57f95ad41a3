//! Bad inputs are errors that say what is wrong, never panics: unsupported tokenizer kinds and
//! pre-tokenizers, missing or mistyped metadata, truncated or corrupted GGUF files, bad files.

#[path = "tokenizer_common.rs"]
mod common;

use common::*;
use proptest::prelude::*;
use radix_models::tokenizer::{Tokenizer, TokenizerError};
use radix_templates::gguf::{GgufMetadata, GgufValue};

fn error_of(metadata: &GgufMetadata) -> TokenizerError {
    Tokenizer::from_gguf_metadata(metadata).expect_err("metadata should be rejected")
}

fn with(key: &str, value: Option<GgufValue>) -> GgufMetadata {
    let mut metadata = smollm2_metadata().clone();
    match value {
        Some(value) => metadata.insert(key.to_owned(), value),
        None => metadata.remove(key),
    };
    metadata
}

#[test]
fn unknown_pre_tokenizer_is_named() {
    let err = error_of(&with("tokenizer.ggml.pre", Some(GgufValue::String("mystery-bpe".into()))));
    assert!(matches!(err, TokenizerError::UnsupportedPreTokenizer { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("\"mystery-bpe\"") && message.contains("smollm") && message.contains("qwen2"),
        "{message}"
    );
}

#[test]
fn absent_pre_tokenizer_means_default() {
    let tokenizer = Tokenizer::from_gguf_metadata(&with("tokenizer.ggml.pre", None)).unwrap();
    assert_eq!(tokenizer.encode("Hello world", false).unwrap(), smollm2().encode("Hello world", false).unwrap());
}

#[test]
fn unsupported_model_is_named() {
    for model in ["llama", "t5", "bert", ""] {
        let err = error_of(&with("tokenizer.ggml.model", Some(GgufValue::String(model.into()))));
        assert!(matches!(err, TokenizerError::UnsupportedModel { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&format!("{model:?}")) && message.contains("gpt2"), "{message}");
    }
    let message = error_of(&with("tokenizer.ggml.model", Some(GgufValue::String("llama".into())))).to_string();
    assert!(message.contains("SentencePiece"), "{message}");
}

#[test]
fn missing_keys_are_named() {
    for key in ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"] {
        let err = error_of(&with(key, None));
        assert!(matches!(&err, TokenizerError::MissingKey { key: k, .. } if k == key), "{key}: {err:?}");
        assert!(err.to_string().contains(key), "{err}");
    }
    assert!(Tokenizer::from_gguf_metadata(&GgufMetadata::new()).is_err());
}

#[test]
fn mistyped_or_inconsistent_metadata_is_rejected() {
    let cases: Vec<(&str, GgufValue)> = vec![
        ("tokenizer.ggml.model", GgufValue::Int(2)),
        ("tokenizer.ggml.pre", GgufValue::Bool(true)),
        ("tokenizer.ggml.tokens", GgufValue::String("<s>".into())),
        ("tokenizer.ggml.tokens", GgufValue::StringArray(vec![])),
        ("tokenizer.ggml.merges", GgufValue::OtherArray(3)),
        ("tokenizer.ggml.token_type", GgufValue::IntArray(vec![1, 1, 3])),
        ("tokenizer.ggml.token_type", GgufValue::StringArray(vec!["1".into()])),
        ("tokenizer.ggml.bos_token_id", GgufValue::Int(49152)),
        ("tokenizer.ggml.eos_token_id", GgufValue::Int(-1)),
        ("tokenizer.ggml.eot_token_id", GgufValue::String("2".into())),
        ("tokenizer.ggml.add_bos_token", GgufValue::Int(1)),
    ];
    for (key, value) in cases {
        let err = error_of(&with(key, Some(value.clone())));
        assert!(err.to_string().contains(key), "{key} = {value:?}: {err}");
    }
}

#[test]
fn bad_merges_are_rejected() {
    let merges = |list: &[&str]| GgufValue::StringArray(list.iter().map(|m| (*m).to_owned()).collect());
    // Not a pair.
    let err = error_of(&with("tokenizer.ggml.merges", Some(merges(&["Ġ t", "a b c"]))));
    assert!(matches!(err, TokenizerError::BadMetadata { .. }) && err.to_string().contains("merge 1"), "{err}");
    // A pair whose tokens are not in the vocabulary.
    let err = error_of(&with("tokenizer.ggml.merges", Some(merges(&["zzzqqq xxxyyy"]))));
    assert!(matches!(err, TokenizerError::Build(_)), "{err:?}");
}

#[test]
fn add_bos_without_bos_is_an_error() {
    let mut metadata = with("tokenizer.ggml.bos_token_id", None);
    metadata.insert("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(true));
    let message = error_of(&metadata).to_string();
    assert!(message.contains("tokenizer.ggml.bos_token_id") && message.contains("add_bos_token"), "{message}");
}

#[test]
fn truncated_gguf_files_are_errors() {
    let bytes = std::fs::read(asset_path("smollm2")).unwrap();
    let dir = std::env::temp_dir().join(format!("radix-tokenizer-truncated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for len in [0, 3, 4, 8, 16, 24, 100, 1_000, 10_000, 100_000, 500_000, 1_000_000] {
        let path = dir.join(format!("cut-{len}.gguf"));
        std::fs::write(&path, &bytes[..len.min(bytes.len())]).unwrap();
        let err = Tokenizer::from_gguf_file(&path).expect_err("a truncated file is an error");
        assert!(matches!(err, TokenizerError::Gguf(_)), "{len}: {err:?}");
    }
    let err = Tokenizer::from_gguf_file(dir.join("absent.gguf")).unwrap_err();
    assert!(err.to_string().contains("absent.gguf"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_tokenizer_files_are_errors() {
    let dir = std::env::temp_dir().join(format!("radix-tokenizer-badfiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(matches!(Tokenizer::from_model_dir(&dir), Err(TokenizerError::Io { .. })));
    std::fs::write(dir.join("tokenizer.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    let err = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap_err();
    assert!(matches!(err, TokenizerError::BadFile { .. }) && err.to_string().contains("tokenizer.json"), "{err}");
    // A good tokenizer.json with a config naming an unknown EOS.
    std::fs::copy(asset_path("qwen3").join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "<|no such token|>"}"#).unwrap();
    let err = Tokenizer::from_model_dir(&dir).unwrap_err();
    assert!(err.to_string().contains("<|no such token|>"), "{err}");
    std::fs::write(dir.join("tokenizer_config.json"), "not json").unwrap();
    assert!(Tokenizer::from_model_dir(&dir).unwrap_err().to_string().contains("tokenizer_config.json"));
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": {"content": "<|im_end|>"}}"#).unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [151643, "x"]}"#).unwrap();
    assert!(Tokenizer::from_model_dir(&dir).unwrap_err().to_string().contains("generation_config.json"));
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [151643, 151645]}"#).unwrap();
    let tokenizer = Tokenizer::from_model_dir(&dir).unwrap();
    assert_eq!(tokenizer.eos_token_ids().iter().copied().collect::<Vec<_>>(), vec![151643, 151645]);
    std::fs::remove_dir_all(&dir).ok();
}

/// A small GGUF file (version 3) holding a byte-level BPE vocabulary: the 256 byte tokens, two
/// merges, and a control token.
fn tiny_gguf() -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn key(out: &mut Vec<u8>, k: &str, value_type: u32) {
        string(out, k);
        out.extend(value_type.to_le_bytes());
    }
    fn string_array(out: &mut Vec<u8>, k: &str, items: &[String]) {
        key(out, k, 9);
        out.extend(8u32.to_le_bytes());
        out.extend((items.len() as u64).to_le_bytes());
        for item in items {
            string(out, item);
        }
    }
    let base = smollm2().inner().get_vocab(false);
    let mut bytes_tokens: Vec<(u32, String)> =
        base.into_iter().filter(|(t, id)| *id < 273 && t.chars().count() == 1).map(|(t, id)| (id, t)).collect();
    bytes_tokens.sort();
    let mut tokens: Vec<String> = vec!["<|end|>".into()];
    tokens.extend(bytes_tokens.into_iter().map(|(_, t)| t));
    tokens.extend(["he".to_owned(), "hel".to_owned()]);
    let merges = vec!["h e".to_owned(), "he l".to_owned()];

    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes()); // tensors
    out.extend(6u64.to_le_bytes()); // keys
    key(&mut out, "tokenizer.ggml.model", 8);
    string(&mut out, "gpt2");
    key(&mut out, "tokenizer.ggml.pre", 8);
    string(&mut out, "qwen2");
    string_array(&mut out, "tokenizer.ggml.tokens", &tokens);
    key(&mut out, "tokenizer.ggml.token_type", 9);
    out.extend(5u32.to_le_bytes());
    out.extend((tokens.len() as u64).to_le_bytes());
    for index in 0..tokens.len() {
        out.extend((if index == 0 { 3i32 } else { 1 }).to_le_bytes());
    }
    string_array(&mut out, "tokenizer.ggml.merges", &merges);
    key(&mut out, "tokenizer.ggml.eos_token_id", 4);
    out.extend(0u32.to_le_bytes());
    out
}

#[test]
fn tiny_gguf_file_builds() {
    let path = std::env::temp_dir().join(format!("radix-tokenizer-tiny-{}.gguf", std::process::id()));
    std::fs::write(&path, tiny_gguf()).unwrap();
    let tokenizer = Tokenizer::from_gguf_file(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let hel = tokenizer.token_to_id("hel").unwrap();
    let ids = tokenizer.encode("hello<|end|>", false).unwrap();
    assert_eq!(ids[0], hel);
    assert_eq!(*ids.last().unwrap(), 0);
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "hello");
    assert_eq!(tokenizer.eos_token_ids().iter().copied().collect::<Vec<_>>(), vec![0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any byte of the file changed, or the file cut anywhere: an error or a tokenizer, no panic.
    #[test]
    fn corrupted_gguf_never_panics(position in 0usize..1_000_000, byte in any::<u8>(), cut in any::<bool>()) {
        let mut bytes = tiny_gguf();
        let position = position % bytes.len();
        if cut {
            bytes.truncate(position);
        } else {
            bytes[position] = byte;
        }
        let path = std::env::temp_dir()
            .join(format!("radix-tokenizer-corrupt-{}-{position}-{byte}-{cut}.gguf", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let result = Tokenizer::from_gguf_file(&path);
        std::fs::remove_file(&path).ok();
        if cut {
            prop_assert!(result.is_err());
        }
        if let Ok(tokenizer) = result {
            let ids = tokenizer.encode("hello", false).unwrap();
            let _ = tokenizer.decode(&ids, false).unwrap();
        }
    }
}
