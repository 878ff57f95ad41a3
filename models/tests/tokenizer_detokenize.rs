//! The incremental detokenizer: its pieces put together are `decode(all ids)`, and no piece ends
//! inside a UTF-8 character (no U+FFFD unless the full decode has one).

#[path = "tokenizer_common.rs"]
mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use radix_models::tokenizer::{IncrementalDetokenizer, Tokenizer};

/// Runs the detokenizer over `ids`; returns the pieces (finish's last).
fn pieces(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
    let mut detokenizer = IncrementalDetokenizer::new(tokenizer, skip_special_tokens);
    let mut out: Vec<String> = ids.iter().filter_map(|&id| detokenizer.push(id).unwrap()).collect();
    out.push(detokenizer.finish().unwrap());
    out
}

const REPLACEMENT: char = '\u{fffd}';

/// The property: concatenation equals decode; no piece but the last holds a U+FFFD the full
/// decode lacks, and no piece (but the last) ends in one.
fn check(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Result<(), TestCaseError> {
    let expected = tokenizer.decode(ids, skip_special_tokens).unwrap();
    let got = pieces(tokenizer, ids, skip_special_tokens);
    prop_assert_eq!(got.concat(), expected.clone(), "ids {:?}", ids);
    let (last, streamed) = got.split_last().unwrap();
    for piece in streamed {
        prop_assert!(!piece.is_empty());
        prop_assert!(!piece.ends_with(REPLACEMENT), "piece {:?} ends in U+FFFD; ids {:?}", piece, ids);
        prop_assert!(!piece.contains(REPLACEMENT) || expected.contains(REPLACEMENT), "{:?}", piece);
    }
    prop_assert!(!last.contains(REPLACEMENT) || expected.contains(REPLACEMENT), "{:?}", last);
    Ok(())
}

#[test]
fn emoji_split_over_byte_tokens_is_emitted_whole() {
    for tokenizer in [smollm2(), qwen3(), gemma3()] {
        for text in ["😀", "👨‍👩‍👧‍👦", "日本語", "a😀b", "🙂🙂🙂"] {
            let ids = tokenizer.encode(text, false).unwrap();
            let got = pieces(tokenizer, &ids, false);
            assert_eq!(got.concat(), text);
            assert!(got.iter().all(|p| !p.contains('\u{fffd}')), "{text:?}: {got:?}");
        }
        // A character taken by several byte tokens: nothing comes out until the last one.
        let (text, ids) = ["😀", "🦀", "𝄞", "𓀀", "🜁"]
            .iter()
            .map(|text| (*text, tokenizer.encode(text, false).unwrap()))
            .find(|(_, ids)| ids.len() > 1)
            .expect("some character is split over byte tokens");
        let mut detokenizer = IncrementalDetokenizer::new(tokenizer, false);
        for &id in &ids[..ids.len() - 1] {
            assert_eq!(detokenizer.push(id).unwrap(), None);
        }
        assert_eq!(detokenizer.push(ids[ids.len() - 1]).unwrap().as_deref(), Some(text));
        assert_eq!(detokenizer.finish().unwrap(), "");
    }
}

#[test]
fn corpus_streams_exactly() {
    for tokenizer in [smollm2(), qwen3(), gemma3()] {
        for text in corpus() {
            let ids = tokenizer.encode(text, false).unwrap();
            for skip in [false, true] {
                check(tokenizer, &ids, skip).unwrap();
            }
        }
    }
}

#[test]
fn special_tokens_are_skipped_or_kept() {
    let tokenizer = smollm2();
    let ids = tokenizer.encode("hi<|im_end|>", false).unwrap();
    let mut skipping = IncrementalDetokenizer::new(tokenizer, true);
    let mut keeping = IncrementalDetokenizer::new(tokenizer, false);
    let skipped: String = ids.iter().filter_map(|&id| skipping.push(id).unwrap()).collect();
    let kept: String = ids.iter().filter_map(|&id| keeping.push(id).unwrap()).collect();
    assert_eq!(skipped + &skipping.finish().unwrap(), "hi");
    assert_eq!(kept + &keeping.finish().unwrap(), "hi<|im_end|>");
}

#[test]
fn context_is_not_emitted() {
    let tokenizer = Arc::new(qwen3().clone());
    let prompt = tokenizer.encode("<|im_start|>assistant\n", false).unwrap();
    let generated = tokenizer.encode(" Sure, 42 ✓ done.", false).unwrap();
    let mut detokenizer = IncrementalDetokenizer::with_context(Arc::clone(&tokenizer), false, &prompt);
    let mut text = detokenizer.push_all(&generated).unwrap();
    text += &detokenizer.finish().unwrap();
    assert_eq!(text, " Sure, 42 ✓ done.");
}

#[test]
fn long_generations_stay_exact() {
    // Long enough for the detokenizer to drop ids behind its window.
    let text = corpus().concat().repeat(3);
    let tokenizer = smollm2();
    let ids = tokenizer.encode(&text, false).unwrap();
    assert!(ids.len() > 1000);
    assert_eq!(pieces(tokenizer, &ids, false).concat(), text);
}

/// Id sequences from the corpus's reference ids: a slice of one string's ids, possibly followed by
/// a slice of another's (so multi-byte characters get cut), with some random ids mixed in.
fn id_sequences(reference: &'static str, vocab: u32) -> impl Strategy<Value = Vec<u32>> {
    let refs: Vec<Vec<u32>> =
        references(reference).into_iter().map(|r| r.plain).filter(|ids| !ids.is_empty()).collect();
    let n = refs.len();
    (0..n, any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0..n, any::<prop::sample::Index>())
        .prop_flat_map(move |(a, start, len, b, cut)| {
            let first = &refs[a];
            let s = start.index(first.len());
            let e = s + len.index(first.len() - s + 1);
            let second = &refs[b];
            let mut ids = first[s..e].to_vec();
            ids.extend(&second[..cut.index(second.len() + 1)]);
            (Just(ids), prop::collection::vec((any::<prop::sample::Index>(), 0..vocab), 0..4))
        })
        .prop_map(|(mut ids, inserts)| {
            for (at, id) in inserts {
                let at = at.index(ids.len() + 1);
                ids.insert(at, id);
            }
            ids
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn smollm2_random_ids_stream_like_decode(ids in id_sequences("smollm2_gguf", 49152), skip in any::<bool>()) {
        check(smollm2(), &ids, skip)?;
    }

    #[test]
    fn qwen3_random_ids_stream_like_decode(ids in id_sequences("qwen3", 151669), skip in any::<bool>()) {
        check(qwen3(), &ids, skip)?;
    }

    /// Gemma 3: byte-fallback tokens (`<0xF0>`) and the `▁` space marker.
    #[test]
    fn gemma3_random_ids_stream_like_decode(ids in id_sequences("gemma3", 262144), skip in any::<bool>()) {
        check(gemma3(), &ids, skip)?;
    }

    #[test]
    fn random_text_streams_back_exactly(text in "\\PC{0,40}", skip in any::<bool>()) {
        for tokenizer in [smollm2(), qwen3(), gemma3()] {
            let ids = tokenizer.encode(&text, false).unwrap();
            check(tokenizer, &ids, skip)?;
        }
        let ids = smollm2().encode(&text, false).unwrap();
        prop_assert_eq!(pieces(smollm2(), &ids, false).concat(), text);
    }

    /// Only byte-level single-byte tokens (Qwen3 has all 256): every way of cutting or breaking
    /// a multi-byte character.
    #[test]
    fn raw_byte_tokens_stream_like_decode(bytes in prop::collection::vec(any::<u8>(), 0..24)) {
        let tokenizer = qwen3();
        let ids: Vec<u32> = bytes.iter().map(|b| byte_token(tokenizer, *b)).collect();
        check(tokenizer, &ids, false)?;
    }
}

/// The id of the byte-level token standing for one byte.
fn byte_token(tokenizer: &Tokenizer, byte: u8) -> u32 {
    // GPT-2's byte alphabet: printable Latin-1 stands for itself, the rest is shifted past U+00FF.
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut shifted = 0;
    let mut ch = '\0';
    for b in 0..=255u32 {
        let c = if printable(b) {
            b
        } else {
            shifted += 1;
            0xff + shifted
        };
        if b == byte as u32 {
            ch = char::from_u32(c).unwrap();
        }
    }
    tokenizer.token_to_id(&ch.to_string()).unwrap()
}
