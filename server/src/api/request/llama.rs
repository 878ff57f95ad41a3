//! llama-server's request bodies: `/completion`, `/tokenize`, `/detokenize`.

use serde::Deserialize;
use serde_json::Value as Json;

/// The fields of `POST /completion` read here; the sampling and output fields are read by
/// [`super::SamplingFields`] and [`super::GenerationFields`].
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct LlamaCompletionRequest {
    /// The prompt: text, token ids, or llama.cpp's mixed array.
    pub(crate) prompt: Option<Json>,
    /// The token limit; negative: until a stop token or the context is full.
    pub(crate) n_predict: Option<i64>,
    /// OpenAI's name for `n_predict`, used when it is absent.
    pub(crate) max_tokens: Option<i64>,
    /// Alternatives per token whose probabilities are returned.
    pub(crate) n_probs: Option<i64>,
    /// Return the generated token ids.
    pub(crate) return_tokens: Option<bool>,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct TokenizeRequest {
    /// The text.
    pub(crate) content: Option<String>,
    /// Add the BOS where the model adds one (default false).
    pub(crate) add_special: Option<bool>,
    /// Match special-token text (default true; false is refused).
    pub(crate) parse_special: Option<bool>,
    /// Each id with its text.
    pub(crate) with_pieces: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct DetokenizeRequest {
    /// Token ids, checked against the vocabulary.
    pub(crate) tokens: Option<Vec<Json>>,
}
