//! What the HTTP side hands the engine, and what the engine sends back per request.

use super::cache_key::CacheNamespace;
use super::cache_report::{CacheReport, Tenant};
use super::constraint::Constraint;
use super::sampler::SamplingParams;

/// A generation request, already tokenized.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end generation (EOS and end-of-turn tokens); they are not sent back.
    pub stop_tokens: Vec<u32>,
    /// Strings that end generation where they appear in the text (OpenAI's `stop`, llama.cpp's
    /// `stop`, Anthropic's `stop_sequences`); neither they nor anything after them is sent back.
    pub stop_strings: Vec<String>,
    /// Reuse and extend the prefix cache (llama.cpp's `cache_prompt`; off gives a cold prefill).
    pub use_cache: bool,
    /// A grammar the output must follow (tool_choice, response_format); `None` is free text.
    /// The sequence stops by itself once the grammar is complete.
    pub constraint: Option<Constraint>,
    /// Whose request this is: the cache report compares a prompt only with the same tenant's
    /// earlier sequences, so no client reads another's text through it.
    pub tenant: Tenant,
    /// Which prefixes this request may reuse and extend: only those of requests with the same
    /// namespace (vLLM's `cache_salt`), so a client cannot even time another's.
    pub cache_namespace: CacheNamespace,
    /// Hybrid models: prompt positions (token counts, ascending) where the prompt's structure
    /// makes a later request likely to diverge: message boundaries, the end of the tools
    /// block, the start of the generation prompt. The engine saves the recurrent state there
    /// (ARCHITECTURE.md §3). Empty is fine: the engine adds its own points (interval, prompt
    /// end, generation end).
    pub snapshot_points: Vec<usize>,
    /// Hybrid models: of `snapshot_points`, those where a later request is expected to resume
    /// (ascending): the shared system and tools block, where the next user turn re-renders the
    /// history, the generation prompt. Their snapshots are given up after every redundant one
    /// (`radix/snapshots.rs`).
    pub expected_points: Vec<usize>,
    /// Hybrid models: positions (ascending) inside the leading system block where a line starts
    /// (a tool definition, a paragraph): where another agent's prompt may branch from this one.
    /// The engine saves the state at those at least `EngineConfig::branch_spacing` tokens apart.
    pub branch_points: Vec<usize>,
    /// When the server speculates (`--spec-type`): most tokens drafted ahead per step for
    /// this request, `Some(0)` opting it out; `None` takes the server's limit. The output is the
    /// same either way.
    pub draft_max: Option<usize>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (end of turn, end of sequence), or a constraint's grammar is complete.
    Stop,
    /// `max_tokens`, the context length, or a full KV pool.
    Length,
    /// This stop string appeared in the text.
    StopString(String),
}

/// Timings in llama.cpp's terms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens found in the cache.
    pub cache_n: usize,
    /// Prompt tokens computed.
    pub prompt_n: usize,
    /// Milliseconds from admission to the first token.
    pub prompt_ms: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    /// Milliseconds from the first token to the last.
    pub predicted_ms: f64,
    /// Tokens drafted by speculative decoding.
    pub draft_n: usize,
    /// Of which the model accepted.
    pub draft_n_accepted: usize,
}

/// Engine to HTTP messages of one request, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// The request was admitted: how much of the prompt the cache held.
    Started {
        /// Prompt length.
        prompt_tokens: usize,
        /// Of which found in the prefix cache.
        cached_tokens: usize,
        /// Where and why reuse stopped early, judged on tokens (boxed: most events are tokens).
        report: Box<CacheReport>,
    },
    /// Log-probabilities of the token that follows, sent just before its `Token` when the
    /// request's sampling asks for them.
    Logprobs(TokenLogprobs),
    /// One generated token.
    Token {
        /// Its id.
        id: u32,
        /// The text it released past stop-string matching: empty while a character is
        /// incomplete or while the text could still be the start of a stop string.
        text: String,
    },
    /// Generation ended (every ending the client can still receive, a stop string included).
    Finished {
        /// Why.
        reason: FinishReason,
        /// How long it took.
        timings: Timings,
        /// Text held back until now and released by the end (a stop string's start that never
        /// completed, an unfinished character); empty after a stop string.
        text: String,
    },
    /// The request could not be served.
    Failed(String),
}

/// A generated token's log-probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The generated token.
    pub token: u32,
    /// Its natural-log probability.
    pub logprob: f32,
    /// The most likely tokens with theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// From one position's raw logits (a log-softmax over the whole vocabulary).
    pub fn from_logits(logits: &[f32], token: u32, top: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        let log_total = max + sum.ln() as f32;
        let logprob = |id: u32| logits.get(id as usize).map_or(f32::NEG_INFINITY, |&l| l - log_total);
        let mut best: Vec<u32> = (0..logits.len() as u32).collect();
        let top = top.min(best.len());
        if top > 0 && top < best.len() {
            best.select_nth_unstable_by(top - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        }
        best.truncate(top);
        best.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        TokenLogprobs { token, logprob: logprob(token), top: best.into_iter().map(|id| (id, logprob(id))).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::TokenLogprobs;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_best_first() {
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        let lp = TokenLogprobs::from_logits(&logits, 2, 2);
        let total: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((lp.logprob - (2.0f32.exp() / total).ln()).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        assert!((lp.top[1].1 - lp.logprob).abs() < 1e-6);
        let probs: f32 = (0..4).map(|t| TokenLogprobs::from_logits(&logits, t, 0).logprob.exp()).sum();
        assert!((probs - 1.0).abs() < 1e-5);
        assert!(TokenLogprobs::from_logits(&logits, 0, 10).top.len() == 4);
    }
}
