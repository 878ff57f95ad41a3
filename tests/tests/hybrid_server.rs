//! The server on hybrid models (Qwen3.5's Gated DeltaNet layers, dense and MoE): the tiny
//! random fixtures (`models/tests/fixtures/tiny/qwen35*`, a toy byte vocabulary) with the real
//! Qwen3.5 chat template (`scripts/assets.sh path qwen35_template`). Streaming chat with
//! reasoning, a forced tool call, concurrent requests, and the same answer twice (no prefix is
//! reused without its recurrent state, and state slots are reused cleanly).

mod common;

use common::{Server, asset, binary, workspace_root};
use serde_json::{Value as Json, json};

fn start(arch: &str) -> Server {
    let model = workspace_root().join("models/tests/fixtures/tiny").join(arch).join("model-q8_0.gguf");
    let template = asset("qwen35_template");
    let mut command = std::process::Command::new(binary());
    // The toy vocabulary spends a token per byte: the template's tool block alone is ~1k.
    command.args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2", "-np", "2", "-c", "2048"]);
    command.args(["--chat-template-file", template.to_str().unwrap()]);
    Server::start_custom(command)
}

fn chat(server: &Server, body: Json) -> Json {
    let (status, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    reply
}

#[test]
fn qwen35_streams_reasons_calls_tools_and_answers_alike_twice() {
    let server = start("qwen35");
    assert!(
        server.log().iter().any(|l| l.contains("recurrent state") && l.contains("per sequence")),
        "start-up names the state bytes: {:?}",
        server.log()
    );
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "List the files."}
    ]);
    // Qwen3.5's generation prompt opens `<think>`: what the model writes first is reasoning.
    let body = json!({"messages": messages, "max_tokens": 12, "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}});
    let lines = server.stream(&body);
    let events: Vec<Json> = lines.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let text = |key: &str| -> String {
        events.iter().filter_map(|e| e["choices"][0]["delta"][key].as_str()).collect::<String>()
    };
    let reasoning = text("reasoning_content");
    assert!(!reasoning.is_empty(), "the reply opens in reasoning: {lines:?}");
    assert!(!reasoning.contains("<think>"), "markup never leaks: {reasoning:?}");
    let usage = events.iter().rev().find(|e| e["usage"].is_object()).expect("a usage chunk");
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 50, "{usage}");
    assert!(usage["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{usage}");
    assert!(events.iter().any(|e| e["choices"][0]["finish_reason"].is_string()), "{lines:?}");

    // The same request again, twice at once: the same answer each time, nothing cached.
    let plain = json!({"messages": messages, "max_tokens": 12, "temperature": 0});
    let first = chat(&server, plain.clone());
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| chat(&server, plain.clone()));
        let b = s.spawn(|| chat(&server, plain.clone()));
        (a.join().unwrap(), b.join().unwrap())
    });
    for again in [&a, &b] {
        assert_eq!(again["choices"][0]["message"], first["choices"][0]["message"], "greedy answers repeat");
        assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let streamed = reasoning + &text("content");
    let message = &first["choices"][0]["message"];
    let whole =
        format!("{}{}", message["reasoning_content"].as_str().unwrap_or(""), message["content"].as_str().unwrap_or(""));
    assert_eq!(whole, streamed, "streaming and not streaming say the same");

    // A forced tool call comes back as an OpenAI tool call with JSON arguments; the reasoning
    // the prompt opened is closed first, so the call is not written inside it.
    let tools = json!([{"type": "function", "function": {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["a.rs", "b.rs"]}},
                       "required": ["path"]}}}]);
    let reply = chat(
        &server,
        json!({"messages": messages, "tools": tools, "tool_choice": "required",
                                     "max_tokens": 200, "temperature": 0}),
    );
    let call = &reply["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "read_file", "{reply}");
    let arguments: Json = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {reply}"));
    assert!(["a.rs", "b.rs"].contains(&arguments["path"].as_str().unwrap()), "{reply}");
    assert_eq!(reply["choices"][0]["finish_reason"], "tool_calls", "{reply}");
    server.wait_idle();
}

#[test]
fn qwen35_moe_serves_chat() {
    let server = start("qwen35moe");
    let body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0});
    let first = chat(&server, body.clone());
    assert!(first["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{first}");
    assert_eq!(chat(&server, body)["choices"][0]["message"], first["choices"][0]["message"]);
    server.wait_idle();
}
