//! llama.cpp's llama-server endpoints: `/completion` here; `/tokenize`, `/detokenize`,
//! `/apply-template`, `/props` and `/slots` in [`super::llama_meta`]. Field names and JSON types
//! follow llama-server's documentation, so its clients work unchanged.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value as Json, json};

use super::chat::{next_piece, send_json, sse_response, timings_json};
use super::completion_params::{flag, integer, parse_body, stops, top_logprobs};
use super::completions::{plain_parser, prepare_text, text_of};
use super::llama_meta;
use super::output::{Ending, Generation, TokenText};
use super::{ApiError, ApiState};
use crate::engine::{SamplingParams, Timings, TokenLogprobs};

/// The routes of this module.
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/completion", post(completion))
        .route("/completions", post(completion))
        .route("/tokenize", post(llama_meta::tokenize))
        .route("/detokenize", post(llama_meta::detokenize))
        .route("/apply-template", post(llama_meta::apply_template))
        .route("/props", get(llama_meta::props))
        .route("/slots", get(llama_meta::slots))
}

/// llama-server's sampling defaults for `/completion` (its `/props` reports these).
pub(super) fn llama_defaults() -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, ..SamplingParams::default() }
}

/// llama-server reports its "random" seed as this (`LLAMA_DEFAULT_SEED`).
const RANDOM_SEED: u64 = u32::MAX as u64;

/// The `generation_settings` object (and `/props`' and `/slots`' `params`): the settings a
/// request ran with, under llama-server's names. Samplers we do not have are reported off.
pub(super) fn generation_settings(
    state: &ApiState,
    sampling: &SamplingParams,
    n_predict: i64,
    stops: &[String],
    stream: bool,
) -> Json {
    json!({
        "n_ctx": state.context_length,
        "model": state.model_name,
        "n_predict": n_predict,
        "max_tokens": n_predict,
        "seed": sampling.seed.unwrap_or(RANDOM_SEED),
        "temperature": sampling.temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "typical_p": 1.0,
        "repeat_last_n": -1,
        "repeat_penalty": sampling.repetition_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "dry_multiplier": 0.0,
        "mirostat": 0,
        "stop": stops,
        "n_keep": 0,
        "n_discard": 0,
        "ignore_eos": false,
        "stream": stream,
        "n_probs": 0,
        "min_keep": 0,
        "grammar": "",
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
        "timings_per_token": false,
    })
}

/// `stop_type`: "eos", "limit" or "word".
fn stop_type(ending: &Ending) -> &'static str {
    match ending {
        Ending::Eos => "eos",
        Ending::Length => "limit",
        Ending::Word(_) => "word",
    }
}

/// What a `/completion` request decided, for the response.
struct Settings {
    generation_settings: Json,
    prompt_text: String,
    return_tokens: bool,
    /// `n_predict: 0`: evaluate the prompt only.
    silent: bool,
}

async fn completion(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let prepared = parse_body(&body).and_then(|body| {
        let n_predict = match integer(&body, "n_predict")? {
            Some(n) => n,
            None => integer(&body, "max_tokens")?.unwrap_or(-1),
        };
        let logprobs = top_logprobs(&body, "n_probs")?.filter(|&n| n > 0);
        let text = prepare_text(&state, &body, &SamplingParams { logprobs, ..llama_defaults() }, n_predict)?;
        let stream = flag(&body, "stream", false)?;
        let settings = Settings {
            generation_settings: generation_settings(&state, &text.request.sampling, n_predict, &stops(&body)?, stream),
            prompt_text: state.tokenizer.decode(&text.request.prompt, false).unwrap_or_default(),
            return_tokens: flag(&body, "return_tokens", false)?,
            silent: n_predict == 0,
        };
        Ok((text, stream, settings))
    });
    let (text, stream, settings) = match prepared {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let generation = Generation::start(&state.engine, text.request, plain_parser());
    if stream {
        stream_completion(state, generation, settings).into_response()
    } else {
        complete(state, generation, settings).await
    }
}

/// The final object of a completion (the whole response, or the last streamed chunk).
fn final_json(
    state: &ApiState,
    generation: &Generation,
    settings: &Settings,
    content: &str,
    tokens: &[u32],
    ending: &Ending,
    timings: &Timings,
) -> Json {
    let predicted = if settings.silent { 0 } else { generation.tokens.len() };
    let stopping_word = match ending {
        Ending::Word(w) => w.as_str(),
        _ => "",
    };
    let truncated = matches!(ending, Ending::Length) && generation.prompt_tokens + predicted >= state.context_length;
    json!({
        "index": 0,
        "content": content,
        "tokens": tokens,
        // We have no fixed slots: -1 is llama-server's "any slot".
        "id_slot": -1,
        "stop": true,
        "model": state.model_name,
        "tokens_predicted": predicted,
        "tokens_evaluated": generation.prompt_tokens,
        "generation_settings": settings.generation_settings,
        "prompt": settings.prompt_text,
        "has_new_line": content.contains('\n'),
        "truncated": truncated,
        "stop_type": if settings.silent { "limit" } else { stop_type(ending) },
        "stopping_word": stopping_word,
        "tokens_cached": generation.cached_tokens,
        "timings": timings_json(timings),
    })
}

/// llama.cpp's `completion_probabilities` (`n_probs`) for these tokens.
fn probabilities(text: &mut TokenText, lps: &[TokenLogprobs]) -> Result<Json, ApiError> {
    lps.iter().map(|lp| text.logprobs_entry(lp, true)).collect::<Result<Vec<_>, _>>().map(Json::Array)
}

async fn complete(state: Arc<ApiState>, mut generation: Generation, settings: Settings) -> Response {
    let (events, ending, timings) = match generation.run().await {
        Ok(done) => done,
        Err(e) => return e.into_response(),
    };
    let content = if settings.silent { String::new() } else { text_of(&events) };
    let tokens = if settings.return_tokens && !settings.silent { generation.tokens.clone() } else { Vec::new() };
    let mut body = final_json(&state, &generation, &settings, &content, &tokens, &ending, &timings);
    if !generation.logprobs.is_empty() && !settings.silent {
        match probabilities(&mut TokenText::new(Arc::clone(&state.tokenizer)), &generation.logprobs) {
            Ok(p) => body["completion_probabilities"] = p,
            Err(e) => return e.into_response(),
        }
    }
    axum::Json(body).into_response()
}

/// One `data:` chunk per generated token (`content` may be empty while a character or a
/// possible stop string is incomplete), then a last chunk with `stop: true` and the final
/// fields. llama-server ends `/completion` streams there, without `[DONE]`.
fn stream_completion(state: Arc<ApiState>, mut generation: Generation, settings: Settings) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut token_text = TokenText::new(Arc::clone(&state.tokenizer));
        let (ending, timings) = loop {
            let Some(piece) = next_piece(&mut generation, &tx).await else { return };
            let content = text_of(&piece.events);
            if !settings.silent && (piece.token.is_some() || !content.is_empty()) {
                let mut chunk = json!({
                    "index": 0,
                    "content": content,
                    "tokens": piece.token.into_iter().collect::<Vec<_>>(),
                    "stop": false,
                    "id_slot": -1,
                    "tokens_predicted": generation.tokens.len(),
                    "tokens_evaluated": generation.prompt_tokens,
                });
                // The engine sends a token's logprobs just before the token.
                if let Some(lp) = generation.logprobs.last().filter(|lp| Some(lp.token) == piece.token) {
                    match probabilities(&mut token_text, std::slice::from_ref(lp)) {
                        Ok(p) => chunk["completion_probabilities"] = p,
                        Err(e) => {
                            let _ = send_json(&tx, &e.body()).await;
                            return;
                        }
                    }
                }
                if !send_json(&tx, &chunk).await {
                    return;
                }
            }
            if let Some(end) = piece.end {
                break end;
            }
        };
        let last = final_json(&state, &generation, &settings, "", &[], &ending, &timings);
        let _ = send_json(&tx, &last).await;
    });
    sse_response(rx)
}
