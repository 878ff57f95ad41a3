//! The server on hybrid models (Qwen3.5's Gated DeltaNet layers, dense and MoE): the tiny
//! random fixtures (`models/tests/fixtures/tiny/qwen35*`, a toy byte vocabulary) with the real
//! Qwen3.5 chat template (`scripts/assets.sh path qwen35_template`). Streaming chat with
//! reasoning, a forced tool call (written in Qwen3.5's XML format), concurrent requests, and
//! the same answer from a cached prefix as from a cold one (state slots reused cleanly).
//! Prefix reuse at message boundaries itself: `hybrid_cache.rs`.

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

/// The raw generated text of replies or chunks with `logprobs`: every token's bytes in order,
/// the end-of-turn token (not text the model wrote) left out.
fn raw_text(replies: &[&Json]) -> String {
    let tokens = replies.iter().filter_map(|r| r["choices"][0]["logprobs"]["content"].as_array()).flatten();
    let bytes: Vec<u8> =
        tokens.flat_map(|t| t["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8)).collect();
    let text = String::from_utf8(bytes).expect("the reply is UTF-8");
    text.strip_suffix("<|im_end|>").unwrap_or(&text).to_owned()
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

    // The same request again, twice at once: the same answer each time, resumed from the
    // snapshot the first one left.
    let plain = json!({"messages": messages, "max_tokens": 12, "temperature": 0});
    let first = chat(&server, plain.clone());
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| chat(&server, plain.clone()));
        let b = s.spawn(|| chat(&server, plain.clone()));
        (a.join().unwrap(), b.join().unwrap())
    });
    for again in [&a, &b] {
        assert_eq!(again["choices"][0]["message"], first["choices"][0]["message"], "greedy answers repeat");
        assert!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 50, "{again}");
    }
    let streamed = reasoning + &text("content");
    let message = &first["choices"][0]["message"];
    let whole =
        format!("{}{}", message["reasoning_content"].as_str().unwrap_or(""), message["content"].as_str().unwrap_or(""));
    assert_eq!(whole, streamed, "streaming and not streaming say the same");

    // A forced tool call is written in Qwen3.5's own XML format (the raw tokens, from
    // `logprobs`) and comes back as an OpenAI tool call with JSON arguments typed by the schema
    // (`rev` is a string parameter whose text looks like a number); the reasoning the prompt
    // opened is closed first, so the call is not written inside it. Streamed, the same.
    let tools = json!([{"type": "function", "function": {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "enum": ["a.rs", "b.rs"]},
            "lines": {"type": "integer", "minimum": 1, "maximum": 9},
            "rev": {"type": "string", "enum": ["1", "2"]}},
                       "required": ["path", "lines", "rev"]}}}]);
    let forced = json!({"messages": messages, "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
                        "max_tokens": 400, "temperature": 0, "logprobs": true});
    let reply = chat(&server, forced.clone());
    let call = &reply["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "read_file", "{reply}");
    let arguments: Json = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {reply}"));
    assert!(["a.rs", "b.rs"].contains(&arguments["path"].as_str().unwrap()), "{reply}");
    assert!((1..=9).contains(&arguments["lines"].as_i64().unwrap()), "{reply}");
    assert!(["1", "2"].contains(&arguments["rev"].as_str().unwrap()), "a string stays a string: {reply}");
    assert_eq!(reply["choices"][0]["finish_reason"], "tool_calls", "{reply}");
    let xml = format!(
        "</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\n{}\n</parameter>\n\
         <parameter=lines>\n{}\n</parameter>\n<parameter=rev>\n{}\n</parameter>\n</function>\n</tool_call>",
        arguments["path"].as_str().unwrap(),
        arguments["lines"],
        arguments["rev"].as_str().unwrap()
    );
    assert_eq!(raw_text(&[&reply]), xml, "the call was written as Qwen3.5 writes it: {reply}");

    let mut streamed = forced.clone();
    streamed["stream"] = json!(true);
    let lines = server.stream(&streamed);
    let chunks: Vec<Json> = lines.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let deltas: Vec<&Json> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert!(deltas.iter().all(|d| d["index"] == 0), "one call: {lines:?}");
    let name: String = deltas.iter().filter_map(|d| d["function"]["name"].as_str()).collect();
    let streamed_arguments: String = deltas.iter().filter_map(|d| d["function"]["arguments"].as_str()).collect();
    assert_eq!(name, "read_file", "{lines:?}");
    assert_eq!(serde_json::from_str::<Json>(&streamed_arguments).unwrap(), arguments, "{lines:?}");
    let finish = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"), "{lines:?}");
    assert_eq!(raw_text(&chunks.iter().collect::<Vec<_>>()), xml, "{lines:?}");
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
