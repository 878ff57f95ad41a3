//! The server on the tensor path (what a GPU runs, here on the CPU with `--tensor-path`): the
//! engine drives a KV pool of tensors, the radix cache reuses it, and caching does not change the
//! output (a cached prompt and an extended one answer as they do computed cold).

mod common;

use common::{Server, filler};
use serde_json::{Value as Json, json};

fn completion(server: &Server, prompt: &str, cache: bool) -> Json {
    let body = json!({"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": cache});
    let (status, reply) = server.post("/completion", &body);
    assert_eq!(status, 200, "{reply}");
    reply
}

#[test]
fn tensor_path_serves_and_caches_like_a_cold_prefill() {
    let server = Server::start(&["--tensor-path", "--page-size", "16"]);
    let prompt = filler(7, 150);
    let extended = format!("{prompt} {}", filler(8, 40));
    let first = completion(&server, &prompt, true);
    let again = completion(&server, &prompt, true);
    let longer = completion(&server, &extended, true);
    assert!(again["tokens_cached"].as_u64().unwrap() > 0, "{again}");
    assert!(longer["tokens_cached"].as_u64().unwrap() > 0, "{longer}");
    assert_eq!(first["content"], again["content"]);
    let cold = completion(&server, &extended, false);
    assert_eq!(cold["tokens_cached"], 0, "{cold}");
    assert_eq!(longer["content"], cold["content"], "the cached prefix changed the output");
    assert!(!first["content"].as_str().unwrap().is_empty());
    // Idle, and every page either free or cached: nothing leaked.
    let engine = server.wait_idle();
    assert!(engine["pages_cached"].as_u64().unwrap() > 0, "{engine}");
}
