//! End-to-end fuzzing of every route of the real binary on SmolLM2: a seeded, reproducible
//! generator throws random JSON, valid bodies with one field broken, and malformed bytes at
//! every POST endpoint, and junk query strings and wrong methods at the GET ones. Whatever comes
//! in, the server must answer with a status below 500 (503 only as the documented queue-full
//! refusal), a JSON error object for every 4xx (Anthropic's shape on Anthropic routes), stay
//! healthy, and end idle with no KV page leaked.
//!
//! Reproduce a run with `FUZZ_SEED=<seed> FUZZ_CASES=<n>`; every failure names its case index.

// The generator lives beside this file, named after it; a test target root resolves modules
// from its own directory, hence the path.
#[path = "fuzz_endpoints/cases.rs"]
mod cases;
mod common;

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use cases::{ENDPOINTS, Rng, cap_generation, generate, valid_body};
use common::{Server, filler};
use serde_json::{Value as Json, json};

/// Every request must be answered within this; a slower one counts as a hang.
const TIMEOUT: Duration = Duration::from_secs(60);

/// What came back.
struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

fn send(base: &str, method: &str, path: &str, content_type: &str, body: &[u8]) -> Result<Reply, String> {
    let request = ureq::request(method, &format!("{base}{path}")).timeout(TIMEOUT);
    let result =
        if method == "GET" { request.call() } else { request.set("Content-Type", content_type).send_bytes(body) };
    let response = match result {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(format!("{method} {path}: no answer: {e}")),
    };
    let status = response.status();
    let content_type = response.header("content-type").unwrap_or_default().to_owned();
    let mut bytes = Vec::new();
    response.into_reader().read_to_end(&mut bytes).map_err(|e| format!("{method} {path}: reading the body: {e}"))?;
    Ok(Reply { status, content_type, body: String::from_utf8_lossy(&bytes).into_owned() })
}

/// The checks every answer must pass: no 5xx but a queue-full 503, a JSON error for 4xx in the
/// route's API shape, a parseable 200, and streams that end without a server error.
fn check(path: &str, reply: &Reply) -> Result<(), String> {
    let anthropic = path.starts_with("/v1/messages");
    let json: Option<Json> = serde_json::from_str(&reply.body).ok();
    let error_ok = |j: &Json| {
        let message = j["error"]["message"].as_str().unwrap_or_default();
        !message.is_empty() && j["error"]["type"].is_string() && (!anthropic || j["type"] == "error")
    };
    match reply.status {
        // A full queue: OpenAI's shape carries our code, Anthropic's its overloaded type.
        503 if json.as_ref().is_some_and(|j| {
            j["error"]["code"] == "server_busy" || (anthropic && j["error"]["type"] == "overloaded_error")
        }) =>
        {
            Ok(())
        }
        500.. => Err(format!("server error {}", reply.status)),
        400..=499 if json.as_ref().is_some_and(error_ok) => Ok(()),
        400..=499 => Err(format!("{} without a proper error object", reply.status)),
        200 if reply.content_type.starts_with("text/event-stream") => {
            let bad = ["\"server_error\"", "\"api_error\""].iter().any(|t| reply.body.contains(t));
            if bad { Err("the stream carries a server error".into()) } else { Ok(()) }
        }
        200 if json.is_some() || path == "/metrics" => Ok(()),
        s => Err(format!("unexpected status {s} or a body that is not JSON")),
    }
}

fn short(text: &str) -> String {
    text.chars().take(400).collect()
}

fn health(server: &Server) -> Result<(), String> {
    let reply = send(&server.base, "GET", "/health", "", &[])?;
    match serde_json::from_str::<Json>(&reply.body) {
        Ok(j) if reply.status == 200 && j["status"] == "ok" => Ok(()),
        _ => Err(format!("/health answered {}: {}", reply.status, short(&reply.body))),
    }
}

/// An unbounded generation, streamed: read the first event and hang up, so the engine must
/// abort it and give its pages back.
fn hang_up(server: &Server, path: &str, body: &Json) -> Result<(), String> {
    let response = ureq::post(&format!("{}{path}", server.base)).timeout(TIMEOUT).send_json(body);
    match response {
        Ok(r) => {
            let mut line = String::new();
            BufReader::new(r.into_reader()).read_line(&mut line).map_err(|e| format!("{path}: {e}"))?;
            Ok(())
        }
        Err(ureq::Error::Status(code, r)) => {
            let reply = Reply { status: code, content_type: String::new(), body: r.into_string().unwrap_or_default() };
            check(path, &reply)
        }
        Err(e) => Err(format!("{path}: no answer: {e}")),
    }
}

/// Two 10 MB chat requests are read, parsed and rendered (then refused before tokenizing: they
/// could not fit the context), and two of 0.9 MB are tokenized too (then refused: past the
/// context), while `/health` is polled: preparation runs off the async workers, so `/health`
/// keeps answering at once. It used to wait 16 s behind them.
fn health_answers_while_large_requests_are_prepared(server: &Server) -> Result<(), String> {
    let bodies = [chat_body(&filler(77, 1_700_000)), chat_body(&filler(78, 150_000))];
    let (replies, mut latencies) = std::thread::scope(|scope| {
        let posts: Vec<_> = bodies
            .iter()
            .chain(&bodies)
            .map(|body| scope.spawn(|| send(&server.base, "POST", "/v1/chat/completions", "application/json", body)))
            .collect();
        let mut latencies = Vec::new();
        while !posts.iter().all(|p| p.is_finished()) {
            let asked = std::time::Instant::now();
            let answered = health(server);
            latencies.push(asked.elapsed());
            if answered.is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (posts.into_iter().map(|p| p.join().expect("a posting thread panicked")).collect::<Vec<_>>(), latencies)
    });
    for reply in replies {
        let reply = reply?;
        if reply.status != 400 {
            return Err(format!("a large prompt past the context: {} {}", reply.status, short(&reply.body)));
        }
    }
    latencies.sort();
    let (median, slowest) = (latencies[latencies.len() / 2], latencies[latencies.len() - 1]);
    eprintln!(
        "/health while two 10 MB and two 0.9 MB requests were prepared: {} answers, median {median:?}, slowest {slowest:?}",
        latencies.len()
    );
    // Before, every answer waited behind the preparation (16 s).
    if slowest > Duration::from_millis(100) {
        return Err(format!(
            "/health took {median:?} (median), {slowest:?} (slowest) while large requests were prepared"
        ));
    }
    Ok(())
}

/// The requests that used to cost gigabytes (a 16.5 MB `/tokenize` took 3.2 GB, 28.5 MB with
/// pieces 13 GB) are refused before the work or bounded by the limits, and the server's peak
/// memory stays within a fixed bound above the model's.
fn hostile_sizes_cost_bounded_memory(server: &Server) -> Result<(), String> {
    let before = server.peak_memory_mib();
    let tokenize = |content: &str, pieces: bool| {
        let body = serde_json::to_vec(&json!({"content": content, "with_pieces": pieces})).unwrap();
        send(&server.base, "POST", "/tokenize", "application/json", &body)
    };
    let huge = filler(5, 4_500_000);
    let allowed = &huge[..1 << 20];
    let allowed = &allowed[..allowed.rfind(' ').unwrap_or(0)];
    for (what, reply, status) in [
        ("a 25 MB /tokenize", tokenize(&huge[..25 << 20], false)?, 400),
        ("a 25 MB /tokenize with pieces", tokenize(&huge[..25 << 20], true)?, 400),
        ("a 1 MiB /tokenize with pieces", tokenize(allowed, true)?, 200),
        ("a 1 MiB /tokenize", tokenize(allowed, false)?, 200),
        (
            "a 25 MB chat message",
            send(&server.base, "POST", "/v1/chat/completions", "application/json", &chat_body(&huge[..25 << 20]))?,
            400,
        ),
    ] {
        if reply.status != status {
            return Err(format!("{what}: {} {}", reply.status, short(&reply.body)));
        }
    }
    let after = server.peak_memory_mib();
    eprintln!("peak memory: {before} MiB before the hostile sizes, {after} MiB after");
    if after > before + 1536 {
        return Err(format!("hostile sizes raised peak memory from {before} MiB to {after} MiB"));
    }
    Ok(())
}

fn chat_body(content: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"messages": [{"role": "user", "content": content}], "max_tokens": 1})).unwrap()
}

#[test]
fn every_endpoint_survives_fuzzing() {
    let seed = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_u64);
    let cases = std::env::var("FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(600_usize);
    eprintln!("fuzzing with FUZZ_SEED={seed} FUZZ_CASES={cases}");
    let server = Server::start(&["-c", "1024"]);
    let mut failures = Vec::new();

    // The fixed bodies are what the fuzzer mutates: they must work, or it fuzzes only errors.
    // And errors must be reported: these are wrong for sure and must get a checked 400.
    for &(path, kind) in ENDPOINTS {
        let mut body = valid_body(kind);
        cap_generation(kind, &mut body);
        let reply = send(&server.base, "POST", path, "application/json", &serde_json::to_vec(&body).unwrap());
        match reply {
            Ok(r) if r.status == 200 && check(path, &r).is_ok() => {}
            Ok(r) => failures.push(format!("valid body to {path} got {}: {}", r.status, short(&r.body))),
            Err(e) => failures.push(e),
        }
    }
    let refused = [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})),
        ("/v1/chat/completions", json!({"messages": [{"role": "wizard", "content": "x"}], "max_tokens": 1})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "n": 5})),
        ("/v1/completions", json!({"prompt": [999_999_999], "max_tokens": 1})),
        ("/completion", json!({"prompt": [[1, 2], [3]], "n_predict": 1})),
        ("/tokenize", json!({"content": 5})),
        ("/detokenize", json!({"tokens": [-1]})),
        ("/v1/messages", json!({"messages": [{"role": "user", "content": "x"}]})),
        ("/v1/messages/count_tokens", json!({"messages": []})),
        ("/v1/completions", json!({"prompt": filler(3, 3000), "max_tokens": 1})),
    ];
    for (path, body) in &refused {
        match send(&server.base, "POST", path, "application/json", &serde_json::to_vec(body).unwrap()) {
            Ok(r) if r.status == 400 && check(path, &r).is_ok() => {}
            Ok(r) => {
                failures.push(format!("{path} {body}: expected a 400 error, got {}: {}", r.status, short(&r.body)))
            }
            Err(e) => failures.push(e),
        }
    }

    let mut rng = Rng(seed);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..cases {
        let case = generate(&mut rng);
        match send(&server.base, "POST", case.path, case.content_type, &case.body) {
            Ok(reply) => {
                *statuses.entry(reply.status).or_default() += 1;
                if let Err(e) = check(case.path, &reply) {
                    failures.push(format!(
                        "case {i} (FUZZ_SEED={seed}) {:?} POST {} [{}] {}\n  -> {e}: {}",
                        case.kind,
                        case.path,
                        case.content_type,
                        short(&String::from_utf8_lossy(&case.body)),
                        short(&reply.body)
                    ));
                }
            }
            Err(e) => failures.push(format!("case {i} (FUZZ_SEED={seed}): {e}")),
        }
        if i % 20 == 19
            && let Err(e) = health(&server)
        {
            failures.push(format!("after case {i} (FUZZ_SEED={seed}): {e}"));
            break;
        }
    }
    eprintln!("statuses: {statuses:?}");
    assert!(statuses.keys().any(|s| (400..500).contains(s)), "the fuzzer never produced an error: {statuses:?}");
    assert!(statuses.contains_key(&200), "the fuzzer never produced a success: {statuses:?}");

    // GET routes with junk queries, wrong methods and unknown routes; while the engine is idle,
    // so `/slots?fail_on_no_slot=1` has a free slot.
    let junk = ["?", "?a=1&&&b", "?fail_on_no_slot=1", "?fail_on_no_slot=%FF%FE", "?%", "?x=%00%zz", "?a[]=1&a[b]=2"];
    let long = format!("?x={}", "a".repeat(5000));
    for get in [
        "/health",
        "/v1/models",
        "/props",
        "/slots",
        "/metrics",
        "/v1/cache",
        "/server_info",
        "/model_info",
        "/get_load",
    ] {
        for query in junk.iter().copied().chain([long.as_str()]) {
            match send(&server.base, "GET", &format!("{get}{query}"), "", &[]) {
                Ok(r) if r.status == 200 && check(get, &r).is_ok() => {}
                Ok(r) => failures.push(format!("GET {get}{query}: {} {}", r.status, short(&r.body))),
                Err(e) => failures.push(e),
            }
        }
    }
    let wrong = [
        ("GET", "/v1/chat/completions"),
        ("GET", "/tokenize"),
        ("POST", "/health"),
        ("PUT", "/v1/models"),
        ("GET", "/v1/messages"),
        ("GET", "/flush_cache"),
    ];
    for (method, path) in wrong.into_iter().chain([("GET", "/nope"), ("POST", "/v1/nope")]) {
        match send(&server.base, method, path, "application/json", b"{}") {
            Ok(r) if (400..500).contains(&r.status) && check(path, &r).is_ok() => {}
            Ok(r) => failures.push(format!("{method} {path}: {} {}", r.status, short(&r.body))),
            Err(e) => failures.push(e),
        }
    }

    // Limits that are valid but unbounded: the client hangs up after the first event.
    let user = json!([{"role": "user", "content": "Count to a million."}]);
    let unbounded = [
        ("/v1/chat/completions", json!({"messages": user, "max_tokens": 1e30, "stream": true})),
        ("/v1/chat/completions", json!({"messages": user, "max_completion_tokens": u64::MAX, "stream": true})),
        ("/v1/chat/completions", json!({"messages": user, "stream": true, "temperature": 1e9})),
        ("/v1/completions", json!({"prompt": "1, 2, 3,", "max_tokens": i64::MAX, "stream": true})),
        ("/completion", json!({"prompt": "1, 2, 3,", "n_predict": -1, "stream": true})),
        ("/completion", json!({"prompt": "1, 2, 3,", "n_predict": i64::MAX, "stream": true})),
        ("/v1/messages", json!({"messages": user, "max_tokens": u64::MAX, "stream": true})),
    ];
    // All at once, twice over: more than --parallel, so some hang up while still waiting.
    let hung: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let server = &server;
        let threads: Vec<_> = (unbounded.iter().chain(&unbounded))
            .map(|(path, body)| {
                scope.spawn(move || hang_up(server, path, body).map_err(|e| format!("{path} {body}: {e}")))
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a hang-up thread panicked")).collect()
    });
    failures.extend(hung.into_iter().filter_map(Result::err));
    if let Err(e) = hostile_sizes_cost_bounded_memory(&server) {
        failures.push(e);
    }
    if let Err(e) = health_answers_while_large_requests_are_prepared(&server) {
        failures.push(e);
    }

    if let Err(e) = health(&server) {
        failures.push(format!("at the end: {e}"));
    }
    assert!(failures.is_empty(), "{} failures (FUZZ_SEED={seed}):\n{}", failures.len(), failures.join("\n"));
    // wait_idle asserts running == 0, waiting == 0 and pages_free + pages_cached == pages_total;
    // with nothing running no page is private to a sequence, so any gap is a leaked page.
    let engine = server.wait_idle();
    eprintln!("idle after fuzzing: {engine}");
}
