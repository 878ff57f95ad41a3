//! End-to-end: constrained decoding on the real binary with SmolLM2-135M, a model far too small
//! to follow tool or JSON instructions by itself. `tool_choice` "required" or a named function
//! and `response_format` must still come back as a valid call or valid JSON, because llguidance
//! masks every token the grammar does not allow.
//!
//! The first test runs the Hermes-style ChatML template of the TTFT benchmark, whose
//! `<tool_call>` markers the output parser reads; the second SmolLM2's own template, which shows
//! no tools: the server describes them in the system prompt and reads Hermes calls back.

mod common;

use common::{Server, chat, workspace_root};
use serde_json::{Value as Json, json};

fn weather_tool() -> Json {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
        }, "required": ["city", "days", "unit"], "additionalProperties": false}}})
}

fn time_tool() -> Json {
    json!({"type": "function", "function": {"name": "get_time", "description": "The current time.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 24}},
            "required": ["timezone"], "additionalProperties": false}}})
}

fn ask(text: &str, max_tokens: usize) -> Json {
    chat(json!([{"role": "user", "content": text}]), max_tokens)
}

fn calls(response: &Json) -> Vec<Json> {
    response["choices"][0]["message"]["tool_calls"].as_array().cloned().unwrap_or_default()
}

fn arguments(call: &Json) -> Json {
    let text = call["function"]["arguments"].as_str().expect("arguments are a string");
    serde_json::from_str(text).unwrap_or_else(|e| panic!("arguments {text:?} are not JSON: {e}"))
}

fn check_weather_arguments(args: &Json) {
    let city = args["city"].as_str().unwrap_or_else(|| panic!("city is a string: {args}"));
    assert!(city.chars().count() <= 24, "{args}");
    let days = args["days"].as_i64().unwrap_or_else(|| panic!("days is an integer: {args}"));
    assert!((1..=14).contains(&days), "{args}");
    assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or_default()), "{args}");
    assert_eq!(args.as_object().unwrap().len(), 3, "no other keys: {args}");
}

fn check_named_call(server: &Server, temperature: f64) {
    let mut body = ask("What is the weather like in Paris this week?", 120);
    body["tools"] = json!([time_tool(), weather_tool()]);
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    body["temperature"] = json!(temperature);
    body["seed"] = json!(11);
    let (status, response) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{response}");
    let calls = calls(&response);
    assert_eq!(calls.len(), 1, "exactly one call to the named function: {response}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(calls[0]["id"].as_str().is_some_and(|id| !id.is_empty()));
    check_weather_arguments(&arguments(&calls[0]));
    assert_eq!(response["choices"][0]["finish_reason"], "tool_calls", "{response}");
}

fn check_named_call_streams(server: &Server) {
    let mut body = ask("What is the weather like in Tokyo tomorrow?", 120);
    body["tools"] = json!([weather_tool(), time_tool()]);
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    body["stream"] = json!(true);
    let data = server.stream(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Json> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let deltas: Vec<&Json> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert!(!deltas.is_empty(), "tool call deltas: {chunks:?}");
    let first = deltas[0];
    assert_eq!(first["index"], 0);
    assert!(first["id"].as_str().is_some_and(|id| !id.is_empty()), "the first delta carries the id: {first}");
    assert_eq!(first["type"], "function");
    assert_eq!(first["function"]["name"], "get_weather", "the first delta carries the name: {first}");
    assert!(deltas.iter().all(|d| d["index"] == 0), "one call: {deltas:?}");
    let text: String = deltas.iter().filter_map(|d| d["function"]["arguments"].as_str()).collect();
    let args: Json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("streamed arguments {text:?}: {e}"));
    check_weather_arguments(&args);
    let finish = chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
}

fn check_required(server: &Server) {
    let mut body = ask("Tell me a joke about cats.", 160);
    body["tools"] = json!([weather_tool(), time_tool()]);
    body["tool_choice"] = json!("required");
    let (status, response) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{response}");
    let calls = calls(&response);
    assert!(!calls.is_empty(), "required forces a call: {response}");
    // Later parallel calls may be cut by max_tokens; the first is whole.
    let first = &calls[0];
    match first["function"]["name"].as_str() {
        Some("get_weather") => check_weather_arguments(&arguments(first)),
        Some("get_time") => {
            let args = arguments(first);
            assert!(args["timezone"].is_string(), "{args}");
            assert_eq!(args.as_object().unwrap().len(), 1, "{args}");
        }
        other => panic!("a call to a tool that was not offered: {other:?}"),
    }
}

fn check_json_schema(server: &Server) {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "student": {"type": "boolean"}
    }, "required": ["name", "age", "pets", "student"], "additionalProperties": false});
    let mut body = ask("Describe a person.", 150);
    body["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}});
    let (status, response) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{response}");
    let content = response["choices"][0]["message"]["content"].as_str().expect("content");
    let value: Json = serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?} is not JSON: {e}"));
    assert!(value["name"].as_str().is_some_and(|n| n.chars().count() <= 30), "{value}");
    assert!(value["age"].as_i64().is_some_and(|a| (0..=150).contains(&a)), "{value}");
    let pets = value["pets"].as_array().unwrap_or_else(|| panic!("pets is an array: {value}"));
    assert!(pets.len() <= 3 && pets.iter().all(Json::is_string), "{value}");
    assert!(value["student"].is_boolean(), "{value}");
    assert_eq!(value.as_object().unwrap().len(), 4, "{value}");
    assert_eq!(response["choices"][0]["finish_reason"], "stop", "the grammar ended the reply: {response}");
}

fn check_json_object(server: &Server) {
    let mut body = ask("List two colours as JSON.", 80);
    body["response_format"] = json!({"type": "json_object"});
    let (status, response) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{response}");
    let content = response["choices"][0]["message"]["content"].as_str().expect("content");
    // Any object may run into max_tokens; what was produced is then a prefix of one.
    if response["choices"][0]["finish_reason"] == "stop" {
        let value: Json = serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?} is not JSON: {e}"));
        assert!(value.is_object(), "{value}");
    } else {
        assert!(content.starts_with('{'), "{content:?}");
    }
}

fn check_none_and_auto(server: &Server) {
    for choice in ["none", "auto"] {
        let mut body = ask("Say hello.", 24);
        body["tools"] = json!([weather_tool()]);
        body["tool_choice"] = json!(choice);
        let (status, response) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{response}");
        if choice == "none" {
            assert!(calls(&response).is_empty(), "tool_choice none never calls: {response}");
            assert_ne!(response["choices"][0]["finish_reason"], "tool_calls");
        }
    }
}

fn check_bad_requests(server: &Server) {
    let bad_schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}});
    let cases = [
        ("response_format", bad_schema),
        ("response_format", json!({"type": "yaml"})),
        ("tool_choice", json!({"type": "function", "function": {"name": "not_offered"}})),
        ("tool_choice", json!("sometimes")),
    ];
    for (key, value) in cases {
        let mut body = ask("Hi.", 8);
        body["tools"] = json!([weather_tool()]);
        body[key] = value.clone();
        let (status, response) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 400, "{key}: {value} -> {response}");
        assert_eq!(response["error"]["type"], "invalid_request_error", "{response}");
        assert!(response["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // Still healthy, nothing leaked.
    server.wait_idle();
}

#[test]
fn tool_choice_and_response_format_are_enforced() {
    let template = workspace_root().join("benches/templates/chatml_tools.jinja");
    let server = Server::start(&["--chat-template-file", template.to_str().unwrap()]);
    check_bad_requests(&server);
    check_named_call(&server, 0.0);
    check_named_call(&server, 0.9);
    check_named_call_streams(&server);
    check_required(&server);
    check_json_schema(&server);
    check_json_object(&server);
    check_none_and_auto(&server);
    server.wait_idle();
}

/// SmolLM2's own template ignores `tools`: the server describes them at the end of the system
/// prompt and asks for Hermes calls, so `required` and a named function work with it too.
#[test]
fn tools_reach_a_model_whose_template_has_no_tool_format() {
    let server = Server::start(&[]);
    let mut body = ask("Tell me a joke about cats.", 8);
    body["tools"] = json!([weather_tool(), time_tool()]);
    let (status, rendered) = server.post("/apply-template", &body);
    assert_eq!(status, 200, "{rendered}");
    let prompt = rendered["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("# Tools") && prompt.contains("\"get_weather\"") && prompt.contains("<tool_call>"),
        "{prompt}"
    );
    check_required(&server);
    check_named_call(&server, 0.0);
    server.wait_idle();
}
