//! Completion prompts in every form OpenAI and llama.cpp accept, to token ids.

use radix_models::tokenizer::Tokenizer;
use serde_json::Value as Json;

use super::super::ApiError;

/// The token ids of a completion prompt: a string, token ids, llama.cpp's mixed array of ids and
/// strings, or any of these wrapped in a one-element array (OpenAI's batch form with a batch of
/// one). Strings are tokenized with the tokenizer's own special tokens (a BOS only where the
/// model's tokenizer config adds one, as llama-server's `add_special`), and only a string at the
/// very start gets them. Several prompts in one request are refused: we answer one completion.
/// Text that could not fit a context of `context` tokens is refused before it is tokenized.
pub(crate) fn prompt_tokens(
    tokenizer: &Tokenizer,
    prompt: Option<&Json>,
    context: usize,
) -> Result<Vec<u32>, ApiError> {
    let prompt = prompt.ok_or_else(|| ApiError::bad_request("'prompt' is required"))?;
    let tokens = match prompt {
        Json::Array(items) if items.iter().any(Json::is_number) => mixed_tokens(tokenizer, items, context)?,
        Json::Array(items) => match items.as_slice() {
            [one] => return prompt_tokens(tokenizer, Some(one), context),
            [] => Vec::new(),
            _ => return Err(ApiError::bad_request("only one prompt per request is supported; send one request each")),
        },
        Json::Object(o) if o.contains_key("multimodal_data") => {
            return Err(ApiError::bad_request("multimodal prompts are not supported"));
        }
        Json::Object(o) => match o.get("prompt_string") {
            Some(text) => return prompt_tokens(tokenizer, Some(text), context),
            None => return Err(ApiError::bad_request("a prompt object needs 'prompt_string'")),
        },
        other => mixed_tokens(tokenizer, std::slice::from_ref(other), context)?,
    };
    if tokens.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    Ok(tokens)
}

fn mixed_tokens(tokenizer: &Tokenizer, items: &[Json], context: usize) -> Result<Vec<u32>, ApiError> {
    let text_bytes: usize = items.iter().filter_map(Json::as_str).map(str::len).sum();
    super::check_prompt_bytes(text_bytes, context, "the prompt")?;
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
pub(crate) fn token_id(tokenizer: &Tokenizer, id: Option<u64>, shown: &dyn std::fmt::Display) -> Result<u32, ApiError> {
    id.and_then(|id| u32::try_from(id).ok()).filter(|&id| (id as usize) < tokenizer.vocab_size()).ok_or_else(|| {
        ApiError::bad_request(format!("token id {shown} is not in the vocabulary (0..{})", tokenizer.vocab_size()))
    })
}
