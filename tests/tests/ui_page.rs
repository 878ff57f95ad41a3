//! The cache page (`/`, `/ui`) and its data (`GET /v1/cache/requests`) against the real binary
//! on SmolLM2, with one server for everything (keys on: a user key and an admin key):
//!
//! - the API: the page is served without a key but refused (403) with a foreign `Host`; the data
//!   route wants the key; after two OpenCode-like agent sessions its requests match what the chat
//!   API answered (prompt and cached tokens, newest first), their parts add up and match
//!   `/apply-template`'s and the cache report's; the timeline's totals match `/v1/cache`'s; no
//!   prompt text without the admin key, prompt text with it;
//! - headless Chromium (Debian's `chromium`, driven over the DevTools pipe, `ui_page/cdp.rs`):
//!   the page asks for the key, keeps it in the tab's session storage across a reload, and renders
//!   the same numbers the API gives (each request's prompt, cached and computed tokens, its parts
//!   adding up to them; the totals); no prompt text without the admin key and the preview with
//!   it; no script errors or CSP violations; no sideways scrolling on a phone's width; it works
//!   under a path prefix (a reverse proxy); a foreign `Host` gets the 403 in the browser too. A
//!   screenshot of the page is written to `RADIX_UI_SCREENSHOT` (scripts/ui-screenshot.sh makes
//!   the README's), else to the target's temporary directory.
//!
//! Without Chromium the browser part is skipped, saying so, unless `RADIX_REQUIRE_CHROMIUM` is
//! set (CI sets it: `.ci/run`, after `scripts/chromium.sh` installed it).

#[path = "ui_page/cdp.rs"]
mod cdp;
mod common;
#[path = "ui_page/session.rs"]
mod session;

use std::io::{Read, Write};
use std::time::Duration;

use common::Server;
use serde_json::{Value as Json, json};
use session::{SECRET, Sent};

const KEY: &str = "ui-user-key";
const ADMIN: &str = "ui-admin-key";

/// `GET path` with `key`: the status and the body (JSON, or the text as a JSON string).
fn get(server: &Server, path: &str, key: Option<&str>) -> (u16, Json) {
    let mut request = ureq::get(&format!("{}{path}", server.base)).timeout(Duration::from_secs(60));
    if let Some(key) = key {
        request = request.set("Authorization", &format!("Bearer {key}"));
    }
    let response = match request.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("GET {path}: {e}"),
    };
    let status = response.status();
    let json = response.header("content-type").is_some_and(|t| t.contains("json"));
    let text = response.into_string().unwrap();
    (status, if json { serde_json::from_str(&text).unwrap() } else { Json::String(text) })
}

/// A raw `GET path` with this `Host`; the status.
fn status_with_host(server: &Server, path: &str, host: &str) -> u16 {
    let mut stream = std::net::TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head =
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn parts_sum(parts: &Json, field: &str) -> u64 {
    parts.as_object().unwrap().iter().filter(|(k, _)| *k != "messages").map(|(_, v)| v[field].as_u64().unwrap()).sum()
}

/// The page's files and guards, before any traffic.
fn page_is_served_like_the_api(server: &Server) {
    for path in ["/", "/ui"] {
        let response = ureq::get(&format!("{}{path}", server.base)).call().expect("the page needs no key");
        assert_eq!(response.content_type(), "text/html");
        let csp = response.header("content-security-policy").unwrap_or_default().to_owned();
        assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(response.into_string().unwrap().contains("ui/app.js"));
    }
    for (path, kind) in [("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")] {
        let response = ureq::get(&format!("{}{path}", server.base)).call().unwrap();
        assert_eq!(response.content_type(), kind, "{path}");
    }
    for path in ["/", "/ui", "/ui/app.js", "/v1/cache/requests"] {
        assert_eq!(status_with_host(server, path, "evil.example:80"), 403, "{path} with a foreign Host");
    }
    assert_eq!(status_with_host(server, "/ui", "localhost"), 200);
    let (status, _) = get(server, "/v1/cache/requests", None);
    assert_eq!(status, 401, "the data wants the key");
    let (status, error) = get(server, "/v1/cache/requests?limit=0", Some(KEY));
    assert_eq!(status, 400, "{error}");
    let (status, empty) = get(server, "/v1/cache/requests", Some(KEY));
    assert_eq!(status, 200);
    assert_eq!((empty["requests"].as_array().map(Vec::len), &empty["admin"]), (Some(0), &json!(false)));
}

/// `/v1/cache/requests` against what the chat API answered.
fn requests_match_the_api(server: &Server, sent: &[Sent]) -> Json {
    let (_, data) = get(server, "/v1/cache/requests", Some(KEY));
    let requests = data["requests"].as_array().unwrap();
    assert_eq!(requests.len(), sent.len(), "{data}");
    for (entry, sent) in requests.iter().zip(sent.iter().rev()) {
        let what =
            format!("{} ({} prompt, {} cached) as {entry}", sent.session, sent.prompt_tokens, sent.cached_tokens);
        assert_eq!(entry["status"], "finished", "{what}");
        assert_eq!(entry["session"], sent.session, "{what}");
        assert_eq!(entry["prompt_tokens"].as_u64(), Some(sent.prompt_tokens), "{what}");
        assert_eq!(entry["cached_tokens"].as_u64(), Some(sent.cached_tokens), "{what}");
        assert_eq!(entry["parts_status"], "ready", "{what}");
        let parts = &entry["parts"];
        assert_eq!(parts_sum(parts, "tokens"), sent.prompt_tokens, "the parts add up: {what}");
        assert_eq!(parts_sum(parts, "cached"), sent.cached_tokens, "{what}");
        // The same split /apply-template gives for the same messages...
        let (status, applied) = {
            let response = ureq::post(&format!("{}/apply-template", server.base))
                .set("Authorization", &format!("Bearer {KEY}"))
                .send_json(&sent.body)
                .unwrap();
            (response.status(), response.into_json::<Json>().unwrap())
        };
        assert_eq!(status, 200);
        for (name, part) in parts.as_object().unwrap() {
            assert_eq!(
                part["tokens"], applied["prompt_parts"][name]["tokens"],
                "{name}: {what} vs {}",
                applied["prompt_parts"]
            );
        }
        // ... and, where the request asked for it, the cache report's, cached split included.
        if let Some(report) = &sent.parts {
            for (name, part) in parts.as_object().unwrap() {
                assert_eq!(part, &report[name], "{name}: {what}");
            }
        }
        assert!(entry["ttft_ms"].as_f64().is_some_and(|t| t > 0.0), "{what}");
        assert_eq!(entry["kind"], "chat");
        assert!(entry.get("preview").is_none());
    }
    let (a, b) = (&requests[requests.len() - 1], &requests[0]);
    assert_eq!((a["turn"].as_str(), requests[1]["turn"].as_str()), (Some("first"), Some("later")));
    assert_eq!(b["divergence"]["part"], "system", "session B's date differs: {b}");
    assert_eq!(b["reason"], "new_content", "another tenant's sequences are not compared: {b}");
    assert_ne!(a["tenant"], b["tenant"], "session B sets `user`: another tenant");
    // The timeline counts what the engine counted.
    let (_, cache) = get(server, "/v1/cache", Some(KEY));
    let buckets = data["timeline"]["buckets"].as_array().unwrap();
    let sum = |field: &str| buckets.iter().map(|b| b[field].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("prompt_tokens"), cache["prompt_tokens"].as_u64().unwrap());
    assert_eq!(sum("cached_tokens"), cache["cached_tokens"].as_u64().unwrap());
    assert_eq!(sum("requests"), sent.len() as u64);
    // The branches: one shared by every sequence of session A at least.
    let top = &data["branches"][0];
    assert!(top["sequences"].as_u64().unwrap() >= 2 && top["tokens"].as_u64().unwrap() > 100, "{top}");
    // No prompt text without the admin key; with it, the preview and the text at the cut.
    let text = data.to_string();
    assert!(!text.contains(SECRET) && !text.contains("Today's date"), "prompt text without the admin key");
    assert!(top.get("head").is_none());
    let (_, admin) = get(server, "/v1/cache/requests", Some(ADMIN));
    assert_eq!(admin["admin"], true);
    assert!(admin["requests"][0]["preview"].as_str().is_some_and(|p| p.contains(SECRET)), "{}", admin["requests"][0]);
    assert!(admin["branches"][0]["head"].is_string());
    data
}

/// Numbers as the page prints them (`1,234`).
fn number(text: &Json) -> u64 {
    let digits: String = text.as_str().unwrap_or_default().chars().filter(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("not a number: {text}"))
}

/// What the page shows of each request, read from the rendered DOM.
const READ_REQUESTS: &str = r#"[...document.querySelectorAll('#request-list .req')].map(li => ({
    id: li.dataset.id,
    prompt: li.querySelector('.n-prompt').textContent,
    cached: li.querySelector('.n-cached').textContent,
    computed: li.querySelector('.n-computed').textContent,
    parts: [...li.querySelectorAll('.chip')].map(c => [c.dataset.part,
        c.querySelector('.n-part-tokens').textContent, c.querySelector('.n-part-cached').textContent]),
    segments: li.querySelectorAll('.bar .seg').length,
    visible: li.getBoundingClientRect().height > 0,
}))"#;

fn page_shows_the_api_numbers(browser: &mut cdp::Browser, tab: &str, server: &Server, data: &Json) {
    let shown = browser.eval(tab, READ_REQUESTS);
    let shown = shown.as_array().unwrap();
    let requests = data["requests"].as_array().unwrap();
    assert_eq!(shown.len(), requests.len(), "{shown:?}");
    for (row, entry) in shown.iter().zip(requests) {
        let what = format!("{row} for {entry}");
        assert_eq!(row["id"].as_str().map(str::to_owned), Some(entry["id"].to_string()), "{what}");
        assert_eq!(row["visible"], true);
        assert_eq!(number(&row["prompt"]), entry["prompt_tokens"].as_u64().unwrap(), "{what}");
        assert_eq!(number(&row["cached"]), entry["cached_tokens"].as_u64().unwrap(), "{what}");
        assert_eq!(number(&row["computed"]), entry["computed_tokens"].as_u64().unwrap(), "{what}");
        let parts = row["parts"].as_array().unwrap();
        let (mut tokens, mut cached) = (0, 0);
        for part in parts {
            let name = part[0].as_str().unwrap();
            assert_eq!(number(&part[1]), entry["parts"][name]["tokens"].as_u64().unwrap(), "{name}: {what}");
            assert_eq!(number(&part[2]), entry["parts"][name]["cached"].as_u64().unwrap(), "{name}: {what}");
            tokens += number(&part[1]);
            cached += number(&part[2]);
        }
        assert_eq!((tokens, cached), (number(&row["prompt"]), number(&row["cached"])), "parts add up: {what}");
        assert_eq!(row["segments"].as_u64(), Some(parts.len() as u64), "one bar segment per part: {what}");
    }
    let (_, cache) = get(server, "/v1/cache", Some(KEY));
    let mut card = |class: &str| browser.eval(tab, &format!("document.querySelector('.{class}').textContent"));
    assert_eq!(number(&card("total-prompt")), cache["prompt_tokens"].as_u64().unwrap());
    assert_eq!(number(&card("total-cached")), cache["cached_tokens"].as_u64().unwrap());
    let branches = browser.eval(tab, "document.querySelectorAll('#branches .branch').length").as_u64().unwrap();
    assert!(branches >= 2, "the cache's branches are drawn");
}

/// Waits for the page's key form and submits `key` through it.
fn enter_key(browser: &mut cdp::Browser, tab: &str, key: &str) {
    browser.wait_for(tab, "!document.getElementById('key-form').hidden", 10);
    let submit = format!(
        "document.getElementById('key-input').value = '{key}'; document.getElementById('key-form').requestSubmit(); true"
    );
    browser.eval(tab, &submit);
}

/// Polls the page has completed since load, once the key is in.
const POLLS: &str = "Number(document.body.dataset.polls || 0)";

fn browser_part(server: &Server, data: &Json) {
    let Some(chromium) = cdp::find_chromium() else {
        assert!(
            std::env::var_os("RADIX_REQUIRE_CHROMIUM").is_none(),
            "RADIX_REQUIRE_CHROMIUM is set but no Chromium was found (scripts/chromium.sh installs it)"
        );
        println!(
            "SKIPPED the browser part of ui_page: Chromium not found (apt-get install chromium, or set RADIX_CHROMIUM)"
        );
        return;
    };
    let scratch = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let rules = "--host-resolver-rules=MAP evil.example 127.0.0.1";
    let mut browser = cdp::Browser::launch(&chromium, &scratch, &[rules]);
    let tab = browser.open_tab();
    browser.navigate(&tab, &format!("{}/", server.base));
    // Keys on: the page asks for one, and polls once it has it.
    enter_key(&mut browser, &tab, KEY);
    browser.wait_for(&tab, &format!("{POLLS} >= 1"), 20);
    // Kept in the tab's session storage (not local storage): a reload needs no key.
    browser.navigate(&tab, &format!("{}/ui", server.base));
    browser.wait_for(&tab, &format!("{POLLS} >= 1"), 20);
    let storage = browser.eval(&tab, "[sessionStorage.getItem('radix-serve.key'), localStorage.length]");
    assert_eq!(storage, json!([KEY, 0]));
    page_shows_the_api_numbers(&mut browser, &tab, server, data);
    let html = browser.eval(&tab, "document.documentElement.outerHTML").as_str().unwrap().to_owned();
    assert!(!html.contains(SECRET) && !html.contains("Today's date"), "prompt text on the page without the admin key");

    let png = browser.screenshot(&tab, 1000);
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of {} bytes", png.len());
    let path = std::env::var_os("RADIX_UI_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| scratch.join("cache-page.png"));
    std::fs::write(&path, &png).unwrap();
    println!("screenshot of the cache page: {} ({} KiB)", path.display(), png.len() / 1024);

    // A phone's width: one column, nothing scrolls sideways.
    browser.call(
        Some(&tab),
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": true}),
    );
    browser.wait_for(&tab, "document.documentElement.scrollWidth <= window.innerWidth", 5);
    browser.call(Some(&tab), "Emulation.clearDeviceMetricsOverride", json!({}));

    // The admin key, given through the page's key form, shows prompt text.
    browser.eval(&tab, "document.getElementById('key-button').click(); true");
    enter_key(&mut browser, &tab, ADMIN);
    browser.wait_for(&tab, &format!("document.documentElement.outerHTML.includes('{SECRET}')"), 20);
    browser.wait_for(&tab, "document.getElementById('model').textContent.includes('admin view')", 5);

    // Under a path prefix (a reverse proxy): the page's relative URLs reach the API there.
    // Another origin (the proxy's port), so another session storage: the key is asked again.
    let proxied = session::prefix_proxy(&server.base, "worker-0");
    browser.navigate(&tab, &proxied);
    enter_key(&mut browser, &tab, KEY);
    browser.wait_for(&tab, &format!("{POLLS} >= 1"), 20);
    let rows = browser.eval(&tab, "document.querySelectorAll('#request-list .req').length");
    assert_eq!(rows.as_u64(), data["requests"].as_array().map(|r| r.len() as u64));

    // A foreign Host (a DNS-rebinding page's name) gets the API's 403, in the browser too.
    let port = server.base.rsplit(':').next().unwrap();
    browser.navigate(&tab, &format!("http://evil.example:{port}/"));
    let body = browser.eval(&tab, "document.body.textContent");
    assert!(body.as_str().is_some_and(|b| b.contains("is not this server's")), "{body}");

    browser.pump();
    let problems: Vec<&Json> = browser
        .events
        .iter()
        .filter(|e| {
            e["method"] == "Runtime.exceptionThrown"
                || (e["method"] == "Log.entryAdded"
                    && matches!(e["params"]["entry"]["source"].as_str(), Some("security" | "javascript")))
        })
        .collect();
    assert!(problems.is_empty(), "script errors or CSP violations: {problems:?}");
}

#[test]
fn cache_page_shows_what_the_api_reports() {
    let started = std::time::Instant::now();
    let server = Server::start(&["--api-key", KEY, "--admin-api-key", ADMIN]);
    page_is_served_like_the_api(&server);
    let sent = session::run(&server.base, KEY);
    server_idle(&server);
    let data = requests_match_the_api(&server, &sent);
    println!("API part: {:.1} s", started.elapsed().as_secs_f64());
    browser_part(&server, &data);
    println!("ui_page: {:.1} s in all", started.elapsed().as_secs_f64());
}

/// Waits until nothing runs (a reply is sent before its sequence leaves the engine).
fn server_idle(server: &Server) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, health) = get(server, "/health", None);
        if health["engine"]["running"] == 0 && health["engine"]["waiting"] == 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the engine never went idle: {health}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
