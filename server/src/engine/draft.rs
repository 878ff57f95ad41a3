//! Drafts for speculative decoding by prompt lookup: what a coding agent writes often repeats
//! what it has read (an edit re-emits a file with a few lines changed, a tool call quotes paths
//! and code), so when the sequence's last tokens occurred earlier in its prompt or output, the
//! tokens that followed them there are a likely continuation. The model verifies them all in
//! one pass (`scheduler.rs`, `postprocess.rs`); the accepted ones cost one forward for many.
//!
//! Per sequence, an index of every `ngram_min`-token window's end positions finds the earlier
//! occurrences; the longest match (up to `ngram_max` tokens back, the most recent among equals)
//! gives the draft, at most twice as long as the match, copied as LZ77 does (a continuation that
//! reaches the sequence's end goes on with the draft itself, so loops draft in full). Its length adapts to how drafts fare:
//! it doubles after a round that accepted every drafted token and shrinks to what was accepted
//! after one that did not; after rounds that accepted nothing, drafting pauses for a number of
//! steps that doubles each time, so text that merely looks repetitive costs little.
//!
//! With `--spec-type draft-mtp` a step that prompt lookup drafts nothing for (or every step,
//! without `ngram`) asks the model's multi-token-prediction head instead: the drafter says how
//! many tokens it wants ([`Drafter::mtp_wanted`], the same length rules, at most `mtp_max`), the
//! engine runs the head over the sequences that asked (`EngineCore::draft_with_head`,
//! `Model::draft_mtp`) and hands each its draft back.

use std::collections::HashMap;

/// Which drafts speculative decoding uses (`--spec-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecType {
    /// No speculation.
    #[default]
    None,
    /// Prompt lookup: the continuation of the longest earlier match of the sequence's end.
    Ngram,
    /// The model's multi-token-prediction head (`Model::draft_mtp`).
    Mtp,
    /// Prompt lookup where it finds a match, the multi-token-prediction head where not.
    NgramAndMtp,
}

impl SpecType {
    /// The type drafting by prompt lookup (`ngram`), by the head (`mtp`), both, or none.
    pub fn of(ngram: bool, mtp: bool) -> Self {
        match (ngram, mtp) {
            (false, false) => SpecType::None,
            (true, false) => SpecType::Ngram,
            (false, true) => SpecType::Mtp,
            (true, true) => SpecType::NgramAndMtp,
        }
    }

    /// Whether it drafts by prompt lookup.
    pub fn ngram(self) -> bool {
        matches!(self, SpecType::Ngram | SpecType::NgramAndMtp)
    }

    /// Whether it drafts with the multi-token-prediction head.
    pub fn mtp(self) -> bool {
        matches!(self, SpecType::Mtp | SpecType::NgramAndMtp)
    }
}

/// Speculative decoding's settings (the `--spec-*` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecConfig {
    /// Where drafts come from.
    pub spec_type: SpecType,
    /// Most tokens drafted for one verify pass (`--spec-draft-n-max`).
    pub draft_max: usize,
    /// Fewest tokens worth a verify pass (`--spec-draft-n-min`): shorter drafts are dropped.
    pub draft_min: usize,
    /// Fewest tokens of the sequence's end that must match earlier text (`--spec-ngram-n-match`).
    pub ngram_min: usize,
    /// Longest match looked for: a longer match is not a better one. Long enough to tell apart
    /// the places of a file that differ only a line back (similar functions, repeated blocks).
    pub ngram_max: usize,
    /// Most tokens the multi-token-prediction head drafts in one round (`--spec-mtp-n-max`):
    /// each is a step of the head and the output matrix, and its guesses fade after a few.
    pub mtp_max: usize,
    /// The head's drafts stop before the first token it gives less than this probability
    /// (`--spec-draft-p-min`, llama-server's greedy threshold).
    pub p_min: f32,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            spec_type: SpecType::None,
            // Longer drafts copy long runs in fewer rounds, but where an edit departs from the
            // text it copies, the rest of the draft is verified for nothing: on the default
            // model's 200- and 300-line edits, 16 decodes 1.1-1.3x as fast as 64
            // (benches/README.md, "Draft length").
            draft_max: 16,
            draft_min: 1,
            ngram_min: 4,
            ngram_max: 128,
            mtp_max: 3,
            p_min: 0.0,
        }
    }
}

impl SpecConfig {
    /// Whether any drafting is on.
    pub fn enabled(&self) -> bool {
        self.spec_type != SpecType::None && self.draft_max > 0
    }
}

/// The draft length a sequence starts with (at most `draft_max`): long enough to pay off at once
/// when it copies.
const FIRST_DRAFT: usize = 16;
/// Candidates whose match length is measured per lookup (the most recent first): bounds a
/// step's cost on text where one short window recurs thousands of times.
const CANDIDATES: usize = 64;

/// One sequence's drafting: its index of earlier windows, the draft of the current step and
/// how drafts have fared.
#[derive(Debug, Clone)]
pub(crate) struct Drafter {
    config: SpecConfig,
    /// End positions (exclusive) of every `ngram_min`-token window, by the window's hash.
    windows: HashMap<u64, Vec<u32>>,
    /// Tokens whose windows are indexed.
    indexed: usize,
    /// The draft being verified this step.
    draft: Vec<u32>,
    /// Tokens to ask the multi-token-prediction head for this step (0: none).
    mtp_wanted: usize,
    /// Tokens to draft next time.
    next_len: usize,
    /// Steps to skip drafting, and the pause after the next fruitless round.
    pause: usize,
    next_pause: usize,
    /// Tokens drafted and accepted, for the timings.
    drafted: usize,
    accepted: usize,
}

impl Drafter {
    /// A drafter with `config` (which must be enabled).
    pub(crate) fn new(config: SpecConfig) -> Self {
        Drafter {
            config,
            windows: HashMap::new(),
            indexed: 0,
            draft: Vec::new(),
            mtp_wanted: 0,
            next_len: FIRST_DRAFT.clamp(config.draft_min.max(1), config.draft_max.max(1)),
            pause: 0,
            next_pause: 1,
            drafted: 0,
            accepted: 0,
        }
    }

    /// The draft of the current step (empty: none).
    pub(crate) fn draft(&self) -> &[u32] {
        &self.draft
    }

    /// Tokens drafted and accepted so far.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.drafted, self.accepted)
    }

    /// Drafts at most `limit` tokens to follow `tokens` (the sequence so far); the draft is
    /// empty when nothing earlier matches, drafting pauses, or the draft would be shorter than
    /// `draft_min`.
    /// With the multi-token-prediction head on, a step that prompt lookup drafts nothing for
    /// asks the head instead ([`mtp_wanted`](Self::mtp_wanted)).
    pub(crate) fn propose(&mut self, tokens: &[u32], limit: usize) -> &[u32] {
        self.draft.clear();
        self.mtp_wanted = 0;
        let ngram = self.config.spec_type.ngram();
        if ngram {
            self.index(tokens);
        }
        if self.pause > 0 {
            self.pause -= 1;
            return &self.draft;
        }
        let limit = limit.min(self.next_len);
        if limit < self.config.draft_min.max(1) {
            return &self.draft;
        }
        let found = if ngram { self.longest_match(tokens) } else { None };
        if found.is_none() && self.config.spec_type.mtp() {
            self.mtp_wanted = limit.min(self.config.mtp_max);
        }
        if let Some((start, matched)) = found {
            // A short match is weak evidence of copying (prose repeats 4-token phrases all the
            // time): its draft is at most twice as long, so a wrong one costs little.
            // Copied as LZ77 copies, overlapping: where the continuation runs into the end of
            // the sequence, the draft goes on with its own first tokens, so a loop of period p
            // drafts more than p tokens.
            for at in start..start + limit.min(2 * matched) {
                let token = tokens.get(at).copied().unwrap_or_else(|| self.draft[at - tokens.len()]);
                self.draft.push(token);
            }
        }
        &self.draft
    }

    /// Tokens the multi-token-prediction head should draft this step (0: none).
    pub(crate) fn mtp_wanted(&self) -> usize {
        self.mtp_wanted
    }

    /// Takes the head's draft for this step (shorter than `draft_min`: none).
    pub(crate) fn take_mtp_draft(&mut self, draft: Vec<u32>) {
        self.mtp_wanted = 0;
        self.draft = if draft.len() >= self.config.draft_min.max(1) { draft } else { Vec::new() };
    }

    /// Keeps only the first `len` tokens of the current draft.
    pub(crate) fn cut(&mut self, len: usize) {
        self.draft.truncate(len);
    }

    /// Records that the model accepted the first `accepted` tokens of the current draft, and
    /// adapts the next draft's length.
    pub(crate) fn verified(&mut self, accepted: usize) {
        let drafted = self.draft.len();
        debug_assert!(accepted <= drafted, "accepted {accepted} of {drafted} drafted tokens");
        self.drafted += drafted;
        self.accepted += accepted;
        let (floor, ceiling) = (self.config.draft_min.max(1), self.config.draft_max.max(1));
        if accepted == drafted {
            self.next_len = (self.next_len * 2).min(ceiling);
            self.next_pause = 1;
        } else if accepted == 0 {
            self.next_len = floor.max(self.next_len / 2);
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(64);
        } else {
            self.next_len = accepted.clamp(floor, ceiling);
            self.next_pause = 1;
        }
        self.draft.clear();
    }

    /// Indexes the windows ending at each token not yet indexed, but the last: a match must
    /// have a continuation, and the window ending at the end is the one being looked up.
    fn index(&mut self, tokens: &[u32]) {
        let n = self.config.ngram_min.max(1);
        let upto = tokens.len().saturating_sub(1);
        for end in self.indexed.max(n)..=upto {
            if end < n {
                continue;
            }
            self.windows.entry(window_hash(&tokens[end - n..end])).or_default().push(end as u32);
        }
        self.indexed = self.indexed.max(upto + 1);
    }

    /// Where the continuation of the longest earlier match of `tokens`' end starts, and the
    /// match's length.
    fn longest_match(&self, tokens: &[u32]) -> Option<(usize, usize)> {
        let n = self.config.ngram_min.max(1);
        if tokens.len() <= n {
            return None;
        }
        let tail = &tokens[tokens.len() - n..];
        let ends = self.windows.get(&window_hash(tail))?;
        let mut best: Option<(usize, usize)> = None;
        for &end in ends.iter().rev().take(CANDIDATES) {
            let end = end as usize;
            if end >= tokens.len() || tokens[end - n..end] != *tail {
                continue;
            }
            let matched = (0..self.config.ngram_max.min(end))
                .take_while(|&back| tokens[end - 1 - back] == tokens[tokens.len() - 1 - back])
                .count();
            if best.is_none_or(|(_, longest)| matched > longest) {
                best = Some((end, matched));
            }
        }
        best
    }
}

/// FNV-1a over a window's token ids.
fn window_hash(window: &[u32]) -> u64 {
    window
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ngram(draft_max: usize) -> SpecConfig {
        SpecConfig { spec_type: SpecType::Ngram, draft_max, ..SpecConfig::default() }
    }

    /// The longest match wins over a more recent shorter one, and the draft is what followed it.
    #[test]
    fn drafts_the_continuation_of_the_longest_match() {
        let mut drafter = Drafter::new(ngram(8));
        //            0  1  2  3  4  5  6   7  8  9  10 11 12 13  14  15 16 17 18 19
        let tokens = [9, 1, 2, 3, 4, 5, 6, 70, 1, 2, 3, 4, 8, 8, 8, 99, 1, 2, 3, 4];
        // `1 2 3 4` also ends at 5 and at 12; the token before differs from the end's (9, 70
        // against 99), so both match 4 tokens and the most recent wins.
        assert_eq!(drafter.propose(&tokens, 8), &[8, 8, 8, 99, 1, 2, 3, 4]);
        let mut drafter = Drafter::new(ngram(8));
        let tokens = [7, 1, 2, 3, 4, 5, 6, 70, 1, 2, 3, 4, 8, 8, 8, 7, 1, 2, 3, 4];
        assert_eq!(drafter.propose(&tokens, 3), &[5, 6, 70], "7 1 2 3 4 matches 5 tokens back");
        assert_eq!(Drafter::new(ngram(8)).propose(&[1, 2, 3, 4, 5], 8), &[] as &[u32], "no earlier match");
        // A loop of period 3: the continuation of its most recent match reaches the end after 3
        // tokens and goes on around the loop.
        let tokens = [5, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3];
        assert_eq!(Drafter::new(ngram(8)).propose(&tokens, 8), &[1, 2, 3, 1, 2, 3, 1, 2]);
    }

    /// Lengths double on full acceptance, follow partial acceptance, and a fruitless round
    /// pauses drafting for a doubling number of steps.
    #[test]
    fn draft_length_adapts() {
        let config = SpecConfig { draft_min: 2, ..ngram(64) };
        let tokens: Vec<u32> = (0..400).map(|i| i % 100).collect();
        let mut drafter = Drafter::new(config);
        assert_eq!(drafter.propose(&tokens, 100).len(), 16);
        drafter.verified(16);
        assert_eq!(drafter.propose(&tokens, 100).len(), 32);
        drafter.verified(32);
        assert_eq!(drafter.propose(&tokens, 100).len(), 64);
        drafter.verified(64);
        assert_eq!(drafter.propose(&tokens, 10).len(), 10, "the caller's limit");
        drafter.verified(3);
        assert_eq!(drafter.propose(&tokens, 100).len(), 3);
        drafter.verified(0);
        assert!(drafter.propose(&tokens, 100).is_empty(), "paused one step");
        assert_eq!(drafter.propose(&tokens, 100).len(), 2);
        drafter.verified(0);
        assert!(drafter.propose(&tokens, 100).is_empty());
        assert!(drafter.propose(&tokens, 100).is_empty(), "paused two steps");
        assert_eq!(drafter.propose(&tokens, 1).len(), 0, "below draft_min");
        assert_eq!(drafter.counts(), (16 + 32 + 64 + 10 + 3 + 2, 16 + 32 + 64 + 3));
    }

    proptest! {
        /// Whatever the tokens, a draft is a continuation of an earlier occurrence of the last
        /// `ngram_min` tokens, within the limit, and growing the sequence token by token (as
        /// decoding does) drafts what a fresh drafter would.
        #[test]
        fn drafts_continue_an_earlier_occurrence(tokens in prop::collection::vec(0u32..4, 1..120), limit in 1usize..20) {
            let config = SpecConfig { ngram_min: 3, ..ngram(64) };
            let mut grown = Drafter::new(config);
            for len in 1..=tokens.len() {
                let seq = &tokens[..len];
                let draft = grown.propose(seq, limit).to_vec();
                let fresh = Drafter::new(config).propose(seq, limit).to_vec();
                prop_assert_eq!(&draft, &fresh);
                prop_assert!(draft.len() <= limit.min(16));
                if !draft.is_empty() {
                    let tail = &seq[len - 3..];
                    // Overlapping copy: the draft continues the sequence it extends.
                    let extended = [seq, &draft].concat();
                    let found = (3..len).any(|end| &seq[end - 3..end] == tail
                        && extended[end..end + draft.len()] == draft[..]);
                    prop_assert!(found, "draft {:?} after {:?}", draft, seq);
                }
                grown.draft.clear();
            }
        }
    }
}
