//! Guards against web pages. Any page the user visits can send requests to 127.0.0.1, and a
//! DNS-rebinding page (its own name re-pointed at 127.0.0.1) can also read the answers. Three
//! rules close that:
//! - A body is JSON only with a JSON content type: browsers send a cross-origin POST without
//!   asking first (no CORS preflight) only with `text/plain`, a form encoding or no type, so a
//!   page cannot make one that is read here (415).
//! - `Host` must be an IP literal, `localhost`, or a name given with `--allowed-hosts`: a
//!   rebinding page's requests carry its own name (403).
//! - CORS headers go only to origins given with `--cors-origin`; without it a page can read
//!   nothing cross-origin, and its preflights get no permission.

use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, ApiState};

/// Which hosts and origins may reach the server (`--allowed-hosts`, `--cors-origin`).
#[derive(Debug, Clone, Default)]
pub struct BrowserPolicy {
    /// Extra host names accepted in `Host` (lowercase, without port); `*` accepts any.
    allowed_hosts: Vec<String>,
    /// Origins that get CORS headers (`scheme://host[:port]`); `*` is any.
    cors_origins: Vec<String>,
}

/// Headers a browser client may send cross-origin when CORS is on.
const CORS_ALLOWED_HEADERS: &str = "authorization, content-type, x-api-key, anthropic-version, anthropic-beta, \
     x-session-affinity, x-smg-routing-key";

impl BrowserPolicy {
    /// The policy from the comma-separated flags; entries are trimmed, empty ones dropped.
    pub fn new(allowed_hosts: Option<&str>, cors_origins: Option<&str>) -> anyhow::Result<Self> {
        let list = |flag: Option<&str>| -> Vec<String> {
            flag.into_iter()
                .flat_map(|v| v.split(','))
                .map(|v| v.trim().trim_end_matches('/').to_ascii_lowercase())
                .filter(|v| !v.is_empty())
                .collect()
        };
        let policy = BrowserPolicy { allowed_hosts: list(allowed_hosts), cors_origins: list(cors_origins) };
        if let Some(bad) = policy.cors_origins.iter().find(|o| *o != "*" && !o.contains("://")) {
            anyhow::bail!(
                "--cors-origin {bad:?} is not an origin: write it as scheme://host[:port], e.g. http://localhost:3000"
            );
        }
        Ok(policy)
    }

    /// Whether a request's `Host` header names this server: an IP literal (what rebinding cannot
    /// forge), `localhost` or a subdomain of it, or a name from `--allowed-hosts`. HTTP/1.0
    /// requests without `Host` pass; they cannot come from a browser.
    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST) else { return true };
        let Ok(host) = host.to_str() else { return false };
        let name = host_name(host).to_ascii_lowercase();
        name.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.allowed_hosts.iter().any(|h| h == "*" || *h == name)
    }

    /// The `Access-Control-Allow-Origin` value for a request's `Origin`, if it is allowed.
    fn cors_origin(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        let text = origin.to_str().ok()?.trim_end_matches('/').to_ascii_lowercase();
        self.cors_origins.iter().any(|o| o == "*" || *o == text).then(|| origin.clone())
    }
}

/// The name part of a `Host` value: without the port, and without the brackets of an IPv6 literal.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// 403 for a `Host` the server does not answer to (DNS rebinding); on every route.
pub(super) async fn check_host(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    if state.browser.host_allowed(request.headers()) {
        return next.run(request).await;
    }
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("?");
    ApiError::Forbidden(format!(
        "the Host {host:?} is not this server's: use an IP address or localhost, or start the server with \
         --allowed-hosts naming it (a guard against DNS rebinding)"
    ))
    .into_response()
}

/// 415 for a request body that does not say it is JSON. Empty bodies pass (nothing to read):
/// `Content-Length: 0`, or neither a length nor a transfer encoding (HTTP/1.1's bodiless request,
/// as clients send a bare `POST /flush_cache`).
pub(super) async fn require_json(request: Request, next: Next) -> Response {
    if request.method() == Method::GET || request.method() == Method::HEAD || is_empty(&request) {
        return next.run(request).await;
    }
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if content_type.is_some_and(is_json_type) {
        return next.run(request).await;
    }
    ApiError::UnsupportedMediaType(content_type.unwrap_or("none").to_owned()).into_response()
}

fn is_empty(request: &Request<Body>) -> bool {
    let headers = request.headers();
    match headers.get(header::CONTENT_LENGTH) {
        Some(length) => length.to_str().is_ok_and(|n| n.trim() == "0"),
        None => !headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// `application/json`, or any `+json` type, with any parameters (`; charset=utf-8`).
fn is_json_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// CORS for the origins of `--cors-origin`: preflights answered, replies marked readable. Other
/// origins get no CORS headers, so browsers keep the replies from their pages.
pub(super) async fn cors(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let allowed = state.browser.cors_origin(request.headers());
    let preflight =
        request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = match (&allowed, preflight) {
        (Some(_), true) => {
            let mut response = StatusCode::NO_CONTENT.into_response();
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
            headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static(CORS_ALLOWED_HEADERS));
            headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
            response
        }
        (None, true) => ApiError::Forbidden(
            "cross-origin requests from this origin are not allowed; start the server with --cors-origin naming it"
                .into(),
        )
        .into_response(),
        (_, false) => next.run(request).await,
    };
    if let Some(origin) = allowed {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, value.parse().unwrap());
        headers
    }

    #[test]
    fn hosts_are_ip_literals_localhost_or_allowed_names() {
        let policy = BrowserPolicy::new(Some("gpu-box.lan, Radix.Internal"), None).unwrap();
        for host in ["127.0.0.1:8080", "10.0.0.7", "[::1]:8080", "localhost:8080", "LOCALHOST", "app.localhost:1"] {
            assert!(policy.host_allowed(&with(header::HOST, host)), "{host}");
        }
        for host in ["gpu-box.lan:8080", "radix.internal"] {
            assert!(policy.host_allowed(&with(header::HOST, host)), "{host}");
        }
        for host in ["evil.example:8080", "localhost.evil.example", "127.0.0.1.evil.example", "gpu-box.lan.evil"] {
            assert!(!policy.host_allowed(&with(header::HOST, host)), "{host}");
        }
        assert!(policy.host_allowed(&HeaderMap::new()), "HTTP/1.0 without Host");
        let any = BrowserPolicy::new(Some("*"), None).unwrap();
        assert!(any.host_allowed(&with(header::HOST, "evil.example")));
    }

    #[test]
    fn only_json_content_types_are_json() {
        for t in ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json"] {
            assert!(is_json_type(t), "{t}");
        }
        for t in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "",
            "text/json+x",
        ] {
            assert!(!is_json_type(t), "{t}");
        }
    }

    #[test]
    fn cors_names_only_the_given_origins() {
        let none = BrowserPolicy::default();
        assert_eq!(none.cors_origin(&with(header::ORIGIN, "http://localhost:3000")), None);
        let some = BrowserPolicy::new(None, Some("http://localhost:3000/")).unwrap();
        assert!(some.cors_origin(&with(header::ORIGIN, "http://localhost:3000")).is_some());
        assert_eq!(some.cors_origin(&with(header::ORIGIN, "http://evil.example")), None);
        assert_eq!(some.cors_origin(&HeaderMap::new()), None);
        assert!(BrowserPolicy::new(None, Some("localhost:3000")).unwrap_err().to_string().contains("scheme://"));
    }
}
