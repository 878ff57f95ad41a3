//! `Tokenizer::token_bytes`, the vocabulary as raw bytes for the grammar engine's token trie: the
//! bytes of a text's tokens put together are the text's decode, and a token that is whole UTF-8 on its own
//! has the bytes its decode has. Byte-level BPE (SmolLM2 from GGUF, Qwen3) and SentencePiece with
//! byte fallback (Gemma 3).

#[path = "tokenizer_common.rs"]
mod common;

use common::*;
use radix_models::tokenizer::Tokenizer;

fn check(name: &str, tokenizer: &Tokenizer) {
    let bytes = tokenizer.token_bytes().unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(bytes.len(), tokenizer.vocab_size(), "{name}");
    let mut whole = 0;
    for (id, token) in bytes.iter().enumerate() {
        let id = id as u32;
        if tokenizer.is_special(id) {
            continue;
        }
        if let Ok(text) = std::str::from_utf8(token) {
            assert_eq!(tokenizer.decode(&[id], false).unwrap(), text, "{name}: token {id}");
            whole += 1;
        }
    }
    assert!(whole > bytes.len() / 2, "{name}: only {whole} tokens checked");
    for text in corpus() {
        let ids = tokenizer.encode(text, false).unwrap();
        let joined: Vec<u8> = ids.iter().flat_map(|&id| bytes[id as usize].iter().copied()).collect();
        // Against the decode, not the text: a normalizer (Qwen's NFC) may have changed the text.
        assert_eq!(String::from_utf8_lossy(&joined), tokenizer.decode(&ids, false).unwrap(), "{name}: {text:?}");
    }
}

#[test]
fn token_bytes_spell_the_vocabulary() {
    check("smollm2", smollm2());
    check("qwen3", qwen3());
    check("gemma3", gemma3());
}
