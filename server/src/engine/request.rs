//! What the HTTP side hands the engine, and what the engine sends back per request.

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
    /// Reuse and extend the prefix cache (llama.cpp's `cache_prompt`; off gives a cold prefill).
    pub use_cache: bool,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (or, on the HTTP side, a stop string).
    Stop,
    /// `max_tokens`, the context length, or a full KV pool.
    Length,
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
    },
    /// One generated token.
    Token(u32),
    /// Generation ended.
    Finished {
        /// Why.
        reason: FinishReason,
        /// How long it took.
        timings: Timings,
    },
    /// The request could not be served.
    Failed(String),
}
