//! `POST /v1/completions`: OpenAI's legacy text completions, one prompt and one choice per
//! request; and the prompt-to-request step it shares with llama.cpp's `/completion`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use radix_templates::parse::{OutputFormat, ParseEvent, ParserOptions};
use serde_json::{Value as Json, json};

use super::chat::{created, next_piece, send_json, sse_response, timings_json, unique_suffix, usage};
use super::completion_params::{
    check_context, field, flag, include_usage, integer, parse_body, prompt_tokens, sampling, stops, top_logprobs,
};
use super::output::{Generation, TokenText};
use super::{ApiError, ApiState};
use crate::engine::{GenerateRequest, SamplingParams};

/// OpenAI's default `max_tokens` for text completions.
const DEFAULT_MAX_TOKENS: i64 = 16;

/// The routes of this module.
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new().route("/v1/completions", post(completions))
}

/// A raw-text generation request: the prompt is tokenized as given, no chat template.
pub(super) struct TextRequest {
    /// What the engine runs (stop strings included).
    pub(super) request: GenerateRequest,
}

/// Reads a raw-text body: `prompt` (see [`prompt_tokens`]), sampling over `defaults`, `stop`,
/// and `cache_prompt`. `max_tokens` is the requested limit, negative for "until a stop token
/// or the context is full"; 0 evaluates the prompt (into the cache) and generates nothing.
pub(super) fn prepare_text(
    state: &ApiState,
    body: &Json,
    defaults: &SamplingParams,
    max_tokens: i64,
) -> Result<TextRequest, ApiError> {
    let prompt = prompt_tokens(&state.tokenizer, body.get("prompt"))?;
    let context = state.context_length;
    check_context(prompt.len(), context, "prompt")?;
    let room = context - prompt.len();
    // The engine always samples at least one token; a limit of 0 still runs the prompt (and so
    // caches it), and the caller shows no output.
    let max_tokens = if max_tokens < 0 { room } else { (max_tokens as usize).clamp(1, room) };
    let request = GenerateRequest {
        prompt,
        sampling: sampling(body, defaults)?,
        max_tokens,
        stop_tokens: state.stop_tokens.clone(),
        stop_strings: stops(body)?,
        use_cache: flag(body, "cache_prompt", true)?,
        constraint: None,
    };
    Ok(TextRequest { request })
}

/// Raw text out: no reasoning or tool-call parsing.
pub(super) fn plain_parser() -> ParserOptions {
    ParserOptions {
        format: OutputFormat::Plain,
        starts_in_reasoning: false,
        tool_call_id_prefix: String::new(),
        tools_enabled: false,
    }
}

/// The text of parse events (all content under [`plain_parser`]).
pub(super) fn text_of(events: &[ParseEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ParseEvent::Content(t) | ParseEvent::Reasoning(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// Refuses what we do not implement, rather than silently answering something else.
fn refuse_unsupported(body: &Json) -> Result<(), ApiError> {
    if let Some(n) = field(body, "n")
        && n.as_u64() != Some(1)
    {
        return Err(ApiError::bad_request("only 'n': 1 is supported"));
    }
    if let Some(b) = field(body, "best_of")
        && b.as_u64() != Some(1)
    {
        return Err(ApiError::bad_request("only 'best_of': 1 is supported"));
    }
    if flag(body, "echo", false)? {
        return Err(ApiError::bad_request("'echo' is not supported"));
    }
    if field(body, "suffix").is_some_and(|s| s.as_str() != Some("")) {
        return Err(ApiError::bad_request("'suffix' (fill-in-the-middle) is not supported"));
    }
    Ok(())
}

async fn completions(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let prepared = parse_body(&body).and_then(|body| {
        refuse_unsupported(&body)?;
        let max_tokens = match integer(&body, "max_tokens")? {
            Some(n) if n < 0 => return Err(ApiError::bad_request("'max_tokens' must not be negative")),
            Some(n) => n,
            None => DEFAULT_MAX_TOKENS,
        };
        let defaults = SamplingParams { logprobs: top_logprobs(&body, "logprobs")?, ..SamplingParams::default() };
        let text = prepare_text(&state, &body, &defaults, max_tokens)?;
        Ok((text, flag(&body, "stream", false)?, include_usage(&body), max_tokens == 0))
    });
    let (text, stream, include_usage, silent) = match prepared {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let wants_logprobs = text.request.sampling.logprobs.is_some();
    let generation = Generation::start(&state.engine, text.request, plain_parser());
    let id = format!("cmpl-{}", unique_suffix());
    if stream {
        stream_completion(state, generation, id, include_usage, silent, wants_logprobs).into_response()
    } else {
        complete(state, generation, id, silent, wants_logprobs).await
    }
}

fn choice(text: &str, finish: Option<&str>, logprobs: Json) -> Json {
    json!([{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}])
}

async fn complete(
    state: Arc<ApiState>,
    mut generation: Generation,
    id: String,
    silent: bool,
    wants_logprobs: bool,
) -> Response {
    let (events, ending, timings) = match generation.run().await {
        Ok(done) => done,
        Err(e) => return e.into_response(),
    };
    if silent {
        generation.tokens.clear();
    }
    let text = if silent { String::new() } else { text_of(&events) };
    let logprobs = match wants_logprobs && !silent {
        true => TokenText::new(Arc::clone(&state.tokenizer)).completion_logprobs(&generation.logprobs, 0),
        false => Json::Null,
    };
    axum::Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created(),
        "model": state.model_name,
        "choices": choice(&text, Some(ending.finish_reason(false)), logprobs),
        "usage": usage(&generation),
        "timings": timings_json(&timings),
    }))
    .into_response()
}

fn stream_completion(
    state: Arc<ApiState>,
    mut generation: Generation,
    id: String,
    include_usage: bool,
    silent: bool,
    wants_logprobs: bool,
) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let created = created();
        let chunk = |choices: Json| {
            json!({"id": id, "object": "text_completion", "created": created, "model": state.model_name,
                   "choices": choices})
        };
        let token_text = TokenText::new(Arc::clone(&state.tokenizer));
        let (mut logprobs_sent, mut offset) = (0, 0);
        let (ending, timings) = loop {
            let Some(piece) = next_piece(&mut generation, &tx).await else { return };
            let text = text_of(&piece.events);
            if !text.is_empty() && !silent {
                // The tokens since the last chunk, which this text completes.
                let logprobs = match wants_logprobs {
                    true => token_text.completion_logprobs(&generation.logprobs[logprobs_sent..], offset),
                    false => Json::Null,
                };
                logprobs_sent = generation.logprobs.len();
                offset += text.len();
                if !send_json(&tx, &chunk(choice(&text, None, logprobs))).await {
                    return;
                }
            }
            if let Some(end) = piece.end {
                break end;
            }
        };
        if silent {
            generation.tokens.clear();
        }
        let mut last = chunk(choice("", Some(ending.finish_reason(false)), Json::Null));
        last["timings"] = timings_json(&timings);
        if !send_json(&tx, &last).await {
            return;
        }
        if include_usage {
            let mut usage_chunk = chunk(json!([]));
            usage_chunk["usage"] = usage(&generation);
            if !send_json(&tx, &usage_chunk).await {
                return;
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    sse_response(rx)
}
