//! llama.cpp's llama-server endpoints: `/completion` here; `/tokenize`, `/detokenize`,
//! `/apply-template`, `/props` and `/slots` in [`super::llama_meta`]. Field names and JSON types
//! follow llama-server's documentation, so its clients work unchanged.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::completions::text_spec;
use super::driver::{Done, Progress, WireEvent, WireFormat, respond};
use super::llama_meta;
use super::logprobs::{TokenText, llama_probabilities};
use super::output::{Ending, Generation, Piece};
use super::preparation::off_workers;
use super::reply::text_of;
use super::request::{GenerationBody, LlamaCompletionRequest, top_logprobs};
use super::response::llama::{CompletionChunk, CompletionFinal, GenerationSettings};
use super::response::{self, to_json};
use super::{ApiError, ApiState};
use crate::engine::{SamplingParams, Tenant, Timings};

/// The routes of this module that queue generation on the engine.
pub(super) fn generation_routes() -> Router<Arc<ApiState>> {
    Router::new().route("/completion", post(completion)).route("/completions", post(completion))
}

/// The routes of this module around generation.
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/tokenize", post(llama_meta::tokenize))
        .route("/detokenize", post(llama_meta::detokenize))
        .route("/apply-template", post(llama_meta::apply_template))
        .route("/props", get(llama_meta::props))
        .route("/slots", get(llama_meta::slots))
}

/// `stop_type`: "eos", "limit" or "word".
fn stop_type(ending: &Ending) -> &'static str {
    match ending {
        Ending::Eos => "eos",
        Ending::Length => "limit",
        Ending::Word(_) => "word",
    }
}

/// llama-server's `/completion` wire format, with what the request decided for the response.
struct LlamaWire {
    state: Arc<ApiState>,
    generation_settings: GenerationSettings,
    prompt_text: String,
    return_tokens: bool,
    /// `n_predict: 0`: evaluate the prompt only.
    silent: bool,
    token_text: TokenText,
}

async fn completion(State(state): State<Arc<ApiState>>, headers: HeaderMap, body: Bytes) -> Response {
    let tenant = Tenant::new(state.api_keys.presented(&headers).as_deref(), None);
    let prepared = off_workers(&state, move |state| {
        let GenerationBody { fields, sampling: sampling_fields, output } =
            GenerationBody::<LlamaCompletionRequest>::parse(&body)?;
        let n_predict = fields.n_predict.or(fields.max_tokens).unwrap_or(-1);
        let logprobs = top_logprobs(fields.n_probs, "n_probs")?.filter(|&n| n > 0);
        let sampling = sampling_fields.over(&SamplingParams { logprobs, ..state.sampling_defaults.clone() })?;
        let spec = text_spec(state, fields.prompt.as_ref(), sampling, n_predict, &output, tenant)?;
        let stream = output.stream();
        let wire = LlamaWire {
            state: Arc::clone(state),
            generation_settings: GenerationSettings::new(
                state.context_length,
                &state.model_name,
                &spec.request.sampling,
                n_predict,
                &output.stop.0,
                stream,
            ),
            prompt_text: state.tokenizer.decode(&spec.request.prompt, false).unwrap_or_default(),
            return_tokens: fields.return_tokens.unwrap_or(false),
            silent: n_predict == 0,
            token_text: TokenText::new(Arc::clone(&state.tokenizer)),
        };
        Ok((spec, wire, stream))
    })
    .await;
    match prepared {
        Ok((spec, wire, stream)) => respond(&state, spec, wire, stream).await,
        Err(e) => e.into_response(),
    }
}

impl LlamaWire {
    /// The final object of a completion (the whole response, or the last streamed chunk).
    fn final_object(
        &self,
        generation: &Generation,
        content: String,
        tokens: Vec<u32>,
        ending: &Ending,
        timings: &Timings,
    ) -> CompletionFinal {
        let predicted = if self.silent { 0 } else { generation.tokens.len() };
        let stopping_word = match ending {
            Ending::Word(w) => w.clone(),
            _ => String::new(),
        };
        let truncated =
            matches!(ending, Ending::Length) && generation.prompt_tokens + predicted >= self.state.context_length;
        CompletionFinal {
            index: 0,
            has_new_line: content.contains('\n'),
            content,
            tokens,
            // We have no fixed slots: -1 is llama-server's "any slot".
            id_slot: -1,
            stop: true,
            model: self.state.model_name.clone(),
            tokens_predicted: predicted,
            tokens_evaluated: generation.prompt_tokens,
            generation_settings: self.generation_settings.clone(),
            prompt: self.prompt_text.clone(),
            truncated,
            stop_type: if self.silent { "limit" } else { stop_type(ending) },
            stopping_word,
            tokens_cached: generation.cached_tokens,
            timings: response::Timings::new(timings),
            completion_probabilities: None,
        }
    }
}

/// One `data:` chunk per generated token (`content` may be empty while a character or a
/// possible stop string is incomplete), then a last chunk with `stop: true` and the final
/// fields. llama-server ends `/completion` streams there, without `[DONE]`.
impl WireFormat for LlamaWire {
    fn on_piece(&mut self, piece: &Piece, at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let generation = at.generation;
        let content = text_of(&piece.events);
        if self.silent || (piece.token.is_none() && content.is_empty()) {
            return Ok(Vec::new());
        }
        let mut chunk = CompletionChunk {
            index: 0,
            content,
            tokens: piece.token.into_iter().collect(),
            stop: false,
            id_slot: -1,
            tokens_predicted: generation.tokens.len(),
            tokens_evaluated: generation.prompt_tokens,
            completion_probabilities: None,
        };
        // The engine sends a token's logprobs just before the token.
        if let Some(lp) = generation.logprobs.last().filter(|lp| Some(lp.token) == piece.token) {
            chunk.completion_probabilities = Some(llama_probabilities(&mut self.token_text, std::slice::from_ref(lp))?);
        }
        Ok(vec![WireEvent::Data(to_json(&chunk))])
    }

    fn finish(&mut self, (ending, timings): &(Ending, Timings), at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let last = self.final_object(at.generation, String::new(), Vec::new(), ending, timings);
        Ok(vec![WireEvent::Data(to_json(&last))])
    }

    fn complete(mut self, Done { generation, events, ending, timings }: Done) -> Result<Response, ApiError> {
        let content = if self.silent { String::new() } else { text_of(&events) };
        let tokens = if self.return_tokens && !self.silent { generation.tokens.clone() } else { Vec::new() };
        let mut body = self.final_object(generation, content, tokens, &ending, &timings);
        if !generation.logprobs.is_empty() && !self.silent {
            body.completion_probabilities = Some(llama_probabilities(&mut self.token_text, &generation.logprobs)?);
        }
        Ok(axum::Json(to_json(&body)).into_response())
    }
}
