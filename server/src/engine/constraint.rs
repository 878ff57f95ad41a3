//! Constrained decoding with llguidance: a grammar (Lark, possibly with embedded JSON schemas)
//! becomes a per-sequence matcher that says which tokens may come next, learns each sampled
//! token, and reports when the grammar is complete so the sequence stops.
//!
//! The token trie over the vocabulary (llguidance's `toktrie`) is built once per tokenizer and
//! shared by every request ([`ConstraintFactory::shared`]); a grammar is compiled on the HTTP
//! side, so a bad one is the client's 400, and only the cheap per-token work runs on the engine
//! thread.

use std::sync::{Arc, Mutex, Weak};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use radix_models::tokenizer::Tokenizer;

/// The vocabulary as llguidance sees it: token bytes in a trie, and our tokenizer for the
/// strings the grammar engine wants tokenized.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Not tokenizable text (an encoder error) falls back to the trie's greedy split.
        self.trie.tokenize_with_greedy_fallback(s, |s| self.tokenizer.encode(s, false).unwrap_or_default())
    }
}

/// Compiles grammars against one tokenizer's vocabulary.
pub struct ConstraintFactory {
    factory: ParserFactory,
    vocab_size: usize,
}

impl std::fmt::Debug for ConstraintFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintFactory").field("vocab_size", &self.vocab_size).finish_non_exhaustive()
    }
}

impl ConstraintFactory {
    /// Builds the token trie of `tokenizer` (a few hundred milliseconds for a 50k vocabulary).
    /// Its EOS set is what may end a complete grammar.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, String> {
        let mut words = tokenizer.token_bytes().map_err(|e| format!("cannot read the vocabulary's bytes: {e}"))?;
        for (id, word) in words.iter_mut().enumerate() {
            // The trie keeps special tokens apart by this leading marker byte, so a grammar's
            // literal text never matches `<|im_end|>` by accident.
            if tokenizer.is_special(id as u32) {
                word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
        }
        let vocab_size = words.len();
        let eos: Vec<u32> = tokenizer.eos_token_ids().iter().copied().filter(|&t| (t as usize) < vocab_size).collect();
        let first_eos = eos.first().copied().ok_or("the tokenizer has no EOS token to end a grammar with")?;
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        let env: TokEnv = Arc::new(VocabEnv { trie, tokenizer: tokenizer.clone() });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| format!("cannot set up the grammar engine: {e}"))?;
        // Grammar problems reach the client as errors; llguidance's own stderr logging would
        // only duplicate them in the server log.
        factory.quiet();
        Ok(ConstraintFactory { factory, vocab_size })
    }

    /// The factory of `tokenizer`, built on first use and shared afterwards (one per tokenizer
    /// alive; a server has one).
    pub fn shared(tokenizer: &Arc<Tokenizer>) -> Result<Arc<Self>, String> {
        static CACHE: Mutex<Vec<(Weak<Tokenizer>, Arc<ConstraintFactory>)>> = Mutex::new(Vec::new());
        let mut cache = CACHE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.retain(|(t, _)| t.strong_count() > 0);
        if let Some((_, f)) = cache.iter().find(|(t, _)| std::ptr::eq(t.as_ptr(), Arc::as_ptr(tokenizer))) {
            return Ok(Arc::clone(f));
        }
        let factory = Arc::new(ConstraintFactory::new(tokenizer)?);
        cache.push((Arc::downgrade(tokenizer), Arc::clone(&factory)));
        Ok(factory)
    }

    /// A matcher for a Lark grammar (llguidance's dialect: `%json { schema }` embeds a JSON
    /// schema). The message of an invalid grammar names the problem, for an HTTP 400.
    pub fn lark(&self, grammar: &str) -> Result<Constraint, String> {
        self.compile(TopLevelGrammar::from_lark(grammar.to_owned()))
    }

    /// A matcher for JSON documents valid under `schema`.
    pub fn json_schema(&self, schema: serde_json::Value) -> Result<Constraint, String> {
        self.compile(TopLevelGrammar::from_json_schema(schema))
    }

    fn compile(&self, grammar: TopLevelGrammar) -> Result<Constraint, String> {
        let parser = self.factory.create_parser(grammar).map_err(|e| format!("invalid grammar: {e}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(format!("invalid grammar: {}", first_line(&e)));
        }
        probe(&matcher).map_err(|e| format!("the grammar cannot be applied: {}", first_line(&e)))?;
        Ok(Constraint { matcher: Box::new(matcher), vocab_size: self.vocab_size, lazy: None })
    }
}

/// Runs the first step of generation on a copy of `matcher`: its first mask, then its lowest
/// allowed token that is not EOS. Some grammars compile and then fail right there (recursive
/// `$ref`s, huge repeats or constants past the parser's limits); found here, that is the
/// client's 400 before anything is sent, not a failure on the engine thread after the first
/// chunk.
fn probe(matcher: &Matcher) -> Result<(), String> {
    let mut probe = matcher.deep_clone();
    let mask = probe.compute_mask().map_err(|e| e.to_string())?;
    let eos = probe.tok_env().map(|env| env.tok_trie().eos_token()).ok();
    let mut first = None;
    mask.iter_set_entries(|id| {
        if first.is_none() && Some(id as TokenId) != eos {
            first = Some(id as TokenId);
        }
    });
    if let Some(token) = first {
        probe.consume_token(token).map_err(|e| e.to_string())?;
        probe.compute_mask().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The first line of a grammar engine's error, at most 300 characters: its later lines dump
/// the parser's state, which is no use to a client.
fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    match line.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_owned(),
    }
}

/// The grammar state of one sequence.
#[derive(Clone)]
pub struct Constraint {
    /// Boxed: the matcher is over a kilobyte, and requests travel through channels by value.
    matcher: Box<Matcher>,
    vocab_size: usize,
    /// `Some` for a lazy constraint (see [`Constraint::lazy`]): where it stands.
    lazy: Option<Lazy>,
}

/// A lazy constraint's state.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lazy {
    /// Nothing but whitespace yet: the tokens so far, to be replayed into the grammar.
    Waiting(Vec<u32>),
    /// The reply opened what the grammar describes: every token is masked from now on.
    Active,
    /// The reply is something else: it stays free.
    Dropped,
}

/// What opens a tool call, with the whitespace taken out: a call object (bare, or first thing
/// in a ```json or bare fence) or Hermes' tag. A reply that opens with anything else (prose,
/// another fence language, an object with another first key) stays free.
const LAZY_OPENINGS: &[&[u8]] = &[b"{\"name\"", b"```json{\"name\"", b"```{\"name\"", b"<tool_call>"];

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("finished", &self.is_finished()).finish_non_exhaustive()
    }
}

impl Constraint {
    /// This grammar (a tool call's), applied only if the reply opens a call: nothing is masked
    /// while the reply could still become one of [`LAZY_OPENINGS`]; once it has opened one, the
    /// tokens so far are replayed into the grammar and, if it takes them, it constrains every
    /// later token; otherwise (prose, code, other JSON, an opening the grammar rejects) the
    /// reply stays free. llama.cpp calls this a lazy grammar; here it makes a small model's tool
    /// call, once begun, a valid call of a declared tool.
    pub fn lazy(mut self) -> Constraint {
        self.lazy = Some(Lazy::Waiting(Vec::new()));
        self
    }

    /// Whether the grammar masks tokens now (a lazy one only once triggered).
    pub fn masking(&self) -> bool {
        matches!(self.lazy, None | Some(Lazy::Active))
    }

    /// Sets the logit of every token the grammar does not allow next to negative infinity.
    /// Where the grammar may end here, `stop_tokens` (EOS, end of turn) stay allowed. Logits
    /// past the tokenizer's vocabulary (padding rows of the embedding) are never allowed.
    pub fn mask_logits(&mut self, logits: &mut [f32], stop_tokens: &[u32]) -> Result<(), String> {
        if !self.masking() {
            return Ok(());
        }
        let mask = self.matcher.compute_mask().map_err(|e| format!("grammar failed: {e}"))?;
        let accepting = self.matcher.is_accepting().unwrap_or(false);
        for (id, logit) in logits.iter_mut().enumerate() {
            let allowed = id < self.vocab_size && mask.is_allowed(id as TokenId)
                || accepting && stop_tokens.contains(&(id as u32));
            if !allowed {
                *logit = f32::NEG_INFINITY;
            }
        }
        if logits.iter().all(|&l| l == f32::NEG_INFINITY) {
            return Err("the grammar allows no token here".into());
        }
        Ok(())
    }

    /// Advances over a sampled token (a stop token where the grammar may end is fine).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        match &mut self.lazy {
            Some(Lazy::Dropped) => return Ok(()),
            Some(Lazy::Waiting(tokens)) => {
                tokens.push(token);
                let tokens = tokens.clone();
                self.lazy = self.trigger(&tokens);
                return Ok(());
            }
            Some(Lazy::Active) | None => {}
        }
        if self.matcher.is_accepting().unwrap_or(false) && !self.matcher.is_stopped() {
            // EOS-like tokens are not grammar text; the caller ends the sequence on them.
            let trie_eos = self.matcher.tok_env().map(|env| env.tok_trie().eos_token_set().is_allowed(token));
            if trie_eos.unwrap_or(false) {
                return Ok(());
            }
        }
        self.matcher.consume_token(token).map_err(|e| format!("the sampled token {token} broke the grammar: {e}"))
    }

    /// A waiting lazy constraint's next state, given the reply's tokens so far.
    fn trigger(&mut self, tokens: &[u32]) -> Option<Lazy> {
        let Ok(env) = self.matcher.tok_env() else { return Some(Lazy::Dropped) };
        let trie = env.tok_trie();
        let squeezed: Vec<u8> =
            tokens.iter().flat_map(|&t| trie.token(t).to_vec()).filter(|b| !b.is_ascii_whitespace()).collect();
        if !LAZY_OPENINGS.iter().any(|opening| squeezed.starts_with(opening)) {
            let may_open = LAZY_OPENINGS.iter().any(|opening| opening.starts_with(&squeezed));
            return Some(if may_open { Lazy::Waiting(tokens.to_vec()) } else { Lazy::Dropped });
        }
        let mut matcher = self.matcher.deep_clone();
        if tokens.iter().all(|&t| matcher.consume_token(t).is_ok()) && matcher.get_error().is_none() {
            *self.matcher = matcher;
            Some(Lazy::Active)
        } else {
            Some(Lazy::Dropped)
        }
    }

    /// The grammar is complete and nothing may follow: the sequence should stop.
    pub fn is_finished(&self) -> bool {
        self.masking() && self.matcher.is_stopped()
    }

    /// The grammar could end here (a stop token would be allowed).
    pub fn is_accepting(&mut self) -> bool {
        !self.masking() || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
