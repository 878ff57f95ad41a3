//! Incremental detokenization: generated ids in, text pieces out, for streaming.
//!
//! Decoding one token at a time is wrong twice over: a byte-level (or byte-fallback) token may hold
//! only part of a UTF-8 character (emoji and CJK are often split over two or three tokens), and a
//! decoder's rules (a SentencePiece leading space, cleanup) depend on the neighbouring tokens. So,
//! as text-generation-inference and vLLM do, we decode a sliding window of tokens twice: the tokens
//! already emitted in the last step (`prefix_offset..read_offset`) and the same plus the new ones
//! (`prefix_offset..`). What the longer decode adds is the new text, emitted only once it does not
//! end in U+FFFD (an incomplete character). When a decode ends with no U+FFFD, the bytes end on a
//! whole character, so decoding the rest separately gives the same text as decoding everything:
//! the emitted pieces put together are `decode(all ids)`.

use std::borrow::Borrow;

use super::{Result, Tokenizer};

/// How many prompt tokens [`IncrementalDetokenizer::with_context`] keeps as decoding context.
const CONTEXT_TOKENS: usize = 5;
/// Ids before the window are dropped once this many have piled up.
const COMPACT_AFTER: usize = 256;

/// Turns generated token ids into text pieces that never end inside a UTF-8 character.
///
/// Generic over how the tokenizer is held: `&Tokenizer`, `Arc<Tokenizer>` or an owned one.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer<T: Borrow<Tokenizer>> {
    tokenizer: T,
    skip_special_tokens: bool,
    /// The ids from (at least) the start of the window.
    ids: Vec<u32>,
    /// Start of the window: the first id of the text emitted last.
    prefix_offset: usize,
    /// End of the emitted text: ids from here on are not emitted yet.
    read_offset: usize,
}

impl<T: Borrow<Tokenizer>> IncrementalDetokenizer<T> {
    /// A detokenizer for a generation with no context: the first token is decoded as the start of
    /// a text. With `skip_special_tokens`, special tokens produce no text.
    pub fn new(tokenizer: T, skip_special_tokens: bool) -> Self {
        Self { tokenizer, skip_special_tokens, ids: Vec::new(), prefix_offset: 0, read_offset: 0 }
    }

    /// A detokenizer for a generation that continues `context` (the prompt ids): the last few of
    /// them are decoded with the generated ids, so that a decoder's rules about the start of a text
    /// (a SentencePiece leading space) do not apply to the first generated token. The context
    /// itself is never emitted.
    pub fn with_context(tokenizer: T, skip_special_tokens: bool, context: &[u32]) -> Self {
        let ids = context[context.len().saturating_sub(CONTEXT_TOKENS)..].to_vec();
        let read_offset = ids.len();
        Self { tokenizer, skip_special_tokens, ids, prefix_offset: 0, read_offset }
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.borrow().decode(ids, self.skip_special_tokens)
    }

    /// Adds one generated id; returns the text it completes, if any (`None` while a character is
    /// still incomplete, or when the id adds no text, like a skipped special token).
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let text = self.decode(&self.ids[self.prefix_offset..])?;
        if text.len() <= prefix.len() || text.ends_with('\u{fffd}') {
            return Ok(None);
        }
        let Some(new) = text.strip_prefix(prefix.as_str()) else {
            // The decoder rewrote text already emitted; wait, and let `finish` reconcile.
            return Ok(None);
        };
        let new = new.to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        if self.prefix_offset >= COMPACT_AFTER {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
        Ok(Some(new))
    }

    /// Adds several ids; returns the text they complete (possibly empty).
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.extend(self.push(id)?);
        }
        Ok(out)
    }

    /// Ends the generation: returns the text not emitted yet, incomplete characters included (as
    /// U+FFFD, as `decode` has them).
    pub fn finish(self) -> Result<String> {
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let text = self.decode(&self.ids[self.prefix_offset..])?;
        if let Some(rest) = text.strip_prefix(prefix.as_str()) {
            return Ok(rest.to_owned());
        }
        // Only where a decoder rewrote emitted text: emit what follows the common part.
        let common = prefix
            .char_indices()
            .zip(text.chars())
            .find(|((_, a), b)| a != b)
            .map_or(prefix.len().min(text.len()), |((index, _), _)| index);
        Ok(text.get(common..).unwrap_or_default().to_owned())
    }

    /// The tokenizer this detokenizer decodes with.
    pub fn tokenizer(&self) -> &Tokenizer {
        self.tokenizer.borrow()
    }
}
