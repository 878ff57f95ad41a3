//! End-to-end: llama-server's native endpoints on the real binary serving SmolLM2, checked
//! black-box against the field names and JSON types llama-server documents: `/completion`
//! (streamed and not, `cache_prompt`, `return_tokens`, stop words), `/tokenize`, `/detokenize`,
//! `/apply-template`, `/props`, `/slots`, and `timings` on chat completions.

mod common;

use common::{Server, filler};
use serde_json::{Value as Json, json};

fn completion(prompt: Json, n_predict: i64) -> Json {
    json!({"prompt": prompt, "n_predict": n_predict, "temperature": 0})
}

fn post_ok(server: &Server, path: &str, body: &Json) -> Json {
    let (status, response) = server.post(path, body);
    assert_eq!(status, 200, "{path} {body} -> {response}");
    response
}

fn check_timings(timings: &Json) {
    for name in ["cache_n", "prompt_n", "predicted_n"] {
        assert!(timings[name].is_u64(), "timings.{name} is an integer: {timings}");
    }
    for name in [
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ] {
        assert!(timings[name].is_number(), "timings.{name} is a number: {timings}");
    }
}

/// The final `/completion` object: every documented field with its JSON type.
fn check_final_fields(r: &Json) {
    assert!(r["content"].is_string(), "{r}");
    assert!(r["tokens"].is_array());
    assert!(r["id_slot"].is_i64());
    assert_eq!(r["stop"], true);
    assert!(r["model"].is_string());
    assert!(r["tokens_predicted"].is_u64());
    assert!(r["tokens_evaluated"].as_u64().unwrap() > 0);
    let settings = &r["generation_settings"];
    assert!(settings["n_predict"].is_i64() && settings["temperature"].is_number() && settings["top_k"].is_u64());
    assert!(settings["stop"].is_array() && settings["seed"].is_u64() && settings["n_ctx"].is_u64());
    assert!(r["prompt"].is_string());
    assert!(r["truncated"].is_boolean());
    assert!(["eos", "limit", "word"].contains(&r["stop_type"].as_str().unwrap()), "{r}");
    assert!(r["stopping_word"].is_string());
    assert!(r["tokens_cached"].is_u64());
    check_timings(&r["timings"]);
    assert_eq!(r["timings"]["predicted_n"], r["tokens_predicted"]);
}

/// Non-streamed and streamed `/completion` agree; the stream is token chunks with `stop: false`
/// and ends with one `stop: true` chunk carrying the final fields and `timings`, no `[DONE]`.
fn check_completion(server: &Server) {
    let mut body = completion(json!("The capital of France is"), 8);
    body["return_tokens"] = json!(true);
    let r = post_ok(server, "/completion", &body);
    check_final_fields(&r);
    let predicted = r["tokens_predicted"].as_u64().unwrap();
    assert!((1..=8).contains(&predicted));
    assert_eq!(r["stop_type"], if predicted == 8 { "limit" } else { "eos" }, "{r}");
    assert_eq!(r["tokens"].as_array().unwrap().len() as u64, predicted, "return_tokens gives the ids");
    assert_eq!(r["prompt"], "The capital of France is");
    let detok = post_ok(server, "/detokenize", &json!({"tokens": r["tokens"]}));
    assert_eq!(detok["content"], r["content"], "the returned ids are the content");
    // Without return_tokens, `tokens` stays empty.
    body["return_tokens"] = json!(false);
    assert_eq!(post_ok(server, "/completion", &body)["tokens"], json!([]));

    body["stream"] = json!(true);
    let data = server.stream_at("/completion", &body);
    assert!(data.iter().all(|d| d != "[DONE]"), "llama-server sends no [DONE] on /completion");
    let chunks: Vec<Json> = data.iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let (last, tokens) = chunks.split_last().unwrap();
    assert_eq!(tokens.len() as u64, predicted, "one chunk per token");
    for c in tokens {
        assert_eq!(c["stop"], false, "{c}");
        assert!(c["content"].is_string());
        assert_eq!(c["tokens"].as_array().unwrap().len(), 1);
    }
    check_final_fields(last);
    let streamed: String = tokens.iter().map(|c| c["content"].as_str().unwrap()).collect();
    assert_eq!(streamed, r["content"].as_str().unwrap());
    assert_eq!(last["tokens_predicted"], r["tokens_predicted"]);

    // A stop word from the model's own output: the content ends before it.
    let content = r["content"].as_str().unwrap();
    if let Some(word) = content.split_whitespace().nth(1) {
        let mut body = completion(json!("The capital of France is"), 8);
        body["stop"] = json!([word]);
        let stopped = post_ok(server, "/completion", &body);
        assert_eq!(stopped["stop_type"], "word", "{stopped}");
        assert_eq!(stopped["stopping_word"], word);
        assert_eq!(stopped["content"].as_str().unwrap(), &content[..content.find(word).unwrap()]);
        check_timings(&stopped["timings"]);
    }

    // n_probs: each token's id, text, bytes and logprob with the top alternatives.
    let mut probs = completion(json!("The capital of France is"), 8);
    probs["n_probs"] = json!(2);
    probs["return_tokens"] = json!(true);
    let with_probs = post_ok(server, "/completion", &probs);
    let entries = with_probs["completion_probabilities"].as_array().unwrap();
    assert_eq!(Json::Array(entries.iter().map(|e| e["id"].clone()).collect()), with_probs["tokens"]);
    for e in entries {
        assert!(e["token"].is_string() && e["bytes"].is_array() && e["logprob"].as_f64().unwrap() <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["id"], e["id"], "greedy takes the most likely token");
    }
    probs["stream"] = json!(true);
    let data = server.stream_at("/completion", &probs);
    let streamed: Vec<Json> = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Json>(d).unwrap()["completion_probabilities"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, entries, "streamed chunks carry their token's probabilities");

    // n_predict 0 evaluates the prompt and generates nothing.
    let none = post_ok(server, "/completion", &completion(json!("The capital of France is"), 0));
    assert_eq!(none["content"], "");
    assert_eq!(none["tokens_predicted"], 0);

    // Mixed token ids and text, as llama-server accepts them.
    let ids = post_ok(server, "/tokenize", &json!({"content": "The capital of"}))["tokens"].clone();
    let mut mixed = ids.as_array().unwrap().clone();
    mixed.push(json!(" France is"));
    let by_mixed = post_ok(server, "/completion", &completion(json!(mixed), 8));
    assert!(by_mixed["content"].is_string());
    assert!(by_mixed["tokens_evaluated"].as_u64().unwrap() >= ids.as_array().unwrap().len() as u64);
}

/// `cache_prompt` (default true) reuses the cached prefix of a repeated prompt; false computes
/// it all again.
fn check_cache_prompt(server: &Server) {
    let prompt = filler(7, 150);
    let first = post_ok(server, "/completion", &completion(json!(prompt), 2));
    let again = post_ok(server, "/completion", &completion(json!(prompt), 2));
    let evaluated = again["tokens_evaluated"].as_u64().unwrap();
    assert!(again["tokens_cached"].as_u64().unwrap() > 0, "{again}");
    assert!(again["timings"]["cache_n"].as_u64().unwrap() >= evaluated - 1, "{}", again["timings"]);
    assert!(again["timings"]["prompt_n"].as_u64().unwrap() <= 1);
    let mut cold = completion(json!(prompt), 2);
    cold["cache_prompt"] = json!(false);
    let cold = post_ok(server, "/completion", &cold);
    assert_eq!(cold["tokens_cached"], 0, "{cold}");
    assert_eq!(cold["timings"]["cache_n"], 0);
    assert_eq!(cold["timings"]["prompt_n"].as_u64().unwrap(), evaluated);
    assert_eq!(first["content"], again["content"]);
    assert_eq!(first["content"], cold["content"]);
}

fn check_tokenize(server: &Server) {
    let text = "Hello world, héllo 日本";
    let plain = post_ok(server, "/tokenize", &json!({"content": text}));
    let ids: Vec<u64> = plain["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert!(ids.len() >= 4);
    let special = post_ok(server, "/tokenize", &json!({"content": text, "add_special": true}));
    assert!(special["tokens"].as_array().unwrap().len() >= ids.len());
    let pieces = post_ok(server, "/tokenize", &json!({"content": text, "with_pieces": true}));
    let mut bytes = Vec::new();
    for (piece, id) in pieces["tokens"].as_array().unwrap().iter().zip(&ids) {
        assert_eq!(piece["id"].as_u64(), Some(*id));
        match &piece["piece"] {
            Json::String(s) => bytes.extend(s.as_bytes()),
            Json::Array(b) => bytes.extend(b.iter().map(|x| x.as_u64().unwrap() as u8)),
            other => panic!("a piece is a string or bytes: {other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text, "the pieces spell the text");
    let back = post_ok(server, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(back["content"], text);
}

fn check_apply_template(server: &Server) {
    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]);
    let prompt =
        post_ok(server, "/apply-template", &json!({"messages": messages}))["prompt"].as_str().unwrap().to_owned();
    assert!(prompt.contains("Be brief.") && prompt.contains("Name a colour."), "{prompt}");
    let chat =
        post_ok(server, "/v1/chat/completions", &json!({"messages": messages, "max_tokens": 3, "temperature": 0}));
    let tokens = post_ok(server, "/tokenize", &json!({"content": prompt}))["tokens"].as_array().unwrap().len();
    assert_eq!(chat["usage"]["prompt_tokens"].as_u64(), Some(tokens as u64), "chat renders the same prompt");
    // Chat carries llama.cpp's timings (and reasoning_tokens), streamed too.
    check_timings(&chat["timings"]);
    assert!(chat["usage"]["completion_tokens_details"]["reasoning_tokens"].is_u64());
    let data = server.stream(&json!({"messages": messages, "max_tokens": 3, "temperature": 0, "stream": true}));
    let finish: Json = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(finish["choices"][0]["finish_reason"].is_string(), "{finish}");
    check_timings(&finish["timings"]);
    assert!(chat["choices"][0]["logprobs"].is_null());
    // Chat logprobs: one entry per generated token, streamed or not.
    let body = json!({"messages": messages, "max_tokens": 4, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let r = post_ok(server, "/v1/chat/completions", &body);
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len() as u64, r["usage"]["completion_tokens"].as_u64().unwrap());
    for e in &content {
        assert!(e["token"].is_string() && e["bytes"].is_array() && e["logprob"].as_f64().unwrap() <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"], "greedy takes the most likely token");
    }
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let data = server.stream(&streamed_body);
    let streamed: Vec<Json> = data[..data.len() - 1]
        .iter()
        .filter_map(|d| {
            serde_json::from_str::<Json>(d).unwrap()["choices"][0]["logprobs"]["content"].as_array().cloned()
        })
        .flatten()
        .collect();
    assert_eq!(streamed, content);
    let (status, response) = server.post("/v1/chat/completions", &json!({"messages": messages, "top_logprobs": 3}));
    assert_eq!(status, 400, "top_logprobs without logprobs: {response}");
}

fn check_props_and_slots(server: &Server) {
    let props = server.get("/props");
    let settings = &props["default_generation_settings"];
    assert!(settings["n_ctx"].as_u64().unwrap() > 0, "{props}");
    assert!(settings["params"]["temperature"].is_number() && settings["params"]["n_predict"].is_i64());
    assert_eq!(props["total_slots"], 2);
    assert!(props["model_path"].as_str().unwrap().ends_with(".gguf"));
    assert!(props["chat_template"].as_str().unwrap().contains("messages"));
    assert!(props["bos_token"].is_string() && props["eos_token"].is_string());
    assert!(props["build_info"].is_string());
    assert_eq!(props["modalities"]["vision"], false);
    let slots = server.get("/slots");
    let slots = slots.as_array().unwrap();
    assert_eq!(slots.len(), 2);
    for (i, slot) in slots.iter().enumerate() {
        assert_eq!(slot["id"], i);
        assert_eq!(slot["n_ctx"], settings["n_ctx"]);
        assert_eq!(slot["is_processing"], false, "idle: {slot}");
        assert!(slot["params"].is_object() && slot["next_token"].is_object());
    }
}

/// Bad input is a 400 with an OpenAI-style error, never a 500, and the server stays healthy.
fn check_bad_input(server: &Server) {
    let cases = [
        ("/completion", json!({"n_predict": 4})),
        ("/completion", json!({"prompt": ""})),
        ("/completion", json!({"prompt": [1, 2, 4_000_000_000u64]})),
        ("/completion", json!({"prompt": [1, true]})),
        ("/completion", json!({"prompt": "hi", "n_predict": "four"})),
        ("/completion", json!({"prompt": "hi", "cache_prompt": "yes"})),
        ("/completion", json!({"prompt": "hi", "top_p": 0})),
        ("/completion", json!({"prompt": "hi".repeat(20_000)})),
        ("/tokenize", json!({})),
        ("/tokenize", json!({"content": 5})),
        // 1 MiB is the most tokenized with pieces (28.5 MB took 13 GB before the limit).
        ("/tokenize", json!({"content": "word ".repeat(220_000), "with_pieces": true})),
        // 4 MiB of stop strings is the most one request may send.
        ("/completion", json!({"prompt": "hi", "stop": vec!["0123456789abcdef"; 300_000]})),
        ("/detokenize", json!({"tokens": ["a"]})),
        ("/detokenize", json!({"tokens": [-1]})),
        ("/apply-template", json!({})),
        ("/apply-template", json!({"messages": "hi"})),
    ];
    for (path, body) in cases {
        let (status, response) = server.post(path, &body);
        assert_eq!(status, 400, "{path} {body} -> {response}");
        assert!(response["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{response}");
    }
    let raw = ureq::post(&format!("{}/completion", server.base))
        .set("content-type", "application/json")
        .send_string("{not json");
    match raw {
        Err(ureq::Error::Status(400, _)) => {}
        other => panic!("invalid JSON is a 400: {other:?}"),
    }
    assert_eq!(server.get("/health")["status"], "ok");
}

/// A ChatML template of our own that opens `<think>` in the generation prompt unless
/// `enable_thinking` is false (as Qwen3's does). The `<tool_call>` comment makes the server pick
/// the `<think>`-aware output parser, as it does for Qwen templates.
const THINKING_TEMPLATE: &str = "{# <tool_call> #}{% for message in messages %}<|im_start|>{{ message.role }}\n\
{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n\
{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}\
{% endif %}";

/// `chat_template_kwargs` reach the template, and `usage.completion_tokens_details.reasoning_tokens`
/// counts the tokens the parser read as reasoning.
fn check_reasoning_tokens() {
    let dir = std::env::temp_dir().join(format!("radix-llama-compat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let template = dir.join("thinking.jinja");
    std::fs::write(&template, THINKING_TEMPLATE).unwrap();
    let server = Server::start(&["--chat-template-file", template.to_str().unwrap()]);
    let messages = json!([{"role": "user", "content": "Count from one to ten."}]);
    let thinking = json!({"messages": messages, "max_tokens": 6, "temperature": 0});
    let rendered = post_ok(&server, "/apply-template", &thinking)["prompt"].as_str().unwrap().to_owned();
    assert!(rendered.trim_end().ends_with("<think>"), "{rendered:?}");
    let r = post_ok(&server, "/v1/chat/completions", &thinking);
    let usage = &r["usage"];
    let reasoning = usage["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    let completion = usage["completion_tokens"].as_u64().unwrap();
    let message = &r["choices"][0]["message"];
    assert!(message["reasoning_content"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
    assert!(reasoning >= 1 && reasoning <= completion, "{usage}");
    if message["content"].as_str().unwrap_or_default().is_empty() {
        assert_eq!(reasoning, completion, "a reply that never left reasoning: {r}");
    }
    let mut direct = thinking.clone();
    direct["chat_template_kwargs"] = json!({"enable_thinking": false});
    let rendered = post_ok(&server, "/apply-template", &direct)["prompt"].as_str().unwrap().to_owned();
    assert!(rendered.trim_end().ends_with("</think>"), "enable_thinking reaches the template: {rendered:?}");
    let r = post_ok(&server, "/v1/chat/completions", &direct);
    assert_eq!(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 0, "{r}");
    assert!(r["choices"][0]["message"]["reasoning_content"].is_null(), "{r}");
    server.wait_idle();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One server at a time (the machine has two cores), one after the other.
#[test]
fn llama_server_endpoints() {
    let server = Server::start(&["--parallel", "2"]);
    check_props_and_slots(&server);
    check_tokenize(&server);
    check_completion(&server);
    check_cache_prompt(&server);
    check_apply_template(&server);
    check_bad_input(&server);
    server.wait_idle();
    drop(server);
    check_reasoning_tokens();
}
