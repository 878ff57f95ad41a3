//! Replays a workload against an OpenAI-compatible endpoint, streaming each request with usage as
//! agents do, and records what the server reports and how long it took.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value as Json, json};

use super::workload::{BenchRequest, RequestKind, Workload};

/// Where to send requests.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Base URL up to `/v1`, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` when set.
    pub api_key: Option<String>,
    /// The `model` field.
    pub model: String,
}

/// What one request measured.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// Position in the workload.
    pub index: usize,
    /// Its conversation.
    pub conversation: String,
    /// Its session.
    pub session: usize,
    /// What it was.
    pub kind: RequestKind,
    /// First request of its conversation.
    pub first: bool,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: usize,
    /// Cached prompt tokens as the server reported them.
    pub cached_tokens: usize,
    /// Where `cached_tokens` came from: `usage` (`prompt_tokens_details.cached_tokens`),
    /// `timings` (llama.cpp's `timings.cache_n`) or `none`.
    pub cached_source: &'static str,
    /// llama.cpp's `timings.cache_n` when the server sent it as well (a cross-check of
    /// `cached_tokens`).
    pub timings_cache_n: Option<usize>,
    /// The most prompt tokens any prefix cache could have reused here (see [`super::ideal`]),
    /// when the server could render and tokenize prompts for us.
    pub ideal_cached: Option<usize>,
    /// `usage.completion_tokens`.
    pub completion_tokens: usize,
    /// Milliseconds from sending the request to the first chunk that carries generated text,
    /// reasoning or a tool call (or to the end, if the reply was empty).
    pub ttft_ms: f64,
    /// Milliseconds from sending the request to the end of the stream.
    pub total_ms: f64,
    /// Milliseconds from the start of the replay to sending this request.
    pub sent_at_ms: f64,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

impl Measurement {
    /// Prompt tokens the server had to compute.
    pub fn prefilled(&self) -> usize {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }
}

/// Replays `workload` in order, one request at a time; errors are recorded, not fatal.
pub fn replay(endpoint: &Endpoint, workload: &Workload, mut progress: impl FnMut(&Measurement)) -> Vec<Measurement> {
    let start = Instant::now();
    workload
        .requests
        .iter()
        .enumerate()
        .map(|(index, request)| {
            let sent_at_ms = start.elapsed().as_secs_f64() * 1e3;
            let m = send(endpoint, request, index, sent_at_ms);
            progress(&m);
            m
        })
        .collect()
}

/// The request body agents send.
pub fn request_body(endpoint: &Endpoint, request: &BenchRequest) -> Json {
    let mut body = json!({
        "model": endpoint.model,
        "messages": request.messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": request.max_tokens,
        "temperature": 0,
    });
    if !request.tools.is_empty() {
        body["tools"] = Json::Array(request.tools.clone());
    }
    body
}

fn send(endpoint: &Endpoint, request: &BenchRequest, index: usize, sent_at_ms: f64) -> Measurement {
    let mut m = Measurement {
        index,
        conversation: request.conversation.clone(),
        session: request.session,
        kind: request.kind,
        first: request.first,
        prompt_tokens: 0,
        cached_tokens: 0,
        cached_source: "none",
        timings_cache_n: None,
        ideal_cached: None,
        completion_tokens: 0,
        ttft_ms: 0.0,
        total_ms: 0.0,
        sent_at_ms,
        error: None,
    };
    let started = Instant::now();
    let ms = || started.elapsed().as_secs_f64() * 1e3;
    let mut call = ureq::post(&format!("{}/chat/completions", endpoint.base_url.trim_end_matches('/')))
        .timeout(Duration::from_secs(1800));
    if let Some(key) = &endpoint.api_key {
        call = call.set("Authorization", &format!("Bearer {key}"));
    }
    let response = match call.send_json(request_body(endpoint, request)) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => {
            m.error = Some(format!(
                "HTTP {code}: {}",
                r.into_string().unwrap_or_default().chars().take(300).collect::<String>()
            ));
            m.total_ms = ms();
            return m;
        }
        Err(e) => {
            m.error = Some(format!("request failed: {e}"));
            m.total_ms = ms();
            return m;
        }
    };
    let mut first_token: Option<f64> = None;
    let mut cache_n: Option<usize> = None;
    let mut usage_cached: Option<usize> = None;
    for line in BufReader::new(response.into_reader()).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                m.error = Some(format!("stream broke: {e}"));
                break;
            }
        };
        let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
        if data == "[DONE]" {
            break;
        }
        let Ok(chunk) = serde_json::from_str::<Json>(data) else {
            m.error = Some(format!("bad chunk: {}", data.chars().take(200).collect::<String>()));
            continue;
        };
        if let Some(e) = chunk.get("error") {
            m.error = Some(format!("server error: {e}"));
        }
        if first_token.is_none() && carries_output(&chunk) {
            first_token = Some(ms());
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |v: &Json| v.as_u64().map(|n| n as usize);
            m.prompt_tokens = n(&usage["prompt_tokens"]).unwrap_or(m.prompt_tokens);
            m.completion_tokens = n(&usage["completion_tokens"]).unwrap_or(m.completion_tokens);
            usage_cached = n(&usage["prompt_tokens_details"]["cached_tokens"]).or(usage_cached);
        }
        if let Some(n) = chunk.pointer("/timings/cache_n").and_then(Json::as_u64) {
            cache_n = Some(n as usize);
        }
    }
    m.total_ms = ms();
    m.timings_cache_n = cache_n;
    m.ttft_ms = first_token.unwrap_or(m.total_ms);
    (m.cached_tokens, m.cached_source) = match (usage_cached, cache_n) {
        (Some(n), _) => (n, "usage"),
        (None, Some(n)) => (n, "timings"),
        (None, None) => (0, "none"),
    };
    if m.prompt_tokens == 0 && m.error.is_none() {
        m.error = Some("the stream carried no usage (stream_options.include_usage ignored?)".into());
    }
    m
}

/// Whether a chunk's delta carries generated text, reasoning or a tool call (a role-only chunk,
/// which some servers send before prefill, does not count).
fn carries_output(chunk: &Json) -> bool {
    let Some(delta) = chunk.pointer("/choices/0/delta") else { return false };
    let text = |k: &str| delta.get(k).and_then(Json::as_str).is_some_and(|s| !s.is_empty());
    text("content") || text("reasoning_content") || delta.get("tool_calls").is_some_and(|c| !c.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_only_chunks_are_not_output() {
        assert!(!carries_output(&json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]})));
        assert!(!carries_output(&json!({"choices": [], "usage": {"prompt_tokens": 3}})));
        assert!(carries_output(&json!({"choices": [{"delta": {"content": "Hi"}}]})));
        assert!(carries_output(&json!({"choices": [{"delta": {"reasoning_content": "hm"}}]})));
        assert!(carries_output(&json!({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]})));
    }
}
