//! `POST /v1/chat/completions`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use radix_templates::ChatRequest;
use radix_templates::parse::{ParseEvent, ParsedMessage, ParserOptions};
use serde_json::{Value as Json, json};

use super::completion_params::{
    check_context, field, flag, include_usage, number, parse_body, sampling, stops, top_logprobs,
};
use super::output::{Generation, Piece, TokenText};
use super::{ApiError, ApiState};
use crate::engine::{GenerateRequest, SamplingParams, Timings, TokenLogprobs};

/// Everything a chat request decided before generation starts.
pub(super) struct Prepared {
    pub(super) request: GenerateRequest,
    pub(super) parser: ParserOptions,
    pub(super) stream: bool,
    include_usage: bool,
    id: String,
    /// To explain a cache miss in terms of messages (api/cache_report.rs).
    pub(super) cache: Option<super::cache_report::CacheContext>,
}

pub(super) async fn chat_completions(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let prepared = match prepare(&state, &body) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if prepared.stream { stream(state, prepared).into_response() } else { complete(state, prepared).await }
}

/// Reads an OpenAI chat body and decides everything before generation (the Anthropic API
/// converts its body to this shape and comes through here too).
pub(super) fn prepare(state: &ApiState, body: &[u8]) -> Result<Prepared, ApiError> {
    let body = parse_body(body)?;
    let chat = ChatRequest::from_json(&body)?;
    super::limits::check_roles(&chat.messages)?;
    if let Some(n) = field(&body, "n")
        && n.as_u64() != Some(1)
    {
        return Err(ApiError::bad_request("only 'n': 1 is supported"));
    }
    let prompt_text = state.template.render(&chat)?;
    let prompt = state
        .tokenizer
        .encode(&prompt_text, false)
        .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))?;
    let context = state.context_length;
    check_context(prompt.len(), context, "messages")?;
    let max_tokens = match number(&body, "max_completion_tokens")?.or(number(&body, "max_tokens")?) {
        Some(n) if n >= 1.0 => (n as usize).min(context - prompt.len()),
        Some(_) => return Err(ApiError::bad_request("'max_tokens' must be at least 1")),
        None => context - prompt.len(),
    };
    let mut sampling = sampling(&body, &SamplingParams::default())?;
    sampling.logprobs = logprobs_setting(&body)?;
    let stops = stops(&body)?;
    let stream = flag(&body, "stream", false)?;
    let include_usage = include_usage(&body);
    let tools_enabled = chat.tools.as_ref().is_some_and(|t| !t.is_empty())
        && field(&body, "tool_choice").and_then(Json::as_str) != Some("none");
    let parser = ParserOptions {
        format: state.output_format,
        starts_in_reasoning: prompt_text.trim_end().ends_with("<think>"),
        tool_call_id_prefix: format!("call_{}_", unique_suffix()),
        tools_enabled,
    };
    let cache = super::cache_report::CacheContext::new(
        &state.template,
        &state.tokenizer,
        chat,
        prompt_text,
        prompt.clone(),
        flag(&body, "cache_report", false)?,
    );
    let request = GenerateRequest {
        prompt,
        sampling,
        max_tokens,
        stop_tokens: state.stop_tokens.clone(),
        stop_strings: stops,
        use_cache: flag(&body, "cache_prompt", true)?,
        constraint: super::constrain::chat_constraint(&body, state.output_format, &state.tokenizer)?,
    };
    let id = format!("chatcmpl-{}", unique_suffix());
    Ok(Prepared { request, parser, stream, include_usage, id, cache: Some(cache) })
}

/// A suffix that makes ids unique within this process and across restarts.
pub(super) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("{:x}{n:x}", t)
}

/// Seconds since the epoch, for `created`.
pub(super) fn created() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// OpenAI's `usage` object of a finished generation.
pub(super) fn usage(generation: &Generation) -> Json {
    let (prompt, completion) = (generation.prompt_tokens, generation.tokens.len());
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": generation.pipeline.reasoning_tokens}
    })
}

/// llama.cpp's `timings` object.
pub(super) fn timings_json(t: &Timings) -> Json {
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1000.0 / ms } else { 0.0 };
    let per_token = |n: usize, ms: f64| if n > 0 { ms / n as f64 } else { 0.0 };
    json!({
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": per_token(t.prompt_n, t.prompt_ms),
        "prompt_per_second": rate(t.prompt_n, t.prompt_ms),
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": per_token(t.predicted_n, t.predicted_ms),
        "predicted_per_second": rate(t.predicted_n, t.predicted_ms),
    })
}

/// The delta object of one parse event.
fn delta(event: &ParseEvent) -> Json {
    match event {
        ParseEvent::Content(text) => json!({"content": text}),
        ParseEvent::Reasoning(text) => json!({"reasoning_content": text}),
        ParseEvent::ToolCallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
        ParseEvent::ToolCallArguments { index, delta } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
        }
    }
}

fn start(state: &ApiState, p: Prepared) -> (Generation, String, bool) {
    let mut generation = Generation::start(&state.engine, p.request, p.parser);
    generation.cache_context = p.cache;
    (generation, p.id, p.include_usage)
}

/// `logprobs` (bool) and `top_logprobs` (0 to 20 alternatives, only with `logprobs`).
fn logprobs_setting(body: &Json) -> Result<Option<usize>, ApiError> {
    match (flag(body, "logprobs", false)?, top_logprobs(body, "top_logprobs")?) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, None | Some(0)) => Ok(None),
        (false, Some(_)) => Err(ApiError::bad_request("'top_logprobs' needs 'logprobs': true")),
    }
}

/// The `logprobs` object of a choice for these tokens.
fn chat_logprobs(text: &mut TokenText, lps: &[TokenLogprobs]) -> Result<Json, ApiError> {
    let content = lps.iter().map(|lp| text.logprobs_entry(lp, false)).collect::<Result<Vec<_>, _>>()?;
    Ok(json!({"content": content}))
}

async fn complete(state: Arc<ApiState>, p: Prepared) -> Response {
    let wants_logprobs = p.request.sampling.logprobs.is_some();
    let (mut generation, id, _) = start(&state, p);
    let (events, ending, timings) = match generation.run().await {
        Ok(done) => done,
        Err(e) => return e.into_response(),
    };
    let message = ParsedMessage::from_events(events);
    let mut reply = json!({"role": "assistant", "content": message.content});
    if let Some(reasoning) = &message.reasoning_content {
        reply["reasoning_content"] = json!(reasoning);
    }
    if !message.tool_calls.is_empty() {
        if message.content.is_empty() {
            reply["content"] = Json::Null;
        }
        reply["tool_calls"] = message
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    let finish = ending.finish_reason(generation.pipeline.tool_calls);
    let logprobs = match wants_logprobs {
        true => match chat_logprobs(&mut TokenText::new(Arc::clone(&state.tokenizer)), &generation.logprobs) {
            Ok(l) => l,
            Err(e) => return e.into_response(),
        },
        false => Json::Null,
    };
    let mut body = json!({
        "id": id,
        "object": "chat.completion",
        "created": created(),
        "model": state.model_name,
        "choices": [{"index": 0, "message": reply, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage(&generation),
        "timings": timings_json(&timings),
    });
    super::cache_report::attach(&mut body, generation.cache.as_ref());
    let mut response = axum::Json(body).into_response();
    super::cache_report::set_header(&mut response, generation.cache.as_ref());
    response
}

/// An SSE response fed by a channel, with keep-alive comments so that clients with a read
/// timeout wait through a long prefill.
pub(super) fn sse_response(rx: tokio::sync::mpsc::Receiver<Event>) -> impl IntoResponse {
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok::<_, Infallible>(event), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)).text("keep-alive"))
}

/// The next piece of a streamed generation, or `None` once it is over: ended, or failed (the
/// error then goes to the client as a `data:` event).
pub(super) async fn next_piece(generation: &mut Generation, tx: &tokio::sync::mpsc::Sender<Event>) -> Option<Piece> {
    match generation.next().await {
        Ok(piece) => piece,
        Err(e) => {
            let _ = send_json(tx, &e.body()).await;
            None
        }
    }
}

/// Sends one JSON `data:` event; false once the client is gone.
pub(super) async fn send_json(tx: &tokio::sync::mpsc::Sender<Event>, value: &Json) -> bool {
    tx.send(Event::default().data(value.to_string())).await.is_ok()
}

fn stream(state: Arc<ApiState>, p: Prepared) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let wants_logprobs = p.request.sampling.logprobs.is_some();
    tokio::spawn(async move {
        let (mut generation, id, include_usage) = start(&state, p);
        let mut token_text = TokenText::new(Arc::clone(&state.tokenizer));
        // Log-probabilities go with the next chunk sent after their token (a token whose text is
        // held back has none of its own).
        let mut logprobs_sent = 0;
        let mut with_logprobs = |mut chunk: Json, generation: &Generation| -> Result<Json, ApiError> {
            if wants_logprobs && logprobs_sent < generation.logprobs.len() {
                chunk["choices"][0]["logprobs"] =
                    chat_logprobs(&mut token_text, &generation.logprobs[logprobs_sent..])?;
                logprobs_sent = generation.logprobs.len();
            }
            Ok(chunk)
        };
        let created = created();
        let chunk = |delta: Json, finish: Option<&str>| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
            })
        };
        if !send_json(&tx, &chunk(json!({"role": "assistant", "content": ""}), None)).await {
            return;
        }
        let (ending, timings) = loop {
            let Some(piece) = next_piece(&mut generation, &tx).await else { return };
            for event in &piece.events {
                let sent = match with_logprobs(chunk(delta(event), None), &generation) {
                    Ok(c) => send_json(&tx, &c).await,
                    Err(e) => {
                        let _ = send_json(&tx, &e.body()).await;
                        false
                    }
                };
                if !sent {
                    return;
                }
            }
            if let Some(end) = piece.end {
                break end;
            }
        };
        let last = chunk(json!({}), Some(ending.finish_reason(generation.pipeline.tool_calls)));
        let mut last = match with_logprobs(last, &generation) {
            Ok(c) => c,
            Err(e) => {
                let _ = send_json(&tx, &e.body()).await;
                return;
            }
        };
        last["timings"] = timings_json(&timings);
        super::cache_report::attach(&mut last, generation.cache.as_ref());
        if !send_json(&tx, &last).await {
            return;
        }
        if include_usage {
            let usage_chunk = json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                "choices": [], "usage": usage(&generation)
            });
            if !send_json(&tx, &usage_chunk).await {
                return;
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    sse_response(rx)
}
