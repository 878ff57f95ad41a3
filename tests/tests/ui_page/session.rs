//! The traffic the cache page is shown: two OpenCode-like agent sessions (our own system prompt
//! with an `<env>` block, tool schemas, tool calls and their results, turn after turn), and a
//! reverse proxy that serves the server under a path prefix.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use serde_json::{Value as Json, json};

use crate::common::filler;

/// A phrase only the second session's prompt holds: no page without the admin key may show it.
pub const SECRET: &str = "zebra-quartz-4417";

/// One answered request: which session, and what the API said about its prompt.
#[derive(Debug, Clone)]
pub struct Sent {
    pub session: &'static str,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The request's messages and tools (for `/apply-template`).
    pub body: Json,
    /// `cache_report.prompt_parts`, where the request asked for the report.
    pub parts: Option<Json>,
}

fn tools() -> Json {
    let tool = |name: &str, description: &str, properties: Json, required: &[&str]| {
        json!({"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}})
    };
    json!([
        tool(
            "read",
            "Reads a file from the local filesystem.",
            json!({"filePath": {"type": "string"},
            "offset": {"type": "number"}, "limit": {"type": "number"}}),
            &["filePath"]
        ),
        tool(
            "grep",
            "Searches file contents with a regular expression.",
            json!({"pattern": {"type": "string"},
            "path": {"type": "string"}, "include": {"type": "string"}}),
            &["pattern"]
        ),
        tool(
            "edit",
            "Replaces text in a file.",
            json!({"filePath": {"type": "string"},
            "oldString": {"type": "string"}, "newString": {"type": "string"}}),
            &["filePath", "oldString", "newString"]
        ),
        tool(
            "bash",
            "Runs a shell command.",
            json!({"command": {"type": "string"},
            "description": {"type": "string"}}),
            &["command"]
        ),
    ])
}

fn system(date: &str) -> Json {
    let text = format!(
        "You are an interactive coding agent working in the user's repository. {}\n<env>\n  Working directory: \
         /home/dev/radix-serve\n  Is directory a git repo: yes\n  Platform: linux\n  Today's date: {date}\n</env>",
        filler(11, 140)
    );
    json!({"role": "system", "content": text})
}

fn call(id: &str, name: &str, arguments: Json) -> Json {
    json!({"role": "assistant", "content": "", "tool_calls": [{"id": id, "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()}}]})
}

fn result(id: &str, seed: u64, words: usize) -> Json {
    json!({"role": "tool", "tool_call_id": id, "content": filler(seed, words)})
}

/// Sends one greedy chat request for `session` with `key`, optionally streamed or asking for
/// the cache report; returns what the API said.
fn send(base: &str, key: &str, session: &'static str, mut body: Json, stream: bool, report: bool) -> Sent {
    body["temperature"] = json!(0);
    body["max_tokens"] = json!(4);
    if report {
        body["cache_report"] = json!(true);
    }
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let response = ureq::post(&format!("{base}/v1/chat/completions"))
        .set("Authorization", &format!("Bearer {key}"))
        .set("x-session-affinity", session)
        .timeout(Duration::from_secs(600))
        .send_json(&body)
        .expect("the chat request is answered");
    let answer: Json = if stream {
        // The usage and the report come on the last chunks; gather them into one object.
        let mut last = json!({});
        for line in BufReader::new(response.into_reader()).lines().map_while(Result::ok) {
            let Some(chunk) = line.strip_prefix("data: ").and_then(|d| serde_json::from_str::<Json>(d).ok()) else {
                continue;
            };
            for field in ["usage", "cache_report"] {
                if chunk[field].is_object() {
                    last[field] = chunk[field].clone();
                }
            }
        }
        last
    } else {
        response.into_json().unwrap()
    };
    let usage = &answer["usage"];
    Sent {
        session,
        prompt_tokens: usage["prompt_tokens"].as_u64().expect("usage.prompt_tokens"),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens"),
        body: json!({"messages": body["messages"], "tools": body["tools"]}),
        parts: report.then(|| answer["cache_report"]["prompt_parts"].clone()),
    }
}

/// Two agent sessions, as OpenCode sends them: session A's four turns (a grep, a read, an
/// answer, a follow-up question streamed with the cache report), then session B (a subagent of
/// another tenant on another day, so its system prompt differs at the date; its question holds
/// [`SECRET`]). Returns every request in the order sent.
pub fn run(base: &str, key: &str) -> Vec<Sent> {
    let mut sent = Vec::new();
    let mut a = vec![system("Mon Dec 01 2026"), json!({"role": "user", "content": "Where is the cache flushed?"})];
    let body = |messages: &Vec<Json>| json!({"model": "m", "messages": messages, "tools": tools()});
    sent.push(send(base, key, "ses-a", body(&a), false, false));
    a.push(call("call_1", "grep", json!({"pattern": "flush_cache", "path": "server/src"})));
    a.push(result("call_1", 21, 60));
    sent.push(send(base, key, "ses-a", body(&a), false, false));
    a.push(call("call_2", "read", json!({"filePath": "server/src/api/router_compat.rs"})));
    a.push(result("call_2", 22, 100));
    sent.push(send(base, key, "ses-a", body(&a), false, false));
    a.push(json!({"role": "assistant", "content": "It is flushed by POST /flush_cache once nothing runs."}));
    a.push(json!({"role": "user", "content": "Add a test for it."}));
    sent.push(send(base, key, "ses-a", body(&a), true, true));
    let b = vec![
        system("Tue Dec 02 2026"),
        json!({"role": "user", "content": format!("Explore the tests; the ticket is {SECRET}.")}),
    ];
    let mut subagent = body(&b);
    subagent["user"] = json!("explore-subagent");
    sent.push(send(base, key, "ses-b", subagent, false, false));
    sent
}

/// Serves `target` (`http://127.0.0.1:PORT`) under `/PREFIX/` on a port of its own, one request
/// per connection, as a reverse proxy mounting a worker at a path would. Returns its base URL
/// with the prefix and a trailing slash.
pub fn prefix_proxy(target: &str, prefix: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = target.trim_start_matches("http://").to_owned();
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let upstream = upstream.clone();
            std::thread::spawn(move || forward(client, &upstream, prefix));
        }
    });
    format!("http://127.0.0.1:{port}/{prefix}/")
}

fn forward(client: TcpStream, upstream: &str, prefix: &str) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" {
            break;
        }
        head.push(line);
    }
    let mut words = head[0].splitn(3, ' ');
    let (method, path, version) = (words.next().unwrap(), words.next().unwrap(), words.next().unwrap());
    let mut client = client;
    let Some(rest) = path.strip_prefix(&format!("/{prefix}")) else {
        let _ = client.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let rest = if rest.is_empty() { "/" } else { rest };
    let mut request = format!("{method} {rest} {version}");
    for line in &head[1..] {
        let name = line.split(':').next().unwrap_or_default().to_ascii_lowercase();
        if name != "connection" && name != "host" {
            request.push_str(line);
        }
    }
    request.push_str(&format!("Host: {upstream}\r\nConnection: close\r\n\r\n"));
    let Ok(mut server) = TcpStream::connect(upstream) else { return };
    if server.write_all(request.as_bytes()).is_err() {
        return;
    }
    let mut response = Vec::new();
    let _ = server.read_to_end(&mut response);
    let _ = client.write_all(&response);
}
