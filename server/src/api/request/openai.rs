//! OpenAI's request bodies: chat completions and (legacy) text completions.

use serde::Deserialize;
use serde_json::Value as Json;

/// The fields of `POST /v1/chat/completions` read here; the messages, tools and template
/// options are read by `radix_templates::ChatRequest`, the constraint fields by
/// api/constrain.rs, the sampling and output fields by [`super::SamplingFields`] and
/// [`super::GenerationFields`].
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ChatCompletionRequest {
    /// Choices per request; only 1.
    pub(crate) n: Option<u64>,
    /// The token limit, OpenAI's current name.
    pub(crate) max_completion_tokens: Option<f64>,
    /// The token limit, OpenAI's old name.
    pub(crate) max_tokens: Option<f64>,
    /// Return each token's log-probability.
    pub(crate) logprobs: Option<bool>,
    /// Alternatives per token (with `logprobs`).
    pub(crate) top_logprobs: Option<i64>,
    /// `"none"` turns tool-call parsing off.
    pub(crate) tool_choice: Option<Json>,
    /// Return the cache report in the body.
    pub(crate) cache_report: Option<bool>,
}

/// The fields of `POST /v1/completions` read here; the prompt is read by
/// [`super::prompt_tokens`], the sampling and output fields by [`super::SamplingFields`] and
/// [`super::GenerationFields`].
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct CompletionRequest {
    /// The prompt in any of its forms.
    pub(crate) prompt: Option<Json>,
    /// Choices per request; only 1.
    pub(crate) n: Option<u64>,
    /// Candidates per choice; only 1.
    pub(crate) best_of: Option<u64>,
    /// Echo the prompt; not supported.
    pub(crate) echo: Option<bool>,
    /// Fill-in-the-middle suffix; not supported.
    pub(crate) suffix: Option<String>,
    /// The token limit (default 16).
    pub(crate) max_tokens: Option<i64>,
    /// Alternatives per token whose log-probabilities are returned.
    pub(crate) logprobs: Option<i64>,
}
