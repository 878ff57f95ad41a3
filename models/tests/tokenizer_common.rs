//! Shared helpers of the tokenizer tests: fixtures, asset paths, loaded tokenizers. Included by the
//! other `tokenizer_*.rs` tests with `#[path]`; as a test target of its own it holds no tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use radix_models::tokenizer::Tokenizer;
use radix_templates::gguf::{GgufMetadata, GgufValue};
use serde_json::Value as Json;

/// The models test fixtures folder.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub use radix_e2e::asset_path;

/// The corpus strings of `tokenizer_corpus.json`.
pub fn corpus() -> &'static [String] {
    static CORPUS: OnceLock<Vec<String>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let text = std::fs::read_to_string(fixtures_dir().join("tokenizer_corpus.json")).unwrap();
        let doc: Json = serde_json::from_str(&text).expect("corpus is JSON");
        doc["strings"].as_array().expect("strings").iter().map(|s| s.as_str().unwrap().to_owned()).collect()
    })
}

/// Reference ids of one corpus string.
#[derive(Debug, Clone)]
pub struct Reference {
    /// With `add_special_tokens=False`.
    pub plain: Vec<u32>,
    /// With `add_special_tokens=True`.
    pub with_special: Vec<u32>,
}

/// The reference ids transformers produced for `tokenizer` (a key of `tokenizer_refs.json`), in
/// corpus order.
pub fn references(tokenizer: &str) -> Vec<Reference> {
    static REFS: OnceLock<Json> = OnceLock::new();
    let doc = REFS.get_or_init(|| {
        let text = std::fs::read_to_string(fixtures_dir().join("tokenizer_refs.json")).unwrap();
        serde_json::from_str(&text).expect("refs are JSON")
    });
    let ids = |v: &Json| -> Vec<u32> { v.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect() };
    let list = doc["tokenizers"][tokenizer].as_array().unwrap_or_else(|| panic!("no references for {tokenizer}"));
    assert_eq!(list.len(), corpus().len(), "{tokenizer}: references and corpus differ in length; regenerate");
    list.iter().map(|r| Reference { plain: ids(&r["plain"]), with_special: ids(&r["with_special"]) }).collect()
}

/// SmolLM2's tokenizer, built from its GGUF file.
pub fn smollm2() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_gguf_file(asset_path("smollm2")).expect("SmolLM2 GGUF tokenizer"))
}

/// Qwen3's tokenizer, from its model directory (tokenizer.json + tokenizer_config.json).
pub fn qwen3() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_model_dir(asset_path("qwen3")).expect("Qwen3 tokenizer"))
}

/// Gemma 3's tokenizer (SentencePiece-style BPE with byte fallback), from its model directory.
pub fn gemma3() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_model_dir(asset_path("gemma3")).expect("Gemma 3 tokenizer"))
}

/// The GGUF metadata of SmolLM2's file.
pub fn smollm2_metadata() -> &'static GgufMetadata {
    static METADATA: OnceLock<GgufMetadata> = OnceLock::new();
    METADATA.get_or_init(|| radix_templates::gguf::read_gguf_metadata(&asset_path("smollm2")).expect("GGUF metadata"))
}

/// The metadata a GGUF would hold for the byte-level BPE of `dir/tokenizer.json`, with
/// `tokenizer.ggml.pre` = `pre`: tokens in id order, merges as `"a b"`, token_type 3 for special
/// added tokens and 4 for the others (the construction `scripts/gen_tokenizer_refs.py` mirrors).
pub fn gguf_style_metadata(dir: &Path, pre: &str) -> GgufMetadata {
    let text = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
    let doc: Json = serde_json::from_str(&text).unwrap();
    let model = &doc["model"];
    assert_eq!(model["type"], "BPE");
    let mut by_id: BTreeMap<u32, String> =
        model["vocab"].as_object().unwrap().iter().map(|(t, id)| (id.as_u64().unwrap() as u32, t.clone())).collect();
    let mut types = BTreeMap::new();
    for added in doc["added_tokens"].as_array().unwrap() {
        let id = added["id"].as_u64().unwrap() as u32;
        by_id.insert(id, added["content"].as_str().unwrap().to_owned());
        types.insert(id, if added["special"].as_bool().unwrap() { 3 } else { 4 });
    }
    let size = by_id.len() as u32;
    assert_eq!(by_id.keys().next_back(), Some(&(size - 1)), "dense ids");
    let merges = model["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => s.clone(),
            Json::Array(pair) => format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()),
            other => panic!("merge {other}"),
        })
        .collect();
    let mut metadata = GgufMetadata::new();
    let mut put = |key: &str, value: GgufValue| metadata.insert(key.to_owned(), value);
    put("tokenizer.ggml.model", GgufValue::String("gpt2".into()));
    put("tokenizer.ggml.pre", GgufValue::String(pre.into()));
    put("tokenizer.ggml.tokens", GgufValue::StringArray(by_id.into_values().collect()));
    put("tokenizer.ggml.token_type", GgufValue::IntArray((0..size).map(|id| *types.get(&id).unwrap_or(&1)).collect()));
    put("tokenizer.ggml.merges", GgufValue::StringArray(merges));
    metadata
}

/// Ids of `tokenizer` for every corpus string compared with `refs`; panics listing the
/// mismatches (string, expected, got).
pub fn assert_matches_references(name: &str, tokenizer: &Tokenizer, refs: &[Reference]) {
    let mut mismatches = Vec::new();
    for (text, reference) in corpus().iter().zip(refs) {
        for (special, expected) in [(false, &reference.plain), (true, &reference.with_special)] {
            let got = tokenizer.encode(text, special).unwrap_or_else(|e| panic!("{name}: encode {text:?}: {e}"));
            if &got != expected {
                mismatches
                    .push(format!("{text:?} (add_special_tokens={special}):\n  want {expected:?}\n  got  {got:?}"));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {} encodings differ from transformers:\n{}",
        mismatches.len(),
        2 * corpus().len(),
        mismatches.join("\n")
    );
}
