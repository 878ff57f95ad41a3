//! API keys (`--api-key`, `--api-key-file`, as llama-server names them): every route but
//! `/health` and the cache page's static files (`ui.rs`) wants one, as `Authorization: Bearer
//! <key>` (OpenAI clients) or `x-api-key: <key>` (Anthropic clients).

use std::path::Path;

use anyhow::Context;
use axum::http::HeaderMap;

/// The accepted keys; none means the server is open.
#[derive(Clone, Default)]
pub struct ApiKeys {
    keys: Vec<Vec<u8>>,
}

impl std::fmt::Debug for ApiKeys {
    // Keys are secrets: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.keys.len())
    }
}

impl ApiKeys {
    /// Keys from `--api-key` (comma-separated, as llama-server takes them) and from a file with
    /// one key per line (blank lines and `#` comments skipped).
    pub fn load(flag: Option<&str>, file: Option<&Path>) -> anyhow::Result<Self> {
        let mut keys = flag_keys("--api-key", flag)?;
        if let Some(file) = file {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the API key file {}", file.display()))?;
            keys.extend(text.lines().map(str::to_owned).filter(|l| !l.starts_with('#')));
        }
        let keys: Vec<Vec<u8>> =
            keys.iter().map(|k| k.trim()).filter(|k| !k.is_empty()).map(|k| k.as_bytes().to_vec()).collect();
        if file.is_some() && keys.is_empty() {
            anyhow::bail!("the API key file has no key");
        }
        Ok(ApiKeys { keys })
    }

    /// The admin keys of `--admin-api-key` (comma-separated).
    pub fn load_admin(flag: Option<&str>) -> anyhow::Result<Self> {
        let keys = flag_keys("--admin-api-key", flag)?;
        Ok(ApiKeys {
            keys: keys.iter().map(|k| k.trim()).filter(|k| !k.is_empty()).map(|k| k.as_bytes().to_vec()).collect(),
        })
    }

    /// Whether any key is required.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The key a request presents (bearer token or `x-api-key`), when keys are on: who is
    /// asking, for the cache report's tenants. `None` on an open server.
    pub fn presented(&self, headers: &HeaderMap) -> Option<String> {
        if !self.enabled() {
            return None;
        }
        let bearer =
            headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token);
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
        bearer.or(x_api_key).map(str::to_owned)
    }

    /// Whether the request carries an accepted key. Every key is compared in full, in time that
    /// depends only on the lengths, so response timing does not reveal how much of a key was right.
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        if !self.enabled() {
            return true;
        }
        let bearer =
            headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token);
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
        let mut ok = false;
        for given in [bearer, x_api_key].into_iter().flatten() {
            for key in &self.keys {
                ok |= constant_time_eq(given.as_bytes(), key);
            }
        }
        ok
    }
}

/// The comma-separated keys of the flag `name`. A flag given with no usable key (a shell
/// variable that was not set, say) is an error: it must not silently leave the server open.
fn flag_keys(name: &str, flag: Option<&str>) -> anyhow::Result<Vec<String>> {
    let keys: Vec<String> = flag.into_iter().flat_map(|k| k.split(',')).map(str::to_owned).collect();
    if flag.is_some() && keys.iter().all(|k| k.trim().is_empty()) {
        anyhow::bail!(
            "{name} has no usable key (it is empty or only commas and spaces): give a key, or leave the flag out"
        );
    }
    Ok(keys)
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
/// (RFC 9110, section 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once([' ', '\t'])?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Equality whose running time depends on the lengths only, not on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn keys_are_checked_from_either_header() {
        let keys = ApiKeys::load(Some("k1,k2"), None).unwrap();
        assert!(keys.accepts(&headers(&[("authorization", "Bearer k2")])));
        assert!(keys.accepts(&headers(&[("x-api-key", "k1")])));
        assert!(!keys.accepts(&headers(&[("authorization", "Bearer k3")])));
        assert!(!keys.accepts(&headers(&[("authorization", "Bearer k")])));
        assert!(!keys.accepts(&headers(&[("authorization", "k1")])));
        assert!(!keys.accepts(&HeaderMap::new()));
        assert!(ApiKeys::default().accepts(&HeaderMap::new()));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let keys = ApiKeys::load(Some("k1"), None).unwrap();
        for value in ["BEARER k1", "bearer k1", "Bearer  k1 ", "bEaReR\tk1"] {
            assert!(keys.accepts(&headers(&[("authorization", value)])), "{value}");
        }
        for value in ["Basic k1", "Bearerk1", "Bearer", "Token k1"] {
            assert!(!keys.accepts(&headers(&[("authorization", value)])), "{value}");
        }
    }

    #[test]
    fn a_flag_without_a_usable_key_is_refused() {
        for flag in ["", " ", ",", " , ", ",,"] {
            let error = ApiKeys::load(Some(flag), None).unwrap_err().to_string();
            assert!(error.contains("--api-key has no usable key"), "{flag:?}: {error}");
        }
        assert!(!ApiKeys::load(None, None).unwrap().enabled(), "no flag: an open server, as asked");
        assert!(ApiKeys::load(Some(" k , "), None).unwrap().enabled());
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }
}
