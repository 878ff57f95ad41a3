//! Truncation on the tiny dense (Qwen3) and hybrid (Qwen3.5) models: a running sequence cut
//! back to an earlier length goes on exactly as a fresh request of the shorter prompt would,
//! wherever the cut falls (in its reply, on a page boundary, inside a prompt the tree shares,
//! inside a prefix it was placed on), and the cache's invariants hold after every step.

use std::path::PathBuf;
use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_models::{KvDType, KvPool, LoadOptions, Model};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::engine::{EngineConfig, EngineCore, EngineEvent, GenerateRequest, SamplingParams};

/// Tokens per KV page: small, so that cuts fall inside pages, on their boundaries and inside
/// the tree's.
const PAGE: usize = 4;

/// Tokens each request generates.
const REPLY: usize = 10;

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny").join(arch).join("model-f32.gguf")
}

fn engine(arch: &str, prefix_cache: bool) -> EngineCore {
    let options = LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() };
    let model = Model::load(&fixture(arch), &options).unwrap();
    let pool = KvPool::new(model.config(), PAGE, 256, KvDType::F32).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf_file(fixture(arch)).unwrap());
    let mut config = EngineConfig::new(2, 16, prefix_cache, 512);
    config.snapshot_interval = 8;
    EngineCore::new(model, pool, config, tokenizer)
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        max_tokens,
        stop_tokens: Vec::new(),
        stop_strings: Vec::new(),
        use_cache: true,
        constraint: None,
        tenant: Default::default(),
        cache_namespace: Default::default(),
        snapshot_points: Vec::new(),
        expected_points: Vec::new(),
        branch_points: Vec::new(),
        draft_max: None,
    }
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7 + 3) % 120 + 4).collect()
}

/// The tokens received so far.
fn drain(events: &mut UnboundedReceiver<EngineEvent>, tokens: &mut Vec<u32>) {
    while let Ok(event) = events.try_recv() {
        match event {
            EngineEvent::Token { id, .. } => tokens.push(id),
            EngineEvent::Failed(message) => panic!("request failed: {message}"),
            _ => {}
        }
    }
}

fn step_until(engine: &mut EngineCore, mut done: impl FnMut(&EngineCore) -> bool) {
    for _ in 0..10_000 {
        if done(engine) {
            return;
        }
        engine.step();
        engine.check_invariants().unwrap();
    }
    panic!("the engine does not get there");
}

/// The greedy reply to `prompt` of a fresh engine without a prefix cache.
fn fresh_reply(arch: &str, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut engine = engine(arch, false);
    let (tx, mut rx) = unbounded_channel();
    engine.add(request(prompt.to_vec(), max_tokens), tx);
    step_until(&mut engine, EngineCore::idle);
    let mut tokens = Vec::new();
    drain(&mut rx, &mut tokens);
    tokens
}

/// Runs `prompt` (after `warm`, a request of the same prompt that fills the cache, when set)
/// until `generated` tokens are out, cuts it to `len` tokens, and checks that what it generates
/// then is what a fresh request of those `len` tokens generates.
fn cut_and_compare(arch: &str, prompt_len: usize, warm: bool, generated: usize, len: usize) {
    let mut engine = engine(arch, true);
    let prompt = prompt(prompt_len);
    if warm {
        let (tx, _rx) = unbounded_channel();
        engine.add(request(prompt.clone(), 3), tx);
        step_until(&mut engine, EngineCore::idle);
    }
    let (tx, mut rx) = unbounded_channel();
    engine.add(request(prompt.clone(), REPLY), tx);
    let mut before = Vec::new();
    step_until(&mut engine, |_| {
        drain(&mut rx, &mut before);
        before.len() >= generated
    });
    assert_eq!(before.len(), generated, "{arch}: one token a step");
    let all: Vec<u32> = prompt.iter().chain(&before).copied().collect();
    engine.truncate_running(0, len).unwrap();
    engine.check_invariants().unwrap();
    step_until(&mut engine, EngineCore::idle);
    let mut after = Vec::new();
    drain(&mut rx, &mut after);
    let left = if len > prompt_len { REPLY - (len - prompt_len) } else { REPLY };
    let expected = fresh_reply(arch, &all[..len], left);
    assert_eq!(after, expected, "{arch}: prompt {prompt_len}, warm {warm}, cut after {generated} to {len}");
    let stats = engine.stats();
    assert_eq!(stats.pages_free + stats.pages_cached, stats.pages_total, "{arch}: every page back");
}

/// Cuts inside the reply (a draft's rejected tail), on a page boundary and one token after it,
/// at the prompt's end, inside the prompt the sequence shared with the tree, and inside the
/// prefix it was placed on.
fn truncations(arch: &str) {
    let prompt_len = 18;
    for (warm, generated, len) in [
        (false, 6, 21),
        (false, 6, 20),
        (false, 6, 23),
        (false, 6, 19),
        (false, 6, 18),
        (false, 6, 13),
        (true, 4, 9),
        (true, 4, 2),
        (false, 1, 19),
    ] {
        cut_and_compare(arch, prompt_len, warm, generated, len);
    }
}

#[test]
fn dense_sequence_cut_back_goes_on_as_a_fresh_request() {
    truncations("qwen3");
}

#[test]
fn hybrid_sequence_cut_back_goes_on_as_a_fresh_request() {
    truncations("qwen35");
}

#[test]
fn bad_truncations_are_refused_and_change_nothing() {
    let mut engine = engine("qwen3", true);
    let (tx, mut rx) = unbounded_channel();
    engine.add(request(prompt(10), REPLY), tx);
    let mut out = Vec::new();
    step_until(&mut engine, |_| {
        drain(&mut rx, &mut out);
        out.len() >= 2
    });
    let before = engine.stats();
    assert!(engine.truncate_running(0, 0).is_err());
    assert!(engine.truncate_running(0, 13).is_err(), "past its length");
    assert_eq!(engine.stats(), before);
    engine.check_invariants().unwrap();
}
