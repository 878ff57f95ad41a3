//! Request bodies as typed structs, one per API: the body is parsed once, then read into the
//! API's struct, whose fields say what each API accepts. `null` means "the default", as clients
//! send it; unknown fields are ignored, as OpenAI does; a field of the wrong type is a 400 that
//! names the field.

pub(crate) mod anthropic;
mod llama;
mod openai;
mod prompt;
mod sampling;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value as Json;

use super::ApiError;
use crate::engine::CacheNamespace;
pub(crate) use llama::{DetokenizeRequest, LlamaCompletionRequest, TokenizeRequest};
pub(crate) use openai::{
    ChatBody, ChatCompletionRequest, CompletionRequest, FunctionDefinition, ResponseFormat, ToolChoice, ToolDefinition,
};
pub(crate) use prompt::{prompt_tokens, token_id};
pub(crate) use sampling::SamplingFields;
pub use sampling::llama_server_sampling;

/// Parses a JSON body, answering 400 when it is not JSON (or not an object).
pub(crate) fn parse_body(body: &[u8]) -> Result<Json, ApiError> {
    let body: Json =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(body)
}

/// Reads a parsed body into `T`; a type error names the field it is in.
pub(crate) fn typed<T: DeserializeOwned>(body: &Json) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad_request(format!("'{path}': {}", e.into_inner()))
    })
}

/// A text-generation body read once: the API's own fields and the sampling and output fields
/// every generation body shares.
#[derive(Debug, Clone)]
pub(crate) struct GenerationBody<F> {
    /// The API's own fields.
    pub(crate) fields: F,
    /// Sampling settings.
    pub(crate) sampling: SamplingFields,
    /// Stop strings, streaming, cache use.
    pub(crate) output: GenerationFields,
}

impl<F: DeserializeOwned> GenerationBody<F> {
    /// Parses a body; 400 when it is not a JSON object or a field has the wrong type.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, ApiError> {
        Self::from_json(&parse_body(body)?)
    }

    /// Reads a parsed body; a type error names the field.
    pub(crate) fn from_json(body: &Json) -> Result<Self, ApiError> {
        Ok(GenerationBody { fields: typed(body)?, sampling: typed(body)?, output: typed(body)? })
    }
}

/// `stop`: a string or an array of strings.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stops(pub(crate) Vec<String>);

impl<'de> Deserialize<'de> for Stops {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Json::deserialize(deserializer)? {
            Json::Null => Ok(Stops::default()),
            Json::String(s) => Ok(Stops(vec![s])),
            Json::Array(items) => items
                .into_iter()
                .map(|s| match s {
                    Json::String(s) => Ok(s),
                    _ => Err(D::Error::custom("must hold strings")),
                })
                .collect::<Result<Vec<_>, _>>()
                .and_then(|stops| {
                    let bytes: usize = stops.iter().map(String::len).sum();
                    if bytes > MAX_STOP_BYTES {
                        return Err(D::Error::custom(format!(
                            "holds {bytes} bytes of stop strings; at most {MAX_STOP_BYTES} are accepted"
                        )));
                    }
                    Ok(Stops(stops))
                }),
            _ => Err(D::Error::custom("must be a string or an array of strings")),
        }
    }
}

/// Most bytes of stop strings one request may send, all together: the matcher's automaton
/// costs tens of bytes per byte of them, and 300,000 ordinary stops stay far below this.
pub(crate) const MAX_STOP_BYTES: usize = 4 << 20;

/// What every generation body says about its output, under the same names in each API: stop
/// strings, streaming, and whether cached prefixes are reused.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct GenerationFields {
    /// Stop strings.
    #[serde(default)]
    pub(crate) stop: Stops,
    /// Stream server-sent events.
    pub(crate) stream: Option<bool>,
    /// OpenAI's streaming options.
    pub(crate) stream_options: Option<StreamOptions>,
    /// Reuse cached prefixes (llama.cpp's name; default true).
    pub(crate) cache_prompt: Option<bool>,
    /// Reuse only prefixes cached by requests with the same salt (vLLM's name); it also
    /// separates the cache report from other clients' where no API key does.
    pub(crate) cache_salt: Option<String>,
    /// Speculative decoding where the server does it (`--spec-type`): `false` opts this
    /// request out (the output is the same either way, only its speed changes).
    pub(crate) speculative: Option<bool>,
    /// llama.cpp's per-request draft limit: most tokens drafted per step, 0 opting out.
    #[serde(rename = "speculative.n_max")]
    pub(crate) speculative_n_max: Option<i64>,
}

impl GenerationFields {
    /// Stream the reply.
    pub(crate) fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Send a usage chunk at the end of an OpenAI stream (`stream_options.include_usage`).
    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }

    /// Reuse cached prefixes.
    pub(crate) fn use_cache(&self) -> bool {
        self.cache_prompt.unwrap_or(true)
    }

    /// Most tokens drafted per step for this request (`Some(0)`: none); `None` leaves the
    /// server's limit.
    pub(crate) fn draft_max(&self) -> Result<Option<usize>, ApiError> {
        if self.speculative == Some(false) {
            return Ok(Some(0));
        }
        match self.speculative_n_max {
            None => Ok(None),
            Some(n) if n >= 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            Some(n) => Err(ApiError::bad_request(format!("'speculative.n_max' must be 0 or more, got {n}"))),
        }
    }

    /// The part of the prefix cache this request reads and extends.
    pub(crate) fn cache_namespace(&self) -> CacheNamespace {
        CacheNamespace::new(self.cache_salt.as_deref())
    }
}

/// OpenAI's `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with the usage.
    include_usage: Option<bool>,
}

/// Most alternatives per token a request may ask log-probabilities for (OpenAI's limit).
pub(crate) const MAX_TOP_LOGPROBS: usize = 20;

/// A count of log-probability alternatives in `0..=MAX_TOP_LOGPROBS`, from the field `name`.
pub(crate) fn top_logprobs(value: Option<i64>, name: &str) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::bad_request(format!("'{name}' must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"))),
    }
}

/// Most bytes of text per token of context a prompt may have before it is tokenized. Text runs
/// about 4 bytes a token; past 32 it could not fit the context, and tokenizing it would cost
/// time and memory (about 170 bytes of memory per byte of text) for a certain 400.
const MAX_PROMPT_BYTES_PER_TOKEN: usize = 32;

/// The most prompt text tokenized for a context of `context` tokens (at least 1 MiB).
pub(crate) fn max_prompt_bytes(context: usize) -> usize {
    (context * MAX_PROMPT_BYTES_PER_TOKEN).max(1 << 20)
}

/// 400 when a prompt's text (`bytes` long) is too long to fit the context in any tokenization.
pub(crate) fn check_prompt_bytes(bytes: usize, context: usize, what: &str) -> Result<(), ApiError> {
    let limit = max_prompt_bytes(context);
    if bytes > limit {
        return Err(ApiError::bad_request(format!(
            "{what} is {bytes} bytes of text, more than the {limit} ({MAX_PROMPT_BYTES_PER_TOKEN} per token) \
             that could fit this model's context of {context} tokens; shorten it"
        )));
    }
    Ok(())
}

/// 400 when a prompt does not fit the context.
pub(crate) fn check_context(prompt_tokens: usize, context: usize, what: &'static str) -> Result<(), ApiError> {
    if prompt_tokens >= context {
        return Err(ApiError::ContextTooLong { context, prompt_tokens, what });
    }
    Ok(())
}
