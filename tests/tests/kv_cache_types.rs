//! Quantized KV cache (`-ctk/--cache-type-k`, `-ctv/--cache-type-v`, as llama-server's): the
//! same `--kv-cache` holds ~1.88x (q8_0) and ~3.56x (q4_0) the tokens of f16, `/props` and the
//! start-up line say so, a prompt served from a quantized prefix cache answers as the same
//! prompt cold on the same format, and what the kernels cannot read is refused with a message
//! that names the flag. (Determinism under load with quantized K/V: determinism.rs.)

mod common;

use std::process::Command;

use common::{Server, asset, binary, workspace_root};
use serde_json::{Value as Json, json};

/// `/props`' `kv_cache` of SmolLM2 (head size 64) with `--kv-cache 64` and `flags`.
fn kv_cache(flags: &[&str]) -> (Json, Vec<String>) {
    let mut args = vec!["--kv-cache", "64", "-c", "2048"];
    args.extend_from_slice(flags);
    let server = Server::start(&args);
    let props = server.get("/props");
    (props["kv_cache"].clone(), server.log())
}

#[test]
fn quantized_types_hold_more_tokens_in_the_same_budget() {
    let (f16, _) = kv_cache(&[]);
    let (q8, log) = kv_cache(&["-ctk", "q8_0", "-ctv", "q8_0"]);
    let (q4, _) = kv_cache(&["--cache-type-k", "q4_0", "--cache-type-v", "q4_0"]);
    let (mixed, _) = kv_cache(&["-ctk", "q8_0", "-ctv", "q4_0"]);
    assert_eq!((f16["type_k"].as_str(), f16["type_v"].as_str()), (Some("f16"), Some("f16")), "{f16}");
    assert_eq!((q8["type_k"].as_str(), q8["type_v"].as_str()), (Some("q8_0"), Some("q8_0")), "{q8}");
    assert_eq!((mixed["type_k"].as_str(), mixed["type_v"].as_str()), (Some("q8_0"), Some("q4_0")), "{mixed}");
    let tokens = |j: &Json| j["capacity_tokens"].as_u64().unwrap_or_else(|| panic!("capacity in {j}")) as f64;
    let (base, q8_ratio, q4_ratio) = (tokens(&f16), tokens(&q8) / tokens(&f16), tokens(&q4) / tokens(&f16));
    assert!(base > 0.0);
    // 64 / 34 = 1.88 and 64 / 18 = 3.56, less a page's rounding.
    assert!(q8_ratio >= 1.85, "q8_0 holds {q8_ratio:.3}x f16's tokens");
    assert!(q4_ratio >= 3.4, "q4_0 holds {q4_ratio:.3}x f16's tokens");
    assert!(tokens(&mixed) > tokens(&q8) && tokens(&mixed) < tokens(&q4), "{mixed}");
    let line = log.iter().find(|l| l.contains("KV capacity")).expect("the start-up line");
    assert!(line.contains(&format!("KV capacity {} tokens (q8_0)", tokens(&q8))), "{line}");
}

/// Greedy replies with logprobs from a quantized prefix cache equal the same prompts cold, on
/// the dense SmolLM2 (q8_0 K, q4_0 V) and the hybrid tiny model (q4_0 K, q8_0 V).
#[test]
fn a_prompt_served_from_a_quantized_prefix_cache_answers_as_cold() {
    let reply = |server: &Server, prompt: &str, cache: bool| {
        let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "n_probs": 3, "cache_prompt": cache});
        let (status, reply) = server.post("/completion", &body);
        assert_eq!(status, 200, "{reply}");
        reply
    };
    let check = |server: Server| {
        let base = "Notes on the build: the server keeps every prompt's K/V in pages, and ".repeat(8);
        for (i, tail) in
            ["the first question is why.", "a second one asks how.", "a third asks when."].iter().enumerate()
        {
            let prompt = format!("{base}{tail}");
            let warm = reply(&server, &prompt, true);
            if i > 0 {
                let cached = warm["tokens_cached"].as_u64().or(warm["timings"]["cache_n"].as_u64()).unwrap_or(0);
                assert!(cached > 100, "request {i} reuses the shared prefix: {}", warm["timings"]);
            }
            let cold = reply(&server, &prompt, false);
            assert_eq!(warm["content"], cold["content"], "request {i}");
            assert_eq!(warm["completion_probabilities"], cold["completion_probabilities"], "request {i}");
        }
        server.wait_idle();
    };
    check(Server::start(&["-ctk", "q8_0", "-ctv", "q4_0", "-c", "2048"]));
    let model = workspace_root().join("models/tests/fixtures/tiny/qwen35/model-q8_0.gguf");
    let mut command = Command::new(binary());
    command.args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2", "-c", "2048"]);
    command.args(["-ctk", "q4_0", "-ctv", "q8_0", "--snapshot-interval", "64"]);
    command.args(["--chat-template-file", asset("qwen35_template").to_str().unwrap()]);
    check(Server::start_custom(command));
}

#[test]
fn types_the_kernels_do_not_read_are_refused_with_the_flag_named() {
    let run = |args: &[&str]| {
        let out = Command::new(binary()).args(args).args(["--port", "0"]).output().expect("the binary runs");
        assert!(!out.status.success(), "{args:?} must not start");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--cache-type-k", "q5_1"]);
    assert!(err.contains("q5_1") && err.contains("q8_0"), "{err}");
    let err = run(&["-ctk", "f32", "-ctv", "q8_0"]);
    assert!(err.contains("--cache-type-k") && err.contains("f32") && err.contains("q8_0"), "{err}");
    // The tiny Llama's heads are 16 values: not whole blocks of 32.
    let model = workspace_root().join("models/tests/fixtures/tiny/llama/model-f32.gguf");
    let template = asset("qwen35_template");
    let err = run(&["-m", model.to_str().unwrap(), "--chat-template-file", template.to_str().unwrap(), "-ctv", "q4_0"]);
    assert!(err.contains("q4_0") && err.contains("16") && err.contains("f16"), "{err}");
    // The tensor path off CUDA (as Metal runs it) gathers pages with candle ops, which read no
    // blocks.
    let err = run(&["--tensor-path", "-ctk", "q8_0"]);
    assert!(err.contains("q8_0") && err.contains("CUDA") && err.contains("f16"), "{err}");
}
