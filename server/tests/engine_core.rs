//! The engine on a tiny random model: prefix sharing between concurrent requests, "the cache
//! never changes the answer", behaviour under KV pressure, and page accounting after everything
//! finishes.

use std::path::Path;

use radix_models::{KvDType, KvPool, LoadOptions, Model};
use radix_serve::engine::{EngineConfig, EngineCore, EngineEvent, GenerateRequest, SamplingParams};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

fn model() -> Model {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny/qwen3/model.safetensors");
    Model::load(&path, &LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() }).unwrap()
}

fn engine(pages: usize, page_size: usize, prefix_cache: bool) -> EngineCore {
    let model = model();
    let pool = KvPool::new(model.config(), page_size, pages, KvDType::F32).unwrap();
    let config = EngineConfig { max_running: 4, batch_tokens: 16, prefix_cache, max_context: 512 };
    EngineCore::new(model, pool, config)
}

fn request(prompt: Vec<u32>, max_tokens: usize, use_cache: bool) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        max_tokens,
        stop_tokens: vec![],
        use_cache,
        constraint: None,
    }
}

struct Outcome {
    cached: usize,
    tokens: Vec<u32>,
}

fn run(engine: &mut EngineCore, requests: Vec<GenerateRequest>) -> Vec<Outcome> {
    let mut receivers: Vec<UnboundedReceiver<EngineEvent>> = Vec::new();
    for r in requests {
        let (tx, rx) = unbounded_channel();
        engine.add(r, tx);
        receivers.push(rx);
    }
    let mut steps = 0;
    while !engine.idle() {
        engine.step();
        engine.check_invariants().unwrap();
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    receivers
        .into_iter()
        .map(|mut rx| {
            let mut outcome = Outcome { cached: 0, tokens: Vec::new() };
            while let Ok(event) = rx.try_recv() {
                match event {
                    EngineEvent::Started { cached_tokens, .. } => outcome.cached = cached_tokens,
                    EngineEvent::Token(t) => outcome.tokens.push(t),
                    EngineEvent::Finished { .. } | EngineEvent::Logprobs(_) => {}
                    EngineEvent::Failed(m) => panic!("request failed: {m}"),
                }
            }
            outcome
        })
        .collect()
}

fn prompt(seed: u32, shared: &[u32], len: usize) -> Vec<u32> {
    let mut p = shared.to_vec();
    p.extend((0..len as u32).map(|i| (seed.wrapping_mul(31).wrapping_add(i * 7)) % 128));
    p
}

#[test]
fn concurrent_requests_compute_a_shared_prefix_once() {
    let mut engine = engine(256, 1, true);
    let shared: Vec<u32> = (0..40).map(|i| (i * 5 + 1) % 128).collect();
    let out = run(&mut engine, vec![request(prompt(1, &shared, 5), 4, true), request(prompt(2, &shared, 5), 4, true)]);
    assert_eq!(out[0].cached, 0);
    assert_eq!(out[1].cached, 40, "the second request waits for the first's prefill and reuses it");
}

#[test]
fn cache_never_changes_the_answer() {
    let shared: Vec<u32> = (0..30).map(|i| (i * 11 + 3) % 128).collect();
    for page_size in [1, 4] {
        let mut cached_engine = engine(512, page_size, true);
        let mut cold_engine = engine(512, page_size, false);
        for round in 0..3 {
            let requests: Vec<_> =
                (0..6).map(|i| request(prompt(round * 10 + i, &shared, 3 + i as usize), 6, true)).collect();
            let with_cache = run(&mut cached_engine, requests.clone());
            let without = run(&mut cold_engine, requests);
            for (a, b) in with_cache.iter().zip(&without) {
                assert_eq!(a.tokens, b.tokens, "page size {page_size}, round {round}");
                assert_eq!(b.cached, 0);
            }
            if round > 0 {
                assert!(with_cache.iter().all(|o| o.cached >= 28), "later rounds reuse the shared prefix");
            }
        }
        // A conversation's next turn hits everything the last one computed.
        let first = prompt(99, &shared, 4);
        let reply = run(&mut cached_engine, vec![request(first.clone(), 5, true)]).remove(0);
        let mut next = first.clone();
        next.extend(&reply.tokens);
        next.extend([5, 6, 7]);
        let again = run(&mut cached_engine, vec![request(next, 2, true)]).remove(0);
        assert!(again.cached + page_size >= first.len() + reply.tokens.len(), "{} cached", again.cached);
    }
}

#[test]
fn kv_pressure_evicts_cache_and_holds_requests_back_without_failing_running_ones() {
    // 70 slots: each request needs about 30, so at most two run and the cache must be evicted.
    let mut engine = engine(70, 1, true);
    let requests: Vec<_> = (0..6).map(|i| request(prompt(i, &[], 24), 6, true)).collect();
    let out = run(&mut engine, requests);
    assert!(out.iter().all(|o| o.tokens.len() == 6), "every request completes");
    engine.flush_cache();
    let stats = engine.stats();
    assert_eq!(stats.pages_free, stats.pages_total, "every page is free after a flush");
    engine.check_invariants().unwrap();
}

#[test]
fn oversized_prompts_and_dropped_clients_are_handled() {
    let mut engine = engine(32, 1, true);
    let (tx, mut rx) = unbounded_channel();
    engine.add(request(prompt(1, &[], 40), 2, true), tx);
    assert!(matches!(rx.try_recv(), Ok(EngineEvent::Failed(m)) if m.contains("--kv-cache")));
    let (tx, rx) = unbounded_channel();
    engine.add(request(prompt(2, &[], 10), 100, true), tx);
    engine.step();
    drop(rx);
    engine.step();
    assert!(engine.idle(), "a request whose client left is dropped");
    engine.check_invariants().unwrap();
    let stats = engine.stats();
    assert_eq!(stats.pages_free + stats.pages_cached, stats.pages_total);
}
