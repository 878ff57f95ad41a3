//! Answers never depend on the load or the cache. Six greedy chat requests and a seeded sampled
//! one are sent one at a time with the cache off (each one's *solo* reply), then all at once with the cache off, all
//! at once again twice with the cache on (a cold round that fills it, a warm one served from
//! it), then all at once beside long prompts of other requests being prefilled, in chunks, in
//! the same forward passes. Every reply must be its solo reply token for token, and with the same
//! log-probabilities, bit for bit: the kernels reduce each row in one order whatever else is in
//! the batch, however a prompt is chunked and wherever its prefix comes from.
//!
//! On the real default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0
//! matrices on our kernels) and on the tiny Qwen3.5-structured model (Gated DeltaNet layers,
//! state snapshots), whose Q8_0 and f32 files run the int8 and the float kernels.

mod common;

use std::process::Command;

use common::{Server, asset, binary, filler, workspace_root};
use serde_json::{Value as Json, json};

/// Questions an agent's user could ask, different enough to give different replies: the first
/// six greedy, the last one sampled with a seed.
const QUESTIONS: [&str; 7] = [
    "Write a Python function that reverses a string.",
    "What does `git rebase` do? One sentence.",
    "Name three sorting algorithms.",
    "Write a Rust function that adds two numbers.",
    "Explain what a prefix cache is, briefly.",
    "Write a shell command that counts lines in all .rs files.",
    "Suggest a name for a local inference server.",
];

/// The index of the sampled question.
const SAMPLED: usize = 6;

/// A greedy chat request with the log-probability of every generated token.
fn request(question: &str, max_tokens: usize, cache: bool) -> Json {
    json!({
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": true,
        "cache_prompt": cache,
    })
}

/// The requests of a round: [`QUESTIONS`], greedy but for the one sampled with a fixed seed.
fn round(max_tokens: usize, cache: bool) -> Vec<Json> {
    let mut bodies: Vec<Json> = QUESTIONS.iter().map(|q| request(q, max_tokens, cache)).collect();
    bodies[SAMPLED]["temperature"] = json!(0.9);
    bodies[SAMPLED]["seed"] = json!(1234);
    bodies
}

/// The generated tokens of a reply with their log-probabilities, as the server wrote them (an
/// f32 printed the same way: equal text means equal bits).
fn generated(reply: &Json) -> Vec<(String, String)> {
    reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("a reply with logprobs: {reply}"))
        .iter()
        .map(|t| (t["token"].to_string(), t["logprob"].to_string()))
        .collect()
}

/// Sends every body at once (one thread each) and returns the replies in order.
fn all_at_once(server: &Server, bodies: &[Json]) -> Vec<Json> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|body| {
                scope.spawn(move || {
                    let (status, reply) = server.post("/v1/chat/completions", body);
                    assert_eq!(status, 200, "{reply}");
                    reply
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("request thread")).collect()
    })
}

/// Runs the rounds on `server` and checks every reply against its solo reply.
fn check_rounds(server: &Server, max_tokens: usize, long_prompt_words: usize) {
    let bodies = |cache: bool| round(max_tokens, cache);
    let solo: Vec<Vec<(String, String)>> = bodies(false)
        .iter()
        .map(|body| {
            let (status, reply) = server.post("/v1/chat/completions", body);
            assert_eq!(status, 200, "{reply}");
            generated(&reply)
        })
        .collect();
    assert!(solo.iter().all(|s| !s.is_empty()), "every solo reply has tokens");
    let distinct: std::collections::HashSet<_> = solo.iter().collect();
    assert!(distinct.len() > 1, "the questions get different replies, or the test shows nothing");

    let compare = |round: &str, replies: &[Json]| {
        for (i, (reply, want)) in replies.iter().zip(&solo).enumerate() {
            let got = generated(reply);
            let first = got.iter().zip(want).position(|(a, b)| a != b);
            assert!(
                got == *want,
                "{round}: request {i} ({:?}) differs from its solo reply at token {first:?} of {}/{}\n got: {got:?}\nwant: {want:?}",
                QUESTIONS[i],
                got.len(),
                want.len()
            );
        }
    };
    compare("all at once, cache off", &all_at_once(server, &bodies(false)));
    compare("all at once, cache cold", &all_at_once(server, &bodies(true)));
    let warm = all_at_once(server, &bodies(true));
    for reply in &warm {
        let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        assert!(cached > 0, "the warm round is served from the cache: {}", reply["usage"]);
    }
    compare("all at once, cache warm", &warm);

    // Two long prompts of other requests arrive with the six: their chunks share the forward
    // passes with the six's prefills and decodes.
    let mut mixed = bodies(true);
    for seed in [1, 2] {
        let long = format!("Summarize these notes:\n{}", filler(seed, long_prompt_words));
        mixed.insert(seed as usize * 2, request(&long, 4, false));
    }
    let mut replies = all_at_once(server, &mixed);
    replies.remove(4);
    replies.remove(2);
    compare("all at once beside long prefills", &replies);
    server.wait_idle();
}

#[test]
fn the_default_model_answers_alike_whatever_the_load_and_the_cache() {
    // The default model, as `radix-serve` with no -m serves it (fetched once into the user's
    // cache; default_model.rs tests the fetch itself). Eight sequences at once, chunks of 256 so
    // that the long prompts take several passes.
    let root = std::env::temp_dir().join(format!("radix-determinism-{}", std::process::id()));
    let mut command = Command::new(binary());
    command
        .args(["--port", "0", "--threads", "2", "-np", "8", "-c", "4096", "--batch-tokens", "256"])
        .env("HF_HOME", root.join("hf"));
    let server = Server::start_custom(command);
    check_rounds(&server, 16, 500);
    drop(server);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_hybrid_model_answers_alike_whatever_the_load_and_the_cache() {
    let dir = workspace_root().join("models/tests/fixtures/tiny/qwen35");
    let template = asset("qwen35_template");
    // The last run keeps K as q8_0 and V as q4_0 blocks (`-ctk`/`-ctv`): quantized per token, so
    // the cache and the load change nothing there either.
    for (file, kv) in [("model-q8_0.gguf", "f16"), ("model-f32.gguf", "f16"), ("model-q8_0.gguf", "quantized")] {
        let model = dir.join(file);
        let mut command = Command::new(binary());
        // A byte vocabulary: 250 words are ~1.6k tokens, prefilled in chunks of 256.
        command.args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2", "-np", "8"]);
        command.args(["-c", "4096", "--batch-tokens", "256", "--chat-template-file", template.to_str().unwrap()]);
        if kv == "quantized" {
            command.args(["-ctk", "q8_0", "-ctv", "q4_0"]);
        }
        let server = Server::start_custom(command);
        check_rounds(&server, 16, 250);
    }
}
