//! Prefix reuse on a hybrid model through the HTTP API: the tiny Qwen3.5 fixture with the real
//! Qwen3.5 template, agent-shaped requests (tools, a stable and a per-folder system message,
//! turns that grow). The next turn resumes from the snapshot at the last message boundary, a
//! session in another folder from the one before its working directory, a repeated prompt from
//! its generation prompt; the answers are those of a cold prefill; `/health` counts the
//! snapshots and, idle, shows every state slot free.

mod common;

use common::{Server, asset, binary, workspace_root};
use serde_json::{Value as Json, json};

fn start() -> Server {
    let model = workspace_root().join("models/tests/fixtures/tiny/qwen35/model-q8_0.gguf");
    let template = asset("qwen35_template");
    let mut command = std::process::Command::new(binary());
    command.args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2", "-np", "2", "-c", "4096"]);
    command.args(["--chat-template-file", template.to_str().unwrap()]);
    Server::start_custom(command)
}

fn tools() -> Json {
    json!([{"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])
}

fn system(folder: &str) -> Json {
    json!([
        {"role": "system", "content": "You are a coding agent. Work through the tools; be brief."},
        {"role": "system", "content": format!("<env>\nWorking directory: /home/dev/{folder}\nPlatform: linux\n</env>")}
    ])
}

/// Sends `messages` with the tools, greedily, with the cache report; returns the reply.
fn ask(server: &Server, messages: &Json, cache: bool) -> Json {
    let body = json!({"messages": messages, "tools": tools(), "max_tokens": 8, "temperature": 0,
                      "cache_report": true, "cache_prompt": cache});
    let (status, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    reply
}

/// Whether message `k`'s tokens were all reused, per the cache report's prompt parts.
fn message_cached(reply: &Json, k: usize) -> bool {
    let m = &reply["cache_report"]["prompt_parts"]["messages"][k];
    m["tokens"].as_u64().is_some() && m["tokens"] == m["cached"]
}

fn cached(reply: &Json) -> u64 {
    reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

#[test]
fn a_hybrid_model_reuses_prefixes_at_message_boundaries() {
    let server = start();
    let mut messages = system("alpha").as_array().unwrap().clone();
    messages.push(json!({"role": "user", "content": "Read src/main.rs and tell me what it does."}));
    let first = ask(&server, &Json::from(messages.clone()), true);
    assert_eq!(cached(&first), 0, "{first}");

    // The next turn: the reply (as an agent sends it back, without its reasoning) and a new user
    // message. Everything before the reply's assistant header comes from the cache.
    let content = first["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": "Now read Cargo.toml."}));
    let second = ask(&server, &Json::from(messages.clone()), true);
    let report = &second["cache_report"];
    for k in 0..3 {
        assert!(message_cached(&second, k), "message {k} of the first turn is reused: {report}");
    }
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached(&second) > prompt / 2, "{report}");
    // The same prompt without the cache: the same answer.
    let cold = ask(&server, &Json::from(messages.clone()), false);
    assert_eq!(cold["choices"][0]["message"], second["choices"][0]["message"], "the cache never changes the answer");
    assert_eq!(cached(&cold), 0);

    // Sent again: all but the generation prompt is reused.
    let again = ask(&server, &Json::from(messages.clone()), true);
    // (The toy vocabulary spells control tokens as bytes, so the points fall at message texts.)
    let generation_prompt = again["cache_report"]["prompt_parts"]["generation_prompt"]["tokens"].as_u64().unwrap();
    assert!(
        prompt - cached(&again) <= generation_prompt,
        "a repeat resumes at its generation prompt: {}",
        again["cache_report"]
    );
    assert_eq!(again["choices"][0]["message"], second["choices"][0]["message"]);

    // Another folder: the tools and the stable system message are reused; the KV matched on into
    // the working directory's line, which is recomputed from the snapshot before it.
    let mut other = system("beta").as_array().unwrap().clone();
    other.push(json!({"role": "user", "content": "Read src/main.rs and tell me what it does."}));
    let elsewhere = ask(&server, &Json::from(other), true);
    let report = &elsewhere["cache_report"];
    assert!(message_cached(&elsewhere, 0), "the stable system message is reused: {report}");
    assert_eq!(report["prompt_parts"]["tools"]["tokens"], report["prompt_parts"]["tools"]["cached"], "{report}");
    assert_eq!(report["reason"], "no_snapshot", "{report}");
    assert!(report["recomputed_for_snapshot"].as_u64().unwrap() > 0, "{report}");

    let engine = server.wait_idle();
    assert!(engine["snapshots"].as_u64().unwrap() >= 4, "{engine}");
    assert!(engine["snapshots"].as_u64() <= engine["snapshot_slots"].as_u64(), "{engine}");
    assert_eq!(engine["state_slots_free"], engine["state_slots"], "idle, no state slot is held: {engine}");
    let free = engine["snapshot_slots_free"].as_u64().unwrap() + engine["snapshots"].as_u64().unwrap();
    assert_eq!(Some(free), engine["snapshot_slots"].as_u64(), "no snapshot slot leaked: {engine}");
    let metrics = server.get_text("/metrics");
    assert!(metrics.contains("radix_serve_cache_snapshots "), "{metrics}");
}

/// A long system text of numbered rules, the last `n - keep` of them worded for `who`.
fn rules(keep: usize, n: usize, who: &str) -> String {
    (0..n)
        .map(|i| match i < keep {
            true => format!("- Rule {i}: keep changes small and explain each one.\n"),
            false => format!("- Rule {i} for the {who}: report what was found, not what was done.\n"),
        })
        .collect()
}

#[test]
fn a_prompt_branching_inside_the_system_message_resumes_near_the_branch() {
    let server = start();
    let ask_with = |system: String, cache: bool| {
        let messages = json!([{"role": "system", "content": system}, {"role": "user", "content": "Read src/main.rs."}]);
        (ask(&server, &messages, cache), messages)
    };
    let (first, _) = ask_with(rules(16, 24, "agent"), true);
    assert_eq!(cached(&first), 0, "{first}");

    // A subagent whose instructions share the first 16 rules: no message boundary is near the
    // branch, but a line start at most the branch spacing (256) before it holds a snapshot.
    let (branched, messages) = ask_with(rules(16, 24, "subagent"), true);
    let tokens = |messages: &Json| {
        let (status, applied) = server.post("/apply-template", &json!({"messages": messages, "tools": tools()}));
        assert_eq!(status, 200, "{applied}");
        let (status, answer) = server.post("/tokenize", &json!({"content": applied["prompt"]}));
        assert_eq!(status, 200, "{answer}");
        answer["tokens"].as_array().unwrap().clone()
    };
    let main = json!([{"role": "system", "content": rules(16, 24, "agent")}, {"role": "user", "content": "Read src/main.rs."}]);
    let shared = tokens(&main).iter().zip(&tokens(&messages)).take_while(|(a, b)| a == b).count() as u64;
    let report = &branched["cache_report"];
    assert!(shared > 600, "the branch lies deep in the system message: {shared} tokens");
    assert!(cached(&branched) + 256 >= shared && cached(&branched) <= shared, "{shared} shared: {report}");

    // Bitwise the answer of a cold prefill.
    let (cold, _) = ask_with(rules(16, 24, "subagent"), false);
    assert_eq!(cold["choices"][0]["message"], branched["choices"][0]["message"], "the cache never changes the answer");

    // Its next request resumes at the branch itself, kept as a by-product of the first.
    let (again, _) = ask_with(rules(16, 24, "third"), true);
    assert!(cached(&again) + 16 >= shared, "{shared} shared: {}", again["cache_report"]);
    let engine = server.wait_idle();
    assert_eq!(engine["state_slots_free"], engine["state_slots"], "idle, no state slot is held: {engine}");
}
