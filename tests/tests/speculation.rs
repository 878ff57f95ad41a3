//! Speculative decoding through the real binary (`--spec-type ngram`): drafts change the speed,
//! never the reply. On SmolLM2 and the tiny hybrid model with a multi-token-prediction head
//! (Gated DeltaNet state verified read-only and applied for the accepted rows; drafts by prompt
//! lookup and by the head), every reply drafted by prompt lookup must equal
//! the same request opted out (`"speculative": false`) token for token and log-probability for
//! log-probability: alone, streamed, beside other requests, cut by a stop string. The
//! acceptance shows in `timings` and adds up to `/metrics`; a bad per-request limit is a 400.
//! The engine-level identity over many more requests: `server/tests/engine_speculation.rs`.

mod common;

use std::process::Command;

use common::{Server, asset, binary, workspace_root};
use serde_json::{Value as Json, json};

/// A short Python file a reply will quote: prompt lookup drafts what the model copies.
const FILE: &str = "def area(width, height):\n    \"\"\"The area of a rectangle.\"\"\"\n    return width * height\n\n\n\
def perimeter(width, height):\n    \"\"\"The perimeter of a rectangle.\"\"\"\n    return 2 * (width + height)\n\n\n\
def describe(width, height):\n    a = area(width, height)\n    p = perimeter(width, height)\n    \
return f\"{width}x{height}: area {a}, perimeter {p}\"\n\n\nif __name__ == \"__main__\":\n    \
print(describe(3, 4))\n    print(describe(5, 12))\n";

/// Requests that draft well (an edit of [`FILE`], a list to go on with) and one that drafts
/// little (a question), greedy with log-probabilities.
fn requests(max_tokens: usize) -> Vec<Json> {
    let asks = [
        format!("Here is geometry.py:\n```python\n{FILE}```\nRewrite the whole file with `area` renamed to `surface`."),
        format!("Repeat this file exactly, then say done.\n```python\n{FILE}```"),
        "Count from 1 to 40, one number per line, each as `n: item n`.".to_owned(),
        "What is a prefix cache? Answer in two sentences.".to_owned(),
    ];
    asks.iter()
        .map(|ask| {
            json!({
                "messages": [{"role": "user", "content": ask}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "logprobs": true,
            })
        })
        .collect()
}

/// The generated tokens with their log-probabilities as the server wrote them (equal text,
/// equal bits).
fn generated(replies: &[&Json]) -> Vec<(String, String)> {
    replies
        .iter()
        .filter_map(|r| r["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .map(|t| (t["token"].to_string(), t["logprob"].to_string()))
        .collect()
}

fn opted_out(body: &Json) -> Json {
    let mut body = body.clone();
    body["speculative"] = json!(false);
    body
}

fn ok(server: &Server, body: &Json) -> Json {
    let (status, reply) = server.post("/v1/chat/completions", body);
    assert_eq!(status, 200, "{reply}");
    reply
}

/// Tokens drafted and accepted by a reply, from its `timings` (absent: nothing drafted).
fn drafts(timings: &Json) -> (u64, u64) {
    let drafted = timings["draft_n"].as_u64().unwrap_or(0);
    let accepted = timings["draft_n_accepted"].as_u64().unwrap_or(0);
    assert!(accepted <= drafted, "{timings}");
    (drafted, accepted)
}

fn metric(server: &Server, name: &str) -> u64 {
    let text = server.get_text("/metrics");
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} in {text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Every check on one server; returns the tokens drafted and accepted by its replies.
fn check(server: &Server, max_tokens: usize) -> (u64, u64) {
    let bodies = requests(max_tokens);
    let plain: Vec<Json> = bodies.iter().map(|b| ok(server, &opted_out(b))).collect();
    for reply in &plain {
        assert_eq!(drafts(&reply["timings"]), (0, 0), "an opted-out request drafts nothing: {}", reply["timings"]);
    }
    let mut total = (0, 0);
    let mut add = |timings: &Json| {
        let (d, a) = drafts(timings);
        total = (total.0 + d, total.1 + a);
    };

    // Alone.
    for (body, expected) in bodies.iter().zip(&plain) {
        let reply = ok(server, body);
        assert_eq!(generated(&[&reply]), generated(&[expected]), "alone: {body}");
        assert_eq!(reply["choices"][0]["message"], expected["choices"][0]["message"]);
        add(&reply["timings"]);
    }

    // Streamed: no rejected token is ever sent.
    for (body, expected) in bodies.iter().zip(&plain) {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let chunks: Vec<Json> = server
            .stream(&body)
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let refs: Vec<&Json> = chunks.iter().collect();
        assert_eq!(generated(&refs), generated(&[expected]), "streamed: {body}");
        let timings = chunks.iter().rev().find(|c| c.get("timings").is_some()).expect("a chunk with timings");
        add(&timings["timings"]);
    }

    // All at once: verify passes packed beside other sequences' decode steps.
    let replies: Vec<Json> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies.iter().map(|b| scope.spawn(move || ok(server, b))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (reply, expected) in replies.iter().zip(&plain) {
        assert_eq!(generated(&[reply]), generated(&[expected]), "all at once");
        add(&reply["timings"]);
    }

    // Cut by a stop string taken from the middle of the plain reply: the drafted reply stops at
    // the same place, whatever was drafted past it.
    let text = plain[0]["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let chars: Vec<char> = text.chars().collect();
    if chars.len() > 24 {
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 6].iter().collect();
        let mut body = bodies[0].clone();
        body["stop"] = json!([stop]);
        let (cut, expected) = (ok(server, &body), ok(server, &opted_out(&body)));
        assert_eq!(cut["choices"][0]["message"], expected["choices"][0]["message"], "stop {stop:?}");
        assert_eq!(cut["choices"][0]["finish_reason"], "stop");
        add(&cut["timings"]);
    }

    // A bad limit is the client's error, and the server goes on.
    for (field, value) in [("speculative.n_max", json!(-1)), ("speculative", json!("yes"))] {
        let mut body = bodies[0].clone();
        body[field] = value;
        let (status, reply) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 400, "{field}: {reply}");
        assert!(reply["error"]["message"].as_str().unwrap().contains("speculative"), "{reply}");
    }
    // Drafting limited per request, llama-server's way: the same reply.
    let mut limited = bodies[1].clone();
    limited["speculative.n_max"] = json!(2);
    let reply = ok(server, &limited);
    assert_eq!(generated(&[&reply]), generated(&[&plain[1]]), "n_max 2");
    add(&reply["timings"]);

    server.wait_idle();
    assert_eq!(metric(server, "radix_serve_spec_drafted_tokens_total"), total.0, "/metrics adds up the timings");
    assert_eq!(metric(server, "radix_serve_spec_accepted_tokens_total"), total.1);
    total
}

#[test]
fn drafts_change_the_speed_never_the_reply_of_smollm2() {
    let server = Server::start(&["--spec-type", "ngram", "-np", "4", "-c", "2048"]);
    let (drafted, accepted) = check(&server, 160);
    assert!(accepted > 40, "copying replies draft well: {accepted} of {drafted} accepted");
    assert!(accepted < drafted, "some drafts rejected, so rollback ran: {accepted} of {drafted}");
    let log = server.log().join("\n");
    assert!(log.contains("speculative decoding: prompt lookup"), "the start-up log says it drafts");
}

/// The tiny Qwen3.5 with a multi-token-prediction head, drafting by prompt lookup where it
/// matches and with the head elsewhere (`--spec-type ngram,draft-mtp`).
#[test]
fn drafts_change_the_speed_never_the_reply_of_the_hybrid_model() {
    let model = workspace_root().join("models/tests/fixtures/tiny/qwen35mtp/model-f32.gguf");
    let template = asset("qwen35_template");
    let mut command = Command::new(binary());
    command.args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2", "-np", "4", "-c", "4096"]);
    command.args(["--chat-template-file", template.to_str().unwrap(), "--spec-type", "ngram,draft-mtp"]);
    // A byte vocabulary: 4 matching tokens are 4 bytes, rarely repeated by random weights; 2
    // bytes draft often, and mostly badly.
    command.args(["--spec-ngram-n-match", "2"]);
    let server = Server::start_custom(command);
    // Random weights: drafts are mostly rejected (the engine test has accepted ones on hybrid
    // models); what matters here is that the state kept for the accepted rows only gives the
    // same reply through the real server.
    let (drafted, _) = check(&server, 120);
    assert!(drafted > 0, "the hybrid model drafts");
    let by_head = metric(&server, "radix_serve_spec_head_drafted_tokens_total");
    assert!(by_head > 0 && by_head <= drafted, "the head drafted {by_head} of {drafted}");
    let engine = server.get("/health")["engine"].clone();
    assert_eq!(engine["state_slots_free"], engine["state_slots"], "no state slot left behind: {engine}");
    let log = server.log().join("\n");
    assert!(log.contains("prompt lookup, else the model's MTP head"), "the start-up log says how it drafts");
}

/// `draft-mtp` on a model without a head is refused at start-up, naming the problem.
#[test]
fn draft_mtp_needs_a_model_with_a_head() {
    let model = workspace_root().join("models/tests/fixtures/tiny/qwen35/model-q8_0.gguf");
    let output = Command::new(binary())
        .args(["-m", model.to_str().unwrap(), "--port", "0", "--spec-type", "draft-mtp"])
        .output()
        .expect("radix-serve runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--spec-type draft-mtp") && stderr.contains("no multi-token-prediction head"), "{stderr}");
}

#[test]
fn a_bad_spec_flag_is_named_before_the_model_loads() {
    let output = Command::new(binary())
        .args(["-m", asset("smollm2").to_str().unwrap(), "--spec-type", "ngram", "--spec-draft-n-min", "9"])
        .args(["--spec-draft-n-max", "4"])
        .output()
        .expect("radix-serve runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--spec-draft-n-min") && !stderr.contains("listening"), "{stderr}");
}
