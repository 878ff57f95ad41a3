//! A step that fails (here: a panic injected by a debug build's `RADIX_SERVE_FAULT_TOKEN`) fails
//! the requests of its batch with a 500 that names the cause; the engine goes on, the next
//! request succeeds, `/health` stays "ok", and no page is lost. It used to end generation for
//! good while `/health` kept answering "ok".

mod common;

use common::Server;
use serde_json::json;

/// A token no test prompt holds: the last id of SmolLM2's vocabulary.
const FAULT_TOKEN: u32 = 49151;

#[test]
fn a_failed_step_fails_its_batch_and_the_engine_goes_on() {
    let server = Server::start_with_env(&[], &[("RADIX_SERVE_FAULT_TOKEN", &FAULT_TOKEN.to_string())]);
    let good = json!({"prompt": "The capital of France is", "n_predict": 4, "temperature": 0});
    let (status, before) = server.post("/completion", &good);
    assert_eq!(status, 200, "{before}");

    let (status, failed) = server.post("/completion", &json!({"prompt": [1, FAULT_TOKEN, 2], "n_predict": 4}));
    assert_eq!(status, 500, "{failed}");
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("the engine failed") && message.contains("injected fault"), "{failed}");

    assert_eq!(server.get("/health")["status"], "ok");
    let (status, after) = server.post("/completion", &good);
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["content"], before["content"], "the same greedy reply after the engine recovered");
    assert!(server.log().iter().any(|l| l.contains("an engine step failed")), "the failure is logged");
    // wait_idle checks that every page is free or cached: none leaked by the failed step.
    server.wait_idle();
}
