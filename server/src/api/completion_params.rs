//! Request-body reading shared by the generation endpoints (OpenAI chat and completions,
//! llama.cpp's `/completion`): typed field access with 400s that name the field, sampling
//! settings under both APIs' names, stop strings, and prompts given as text or token ids.

use radix_models::tokenizer::Tokenizer;
use serde_json::Value as Json;

use super::ApiError;
use crate::engine::SamplingParams;

/// Parses a JSON body, answering 400 when it is not JSON (or not an object).
pub(super) fn parse_body(body: &[u8]) -> Result<Json, ApiError> {
    let body: Json =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(body)
}

/// A field that is present and not `null` (clients send `null` for "default").
pub(super) fn field<'a>(body: &'a Json, name: &str) -> Option<&'a Json> {
    body.get(name).filter(|v| !v.is_null())
}

/// A numeric field.
pub(super) fn number(body: &Json, name: &str) -> Result<Option<f64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::bad_request(format!("'{name}' must be a number"))),
    }
}

/// An integer field.
pub(super) fn integer(body: &Json, name: &str) -> Result<Option<i64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| ApiError::bad_request(format!("'{name}' must be an integer"))),
    }
}

/// A boolean field with its default.
pub(super) fn flag(body: &Json, name: &str, default: bool) -> Result<bool, ApiError> {
    match field(body, name) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| ApiError::bad_request(format!("'{name}' must be a boolean"))),
    }
}

/// `stream_options.include_usage` (OpenAI streaming).
pub(super) fn include_usage(body: &Json) -> bool {
    field(body, "stream_options").and_then(|o| o.get("include_usage")).and_then(Json::as_bool).unwrap_or(false)
}

/// Sampling settings from a body, under OpenAI's and llama.cpp's names, over the endpoint's
/// defaults. A negative seed is llama.cpp's "random" (-1), not a fixed seed.
pub(super) fn sampling(body: &Json, defaults: &SamplingParams) -> Result<SamplingParams, ApiError> {
    let float =
        |name: &str, default: f32| -> Result<f32, ApiError> { Ok(number(body, name)?.map_or(default, |v| v as f32)) };
    let repetition_penalty = match number(body, "repetition_penalty")? {
        Some(v) => v as f32,
        None => float("repeat_penalty", defaults.repetition_penalty)?,
    };
    let top_k = match number(body, "top_k")? {
        // llama.cpp: 0 or a negative value turns top-k off.
        Some(v) => v.max(0.0) as usize,
        None => defaults.top_k,
    };
    let seed = match field(body, "seed") {
        None => defaults.seed,
        Some(v) => {
            let seed = v.as_i64().ok_or_else(|| ApiError::bad_request("'seed' must be an integer"))?;
            // llama.cpp prints its "random" seed as 4294967295 (u32 -1) and clients echo it back.
            if seed < 0 || seed == i64::from(u32::MAX) { None } else { Some(seed as u64) }
        }
    };
    let sampling = SamplingParams {
        temperature: float("temperature", defaults.temperature)?,
        top_p: float("top_p", defaults.top_p)?,
        top_k,
        min_p: float("min_p", defaults.min_p)?,
        presence_penalty: float("presence_penalty", defaults.presence_penalty)?,
        frequency_penalty: float("frequency_penalty", defaults.frequency_penalty)?,
        repetition_penalty,
        seed,
        logprobs: defaults.logprobs,
    };
    sampling.validate().map_err(ApiError::bad_request)?;
    Ok(sampling)
}

/// `stop`: a string or an array of strings.
pub(super) fn stops(body: &Json) -> Result<Vec<String>, ApiError> {
    match field(body, "stop") {
        None => Ok(Vec::new()),
        Some(Json::String(s)) => Ok(vec![s.clone()]),
        Some(Json::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| ApiError::bad_request("'stop' must hold strings")))
            .collect(),
        Some(_) => Err(ApiError::bad_request("'stop' must be a string or an array of strings")),
    }
}

/// 400 in OpenAI's wording, which clients match, when a prompt does not fit the context; `what`
/// is "messages" for chat, "prompt" for text completions.
pub(super) fn check_context(prompt_tokens: usize, context: usize, what: &str) -> Result<(), ApiError> {
    if prompt_tokens >= context {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {context} tokens. However, your {what} resulted in \
             {prompt_tokens} tokens. Please reduce the length of the {what}."
        ))
        .with_code("context_length_exceeded"));
    }
    Ok(())
}

/// The token ids of a completion prompt: a string, token ids, llama.cpp's mixed array of ids and
/// strings, or any of these wrapped in a one-element array (OpenAI's batch form with a batch of
/// one). Strings are tokenized with the tokenizer's own special tokens (a BOS only where the
/// model's tokenizer config adds one, as llama-server's `add_special`), and only a string at the
/// very start gets them. Several prompts in one request are refused: we answer one completion.
pub(super) fn prompt_tokens(tokenizer: &Tokenizer, prompt: Option<&Json>) -> Result<Vec<u32>, ApiError> {
    let prompt = prompt.ok_or_else(|| ApiError::bad_request("'prompt' is required"))?;
    let tokens = match prompt {
        Json::Array(items) if items.iter().any(Json::is_number) => mixed_tokens(tokenizer, items)?,
        Json::Array(items) => match items.as_slice() {
            [one] => return prompt_tokens(tokenizer, Some(one)),
            [] => Vec::new(),
            _ => return Err(ApiError::bad_request("only one prompt per request is supported; send one request each")),
        },
        Json::Object(o) if o.contains_key("multimodal_data") => {
            return Err(ApiError::bad_request("multimodal prompts are not supported"));
        }
        Json::Object(o) => match o.get("prompt_string") {
            Some(text) => return prompt_tokens(tokenizer, Some(text)),
            None => return Err(ApiError::bad_request("a prompt object needs 'prompt_string'")),
        },
        other => mixed_tokens(tokenizer, std::slice::from_ref(other))?,
    };
    if tokens.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    Ok(tokens)
}

fn mixed_tokens(tokenizer: &Tokenizer, items: &[Json]) -> Result<Vec<u32>, ApiError> {
    let mut tokens = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Json::String(text) => {
                let ids = tokenizer
                    .encode(text, i == 0)
                    .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))?;
                tokens.extend(ids);
            }
            Json::Number(n) => tokens.push(token_id(tokenizer, n.as_u64(), n)?),
            _ => return Err(ApiError::bad_request("'prompt' items must be strings or token ids")),
        }
    }
    Ok(tokens)
}

/// A token id the tokenizer knows; anything else would index past the embedding table.
pub(super) fn token_id(tokenizer: &Tokenizer, id: Option<u64>, shown: &dyn std::fmt::Display) -> Result<u32, ApiError> {
    id.and_then(|id| u32::try_from(id).ok()).filter(|&id| (id as usize) < tokenizer.vocab_size()).ok_or_else(|| {
        ApiError::bad_request(format!("token id {shown} is not in the vocabulary (0..{})", tokenizer.vocab_size()))
    })
}

/// Most alternatives per token a request may ask log-probabilities for (OpenAI's limit).
pub(super) const MAX_TOP_LOGPROBS: usize = 20;

/// A count of log-probability alternatives in `0..=MAX_TOP_LOGPROBS`.
pub(super) fn top_logprobs(body: &Json, name: &str) -> Result<Option<usize>, ApiError> {
    match integer(body, name)? {
        None => Ok(None),
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::bad_request(format!("'{name}' must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"))),
    }
}
