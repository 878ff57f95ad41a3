//! The cache page at `/` and `/ui`: plain HTML, CSS and JavaScript compiled into the binary
//! (`ui/`), no build step. The page itself holds no data, so it is served without a key (a
//! browser cannot send one with a navigation) but behind the `Host` check like every route;
//! what it shows it reads with the key the user gives it (kept in the tab's session storage)
//! from `/v1/cache`, `/health` and `GET /v1/cache/requests` (below), under the same key, `Host`
//! and CORS rules as the rest of the API. Its URLs are relative, so it works under a path prefix
//! (a reverse proxy); SGLang's router forwards only the API, so behind it each worker's page
//! is opened at the worker's own address.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::Uri;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::preparation::off_workers;
use super::recent::branches;
use super::response::radix::CachePage;
use super::response::to_json;
use super::{ApiError, ApiState};

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// Requests `GET /v1/cache/requests` returns unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 30;

/// Scripts and styles from this server only, no inline code, no framing (clickjacking), fetches
/// to this server only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's routes (`/`, `/ui` and its two assets); the caller puts them behind the `Host`
/// check only.
pub(super) fn page_routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
}

/// The page's data route, behind the API's guards.
pub(super) fn data_routes() -> Router<Arc<ApiState>> {
    Router::new().route("/v1/cache/requests", get(requests))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 6] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // A newer binary serves a newer page: never a stale script against a changed API.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}

/// `limit` from the query (1 to the requests remembered).
fn limit(uri: &Uri) -> Result<usize, ApiError> {
    let value = uri.query().into_iter().flat_map(|q| q.split('&')).find_map(|pair| pair.strip_prefix("limit="));
    let Some(value) = value else { return Ok(DEFAULT_LIMIT) };
    match value.parse::<usize>() {
        Ok(n) if (1..=super::recent::CAPACITY).contains(&n) => Ok(n),
        _ => Err(ApiError::bad_request(format!(
            "'limit' is {value:?}; expected a whole number from 1 to {}",
            super::recent::CAPACITY
        ))),
    }
}

/// `GET /v1/cache/requests`: the last requests (newest first) with their prompt parts, the
/// timeline, and the tree of the recently computed sequences' shared prefixes. Prompt text
/// (divergence text, a preview of the last message, branch heads) only for the admin key.
async fn requests(State(state): State<Arc<ApiState>>, headers: HeaderMap, uri: Uri) -> Response {
    let limit = match limit(&uri) {
        Ok(limit) => limit,
        Err(e) => return e.into_response(),
    };
    let admin = state.admin_keys.enabled() && state.admin_keys.accepts(&headers);
    let prefixes = state.engine.recent_prefixes().await.unwrap_or_default();
    let pending = state.recent.take_pending(limit);
    // Parts encode prompts and the tree walks every remembered sequence: off the async workers.
    let shape = off_workers(&state, move |state| {
        if !pending.is_empty() {
            pending.compute(state.content_controls.as_ref());
        }
        let sequences: Vec<(&[u32], u64)> = prefixes.iter().map(|p| (&p.tokens[..], p.uses)).collect();
        let tree = branches::tree(&sequences);
        let decode = |tokens: &[u32]| state.tokenizer.decode(tokens, false).unwrap_or_default();
        let head: Option<branches::Head> = if admin { Some(&decode) } else { None };
        Ok((branches::shown(&tree, &sequences, head, 0), sequences.len()))
    })
    .await;
    let (branches, sequences) = match shape {
        Ok(shape) => shape,
        Err(e) => return e.into_response(),
    };
    let page = CachePage {
        admin,
        model: state.model_name.clone(),
        hybrid: state.hybrid,
        requests: state.recent.requests(limit, admin),
        timeline: state.recent.timeline(),
        sequences,
        branches,
    };
    axum::Json(to_json(&page)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_a_bounded_number() {
        let uri = |q: &str| q.parse::<Uri>().unwrap();
        assert_eq!(limit(&uri("/v1/cache/requests")).unwrap(), DEFAULT_LIMIT);
        assert_eq!(limit(&uri("/v1/cache/requests?limit=5")).unwrap(), 5);
        assert_eq!(limit(&uri("/v1/cache/requests?x=1&limit=64")).unwrap(), 64);
        for bad in ["0", "65", "-1", "ten", ""] {
            let error = limit(&uri(&format!("/v1/cache/requests?limit={bad}"))).unwrap_err();
            assert!(error.message().contains("'limit'"), "{bad}");
        }
    }

    #[test]
    fn the_page_uses_relative_urls_and_no_inline_code() {
        // Relative URLs keep the page working under a reverse proxy's path prefix.
        for (name, text) in [("index.html", INDEX_HTML), ("app.js", APP_JS)] {
            for absolute in ["\"/v1", "'/v1", "`/v1", "\"/health", "'/health", "\"/ui", "'/ui"] {
                assert!(!text.contains(absolute), "{name} names an absolute URL ({absolute})");
            }
        }
        // The CSP allows no inline script or style.
        assert!(!INDEX_HTML.contains("<script>") && !INDEX_HTML.contains("style="), "inline code in index.html");
        assert!(INDEX_HTML.contains("src=\"ui/app.js\"") && INDEX_HTML.contains("href=\"ui/app.css\""));
        assert!(!APP_JS.contains("innerHTML"), "app.js builds the DOM from text nodes, never from markup");
    }
}
