//! Stop strings, matched in the detokenized text across token boundaries and never emitted;
//! and [`StopText`], a sequence's output text as the engine releases it.

use std::sync::Arc;

use radix_models::tokenizer::{IncrementalDetokenizer, Tokenizer};

/// Finds stop strings in streamed text; holds back any tail that could still begin one.
///
/// An Aho-Corasick automaton over the stop strings' bytes, advanced by each new byte only: a
/// token costs the bytes it adds, not the total length of the stop list (a client may send
/// hundreds of thousands of stops).
#[derive(Debug, Clone)]
pub struct StopMatcher {
    automaton: Arc<StopAutomaton>,
    /// The automaton's state after the last byte of `pending`.
    state: u32,
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
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        StopMatcher {
            automaton: Arc::new(StopAutomaton::new(&stops)),
            state: 0,
            pending: String::new(),
            stopped: false,
        }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutput {
        if self.stopped {
            return StopOutput { text: String::new(), stopped: true };
        }
        let offset = self.pending.len();
        self.pending.push_str(text);
        // The earliest start of any stop in the pending text, as if each were searched for.
        let mut earliest: Option<usize> = None;
        for (i, &byte) in text.as_bytes().iter().enumerate() {
            self.state = self.automaton.next(self.state, byte);
            let longest = self.automaton.longest_match(self.state);
            if longest > 0 {
                let start = offset + i + 1 - longest;
                earliest = Some(earliest.map_or(start, |e| e.min(start)));
            }
        }
        if let Some(at) = earliest {
            self.stopped = true;
            let text = self.pending[..at].to_owned();
            self.pending.clear();
            return StopOutput { text, stopped: true };
        }
        // The state's depth is the longest suffix of the text that begins some stop.
        let hold = self.automaton.depth(self.state);
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        StopOutput { text, stopped: false }
    }

    /// Flushes held-back text at the end of generation.
    pub fn finish(&mut self) -> String {
        self.state = 0;
        std::mem::take(&mut self.pending)
    }
}

/// The trie of the stop strings with failure links (Aho-Corasick): state 0 is the root, a
/// state's depth the length of the prefix it stands for.
#[derive(Debug, Default)]
struct StopAutomaton {
    /// Each state's outgoing bytes, sorted by byte.
    edges: Vec<Vec<(u8, u32)>>,
    /// The state of the longest proper suffix that is also a prefix in the trie.
    fail: Vec<u32>,
    depth: Vec<u32>,
    /// The longest stop string that ends at this state (0: none), through failure links too.
    longest_match: Vec<u32>,
}

impl StopAutomaton {
    fn new(stops: &[String]) -> Self {
        let mut automaton =
            StopAutomaton { edges: vec![Vec::new()], fail: vec![0], depth: vec![0], longest_match: vec![0] };
        for stop in stops {
            let mut state = 0u32;
            for &byte in stop.as_bytes() {
                state = match automaton.child(state, byte) {
                    Some(next) => next,
                    None => automaton.add_child(state, byte),
                };
            }
            let s = state as usize;
            automaton.longest_match[s] = automaton.depth[s];
        }
        automaton.link();
        automaton
    }

    fn child(&self, state: u32, byte: u8) -> Option<u32> {
        let edges = &self.edges[state as usize];
        edges.binary_search_by_key(&byte, |&(b, _)| b).ok().map(|i| edges[i].1)
    }

    fn add_child(&mut self, state: u32, byte: u8) -> u32 {
        let next = self.edges.len() as u32;
        let edges = &mut self.edges[state as usize];
        let at = edges.partition_point(|&(b, _)| b < byte);
        edges.insert(at, (byte, next));
        let depth = self.depth[state as usize] + 1;
        self.edges.push(Vec::new());
        self.fail.push(0);
        self.depth.push(depth);
        self.longest_match.push(0);
        next
    }

    /// Failure links and inherited matches, breadth first (a state's link is shallower).
    fn link(&mut self) {
        let mut queue = std::collections::VecDeque::from_iter(self.edges[0].iter().map(|&(_, s)| s));
        while let Some(state) = queue.pop_front() {
            let edges = self.edges[state as usize].clone();
            for (byte, child) in edges {
                let mut fallback = self.fail[state as usize];
                let link = loop {
                    if let Some(next) = self.child(fallback, byte) {
                        break next;
                    }
                    if fallback == 0 {
                        break 0;
                    }
                    fallback = self.fail[fallback as usize];
                };
                let c = child as usize;
                self.fail[c] = link;
                self.longest_match[c] = self.longest_match[c].max(self.longest_match[link as usize]);
                queue.push_back(child);
            }
        }
    }

    /// The state after `byte`.
    fn next(&self, mut state: u32, byte: u8) -> u32 {
        loop {
            if let Some(next) = self.child(state, byte) {
                return next;
            }
            if state == 0 {
                return 0;
            }
            state = self.fail[state as usize];
        }
    }

    fn depth(&self, state: u32) -> usize {
        self.depth[state as usize] as usize
    }

    fn longest_match(&self, state: u32) -> usize {
        self.longest_match[state as usize] as usize
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

    /// The old matcher, by search: the earliest stop in the whole pending text, and the
    /// longest pending suffix that begins a stop held back.
    fn naive(stops: &[String], pieces: &[String]) -> (String, bool) {
        let stops: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();
        let (mut out, mut pending) = (String::new(), String::new());
        for piece in pieces {
            pending.push_str(piece);
            if let Some(at) = stops.iter().filter_map(|s| pending.find(s.as_str())).min() {
                out.push_str(&pending[..at]);
                return (out, true);
            }
            let hold = stops
                .iter()
                .flat_map(|s| s.char_indices().skip(1).map(|(len, _)| &s[..len]))
                .filter(|prefix| pending.ends_with(prefix))
                .map(str::len)
                .max()
                .unwrap_or(0);
            let cut = pending.len() - hold;
            out.push_str(&pending[..cut]);
            pending.drain(..cut);
        }
        out.push_str(&pending);
        (out, false)
    }

    proptest::proptest! {
        #[test]
        fn the_automaton_matches_searching_for_every_stop(
            stops in proptest::collection::vec("[abé]{0,4}", 0..6),
            pieces in proptest::collection::vec("[abcé]{0,5}", 0..8),
        ) {
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            proptest::prop_assert_eq!(run(&stop_refs, &refs), naive(&stops, &pieces));
        }
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_respected() {
        assert_eq!(run(&["b", "ab"], &["xxab"]), ("xx".into(), true));
        // The stop that starts first wins, even when another one inside it ends first.
        assert_eq!(run(&["abcd", "bc"], &["xabcd"]), ("x".into(), true));
        assert_eq!(run(&["终了"], &["日本語", "终", "了です"]), ("日本語".into(), true));
    }
}
