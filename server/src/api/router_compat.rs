//! What a cache-aware router asks of a worker, so radix-serve instances can stand behind SGLang's
//! router (`sglang-router`, checked with 0.3.2 in tests/tests/router.rs) or any gateway that reads
//! the same endpoints, and the routing key agents send.
//!
//! When it registers a worker the router calls `GET /health`, then `GET /server_info` and
//! `GET /model_info` (falling back to `/get_server_info` and `/get_model_info` on a 404): the served
//! model name becomes the worker's model id, the model path and architecture its labels. Its
//! `power_of_two` policy polls `GET /get_load` (the `num_tokens` of each entry); its
//! `POST /flush_cache` goes to every worker. All of them answer here with the engine's own counts.
//!
//! Routing keys: the router's `manual` policy pins a session to one worker by `x-smg-routing-key`,
//! which it forwards to the worker; gateways that hash on a header use `x-session-affinity`. A
//! request may carry either (printable ASCII, at most [`MAX_ROUTING_KEY_BYTES`]; anything else is a
//! 400 naming the header); the key is echoed in the response's `x-session-affinity`, and the
//! server logs one line per keyed request with its cache split, so an instance's log shows whether
//! a session's turns kept finding their prefix.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::{ApiError, ApiState};

/// The header gateways hash on to keep a session on one instance (and echoed on responses).
pub const SESSION_AFFINITY_HEADER: &str = "x-session-affinity";
/// sglang-router's routing key for its `manual` policy (forwarded to the worker).
pub const ROUTER_ROUTING_KEY_HEADER: &str = "x-smg-routing-key";
/// Longest routing key accepted: a session id or a hash, not a payload.
pub const MAX_ROUTING_KEY_BYTES: usize = 256;

/// The routes of this module.
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/get_load", get(load))
        .route("/flush_cache", post(flush_cache))
}

/// `GET /server_info`: how this instance serves (SGLang's field names where they mean the same).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerInfo {
    /// The model file or directory as loaded.
    pub model_path: String,
    /// The name clients and routers use for the model (the router's model id).
    pub served_model_name: String,
    /// The tokenizer's source: the same file or directory (GGUF files carry their tokenizer).
    pub tokenizer_path: String,
    /// `radix-serve X.Y.Z`.
    pub version: String,
    /// Longest context of one sequence.
    pub context_length: usize,
    /// Sequences running at once (`--parallel`).
    pub max_running_requests: usize,
    /// Tokens the KV pool holds (running sequences and the prefix cache together).
    pub max_total_tokens: usize,
    /// Tokens per KV page.
    pub page_size: usize,
    /// Requests that may wait for admission before generation routes answer 503 (`--max-queue`).
    pub max_queued_requests: usize,
    /// Data-parallel ranks behind this address: always one engine.
    pub dp_size: usize,
    /// Whether prompts reuse cached prefixes (false with `--no-prefix-cache`).
    pub prefix_cache: bool,
    /// The load right now, as `/get_load` reports it.
    pub load: Load,
}

/// `GET /model_info`: what model this instance serves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    /// The model file or directory as loaded.
    pub model_path: String,
    /// The tokenizer's source (see [`ServerInfo::tokenizer_path`]).
    pub tokenizer_path: String,
    /// The name clients and routers use for the model.
    pub served_model_name: String,
    /// Always true: this server generates text (no embedding or reward models).
    pub is_generation: bool,
    /// The architecture's name (`llama`, `qwen2`, `qwen3`, ...), as GGUF metadata spells it.
    pub model_type: String,
    /// Longest context of one sequence.
    pub context_length: usize,
    /// Whether the model has recurrent layers, whose cached prefixes resume only from snapshots.
    pub hybrid: bool,
}

/// One engine's load, in the shape of one entry of SGLang's `/get_load`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Load {
    /// Always 0: one engine per instance.
    pub dp_rank: usize,
    /// Sequences running.
    pub num_reqs: usize,
    /// Requests waiting for admission (those the engine has not yet taken in included).
    pub num_waiting_reqs: usize,
    /// KV tokens held outside the prefix cache: pages of running sequences that the cache does
    /// not also hold (a sequence's cached prefix counts under the cache, as SGLang counts it).
    pub num_tokens: usize,
    /// KV tokens held by the prefix cache.
    pub num_cached_tokens: usize,
    /// KV tokens free.
    pub num_free_tokens: usize,
}

fn current_load(state: &ApiState) -> Load {
    let s = state.engine.stats();
    let held = s.pages_total.saturating_sub(s.pages_free).saturating_sub(s.pages_cached);
    Load {
        dp_rank: 0,
        num_reqs: s.running,
        num_waiting_reqs: state.engine.queued(),
        num_tokens: held * s.page_size,
        num_cached_tokens: s.pages_cached * s.page_size,
        num_free_tokens: s.pages_free * s.page_size,
    }
}

fn version() -> String {
    format!("radix-serve {}", env!("CARGO_PKG_VERSION"))
}

async fn server_info(State(state): State<Arc<ApiState>>) -> axum::Json<ServerInfo> {
    let s = state.engine.stats();
    axum::Json(ServerInfo {
        model_path: state.model_path.clone(),
        served_model_name: state.model_name.clone(),
        tokenizer_path: state.model_path.clone(),
        version: version(),
        context_length: state.context_length,
        max_running_requests: state.total_slots,
        max_total_tokens: s.pages_total * s.page_size,
        page_size: s.page_size,
        max_queued_requests: state.max_queue,
        dp_size: 1,
        prefix_cache: state.prefix_cache,
        load: current_load(&state),
    })
}

async fn model_info(State(state): State<Arc<ApiState>>) -> axum::Json<ModelInfo> {
    axum::Json(ModelInfo {
        model_path: state.model_path.clone(),
        tokenizer_path: state.model_path.clone(),
        served_model_name: state.model_name.clone(),
        is_generation: true,
        model_type: state.model_type.clone(),
        context_length: state.context_length,
        hybrid: state.hybrid,
    })
}

/// `GET /get_load`: a list with one entry per data-parallel rank, as SGLang answers; here one.
async fn load(State(state): State<Arc<ApiState>>) -> axum::Json<Vec<Load>> {
    axum::Json(vec![current_load(&state)])
}

/// `POST /flush_cache`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlushAnswer {
    /// What happens: the engine drops every cached prefix once no sequence runs (at once when
    /// idle), so running requests keep their pages.
    pub status: &'static str,
    /// Sequences running when the flush was asked (it waits for them).
    pub running: usize,
    /// KV tokens the cache held when the flush was asked.
    pub cached_tokens: usize,
}

async fn flush_cache(State(state): State<Arc<ApiState>>) -> axum::Json<FlushAnswer> {
    let s = state.engine.stats();
    state.engine.flush_cache();
    eprintln!(
        "radix-serve: flush_cache asked; {} cached tokens dropped once nothing runs",
        s.pages_cached * s.page_size
    );
    axum::Json(FlushAnswer {
        status: if s.running == 0 { "flushed" } else { "flushing once running sequences finish" },
        running: s.running,
        cached_tokens: s.pages_cached * s.page_size,
    })
}

/// The request's routing key: `x-session-affinity`, else `x-smg-routing-key`; `Ok(None)` without
/// either; a 400 naming the header for an empty, overlong or non-printable one.
pub(super) fn routing_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    for name in [SESSION_AFFINITY_HEADER, ROUTER_ROUTING_KEY_HEADER] {
        let Some(value) = headers.get(name) else { continue };
        let bytes = value.as_bytes();
        let printable = bytes.iter().all(|b| (0x20..0x7f).contains(b));
        if bytes.is_empty() || bytes.len() > MAX_ROUTING_KEY_BYTES || !printable {
            return Err(ApiError::bad_request(format!(
                "header '{name}' must be 1 to {MAX_ROUTING_KEY_BYTES} printable ASCII characters (a session id); \
                 it has {} bytes",
                bytes.len()
            )));
        }
        return Ok(Some(String::from_utf8_lossy(bytes).trim().to_owned()));
    }
    Ok(None)
}

/// Checks and echoes the routing key; logs each keyed request with its cache split.
pub(super) async fn session_affinity(request: Request, next: Next) -> Response {
    let key = match routing_key(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) => return next.run(request).await,
        Err(e) => return e.into_response(),
    };
    let route = format!("{} {}", request.method(), request.uri().path());
    let mut response = next.run(request).await;
    let cache = response.headers().get("x-radix-cache").and_then(|v| v.to_str().ok()).map(str::to_owned);
    eprintln!(
        "radix-serve: session {key}: {route} -> {}{}",
        response.status().as_u16(),
        cache.map(|c| format!(" ({c})")).unwrap_or_default()
    );
    if let Ok(value) = HeaderValue::from_str(&key) {
        response.headers_mut().insert(SESSION_AFFINITY_HEADER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_bytes(value).unwrap());
        }
        map
    }

    #[test]
    fn the_affinity_header_wins_over_the_routers_key() {
        assert_eq!(routing_key(&HeaderMap::new()).unwrap(), None);
        let router = headers(&[(ROUTER_ROUTING_KEY_HEADER, b"sess-1")]);
        assert_eq!(routing_key(&router).unwrap().as_deref(), Some("sess-1"));
        let both = headers(&[(ROUTER_ROUTING_KEY_HEADER, b"sess-1"), (SESSION_AFFINITY_HEADER, b"agent-7")]);
        assert_eq!(routing_key(&both).unwrap().as_deref(), Some("agent-7"));
    }

    #[test]
    fn bad_keys_are_a_400_naming_the_header() {
        let long = vec![b'k'; MAX_ROUTING_KEY_BYTES + 1];
        for value in [&b"caf\xc3\xa9"[..], &long, b"tab\there"] {
            let err = routing_key(&headers(&[(SESSION_AFFINITY_HEADER, value)])).unwrap_err();
            assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
            assert!(err.message().contains(SESSION_AFFINITY_HEADER), "{}", err.message());
        }
        let at_limit = vec![b'k'; MAX_ROUTING_KEY_BYTES];
        assert!(routing_key(&headers(&[(ROUTER_ROUTING_KEY_HEADER, &at_limit)])).unwrap().is_some());
    }
}
