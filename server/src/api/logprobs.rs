//! Tokens as the APIs show them with their log-probabilities: decoded text, raw bytes where a
//! token holds part of a character, and each API's log-probability objects.

use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use serde_json::Value as Json;

use super::ApiError;
use super::response::openai::{ChatLogprobs, CompletionLogprobs, TokenLogprob};
use crate::engine::TokenLogprobs;

/// Token texts as the APIs show them: the decoded text, and the raw bytes where a token holds
/// only part of a UTF-8 character (its text then reads U+FFFD).
pub(crate) struct TokenText {
    tokenizer: Arc<Tokenizer>,
    /// Every token's bytes, read once on the first partial character.
    all_bytes: Option<Vec<Vec<u8>>>,
}

impl TokenText {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>) -> Self {
        TokenText { tokenizer, all_bytes: None }
    }

    /// The token's text, lossy where it is part of a character.
    pub(crate) fn text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    /// The token's bytes.
    pub(crate) fn bytes(&mut self, id: u32) -> Result<Vec<u8>, ApiError> {
        let text = self.text(id);
        if !text.contains('\u{FFFD}') {
            return Ok(text.into_bytes());
        }
        if self.all_bytes.is_none() {
            let all = self
                .tokenizer
                .token_bytes()
                .map_err(|e| ApiError::internal(format!("cannot read token bytes: {e}")))?;
            self.all_bytes = Some(all);
        }
        Ok(self.all_bytes.as_ref().and_then(|b| b.get(id as usize)).cloned().unwrap_or_default())
    }

    /// `{"token", "logprob", "bytes"}` (with `"id"` in llama.cpp's form).
    fn entry(&mut self, id: u32, logprob: f32, with_id: bool) -> Result<TokenLogprob, ApiError> {
        let bytes = self.bytes(id)?;
        Ok(TokenLogprob { token: self.text(id), logprob, bytes, id: with_id.then_some(id), top_logprobs: None })
    }

    /// One token of OpenAI chat's `logprobs.content` (or, `with_id`, of llama.cpp's
    /// `completion_probabilities`): the token and its `top_logprobs`.
    pub(crate) fn logprobs_entry(&mut self, lp: &TokenLogprobs, with_id: bool) -> Result<TokenLogprob, ApiError> {
        let mut entry = self.entry(lp.token, lp.logprob, with_id)?;
        let top = lp.top.iter().map(|&(id, l)| self.entry(id, l, with_id)).collect::<Result<Vec<_>, _>>()?;
        entry.top_logprobs = Some(top);
        Ok(entry)
    }

    /// OpenAI text completions' `logprobs` object; offsets count from `offset` in the text.
    pub(crate) fn completion_logprobs(&self, lps: &[TokenLogprobs], mut offset: usize) -> CompletionLogprobs {
        let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) = (vec![], vec![], vec![], vec![]);
        for lp in lps {
            let text = self.text(lp.token);
            text_offset.push(offset);
            offset += text.len();
            tokens.push(text);
            token_logprobs.push(lp.logprob);
            let top: serde_json::Map<String, Json> =
                lp.top.iter().map(|&(id, l)| (self.text(id), Json::from(l))).collect();
            top_logprobs.push(top);
        }
        CompletionLogprobs { tokens, token_logprobs, top_logprobs, text_offset }
    }
}

/// OpenAI chat's `logprobs` object of a choice for these tokens.
pub(crate) fn chat_logprobs(text: &mut TokenText, lps: &[TokenLogprobs]) -> Result<ChatLogprobs, ApiError> {
    let content = lps.iter().map(|lp| text.logprobs_entry(lp, false)).collect::<Result<Vec<_>, _>>()?;
    Ok(ChatLogprobs { content })
}

/// llama.cpp's `completion_probabilities` (`n_probs`) for these tokens.
pub(crate) fn llama_probabilities(text: &mut TokenText, lps: &[TokenLogprobs]) -> Result<Vec<TokenLogprob>, ApiError> {
    lps.iter().map(|lp| text.logprobs_entry(lp, true)).collect()
}
