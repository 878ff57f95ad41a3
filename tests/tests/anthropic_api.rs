//! End-to-end: the Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) of the
//! real binary on SmolLM2: the response and SSE event shapes, streaming equals non-streaming at
//! temperature 0, prefix-cache usage across turns, the same conversation through the OpenAI
//! API renders the same prompt, tool_use/tool_result turns, stop sequences, and errors in
//! Anthropic's shape.

mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::{Server, filler};
use serde_json::{Value as Json, json};

fn message(messages: Json, max_tokens: usize) -> Json {
    json!({"model": "smollm2", "max_tokens": max_tokens, "temperature": 0, "messages": messages,
           "metadata": {"user_id": "e2e"}, "some_future_field": {"ignored": true}})
}

fn text_of(response: &Json) -> String {
    let blocks = response["content"].as_array().expect("content is an array");
    blocks.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect()
}

fn usage(response: &Json, name: &str) -> u64 {
    response["usage"][name].as_u64().unwrap_or_else(|| panic!("usage.{name} is a number: {response}"))
}

fn count_tokens(server: &Server, body: &Json) -> u64 {
    let (status, response) = server.post("/v1/messages/count_tokens", body);
    assert_eq!(status, 200, "{response}");
    response["input_tokens"].as_u64().expect("input_tokens is a number")
}

/// Streams a Messages request and returns every `(event, data)` pair in order.
fn stream(server: &Server, body: &Json) -> Vec<(String, Json)> {
    let response = ureq::post(&format!("{}/v1/messages", server.base))
        .timeout(Duration::from_secs(600))
        .send_json(body)
        .expect("streaming request accepted");
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let mut events = Vec::new();
    let mut name = None;
    for line in BufReader::new(response.into_reader()).lines().map_while(Result::ok) {
        if let Some(event) = line.strip_prefix("event: ") {
            name = Some(event.to_owned());
        } else if let Some(data) = line.strip_prefix("data: ") {
            let event = name.take().expect("every data line has an event name");
            events.push((event, serde_json::from_str(data).expect("data is JSON")));
        }
    }
    events
}

/// The non-streamed reply: shape, usage that adds up to the prompt, stop reason.
fn check_message(server: &Server, body: &Json) -> Json {
    let (status, response) = server.post("/v1/messages", body);
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["type"], "message");
    assert_eq!(response["role"], "assistant");
    assert!(response["id"].as_str().unwrap().starts_with("msg_"), "{response}");
    assert!(response["model"].is_string());
    assert!(!text_of(&response).is_empty(), "a text block: {response}");
    let reason = response["stop_reason"].as_str().unwrap();
    assert!(reason == "end_turn" || reason == "max_tokens", "{response}");
    assert!(response["stop_sequence"].is_null());
    let output = usage(&response, "output_tokens");
    assert!(output >= 1 && output <= body["max_tokens"].as_u64().unwrap());
    assert_eq!(reason == "max_tokens", output == body["max_tokens"].as_u64().unwrap(), "{response}");
    assert_eq!(usage(&response, "cache_creation_input_tokens"), 0);
    let prompt = usage(&response, "input_tokens") + usage(&response, "cache_read_input_tokens");
    assert_eq!(prompt, count_tokens(server, body), "input + cache read = the whole prompt");
    response
}

/// Streaming: the documented event order, and deltas that concatenate to the non-streamed reply.
fn check_streaming(server: &Server, body: &Json, expected: &Json) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let events = stream(server, &body);
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "each data's type is its event name");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).filter(|n| *n != "ping").collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    let start = &events[0].1["message"];
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["content"], json!([]));
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert!(start["usage"]["input_tokens"].is_u64() && start["usage"]["cache_read_input_tokens"].is_u64());
    // Blocks: start, deltas of the same index, stop; indices count from 0.
    let mut open: Option<u64> = None;
    let mut next_index = 0;
    let mut text = String::new();
    for (name, data) in &events[1..events.len() - 2] {
        match name.as_str() {
            "ping" => {}
            "content_block_start" => {
                assert_eq!(open, None, "blocks do not nest");
                assert_eq!(data["index"], next_index);
                open = Some(next_index);
            }
            "content_block_delta" => {
                assert_eq!(Some(data["index"].as_u64().unwrap()), open, "a delta belongs to the open block");
                if data["delta"]["type"] == "text_delta" {
                    text.push_str(data["delta"]["text"].as_str().unwrap());
                }
            }
            "content_block_stop" => {
                assert_eq!(Some(data["index"].as_u64().unwrap()), open);
                open = None;
                next_index += 1;
            }
            other => panic!("unexpected event {other} between message_start and message_delta"),
        }
    }
    assert_eq!(open, None, "every block is closed before message_delta");
    assert_eq!(text, text_of(expected), "streamed deltas concatenate to the non-streamed text");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], expected["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], expected["usage"]["output_tokens"]);
}

/// A long system prompt as blocks with `cache_control`, then a second turn that extends the
/// first: its cached part covers the whole first prompt. The same conversation through the
/// OpenAI API has the same prompt, is a full cache hit, and gives the same greedy reply.
fn check_cache_across_turns(server: &Server) {
    let system = json!([
        {"type": "text", "text": "You are a careful coding agent."},
        {"type": "text", "text": filler(7, 300), "cache_control": {"type": "ephemeral"}}
    ]);
    let mut first = message(json!([{"role": "user", "content": "What should I do first?"}]), 12);
    first["system"] = system.clone();
    let first_prompt = count_tokens(server, &first);
    let (status, reply) = server.post("/v1/messages", &first);
    assert_eq!(status, 200, "{reply}");
    let mut second = message(
        json!([
            {"role": "user", "content": [{"type": "text", "text": "What should I do first?"}]},
            {"role": "assistant", "content": reply["content"].clone()},
            {"role": "user", "content": "And then?"}
        ]),
        12,
    );
    second["system"] = system;
    let (status, response) = server.post("/v1/messages", &second);
    assert_eq!(status, 200, "{response}");
    let cached = usage(&response, "cache_read_input_tokens");
    assert!(cached >= first_prompt, "the second turn reuses the first prompt: {cached} < {first_prompt}");
    let full = usage(&response, "input_tokens") + cached;
    assert_eq!(full, count_tokens(server, &second));
    assert!(usage(&response, "input_tokens") > 0, "the new turn is not cached yet");

    let openai = json!({"model": "smollm2", "temperature": 0, "max_tokens": 12, "messages": [
        {"role": "system", "content": format!("You are a careful coding agent.\n\n{}", filler(7, 300))},
        {"role": "user", "content": "What should I do first?"},
        {"role": "assistant", "content": text_of(&reply)},
        {"role": "user", "content": "And then?"}
    ]});
    let (status, chat) = server.post("/v1/chat/completions", &openai);
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["usage"]["prompt_tokens"].as_u64(), Some(full), "both APIs render the same prompt");
    let chat_cached = chat["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(chat_cached + 1 >= full, "the Anthropic turn's cache serves the OpenAI request: {chat_cached}/{full}");
    assert_eq!(chat["choices"][0]["message"]["content"].as_str(), Some(text_of(&response).as_str()));
}

/// Claude Code's first system block is billing metadata whose nonce changes with every request;
/// it is left out of the prompt, so two requests that differ only in it share their whole prompt.
fn check_billing_nonce(server: &Server) {
    let request = |nonce: &str| {
        let mut body = message(json!([{"role": "user", "content": "List the files in src/."}]), 2);
        body["system"] = json!([
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.3.f1e; cc_entrypoint=cli; cch={nonce};")},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": filler(11, 400), "cache_control": {"type": "ephemeral"}}
        ]);
        let (status, response) = server.post("/v1/messages", &body);
        assert_eq!(status, 200, "{response}");
        (usage(&response, "cache_read_input_tokens"), usage(&response, "input_tokens"))
    };
    request("a1b2c");
    let (cached, computed) = request("f9e8d");
    let ratio = cached as f64 / (cached + computed) as f64;
    assert!(ratio >= 0.95, "the second request is {:.1}% cached ({cached} of {})", ratio * 100.0, cached + computed);
    let log = server.log().join("\n");
    assert_eq!(log.matches("billing block").count(), 1, "logged once:\n{log}");
}

/// An assistant `tool_use` and the user's `tool_result` render into the prompt (it grows), the
/// same way the OpenAI API renders `tool_calls` and a `tool` message.
fn check_tool_round_trip(server: &Server) {
    let tools = json!([{"name": "read_file", "description": "Read a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]);
    let question = json!({"role": "user", "content": "Show me src/main.rs."});
    let call = json!({"role": "assistant", "content": [
        {"type": "text", "text": "Reading it."},
        {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "src/main.rs"}}]});
    let result = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "fn main() {}"}]},
        {"type": "text", "text": "Explain it."}]});
    let with = |messages: Json| {
        let mut body = message(messages, 8);
        body["tools"] = tools.clone();
        body["tool_choice"] = json!({"type": "auto"});
        body
    };
    let asked = count_tokens(server, &with(json!([question])));
    let called = count_tokens(server, &with(json!([question, call, {"role": "user", "content": "Go on."}])));
    let answered = count_tokens(server, &with(json!([question, call, result])));
    assert!(asked < called && called < answered, "{asked} {called} {answered}");
    let (status, response) = server.post("/v1/messages", &with(json!([question, call, result])));
    assert_eq!(status, 200, "{response}");
    assert_eq!(usage(&response, "input_tokens") + usage(&response, "cache_read_input_tokens"), answered);

    let openai = json!({"model": "smollm2", "max_tokens": 1, "messages": [
        {"role": "user", "content": "Show me src/main.rs."},
        {"role": "assistant", "content": "Reading it.", "tool_calls": [{"id": "toolu_01", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\": \"src/main.rs\"}"}}]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "fn main() {}"},
        {"role": "user", "content": "Explain it."}
    ], "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository.",
        "parameters": tools[0]["input_schema"].clone()}}]});
    let (status, chat) = server.post("/v1/chat/completions", &openai);
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["usage"]["prompt_tokens"].as_u64(), Some(answered), "both APIs render the same prompt");
}

/// A stop sequence taken from the model's own greedy reply ends the next reply just before it.
fn check_stop_sequence(server: &Server, body: &Json, expected: &Json) {
    let text = text_of(expected);
    let Some(word) = text.split_whitespace().nth(1).map(str::to_owned) else {
        panic!("the reply has at least two words: {text:?}");
    };
    let at = text.find(&word).unwrap();
    let mut body = body.clone();
    body["stop_sequences"] = json!(["\u{1}never-generated", word]);
    let (status, response) = server.post("/v1/messages", &body);
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["stop_reason"], "stop_sequence", "{response}");
    assert_eq!(response["stop_sequence"], json!(word));
    assert_eq!(text_of(&response).trim_end(), text[..at].trim_end());
}

/// Bad requests: HTTP 400 in Anthropic's error shape, on both routes; the server stays healthy.
fn check_errors(server: &Server) {
    let user = json!([{"role": "user", "content": "Hi"}]);
    let bad = [
        json!({"model": "m", "messages": user}),
        json!({"model": "m", "max_tokens": 0, "messages": user}),
        json!({"model": "m", "max_tokens": 4, "messages": "Hi"}),
        json!({"model": "m", "max_tokens": 4, "messages": []}),
        json!({"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "Hi"}]}),
        json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
        json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        json!({"model": "m", "max_tokens": 4, "temperature": "hot", "messages": user}),
        json!({"model": "m", "max_tokens": 4, "system": {"text": "x"}, "messages": user}),
        json!({"model": "m", "max_tokens": 4, "tool_choice": {"type": "sometimes"}, "messages": user}),
        json!({"model": "m", "max_tokens": 4, "tools": [{"description": "no name"}], "messages": user}),
        json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": "no id"}]}]}),
        json!({"model": "m", "max_tokens": 4, "messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": "not an object"}]}]}),
        json!({"model": "m", "max_tokens": 4, "stream": true, "messages": user, "stop_sequences": [1]}),
        json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": filler(3, 20_000)}]}),
    ];
    let check = |path: &str, status: u16, body: &Json, request: &str| {
        assert_eq!(status, 400, "{path} {request} -> {body}");
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(!body["error"]["message"].as_str().unwrap_or_default().is_empty(), "{body}");
    };
    for request in &bad {
        let (status, body) = server.post("/v1/messages", request);
        check("/v1/messages", status, &body, &request.to_string()[..80.min(request.to_string().len())]);
    }
    let (status, body) = server.post("/v1/messages/count_tokens", &json!({"messages": [{"role": "robot"}]}));
    check("/v1/messages/count_tokens", status, &body, "bad role");
    let raw = ureq::post(&format!("{}/v1/messages", server.base))
        .set("content-type", "application/json")
        .send_string("{not json");
    match raw {
        Err(ureq::Error::Status(400, r)) => check("/v1/messages", 400, &r.into_json().unwrap(), "not JSON"),
        other => panic!("invalid JSON must be a 400: {other:?}"),
    }
    assert_eq!(server.get("/health")["status"], "ok");
    server.wait_idle();
}

#[test]
fn anthropic_messages_api() {
    let server = Server::start(&[]);
    check_errors(&server);
    let body = message(json!([{"role": "user", "content": "Name three colours and say why you like them."}]), 20);
    let expected = check_message(&server, &body);
    check_streaming(&server, &body, &expected);
    check_stop_sequence(&server, &body, &expected);
    let mut short = body.clone();
    short["max_tokens"] = json!(2);
    let (status, response) = server.post("/v1/messages", &short);
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["stop_reason"], "max_tokens", "{response}");
    assert_eq!(usage(&response, "output_tokens"), 2);
    check_cache_across_turns(&server);
    check_billing_nonce(&server);
    check_tool_round_trip(&server);
    check_errors(&server);
    server.wait_idle();
}
