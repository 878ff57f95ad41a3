//! Building a tokenizer from a GGUF file's metadata.
//!
//! A GGUF has no `tokenizer.json`: it stores the vocabulary, the merges, each token's type and the
//! special token ids under llama.cpp's key names. We rebuild the tokenizer the way transformers'
//! GGUF loader (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`, 5.24) does, so that
//! both produce the same ids:
//!
//! - `tokenizer.ggml.model` = `"gpt2"`: a byte-level BPE. Vocabulary from `tokenizer.ggml.tokens`
//!   (a token using characters outside the byte-level alphabet is respelled in it), merges from
//!   `tokenizer.ggml.merges` (`"a b"` strings), ByteLevel decoder.
//! - Tokens of type 3 (control) become special added tokens, unless they use characters outside
//!   the byte-level alphabet (a llama.cpp mislabel transformers skips too); tokens of type 4
//!   (user-defined) become non-special added tokens. Both match whole in the text, never
//!   normalized.
//! - The pre-tokenizer follows `tokenizer.ggml.pre`: a regex split (`Isolated`) followed by a
//!   ByteLevel that does not split again, or GPT-2's own ByteLevel regex where transformers keeps
//!   GPT-2's (`"default"`, `"gpt2"`, `"smollm"`).
//!
//! `"smollm"` note: SmolLM2's own `tokenizer.json` (and llama.cpp) split every digit off before the
//! GPT-2 regex; transformers' GGUF loader does not, and we follow transformers, the reference our
//! tests pin. The two differ only on whitespace runs before a digit (`"a  1"`).
//!
//! Other tokenizer kinds (`"llama"` SentencePiece, `"t5"`, ...) and unknown pre-tokenizers are
//! errors that name the value and what is supported.

use std::collections::BTreeSet;

use radix_templates::gguf::{GgufMetadata, GgufValue};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::{Result, SpecialConfig, TokenizerError};

/// The `tokenizer.ggml.model` values [`super::Tokenizer::from_gguf_metadata`] can build.
pub const SUPPORTED_GGUF_MODELS: &[&str] = &["gpt2"];

/// The `tokenizer.ggml.pre` values [`super::Tokenizer::from_gguf_metadata`] can build (for
/// `tokenizer.ggml.model` = `"gpt2"`), as transformers maps them. Checked against transformers'
/// ids by the tests: `"smollm"` (SmolLM2's GGUF), `"qwen2"` and `"llama-bpe"` (Qwen3's and Llama
/// 3.1's vocabularies rewritten as GGUF metadata); the other names share those regexes or GPT-2's.
pub const SUPPORTED_GGUF_PRE_TOKENIZERS: &[&str] = &[
    "default",
    "gpt2",
    "gpt-2",
    "smollm",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "dbrx",
    "smaug-bpe",
    "tekken",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "megrez",
    "qwen35",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
];

const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const QWEN35_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}",
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The regex split for a `tokenizer.ggml.pre` value: `Ok(None)` keeps GPT-2's ByteLevel regex.
fn split_regex(pre: &str) -> Result<Option<&'static str>> {
    Ok(Some(match pre {
        "default" | "gpt2" | "gpt-2" | "smollm" => return Ok(None),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        other => {
            return Err(TokenizerError::UnsupportedPreTokenizer {
                value: other.to_owned(),
                supported: SUPPORTED_GGUF_PRE_TOKENIZERS.join(", "),
            });
        }
    }))
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    Ok(match split_regex(pre)? {
        None => ByteLevel::new(false, true, true).into(),
        Some(regex) => {
            let split = Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| TokenizerError::Build(format!("the {pre:?} pre-tokenizer regex does not compile: {e}")))?;
            Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into()
        }
    })
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the others are
/// shifted to U+0100 onwards.
pub(super) fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    for (byte, slot) in table.iter_mut().enumerate() {
        let b = byte as u32;
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let code = if printable {
            b
        } else {
            shifted += 1;
            0xff + shifted
        };
        *slot = char::from_u32(code).unwrap_or('\u{fffd}');
    }
    table
}

fn value_kind(value: &GgufValue) -> &'static str {
    match value {
        GgufValue::Int(_) => "an integer",
        GgufValue::Float(_) => "a float",
        GgufValue::Bool(_) => "a boolean",
        GgufValue::String(_) => "a string",
        GgufValue::StringArray(_) => "a string array",
        GgufValue::IntArray(_) => "an integer array",
        GgufValue::OtherArray(_) => "a non-string, non-integer array",
    }
}

fn wrong_type(key: &str, expected: &str, found: &GgufValue) -> TokenizerError {
    TokenizerError::BadMetadata {
        key: key.to_owned(),
        problem: format!("expected {expected}, found {}", value_kind(found)),
    }
}

fn missing(key: &str) -> TokenizerError {
    TokenizerError::MissingKey {
        key: key.to_owned(),
        needed_for: "a byte-level BPE tokenizer (tokenizer.ggml.model \"gpt2\")".into(),
    }
}

fn string<'m>(metadata: &'m GgufMetadata, key: &str) -> Result<Option<&'m str>> {
    match metadata.get(key) {
        None => Ok(None),
        Some(GgufValue::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(key, "a string", other)),
    }
}

fn string_array<'m>(metadata: &'m GgufMetadata, key: &str) -> Result<&'m [String]> {
    match metadata.get(key) {
        None => Err(missing(key)),
        Some(GgufValue::StringArray(items)) => Ok(items),
        Some(other) => Err(wrong_type(key, "a string array", other)),
    }
}

fn boolean(metadata: &GgufMetadata, key: &str) -> Result<Option<bool>> {
    match metadata.get(key) {
        None => Ok(None),
        Some(GgufValue::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(key, "a boolean", other)),
    }
}

fn token_id(metadata: &GgufMetadata, key: &str, vocab_size: usize) -> Result<Option<u32>> {
    match metadata.get(key) {
        None => Ok(None),
        Some(GgufValue::Int(id)) => match usize::try_from(*id) {
            Ok(index) if index < vocab_size => Ok(Some(index as u32)),
            _ => Err(TokenizerError::BadMetadata {
                key: key.to_owned(),
                problem: format!("token id {id} is outside the vocabulary of {vocab_size} tokens"),
            }),
        },
        Some(other) => Err(wrong_type(key, "an integer", other)),
    }
}

/// Builds the `tokenizers` tokenizer and the special-token facts the metadata describes.
pub(super) fn build(metadata: &GgufMetadata) -> Result<(tokenizers::Tokenizer, SpecialConfig)> {
    const MODEL: &str = "tokenizer.ggml.model";
    let model = string(metadata, MODEL)?
        .ok_or_else(|| TokenizerError::MissingKey { key: MODEL.to_owned(), needed_for: "any GGUF".to_owned() })?;
    if !SUPPORTED_GGUF_MODELS.contains(&model) {
        let detail = match model {
            "llama" => " (\"llama\" is a SentencePiece vocabulary, not supported yet)",
            _ => "",
        };
        return Err(TokenizerError::UnsupportedModel {
            value: model.to_owned(),
            supported: format!("\"gpt2\" (byte-level BPE){detail}"),
        });
    }
    // Absent in old files; llama.cpp and transformers then use GPT-2's pre-tokenizer.
    let pre = string(metadata, "tokenizer.ggml.pre")?.unwrap_or("default");
    let pre_tokenizer = pre_tokenizer(pre)?;

    const TOKENS: &str = "tokenizer.ggml.tokens";
    let tokens = string_array(metadata, TOKENS)?;
    if tokens.is_empty() || u32::try_from(tokens.len()).is_err() {
        return Err(TokenizerError::BadMetadata {
            key: TOKENS.to_owned(),
            problem: format!("{} tokens is not a usable vocabulary size", tokens.len()),
        });
    }
    const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    let token_types: &[i64] = match metadata.get(TOKEN_TYPE) {
        None => &[],
        Some(GgufValue::IntArray(types)) if types.len() == tokens.len() => types,
        Some(GgufValue::IntArray(types)) => {
            return Err(TokenizerError::BadMetadata {
                key: TOKEN_TYPE.to_owned(),
                problem: format!("has {} entries for {} tokens", types.len(), tokens.len()),
            });
        }
        Some(other) => return Err(wrong_type(TOKEN_TYPE, "an integer array", other)),
    };
    const MERGES: &str = "tokenizer.ggml.merges";
    let merge_lines = string_array(metadata, MERGES)?;

    // The vocabulary, every token spelled in the byte-level alphabet (a later duplicate wins, as in
    // transformers' dict).
    let table = bytes_to_unicode();
    let alphabet: BTreeSet<char> = table.iter().copied().collect();
    let spelled = |token: &str| token.chars().all(|c| alphabet.contains(&c));
    let mut vocab = Vocab::default();
    for (id, token) in tokens.iter().enumerate() {
        let key = if spelled(token) { token.clone() } else { token.bytes().map(|b| table[b as usize]).collect() };
        vocab.insert(key, id as u32);
    }
    let mut merges = Vec::with_capacity(merge_lines.len());
    for (index, line) in merge_lines.iter().enumerate() {
        let mut parts = line.split(' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) => merges.push((a.to_owned(), b.to_owned())),
            _ => {
                return Err(TokenizerError::BadMetadata {
                    key: MERGES.to_owned(),
                    problem: format!("merge {index} ({line:?}) is not two tokens separated by one space"),
                });
            }
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| TokenizerError::Build(format!("the BPE model rejects the vocabulary or merges: {e}")))?;

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    // Control tokens (3) as special added tokens, user-defined ones (4) as plain added tokens.
    let typed =
        |wanted: i64| tokens.iter().zip(token_types).filter(move |(_, kind)| **kind == wanted).map(|(token, _)| token);
    let control: Vec<AddedToken> =
        typed(3).filter(|t| spelled(t)).map(|t| AddedToken::from(t.clone(), true).normalized(false)).collect();
    tokenizer.add_special_tokens(control).map_err(|e| TokenizerError::Build(format!("control tokens: {e}")))?;
    let user_defined: Vec<AddedToken> = typed(4)
        .filter(|t| tokenizer.token_to_id(t).is_some())
        .map(|t| AddedToken::from(t.clone(), false).normalized(false))
        .collect();
    tokenizer.add_tokens(user_defined).map_err(|e| TokenizerError::Build(format!("user-defined tokens: {e}")))?;

    let size = tokens.len();
    let mut more_eos = BTreeSet::new();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        more_eos.extend(token_id(metadata, key, size)?);
    }
    let special = SpecialConfig {
        bos: token_id(metadata, "tokenizer.ggml.bos_token_id", size)?,
        eos: token_id(metadata, "tokenizer.ggml.eos_token_id", size)?,
        more_eos,
        add_bos: Some(boolean(metadata, "tokenizer.ggml.add_bos_token")?.unwrap_or(false)),
        add_eos: boolean(metadata, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
    };
    for (wanted, id, key, flag) in [
        (special.add_bos == Some(true), special.bos, "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token"),
        (special.add_eos, special.eos, "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_eos_token"),
    ] {
        if wanted && id.is_none() {
            return Err(TokenizerError::MissingKey { key: key.to_owned(), needed_for: format!("{flag} = true") });
        }
    }
    Ok((tokenizer, special))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let table = bytes_to_unicode();
        assert_eq!(table[b'!' as usize], '!');
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(table[0], 'Ā');
        assert_eq!(table.iter().collect::<BTreeSet<_>>().len(), 256);
    }

    #[test]
    fn every_supported_pre_tokenizer_builds() {
        for pre in SUPPORTED_GGUF_PRE_TOKENIZERS {
            pre_tokenizer(pre).unwrap_or_else(|e| panic!("{pre}: {e}"));
        }
        assert!(matches!(pre_tokenizer("starcoder"), Err(TokenizerError::UnsupportedPreTokenizer { .. })));
    }
}
