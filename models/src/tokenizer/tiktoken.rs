//! Building a tokenizer from a tiktoken ranks file.
//!
//! A tiktoken encoding is a byte-level BPE stored as ranks only: one line per token, its bytes in
//! base64 and its rank, which is also its id. The regex that splits text into pre-tokens and the
//! added (special) tokens live in the code that uses the file, so they come in as
//! [`TiktokenOptions`]. `tokenizers` wants a vocabulary of strings and an ordered merge list
//! instead, which this module derives the standard way (as transformers'
//! `convert_slow_tokenizer.TikTokenConverter` does):
//!
//! - every token's bytes are spelled in GPT-2's byte-to-unicode alphabet, its id is its rank;
//! - the pre-tokenizer is the regex as an `Isolated` split followed by a ByteLevel that does not
//!   split again, the decoder and post-processor are ByteLevel;
//! - the added tokens are added tokens matched whole in the text, never normalized.
//!
//! Merges: one per token of more than one byte, in rank order, namely the last join tiktoken's own
//! merge loop makes when it encodes that token's bytes, for every token the loop builds at all.
//! That is what tiktoken's BPE does, so a `tokenizers` BPE with these merges gives tiktoken's ids
//! wherever tiktoken merges (checked on source code and on random concatenations of vocabulary
//! tokens). Two other reconstructions exist and are not used:
//!
//! - transformers 5.24's converter lists every split of a token into two vocabulary tokens (500,709
//!   merges for Qwen3.5's ranks instead of 247,587). Same ids, twice the merges, and not what the
//!   model's own files hold (see `qwen35.rs`).
//! - the older `bpe(…, max_rank=rank)` reconstruction (transformers 4.4x) stops at merges of lower
//!   rank than the token, so it drops tokens tiktoken builds through a higher-ranked intermediate
//!   (31 in Qwen3.5, e.g. `人力资源` through `人力`), which then split differently.
//!
//! Tokens the merge loop never builds (201 in Qwen3.5, e.g. `加拿大`) get no merge. tiktoken still
//! emits them when a whole pre-token equals one, because it looks a pre-token up before merging;
//! [`TiktokenOptions::whole_piece_lookup`] (`ignore_merges` in `tokenizers`) says whether we do too.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use rayon::prelude::*;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::byte_level::ByteLevel as ByteLevelProcessor;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::gguf_vocab::bytes_to_unicode;
use super::{Result, SpecialConfig, Tokenizer, TokenizerError};

/// One added token of a tiktoken encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiktokenAddedToken {
    /// Its text, matched whole wherever it occurs in the input.
    pub content: String,
    /// Its id, past the ranks.
    pub id: u32,
    /// Whether it is special: left out by `skip_special_tokens` and never encoded from request text
    /// (see [`Tokenizer::encode_prompt`]). tiktoken itself has no such distinction.
    pub special: bool,
}

/// What a tiktoken encoding needs beside its ranks file (tiktoken keeps these in code).
#[derive(Debug, Clone)]
pub struct TiktokenOptions {
    /// The pre-tokenizer regex (tiktoken's `pat_str`).
    pub pattern: String,
    /// The added tokens, in any order; their ids must follow the ranks without gaps.
    pub added_tokens: Vec<TiktokenAddedToken>,
    /// Whether the text is NFC-normalized before it is split (added tokens are matched before).
    pub nfc: bool,
    /// Whether a pre-token found whole in the vocabulary is one token without merging, as tiktoken
    /// does (`ignore_merges` in `tokenizers`). Only tokens the merges cannot build are affected.
    pub whole_piece_lookup: bool,
    /// The EOS token's text, if the encoding has one.
    pub eos_token: Option<String>,
}

impl Tokenizer {
    /// Builds the tokenizer of a tiktoken ranks file (`<base64 token> <rank>` per line, ranks
    /// 0..n, every single byte among them) with the regex, added tokens and switches of `options`.
    /// No BOS is added; the EOS set is `options.eos_token`.
    pub fn from_tiktoken(ranks_path: impl AsRef<Path>, options: &TiktokenOptions) -> Result<Self> {
        let path = ranks_path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?;
        let bad = |message: String| TokenizerError::BadFile { path: path.to_owned(), message };
        let ranks = parse_ranks(&text).map_err(bad)?;
        let inner = build(&ranks, options).map_err(bad)?;
        let eos = match &options.eos_token {
            None => None,
            Some(content) => Some(
                inner.token_to_id(content).ok_or_else(|| bad(format!("the EOS token {content:?} is not a token")))?,
            ),
        };
        let special = SpecialConfig { eos, add_bos: Some(false), ..SpecialConfig::default() };
        Self::assemble(inner, special, path)
    }
}

/// The tokens of a ranks file, indexed by rank. Errors name the line.
pub(super) fn parse_ranks(text: &str) -> std::result::Result<Vec<Vec<u8>>, String> {
    let line_count = text.lines().count();
    let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let (Some(token), Some(rank), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(format!("line {number}: expected `<base64 token> <rank>`, found {line:?}"));
        };
        let bytes = decode_base64(token).ok_or_else(|| format!("line {number}: {token:?} is not base64"))?;
        let rank: usize = rank.parse().map_err(|_| format!("line {number}: rank {rank:?} is not a number"))?;
        if bytes.is_empty() {
            return Err(format!("line {number}: an empty token"));
        }
        // Ranks are 0..n, so one past the line count is wrong already (and would be a huge table).
        if rank >= line_count {
            return Err(format!("line {number}: rank {rank} is past the {line_count} lines (ranks must be 0..n)"));
        }
        if let Some(first) = seen.insert(bytes.clone(), number) {
            return Err(format!("line {number}: the token of line {first} again"));
        }
        if by_rank.len() <= rank {
            by_rank.resize(rank + 1, None);
        }
        if by_rank[rank].replace(bytes).is_some() {
            return Err(format!("line {number}: rank {rank} is given twice"));
        }
    }
    // Ids are ranks and added tokens follow them, so a gap would leave ids without a token.
    let tokens: Vec<Vec<u8>> = by_rank
        .into_iter()
        .enumerate()
        .map(|(rank, token)| token.ok_or_else(|| format!("no token has rank {rank} (ranks must be 0..n)")))
        .collect::<std::result::Result<_, _>>()?;
    if let Some(byte) = (0..=255u8).find(|b| !seen.contains_key(&vec![*b])) {
        return Err(format!("byte 0x{byte:02x} has no token (a byte-level BPE needs all 256)"));
    }
    Ok(tokens)
}

/// Standard base64 (`A-Z a-z 0-9 + /`, `=` padding), as tiktoken writes it.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = text.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return None;
    }
    let body = bytes.strip_suffix(b"==").or_else(|| bytes.strip_suffix(b"=")).unwrap_or(bytes);
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        let mut bits = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            bits |= digit(c)? << (18 - 6 * i);
        }
        let produced = chunk.len() - 1;
        out.extend(bits.to_be_bytes()[1..=produced].iter());
        // Padding bits that are not zero mean the text was not written by a base64 encoder.
        if chunk.len() < 4 && bits.to_be_bytes()[1 + produced..].iter().any(|&b| b != 0) {
            return None;
        }
    }
    Some(out)
}

/// tiktoken's merge loop over `piece`: join the adjacent pair whose concatenation has the lowest
/// rank (the leftmost of equals) until no concatenation is a token. Returns how many parts are
/// left and where the last join split its result.
fn merge_loop(ranks: &HashMap<&[u8], u32>, piece: &[u8]) -> (usize, Option<usize>) {
    // Part starts, with the piece's end as the last entry.
    let mut bounds: Vec<usize> = (0..=piece.len()).collect();
    let mut last_split = None;
    while bounds.len() > 2 {
        let best = (0..bounds.len() - 2)
            .filter_map(|i| ranks.get(&piece[bounds[i]..bounds[i + 2]]).map(|&rank| (rank, i)))
            .min();
        let Some((_, i)) = best else { break };
        last_split = Some(bounds[i + 1]);
        bounds.remove(i + 1);
    }
    (bounds.len() - 1, last_split)
}

/// The merges for `tokens` (indexed by rank): for each token the merge loop builds, the pair its
/// last join joined, in rank order.
pub(super) fn merges(tokens: &[Vec<u8>]) -> Vec<(usize, &[u8], &[u8])> {
    let ranks: HashMap<&[u8], u32> = tokens.iter().enumerate().map(|(rank, t)| (t.as_slice(), rank as u32)).collect();
    tokens
        .par_iter()
        .enumerate()
        .filter(|(_, token)| token.len() > 1)
        .filter_map(|(rank, token)| match merge_loop(&ranks, token) {
            (1, Some(split)) => Some((rank, &token[..split], &token[split..])),
            _ => None,
        })
        .collect()
}

/// The `tokenizers` tokenizer of `tokens` (indexed by rank) with `options`.
fn build(tokens: &[Vec<u8>], options: &TiktokenOptions) -> std::result::Result<tokenizers::Tokenizer, String> {
    let table = bytes_to_unicode();
    let spell = |bytes: &[u8]| -> String { bytes.iter().map(|&b| table[b as usize]).collect() };
    let mut vocab = Vocab::default();
    for (rank, token) in tokens.iter().enumerate() {
        vocab.insert(spell(token), rank as u32);
    }
    let merges = merges(tokens).into_iter().map(|(_, left, right)| (spell(left), spell(right))).collect();
    // The empty prefix and suffix are what Qwen's own tokenizer.json files hold; they act as none.
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix(String::new())
        .ignore_merges(options.whole_piece_lookup)
        .build()
        .map_err(|e| format!("the BPE model rejects the vocabulary or merges: {e}"))?;

    let split = Split::new(SplitPattern::Regex(options.pattern.clone()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| format!("the pre-tokenizer regex does not compile: {e}"))?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    if options.nfc {
        tokenizer.with_normalizer(Some(NFC)).map_err(|e| format!("the NFC normalizer: {e}"))?;
    }
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()])));
    tokenizer.with_post_processor(Some(ByteLevelProcessor::new(false, false, false)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    add_tokens(&mut tokenizer, tokens.len(), &options.added_tokens)?;
    Ok(tokenizer)
}

/// Adds the added tokens with exactly their ids: `tokenizers` numbers added tokens in the order
/// they come, from the end of the vocabulary, so they go in one at a time in id order.
fn add_tokens(
    tokenizer: &mut tokenizers::Tokenizer,
    vocab_size: usize,
    added: &[TiktokenAddedToken],
) -> std::result::Result<(), String> {
    let mut sorted: Vec<&TiktokenAddedToken> = added.iter().collect();
    sorted.sort_by_key(|token| token.id);
    let contents: BTreeSet<&str> = sorted.iter().map(|token| token.content.as_str()).collect();
    if contents.len() != sorted.len() {
        return Err("two added tokens have the same text".into());
    }
    for (offset, token) in sorted.into_iter().enumerate() {
        let expected = vocab_size + offset;
        if token.id as usize != expected {
            return Err(format!(
                "added token {:?} has id {}, expected {expected} (added ids follow the {vocab_size} ranks without gaps)",
                token.content, token.id
            ));
        }
        if tokenizer.token_to_id(&token.content).is_some() {
            return Err(format!("added token {:?} is already a ranked token", token.content));
        }
        let added = AddedToken::from(token.content.clone(), token.special).normalized(false);
        let result = match token.special {
            true => tokenizer.add_special_tokens([added]),
            false => tokenizer.add_tokens([added]),
        };
        result.map_err(|e| format!("added token {:?}: {e}", token.content))?;
        if tokenizer.token_to_id(&token.content) != Some(token.id) {
            return Err(format!("added token {:?} did not get id {}", token.content, token.id));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks_file(tokens: &[&[u8]]) -> String {
        const DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let encode = |bytes: &[u8]| -> String {
            let mut out = String::new();
            for chunk in bytes.chunks(3) {
                let mut bits = 0u32;
                for (i, &b) in chunk.iter().enumerate() {
                    bits |= (b as u32) << (16 - 8 * i);
                }
                for i in 0..4 {
                    out.push(if i <= chunk.len() { DIGITS[(bits >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
                }
            }
            out
        };
        tokens.iter().enumerate().map(|(rank, t)| format!("{} {rank}\n", encode(t))).collect()
    }

    /// All 256 bytes, then `extra` at ranks 256.. .
    fn tokens_with(extra: &[&'static [u8]]) -> Vec<Vec<u8>> {
        (0..=255u8).map(|b| vec![b]).chain(extra.iter().map(|t| t.to_vec())).collect()
    }

    #[test]
    fn base64_round_trips_and_rejects_what_is_not_base64() {
        for bytes in [&b"a"[..], b"ab", b"abc", b"\xff\x00\x80\x7f", "加拿大".as_bytes()] {
            let file = ranks_file(&[bytes]);
            let token = file.split(' ').next().unwrap();
            assert_eq!(decode_base64(token).as_deref(), Some(bytes), "{token}");
        }
        for bad in ["", "YQ", "Y===", "YR==", "a-b_", "YWJj\n"] {
            assert_eq!(decode_base64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ranks_file_errors_name_the_line() {
        let bytes = tokens_with(&[]);
        let good = ranks_file(&bytes.iter().map(Vec::as_slice).collect::<Vec<_>>());
        assert_eq!(parse_ranks(&good).unwrap().len(), 256);
        let cases = [
            (format!("{good}!! 256\n"), "line 257: \"!!\" is not base64"),
            (format!("{good}YWI= x\n"), "line 257: rank \"x\" is not a number"),
            (format!("{good}YWI=\n"), "line 257: expected"),
            (format!("{good}YQ== 256\n"), "line 257: the token of line 98 again"),
            (format!("{good}YWI= 255\n"), "line 257: rank 255 is given twice"),
            (format!("{good}\nYWI= 257\n"), "no token has rank 256"),
            (format!("{good}YWI= 900\n"), "line 257: rank 900 is past the 257 lines"),
            (good.lines().skip(1).enumerate().map(|(i, l)| format!("{} {i}\n", &l[..4])).collect(), "byte 0x00"),
        ];
        for (text, expected) in cases {
            let err = parse_ranks(&text).unwrap_err();
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        }
    }

    #[test]
    fn merges_follow_the_merge_loop_not_the_rank_bound() {
        // "abcd" (rank 257) is built through "bcd" (rank 258), a token of higher rank: the merge loop
        // reaches it, a reconstruction bounded by the token's own rank would not. "xyz" has no pair
        // whose concatenation is a token, so nothing builds it.
        let tokens = tokens_with(&[b"bc", b"abcd", b"bcd", b"xyz"]);
        let expected: Vec<(usize, &[u8], &[u8])> = vec![(256, b"b", b"c"), (257, b"a", b"bcd"), (258, b"bc", b"d")];
        assert_eq!(merges(&tokens), expected);
    }

    /// Options whose two added tokens take the ids from `first_id` on.
    fn options(whole_piece_lookup: bool, first_id: u32) -> TiktokenOptions {
        TiktokenOptions {
            pattern: r"\p{L}+|\s+|.".into(),
            added_tokens: vec![
                TiktokenAddedToken { content: "<|end|>".into(), id: first_id + 1, special: true },
                TiktokenAddedToken { content: "<tag>".into(), id: first_id, special: false },
            ],
            nfc: true,
            whole_piece_lookup,
            eos_token: Some("<|end|>".into()),
        }
    }

    #[test]
    fn whole_piece_lookup_decides_tokens_no_merge_builds() {
        let tokens = tokens_with(&[b"bc", b"abcd", b"bcd", b"xyz"]);
        for lookup in [false, true] {
            let tokenizer = build(&tokens, &options(lookup, 260)).unwrap();
            let ids = |text: &str| tokenizer.encode_fast(text, false).unwrap().get_ids().to_vec();
            assert_eq!(ids("abcd"), [257]);
            let xyz = if lookup { vec![259] } else { vec![120, 121, 122] };
            assert_eq!(ids("xyz"), xyz);
            assert_eq!(ids("<tag>xyz<|end|>"), [&[260][..], &xyz, &[261]].concat());
        }
    }

    #[test]
    fn added_tokens_must_follow_the_ranks() {
        let tokens = tokens_with(&[b"ab"]);
        assert!(build(&tokens, &options(false, 257)).is_ok());
        let err = build(&tokens, &options(false, 258)).unwrap_err();
        assert!(err.contains("has id 258, expected 257"), "{err}");
        let mut ranked = options(false, 257);
        ranked.added_tokens = vec![TiktokenAddedToken { content: "ab".into(), id: 257, special: true }];
        let err = build(&tokens, &ranked).unwrap_err();
        assert!(err.contains("already a ranked token"), "{err}");
        let mut regex = options(false, 257);
        regex.pattern = "(".into();
        assert!(build(&tokens, &regex).unwrap_err().contains("regex does not compile"));
    }
}
