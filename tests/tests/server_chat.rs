//! End-to-end: the real `radix-serve` binary serving SmolLM2 over HTTP: the OpenAI streaming
//! format, prefix-cache reuse across agent turns and interleaved sessions, concurrency, client
//! disconnects, and "the cache never changes the answer".

mod common;

use std::io::{BufRead, BufReader};
use std::sync::Mutex;

use common::{Server, chat, filler};
use serde_json::{Value as Json, json};

/// The machine has two cores: one server at a time.
static ONE_SERVER: Mutex<()> = Mutex::new(());

fn tools() -> Json {
    let tool = |name: &str, what: &str| {
        json!({"type": "function", "function": {"name": name, "description": what,
            "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "file path"}},
                           "required": ["path"]}}})
    };
    json!([
        tool("read_file", "Read a file of the repository."),
        tool("list_dir", "List a directory."),
        tool("run_tests", "Run the test suite and report failures.")
    ])
}

fn content(response: &Json) -> String {
    response["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned()
}

fn cached(response: &Json) -> u64 {
    response["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens is always present")
}

fn check_streaming_format(server: &Server) {
    let mut body = chat(json!([{"role": "user", "content": "Name three colours."}]), 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let data = server.stream(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "the stream ends with [DONE]");
    let chunks: Vec<Json> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert!(chunks.len() >= 4, "role, content, finish and usage chunks: {chunks:?}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c["id"].as_str().unwrap().starts_with("chatcmpl-"));
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]), "the usage chunk has no choices");
    let usage = &usage_chunk["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
    let finish = &chunks[chunks.len() - 2]["choices"][0];
    assert!(finish["finish_reason"] == "stop" || finish["finish_reason"] == "length", "{finish}");
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert!(!text.is_empty());
    assert!(usage["completion_tokens"].as_u64().unwrap() >= 1);
    // Without include_usage there is no usage chunk.
    body["stream_options"] = json!({"include_usage": false});
    let data = server.stream(&body);
    assert!(data[..data.len() - 1].iter().all(|d| !d.contains("\"usage\"")));
}

/// An agent session: a long system prompt and tools, then turns that append the model's reply
/// and a tool result. Every turn's cached tokens cover the previous prompt and reply.
fn check_agent_session(server: &Server, system: &str, question: &str, turns: usize) -> Vec<(u64, u64, u64)> {
    let mut messages = vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": question})];
    let mut seen = Vec::new();
    for turn in 0..turns {
        let mut body = chat(json!(messages), 16);
        body["tools"] = tools();
        let (status, response) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{response}");
        let prompt = response["usage"]["prompt_tokens"].as_u64().unwrap();
        let completion = response["usage"]["completion_tokens"].as_u64().unwrap();
        seen.push((prompt, completion, cached(&response)));
        // The assistant turn is the model's own reply followed by a tool call, as an agent
        // appends it; the reply's tokens are what the cache holds from the previous request.
        let call_id = format!("call_{turn}");
        let arguments = format!("{{\"path\": \"src/file{turn}.rs\"}}");
        messages.push(json!({"role": "assistant", "content": content(&response), "tool_calls": [{
            "id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": filler(turn as u64, 40)}));
    }
    seen
}

fn assert_turns_reuse_cache(label: &str, turns: &[(u64, u64, u64)]) {
    for pair in turns.windows(2) {
        let ((prompt, completion, _), (_, _, cached_next)) = (pair[0], pair[1]);
        assert!(
            cached_next + 1 >= prompt + completion,
            "{label}: a turn reused {cached_next} tokens, less than the previous prompt {prompt} + reply {completion} - 1 \
             ({turns:?})"
        );
    }
}

/// Slow (~1 min on a quiet 2-core machine, up to 5 on a busy one): it prefills agent-sized prompts
/// (a 2,200-token system prompt in three sessions) and then 100 requests for the "cache never
/// changes the answer" check, half of them cold by design. One server serves every check.
#[test]
fn chat_api_end_to_end() {
    let _one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(&[]);

    check_streaming_format(&server);

    let models = server.get("/v1/models");
    assert_eq!(models["data"][0]["context_length"], 8192);

    // Bad input: clear 400s, and the server stays healthy.
    let (status, body) = server.post("/v1/chat/completions", &json!({"messages": "hi"}));
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let (status, body) =
        server.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "temperature": 9}));
    assert_eq!((status, body["error"]["message"].as_str().unwrap().contains("temperature")), (400, true));
    let huge = filler(1, 9000);
    let (status, body) = server.post("/v1/chat/completions", &chat(json!([{"role": "user", "content": huge}]), 4));
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("maximum context length is 8192 tokens"), "{body}");

    // An agent session whose system prompt is over 2,000 tokens.
    let system = format!("You are a coding agent.\n{}", filler(7, 2200));
    let session = check_agent_session(&server, &system, "List the files in src.", 3);
    assert!(session[0].0 >= 2000, "the system prompt is agent-sized: {session:?}");
    assert_turns_reuse_cache("agent session", &session);

    // Two sessions sharing the system prompt, interleaved: each keeps its history.
    let mut sessions: Vec<Vec<Json>> = ["Why do tests fail?", "Where is the cache?"]
        .iter()
        .map(|q| vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": q})])
        .collect();
    let mut history: Vec<Vec<(u64, u64, u64)>> = vec![Vec::new(), Vec::new()];
    for _round in 0..2 {
        for (s, messages) in sessions.iter_mut().enumerate() {
            let (status, response) = server.post("/v1/chat/completions", &chat(json!(messages), 12));
            assert_eq!(status, 200);
            history[s].push((
                response["usage"]["prompt_tokens"].as_u64().unwrap(),
                response["usage"]["completion_tokens"].as_u64().unwrap(),
                cached(&response),
            ));
            messages.push(json!({"role": "assistant", "content": content(&response)}));
            messages.push(json!({"role": "user", "content": "Go on."}));
        }
    }
    assert_turns_reuse_cache("session A", &history[0]);
    assert_turns_reuse_cache("session B", &history[1]);
    assert!(history[1][0].2 >= 2000, "session B's first turn reuses the shared system prompt: {history:?}");

    // Eight concurrent streaming requests all complete.
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let server = &server;
                scope.spawn(move || {
                    let mut body = chat(json!([{"role": "user", "content": format!("Count to {}.", i + 2)}]), 10);
                    body["stream"] = json!(true);
                    server.stream(&body)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().last().map(String::as_str), Some("[DONE]"));
        }
    });
    server.wait_idle();

    // A client that disconnects mid-stream leaves no running sequence and no leaked pages.
    let mut body = chat(json!([{"role": "user", "content": "Write a long story about a server."}]), 2000);
    body["stream"] = json!(true);
    let response = ureq::post(&format!("{}/v1/chat/completions", server.base)).send_json(&body).unwrap();
    let mut reader = BufReader::new(response.into_reader());
    let mut line = String::new();
    let mut data_lines = 0;
    while data_lines < 4 {
        line.clear();
        reader.read_line(&mut line).unwrap();
        data_lines += usize::from(line.starts_with("data: "));
    }
    drop(reader);
    server.wait_idle();

    // The cache never changes the answer: 50 prefix-sharing greedy requests, cached and not.
    let shared = format!("Answer briefly.\n{}", filler(3, 120));
    for i in 0..50 {
        let messages = json!([{"role": "system", "content": shared}, {"role": "user", "content": format!("Question {i}: what is {i} plus {i}?")}]);
        let mut cold = chat(messages.clone(), 6);
        cold["cache_prompt"] = json!(false);
        let (_, with_cache) = server.post("/v1/chat/completions", &chat(messages, 6));
        let (_, without) = server.post("/v1/chat/completions", &cold);
        assert_eq!(content(&with_cache), content(&without), "request {i} differs with the cache on");
        assert_eq!(cached(&without), 0);
        if i > 0 {
            assert!(cached(&with_cache) > 100, "request {i} should reuse the shared prefix");
        }
    }
    server.wait_idle();
}

#[test]
fn split_system_prompt_is_accepted_by_a_template_that_raises_on_later_system_messages() {
    let _one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let template = common::workspace_root().join("templates/tests/fixtures/templates/strict_system.jinja");
    let server = Server::start(&["--chat-template-file", template.to_str().unwrap()]);
    let messages = json!([
        {"role": "system", "content": "You are a coding agent."},
        {"role": "system", "content": "Working directory: /srv/app"},
        {"role": "user", "content": "Hello"}
    ]);
    let (status, response) = server.post("/v1/chat/completions", &chat(messages, 4));
    assert_eq!(status, 200, "{response}");
    assert!(response["usage"]["prompt_tokens"].as_u64().unwrap() > 10);
}
