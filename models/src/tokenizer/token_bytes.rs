//! The raw bytes each token stands for, as a grammar engine (llguidance's token trie) needs them:
//! the vocabulary spells tokens in an encoding of its own (`Ġhello` in byte-level BPE, `▁hello`
//! and `<0x0A>` in SentencePiece with byte fallback), and decoding single ids loses bytes that
//! are not whole UTF-8 characters.

use std::collections::HashMap;

use super::{Result, Tokenizer, TokenizerError};

/// How the vocabulary spells bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2 byte-level BPE: every byte is one printable character.
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xNN>` tokens for bytes.
    ByteFallback,
}

/// GPT-2's byte to character table, reversed: bytes that are printable map to themselves, the
/// others to the characters from U+0100 on, in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        if printable(b) {
            map.insert(char::from(b), b);
        } else {
            // Every value from 0x100 to 0x143 is a valid char.
            map.insert(char::from_u32(next).unwrap_or('\u{FFFD}'), b);
            next += 1;
        }
    }
    map
}

impl Tokenizer {
    fn spelling(&self) -> Result<Spelling> {
        // The decoder types are not all public in a matchable way; its JSON names them.
        let decoder = serde_json::to_string(&self.inner.get_decoder())
            .map_err(|e| TokenizerError::Decode { count: 0, message: format!("cannot inspect the decoder: {e}") })?;
        if decoder.contains("\"ByteLevel\"") {
            Ok(Spelling::ByteLevel)
        } else if decoder.contains("\"ByteFallback\"") || decoder.contains("\"Metaspace\"") {
            Ok(Spelling::ByteFallback)
        } else {
            Err(TokenizerError::Decode {
                count: 0,
                message: format!("cannot tell how this tokenizer spells bytes (decoder {decoder})"),
            })
        }
    }

    /// The bytes of every token id below [`Tokenizer::vocab_size`], in id order: what
    /// [`Tokenizer::decode`] makes of the token, before any UTF-8 check. Special tokens get their
    /// text (`<|im_end|>`); callers that must tell them apart ask [`Tokenizer::is_special`]. An id
    /// with no vocabulary entry gets no bytes, so it can never be produced under a grammar.
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>> {
        let spelling = self.spelling()?;
        let chars = byte_level_chars();
        let mut out = Vec::with_capacity(self.vocab_size());
        for id in 0..self.vocab_size() as u32 {
            let Some(piece) = self.inner.id_to_token(id) else {
                out.push(Vec::new());
                continue;
            };
            if self.is_special(id) {
                out.push(piece.into_bytes());
                continue;
            }
            // Added tokens go through the decoder too (Gemma's `▁▁` is two spaces); a character
            // the byte-level table lacks is kept as it is, as the decoder keeps it.
            out.push(match spelling {
                Spelling::ByteLevel => {
                    let mut bytes = Vec::with_capacity(piece.len());
                    for c in piece.chars() {
                        match chars.get(&c) {
                            Some(&b) => bytes.push(b),
                            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    bytes
                }
                Spelling::ByteFallback => byte_fallback_bytes(&piece),
            });
        }
        Ok(out)
    }
}

fn byte_fallback_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>'))
        && hex.len() == 2
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        return vec![b];
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_covers_every_byte_once() {
        let map = byte_level_chars();
        assert_eq!(map.len(), 256);
        let mut bytes: Vec<u8> = map.values().copied().collect();
        bytes.sort_unstable();
        assert_eq!(bytes, (0..=255).collect::<Vec<u8>>());
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
    }

    #[test]
    fn sentencepiece_pieces_become_bytes() {
        assert_eq!(byte_fallback_bytes("<0x0A>"), b"\n");
        assert_eq!(byte_fallback_bytes("\u{2581}hello"), b" hello");
        assert_eq!(byte_fallback_bytes("<0xZZ>"), b"<0xZZ>");
    }
}
