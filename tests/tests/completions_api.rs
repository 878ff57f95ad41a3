//! End-to-end: OpenAI's legacy `POST /v1/completions` on the real binary serving SmolLM2: the
//! prompt forms (text, token ids, one-element batches), streaming with `include_usage`, stop
//! strings, the prefix cache on a repeated prompt, and 400s for what is not supported.

mod common;

use common::{Server, filler};
use serde_json::{Value as Json, json};

fn completion(prompt: Json, max_tokens: usize) -> Json {
    json!({"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

fn text(response: &Json) -> String {
    response["choices"][0]["text"].as_str().expect("choices[0].text is a string").to_owned()
}

fn ok(server: &Server, body: &Json) -> Json {
    let (status, response) = server.post("/v1/completions", body);
    assert_eq!(status, 200, "{body} -> {response}");
    response
}

fn check_response_shape(response: &Json, max_tokens: u64) {
    assert_eq!(response["object"], "text_completion");
    assert!(response["id"].as_str().unwrap().starts_with("cmpl-"));
    assert!(response["created"].is_u64());
    assert!(response["model"].is_string());
    let choice = &response["choices"][0];
    assert_eq!(choice["index"], 0);
    assert!(choice["logprobs"].is_null());
    let usage = &response["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=max_tokens).contains(&completion), "{usage}");
    let expected_finish = if completion == max_tokens { "length" } else { "stop" };
    assert_eq!(choice["finish_reason"], expected_finish, "{response}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), usage["prompt_tokens"].as_u64().unwrap() + completion);
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64(), "cached_tokens is always present");
    assert!(response["timings"]["predicted_n"].is_u64());
}

/// The same prompt as text, as token ids, and in each one-element batch form gives the same
/// greedy text; the prompt is tokenized as given (what `/tokenize` with `add_special` says).
fn check_prompt_forms(server: &Server) -> String {
    let prompt = "The three primary colours are";
    let by_text = ok(server, &completion(json!(prompt), 8));
    check_response_shape(&by_text, 8);
    let expected = text(&by_text);
    assert!(!expected.is_empty());
    let (status, tokenized) = server.post("/tokenize", &json!({"content": prompt, "add_special": true}));
    assert_eq!(status, 200, "{tokenized}");
    let ids = tokenized["tokens"].clone();
    assert_eq!(by_text["usage"]["prompt_tokens"].as_u64().unwrap(), ids.as_array().unwrap().len() as u64);
    for form in [ids.clone(), json!([ids.clone()]), json!([prompt])] {
        let response = ok(server, &completion(form.clone(), 8));
        assert_eq!(text(&response), expected, "prompt form {form}");
        assert_eq!(response["usage"]["prompt_tokens"], by_text["usage"]["prompt_tokens"]);
    }
    // Unknown fields are ignored.
    let mut body = completion(json!(prompt), 8);
    body["some_future_field"] = json!({"x": 1});
    assert_eq!(text(&ok(server, &body)), expected);
    expected
}

fn check_streaming(server: &Server, expected: &str) {
    let mut body = completion(json!("The three primary colours are"), 8);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let data = server.stream_at("/v1/completions", &body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "the stream ends with [DONE]");
    let chunks: Vec<Json> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    for c in &chunks {
        assert_eq!(c["object"], "text_completion", "{c}");
        assert!(c["id"].as_str().unwrap().starts_with("cmpl-"));
    }
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]), "the usage chunk has no choices");
    let completion_tokens = usage_chunk["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    let finish = &chunks[chunks.len() - 2];
    let expected_finish = if completion_tokens == 8 { "length" } else { "stop" };
    assert_eq!(finish["choices"][0]["finish_reason"], expected_finish, "{finish}");
    assert!(finish["timings"]["predicted_n"].is_u64(), "the last choice chunk carries timings: {finish}");
    for c in &chunks[..chunks.len() - 2] {
        assert!(c["choices"][0]["finish_reason"].is_null(), "{c}");
    }
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, expected, "streamed text equals the greedy non-streamed text");
    // Without include_usage there is no usage chunk.
    body["stream_options"] = json!({"include_usage": false});
    let data = server.stream_at("/v1/completions", &body);
    assert!(data.iter().all(|d| !d.contains("\"usage\"")));
}

/// A stop string taken from the model's own greedy output cuts the text right before it.
fn check_stop_string(server: &Server) {
    let body = completion(json!("List the days of the week: Monday,"), 16);
    let full = text(&ok(server, &body));
    let words: Vec<&str> = full.split_whitespace().collect();
    assert!(words.len() >= 3, "enough output to pick a stop word: {full:?}");
    let stop = words[2];
    let cut = &full[..full.find(stop).unwrap()];
    let mut with_stop = body.clone();
    with_stop["stop"] = json!([stop, "never appears"]);
    let response = ok(server, &with_stop);
    assert_eq!(text(&response), cut);
    assert_eq!(response["choices"][0]["finish_reason"], "stop");
}

fn check_cached_tokens(server: &Server) {
    let prompt = filler(42, 200);
    let first = ok(server, &completion(json!(prompt), 2));
    let second = ok(server, &completion(json!(prompt), 2));
    let cached = |r: &Json| r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt_tokens = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 100);
    assert!(cached(&first) < prompt_tokens / 2, "a new prompt is mostly computed: {}", first["usage"]);
    assert!(cached(&second) >= prompt_tokens - 1, "a repeated prompt is cached: {}", second["usage"]);
    assert_eq!(text(&first), text(&second), "the cache never changes the answer");
}

fn check_refusals(server: &Server) {
    let base = completion(json!("Hello"), 4);
    let cases = [
        ("n", json!(2)),
        ("best_of", json!(3)),
        ("echo", json!(true)),
        ("suffix", json!("tail")),
        ("logprobs", json!(50)),
        ("max_tokens", json!(-3)),
        ("max_tokens", json!("many")),
        ("temperature", json!(9)),
        ("stop", json!(7)),
        ("prompt", json!([])),
        ("prompt", json!("")),
        ("prompt", json!(["one", "two"])),
        ("prompt", json!([1, 999_999_999])),
        ("prompt", json!({"no": "prompt"})),
    ];
    for (name, value) in cases {
        let mut body = base.clone();
        body[name] = value.clone();
        let (status, response) = server.post("/v1/completions", &body);
        assert_eq!(status, 400, "{name}: {value} -> {response}");
        let message = response["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{response}");
        assert_eq!(response["error"]["type"], "invalid_request_error");
        if name != "prompt" && name != "temperature" {
            assert!(message.contains(name), "the message names '{name}': {message}");
        }
    }
    let (status, response) = server.post("/v1/completions", &json!({"max_tokens": 4}));
    assert_eq!(status, 400, "a missing prompt: {response}");
    assert_eq!(server.get("/health")["status"], "ok");
}

/// `logprobs: n`: per generated token its text, log-probability, offset and the top `n`; under
/// greedy decoding the chosen token is the most likely one. Streamed chunks carry their tokens'.
fn check_logprobs(server: &Server) {
    let mut body = completion(json!("The three primary colours are"), 6);
    body["logprobs"] = json!(3);
    let response = ok(server, &body);
    let completion_tokens = response["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let lp = &response["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), completion_tokens, "{lp}");
    assert_eq!(tokens.concat(), text(&response), "the tokens spell the text");
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    for (chosen, top) in lp["token_logprobs"].as_array().unwrap().iter().zip(lp["top_logprobs"].as_array().unwrap()) {
        let chosen = chosen.as_f64().unwrap();
        assert!(chosen <= 0.0);
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let best = top.values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert!((best - chosen).abs() < 1e-4, "greedy takes the most likely token: {chosen} vs {best}");
    }
    body["stream"] = json!(true);
    let data = server.stream_at("/v1/completions", &body);
    let streamed: Vec<String> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Json>(d).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array().cloned())
        .flatten()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(streamed.concat(), text(&response), "streamed logprobs cover every token");
    body["stream"] = json!(false);
    body["logprobs"] = Json::Null;
    assert!(ok(server, &body)["choices"][0]["logprobs"].is_null());
}

#[test]
fn completions_endpoint() {
    let server = Server::start(&[]);
    let expected = check_prompt_forms(&server);
    check_streaming(&server, &expected);
    check_stop_string(&server);
    check_cached_tokens(&server);
    check_logprobs(&server);
    check_refusals(&server);
    server.wait_idle();
}
