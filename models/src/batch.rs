//! What one forward pass computes: the new tokens of several sequences, packed.

use radix_kernels::SequenceAttention;

use crate::error::{ModelError, Result};

/// One sequence's part of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceChunk {
    /// Index of its first new token in [`ForwardBatch::tokens`].
    pub start: usize,
    /// Number of new tokens (a prefill chunk, or 1 for a decode step).
    pub len: usize,
    /// Tokens in its context after this step, the new ones included; the new tokens take
    /// positions `context_len - len .. context_len`.
    pub context_len: usize,
    /// Pages holding positions `0..context_len`, in order. The new tokens' K/V are written to
    /// their slots here; earlier positions must already hold their K/V.
    pub page_table: Vec<u32>,
    /// Whether to return logits for its last token.
    pub logits: bool,
    /// Hybrid models: the [`crate::StatePool`] slot holding the sequence's recurrent state
    /// after position `context_len - len - 1`, updated to the state after its last new token.
    /// A chunk starting at position 0 starts from a zero state whatever the slot held.
    pub state_slot: Option<u32>,
    /// A drafted span being verified (speculative decoding): logits for every new token, not
    /// only the last; and a hybrid model's state slot advances over the span's first token
    /// only (the sequence's own, kept whatever becomes of the drafts after it), since a suffix
    /// of the drafts may be rejected: the pass keeps the span's recurrent-layer inputs beside
    /// the slot, and [`crate::Model::apply_verified`] advances the state over the accepted rows.
    pub verify: bool,
}

/// The new tokens of several sequences, packed row after row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// Token ids of all new tokens.
    pub tokens: Vec<u32>,
    /// The sequences, in the order of their rows.
    pub sequences: Vec<SequenceChunk>,
}

impl ForwardBatch {
    /// Adds a sequence's new tokens.
    pub fn push(&mut self, tokens: &[u32], context_len: usize, page_table: Vec<u32>, logits: bool) {
        self.push_with_state(tokens, context_len, page_table, logits, None);
    }

    /// Adds a sequence's new tokens, with a hybrid model's state slot.
    pub fn push_with_state(
        &mut self,
        tokens: &[u32],
        context_len: usize,
        page_table: Vec<u32>,
        logits: bool,
        state_slot: Option<u32>,
    ) {
        self.sequences.push(SequenceChunk {
            start: self.tokens.len(),
            len: tokens.len(),
            context_len,
            page_table,
            logits,
            state_slot,
            verify: false,
        });
        self.tokens.extend_from_slice(tokens);
    }

    /// Adds a drafted span to verify: the sequence's last accepted token followed by drafted
    /// ones, with logits for each ([`SequenceChunk::verify`]).
    pub fn push_verify(&mut self, tokens: &[u32], context_len: usize, page_table: Vec<u32>, state_slot: Option<u32>) {
        self.push_with_state(tokens, context_len, page_table, true, state_slot);
        self.sequences.last_mut().expect("just pushed").verify = true;
    }

    /// Positions of every new token, row by row.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.sequences.iter().flat_map(|s| s.context_len - s.len..s.context_len)
    }

    /// The KV slot (`page * page_size + offset`) of every new token, row by row.
    pub fn slots(&self, page_size: usize) -> Vec<u32> {
        self.sequences
            .iter()
            .flat_map(|s| {
                (s.context_len - s.len..s.context_len)
                    .map(move |p| s.page_table[p / page_size] * page_size as u32 + (p % page_size) as u32)
            })
            .collect()
    }

    /// Each sequence as the attention kernels take it.
    pub fn attention_sequences(&self) -> Vec<SequenceAttention<'_>> {
        self.sequences
            .iter()
            .map(|s| SequenceAttention {
                query_start: s.start,
                query_len: s.len,
                context_len: s.context_len,
                page_table: &s.page_table,
            })
            .collect()
    }

    /// Rows whose logits are wanted, in order: each such sequence's last new token, every new
    /// token of a span being verified.
    pub fn logit_rows(&self) -> Vec<u32> {
        let rows = |s: &SequenceChunk| match (s.verify, s.logits) {
            (true, _) => s.start..s.start + s.len,
            (false, true) => s.start + s.len - 1..s.start + s.len,
            (false, false) => 0..0,
        };
        self.sequences.iter().flat_map(rows).map(|r| r as u32).collect()
    }

    /// Checks that rows tile the tokens, page tables cover contexts, and ids fit the vocabulary.
    pub fn validate(&self, page_size: usize, num_pages: usize, vocab_size: usize) -> Result<()> {
        let bad = |m: String| Err(ModelError::Batch(m));
        let mut next = 0;
        for (i, s) in self.sequences.iter().enumerate() {
            if s.start != next || s.len == 0 {
                return bad(format!("sequence {i} rows start at {} (expected {next}) with {} tokens", s.start, s.len));
            }
            next += s.len;
            if s.context_len < s.len {
                return bad(format!("sequence {i}: context {} shorter than its {} new tokens", s.context_len, s.len));
            }
            if s.page_table.len() * page_size < s.context_len {
                return bad(format!(
                    "sequence {i}: {} pages of {page_size} cannot hold {} tokens",
                    s.page_table.len(),
                    s.context_len
                ));
            }
            if let Some(p) = s.page_table.iter().find(|&&p| p as usize >= num_pages) {
                return bad(format!("sequence {i}: page {p} is outside the pool's {num_pages} pages"));
            }
        }
        let mut slots: Vec<u32> = self.sequences.iter().filter_map(|s| s.state_slot).collect();
        slots.sort_unstable();
        if slots.windows(2).any(|w| w[0] == w[1]) {
            return bad("two sequences of the batch share a state slot".into());
        }
        if next != self.tokens.len() {
            return bad(format!("sequences cover {next} rows but the batch has {} tokens", self.tokens.len()));
        }
        if let Some(t) = self.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return bad(format!("token id {t} is outside the vocabulary of {vocab_size}"));
        }
        Ok(())
    }
}
