//! Guards every route passes through before its handler: the API key, the body size and JSON
//! nesting limits, the waiting-queue limit; and errors made outside handlers (axum's own 404,
//! 405, 413 rejections) rewritten as OpenAI-style JSON so clients can always parse them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, ApiState, MAX_BODY_BYTES, MAX_JSON_DEPTH};

/// 401 unless the request carries an accepted API key. Attached to every route group but the
/// one with `/health`, which stays open for probes.
pub(super) async fn require_key(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let admin = state.admin_keys.enabled() && state.admin_keys.accepts(request.headers());
    if admin || state.api_keys.accepts(request.headers()) {
        next.run(request).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// Reads the body once, answering 413 past [`MAX_BODY_BYTES`] and 400 past [`MAX_JSON_DEPTH`].
pub(super) async fn read_body(request: Request, next: Next) -> Response {
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return next.run(request).await;
    }
    let too_large = || ApiError::TooLarge(MAX_BODY_BYTES).into_response();
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => return too_large(),
    };
    // A large body's scan would hold an async worker (and `/health` behind it) for a while.
    let depth = if bytes.len() > 64 << 10 {
        let scanned = bytes.clone();
        tokio::task::spawn_blocking(move || json_depth_over(&scanned, MAX_JSON_DEPTH)).await.unwrap_or(None)
    } else {
        json_depth_over(&bytes, MAX_JSON_DEPTH)
    };
    if let Some(depth) = depth {
        return ApiError::bad_request(format!(
            "the JSON body nests deeper than {MAX_JSON_DEPTH} levels (at least {depth})"
        ))
        .into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// 503 while more than `--max-queue` requests wait for admission (or are still being
/// prepared); attached to the routes that queue work on the engine.
pub(super) async fn limit_queue(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let queued = state.engine.queued() + state.preparation.pending();
    if request.method() == Method::POST && queued >= state.max_queue {
        return ApiError::Busy { queued, max_queue: state.max_queue }.into_response();
    }
    next.run(request).await
}

/// Rewrites an error response that is not JSON (axum's 404, 405, 413, 415 rejections) as an
/// OpenAI-style error with the same status.
pub(super) async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json =
        response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 64 << 10).await.unwrap_or_default();
    ApiError::from_rejection(status, &String::from_utf8_lossy(&body)).into_response()
}

/// Roles a chat message may have (OpenAI's, `function` included for old clients).
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool", "function"];

/// 400 for a message whose role no API defines: templates would otherwise print any role as-is
/// and the model would see a turn no client meant.
pub(super) fn check_roles(messages: &[serde_json::Value]) -> Result<(), ApiError> {
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if !ROLES.contains(&role) {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].role is '{role}'; expected one of: {}",
                ROLES.join(", ")
            )));
        }
    }
    Ok(())
}

/// The nesting depth of a JSON text once it exceeds `limit`, else `None`. Brackets inside
/// strings do not count; the text need not be valid JSON (the handler reports that).
fn json_depth_over(bytes: &[u8], limit: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(depth);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_roles_pass() {
        let ok = [serde_json::json!({"role": "developer"}), serde_json::json!({"role": "tool"})];
        assert!(check_roles(&ok).is_ok());
        let err = check_roles(&[serde_json::json!({"role": "user"}), serde_json::json!({"role": "wizard"})]);
        assert!(err.unwrap_err().message().contains("messages[1].role is 'wizard'"));
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(json_depth_over(br#"{"a": [[1]]}"#, 3), None);
        assert_eq!(json_depth_over(br#"{"a": [[1]]}"#, 2), Some(3));
        assert_eq!(json_depth_over(br#"{"a": "[[[[[\"[[["}"#, 1), None);
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(json_depth_over(deep.as_bytes(), MAX_JSON_DEPTH), Some(MAX_JSON_DEPTH + 1));
    }
}
