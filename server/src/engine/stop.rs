//! Stop strings, matched in the detokenized text across token boundaries and never emitted;
//! and [`StopText`], a sequence's output text as the engine releases it.

use std::sync::Arc;

use radix_models::tokenizer::{IncrementalDetokenizer, Tokenizer};

/// Finds stop strings in streamed text; holds back any tail that could still begin one.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
}

/// What one [`StopMatcher::push`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutput {
    /// Text that is safe to emit.
    pub text: String,
    /// A stop string was found: generation ends, and nothing after it is emitted.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for the given stop strings (empty ones are ignored).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutput {
        if self.stopped {
            return StopOutput { text: String::new(), stopped: true };
        }
        self.pending.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            self.stopped = true;
            let text = self.pending[..at].to_owned();
            self.pending.clear();
            return StopOutput { text, stopped: true };
        }
        let hold = self.longest_stop_prefix_suffix();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        StopOutput { text, stopped: false }
    }

    /// Flushes held-back text at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            for (len, _) in stop.char_indices().skip(1) {
                if len > best && self.pending.ends_with(&stop[..len]) {
                    best = len;
                }
            }
        }
        best
    }
}

/// One sequence's generated text: decoded token by token, with any tail that could begin a stop
/// string held back until it is known not to.
#[derive(Debug)]
pub(crate) struct StopText {
    detokenizer: Option<IncrementalDetokenizer<Arc<Tokenizer>>>,
    stops: Vec<String>,
    matcher: StopMatcher,
    /// Everything decoded, stop strings included, to tell which stop string matched.
    raw: String,
    /// Bytes of `raw` released past the matcher.
    released: usize,
    stopped: bool,
}

impl StopText {
    /// Text for a generation that ends at any of `stops` (empty ones are ignored).
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        StopText {
            detokenizer: Some(IncrementalDetokenizer::new(tokenizer, true)),
            matcher: StopMatcher::new(stops.clone()),
            stops,
            raw: String::new(),
            released: 0,
            stopped: false,
        }
    }

    /// Feeds one generated token: the text it releases, and the stop string it completed.
    pub(crate) fn push(&mut self, token: u32) -> (String, Option<String>) {
        let text = match self.detokenizer.as_mut() {
            // A token that decodes to nothing yet (part of a character) releases nothing.
            Some(detokenizer) => detokenizer.push(token).ok().flatten().unwrap_or_default(),
            None => String::new(),
        };
        self.feed(&text)
    }

    /// Ends the text without a stop string: releases whatever was held back.
    pub(crate) fn finish(&mut self) -> String {
        let rest = self.detokenizer.take().and_then(|d| d.finish().ok()).unwrap_or_default();
        let (mut text, _) = self.feed(&rest);
        if !self.stopped {
            text.push_str(&self.matcher.finish());
        }
        text
    }

    fn feed(&mut self, text: &str) -> (String, Option<String>) {
        if self.stopped || text.is_empty() {
            return (String::new(), None);
        }
        self.raw.push_str(text);
        let out = self.matcher.push(text);
        self.released += out.text.len();
        if !out.stopped {
            return (out.text, None);
        }
        self.stopped = true;
        let rest = &self.raw[self.released..];
        let word = self.stops.iter().filter(|s| rest.starts_with(s.as_str())).max_by_key(|s| s.len()).cloned();
        (out.text, Some(word.unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()));
        let mut out = String::new();
        for p in pieces {
            let o = m.push(p);
            out.push_str(&o.text);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_split_across_pieces_is_caught_and_not_emitted() {
        assert_eq!(run(&["</answer>"], &["the end</ans", "wer> trailing"]), ("the end".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn near_misses_are_released() {
        assert_eq!(run(&["STOP"], &["ST", "ART", " go"]), ("START go".into(), false));
        assert_eq!(run(&["STOP"], &["a ST"]), ("a ST".into(), false));
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_respected() {
        assert_eq!(run(&["b", "ab"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&["终了"], &["日本語", "终", "了です"]), ("日本語".into(), true));
    }
}
