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

use super::output::OutputPipeline;
use super::{ApiError, ApiState};
use crate::engine::{EngineEvent, FinishReason, GenerateRequest, SamplingParams, Timings};

/// Everything a chat request decided before generation starts.
struct Prepared {
    request: GenerateRequest,
    stops: Vec<String>,
    parser: ParserOptions,
    stream: bool,
    include_usage: bool,
    id: String,
}

pub(super) async fn chat_completions(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let prepared = match prepare(&state, &body) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if prepared.stream { stream(state, prepared).into_response() } else { complete(state, prepared).await }
}

fn field<'a>(body: &'a Json, name: &str) -> Option<&'a Json> {
    body.get(name).filter(|v| !v.is_null())
}

fn number(body: &Json, name: &str) -> Result<Option<f64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::bad_request(format!("'{name}' must be a number"))),
    }
}

fn prepare(state: &ApiState, body: &[u8]) -> Result<Prepared, ApiError> {
    let body: Json =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let chat = ChatRequest::from_json(&body)?;
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
    if prompt.len() >= context {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {context} tokens. However, your messages resulted in {} \
             tokens. Please reduce the length of the messages.",
            prompt.len()
        ))
        .with_code("context_length_exceeded"));
    }
    let max_tokens = match number(&body, "max_completion_tokens")?.or(number(&body, "max_tokens")?) {
        Some(n) if n >= 1.0 => (n as usize).min(context - prompt.len()),
        Some(_) => return Err(ApiError::bad_request("'max_tokens' must be at least 1")),
        None => context - prompt.len(),
    };
    let defaults = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: number(&body, "temperature")?.map_or(defaults.temperature, |v| v as f32),
        top_p: number(&body, "top_p")?.map_or(defaults.top_p, |v| v as f32),
        top_k: number(&body, "top_k")?.map_or(0, |v| v.max(0.0) as usize),
        min_p: number(&body, "min_p")?.map_or(defaults.min_p, |v| v as f32),
        presence_penalty: number(&body, "presence_penalty")?.map_or(0.0, |v| v as f32),
        frequency_penalty: number(&body, "frequency_penalty")?.map_or(0.0, |v| v as f32),
        repetition_penalty: number(&body, "repetition_penalty")?.map_or(1.0, |v| v as f32),
        seed: match field(&body, "seed") {
            None => None,
            Some(v) => Some(v.as_i64().ok_or_else(|| ApiError::bad_request("'seed' must be an integer"))? as u64),
        },
    };
    sampling.validate().map_err(ApiError::bad_request)?;
    let stops = match field(&body, "stop") {
        None => Vec::new(),
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| ApiError::bad_request("'stop' must hold strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad_request("'stop' must be a string or an array of strings")),
    };
    let flag = |name: &str, default: bool| -> Result<bool, ApiError> {
        match field(&body, name) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| ApiError::bad_request(format!("'{name}' must be a boolean"))),
        }
    };
    let stream = flag("stream", false)?;
    let include_usage =
        field(&body, "stream_options").and_then(|o| o.get("include_usage")).and_then(Json::as_bool).unwrap_or(false);
    let tools_enabled = chat.tools.as_ref().is_some_and(|t| !t.is_empty())
        && field(&body, "tool_choice").and_then(Json::as_str) != Some("none");
    let parser = ParserOptions {
        format: state.output_format,
        starts_in_reasoning: prompt_text.trim_end().ends_with("<think>"),
        tool_call_id_prefix: format!("call_{}_", unique_suffix()),
        tools_enabled,
    };
    let request = GenerateRequest {
        prompt,
        sampling,
        max_tokens,
        stop_tokens: state.stop_tokens.clone(),
        use_cache: flag("cache_prompt", true)?,
    };
    Ok(Prepared { request, stops, parser, stream, include_usage, id: format!("chatcmpl-{}", unique_suffix()) })
}

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("{:x}{n:x}", t)
}

fn created() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn usage(prompt_tokens: usize, cached: usize, completion: usize) -> Json {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached}
    })
}

fn timings_json(t: &Timings) -> Json {
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1000.0 / ms } else { 0.0 };
    json!({
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_second": rate(t.prompt_n, t.prompt_ms),
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_second": rate(t.predicted_n, t.predicted_ms),
    })
}

fn finish_reason(reason: FinishReason, stopped_by_string: bool, tool_calls: bool) -> &'static str {
    if tool_calls {
        "tool_calls"
    } else if stopped_by_string {
        "stop"
    } else {
        match reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
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

struct Outcome {
    events: Vec<ParseEvent>,
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
    finish: &'static str,
    timings: Timings,
}

async fn complete(state: Arc<ApiState>, p: Prepared) -> Response {
    let mut receiver = state.engine.submit(p.request.clone());
    let mut pipeline = OutputPipeline::new(Arc::clone(&state.tokenizer), p.stops.clone(), p.parser.clone());
    let mut out = Outcome {
        events: Vec::new(),
        prompt_tokens: p.request.prompt.len(),
        cached_tokens: 0,
        completion_tokens: 0,
        finish: "stop",
        timings: Timings::default(),
    };
    loop {
        match receiver.recv().await {
            Some(EngineEvent::Started { cached_tokens, .. }) => out.cached_tokens = cached_tokens,
            Some(EngineEvent::Token(token)) => {
                out.completion_tokens += 1;
                out.events.extend(pipeline.push(token));
                if pipeline.stopped {
                    out.events.extend(pipeline.finish());
                    out.finish = finish_reason(FinishReason::Stop, true, pipeline.tool_calls);
                    break;
                }
            }
            Some(EngineEvent::Finished { reason, timings }) => {
                out.events.extend(pipeline.finish());
                out.finish = finish_reason(reason, false, pipeline.tool_calls);
                out.timings = timings;
                break;
            }
            Some(EngineEvent::Failed(message)) => return ApiError::internal(message).into_response(),
            None => return ApiError::internal("the engine dropped the request").into_response(),
        }
    }
    drop(receiver);
    let message = ParsedMessage::from_events(out.events);
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
    if out.timings.cache_n == 0 {
        out.timings.cache_n = out.cached_tokens;
    }
    axum::Json(json!({
        "id": p.id,
        "object": "chat.completion",
        "created": created(),
        "model": state.model_name,
        "choices": [{"index": 0, "message": reply, "logprobs": null, "finish_reason": out.finish}],
        "usage": usage(out.prompt_tokens, out.cached_tokens, out.completion_tokens),
        "timings": timings_json(&out.timings),
    }))
    .into_response()
}

fn stream(state: Arc<ApiState>, p: Prepared) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut receiver = state.engine.submit(p.request.clone());
        let mut pipeline = OutputPipeline::new(Arc::clone(&state.tokenizer), p.stops.clone(), p.parser.clone());
        let created = created();
        let chunk = |delta: Json, finish: Option<&str>| {
            json!({
                "id": p.id, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
            })
        };
        let send = |value: Json| {
            let tx = tx.clone();
            async move { tx.send(Event::default().data(value.to_string())).await.is_ok() }
        };
        if !send(chunk(json!({"role": "assistant", "content": ""}), None)).await {
            return;
        }
        let (mut cached, mut completion) = (0, 0);
        let prompt_tokens = p.request.prompt.len();
        let (finish, timings) = loop {
            let (events, end) = match receiver.recv().await {
                Some(EngineEvent::Started { cached_tokens, .. }) => {
                    cached = cached_tokens;
                    continue;
                }
                Some(EngineEvent::Token(token)) => {
                    completion += 1;
                    let mut events = pipeline.push(token);
                    if pipeline.stopped {
                        events.extend(pipeline.finish());
                        (events, Some((finish_reason(FinishReason::Stop, true, pipeline.tool_calls), None)))
                    } else {
                        (events, None)
                    }
                }
                Some(EngineEvent::Finished { reason, timings }) => {
                    let events = pipeline.finish();
                    (events, Some((finish_reason(reason, false, pipeline.tool_calls), Some(timings))))
                }
                Some(EngineEvent::Failed(message)) => {
                    let _ = tx.send(Event::default().data(ApiError::internal(message).body().to_string())).await;
                    return;
                }
                None => return,
            };
            for event in &events {
                if !send(chunk(delta(event), None)).await {
                    return;
                }
            }
            if let Some(end) = end {
                break end;
            }
        };
        // A stop string ends the output here: dropping the receiver aborts the sequence.
        drop(receiver);
        let mut last = chunk(json!({}), Some(finish));
        if let Some(t) = timings {
            last["timings"] = timings_json(&t);
        }
        if !send(last).await {
            return;
        }
        if p.include_usage {
            let usage_chunk = json!({
                "id": p.id, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                "choices": [], "usage": usage(prompt_tokens, cached, completion)
            });
            if !send(usage_chunk).await {
                return;
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok::<_, Infallible>(event), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)).text("keep-alive"))
}
