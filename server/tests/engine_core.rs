//! The engine on a tiny random model: prefix sharing between concurrent requests, "the cache
//! never changes the answer", behaviour under KV pressure, page accounting after everything
//! finishes, stop strings and dropped clients ending replies like any other ending, and
//! `ignore_eos`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_models::{KvDType, KvPool, LoadOptions, Model};
use radix_serve::engine::{EngineConfig, EngineCore, EngineEvent, FinishReason, GenerateRequest, Timings};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

mod common;

use common::{request, run};

fn fixture(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny/qwen3").join(file)
}

fn model() -> Model {
    Model::load(
        &fixture("model.safetensors"),
        &LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() },
    )
    .unwrap()
}

/// The tiny model's toy vocabulary, which its GGUF file carries.
fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_gguf_file(fixture("model-f32.gguf")).unwrap())
}

fn engine(pages: usize, page_size: usize, prefix_cache: bool) -> EngineCore {
    let model = model();
    let pool = KvPool::new(model.config(), page_size, pages, KvDType::F32).unwrap();
    let config = EngineConfig::new(4, 16, prefix_cache, 512);
    EngineCore::new(model, pool, config, tokenizer())
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

/// Everything one request heard, in order.
struct Heard {
    text: String,
    tokens: usize,
    end: Option<(FinishReason, Timings)>,
}

fn hear(rx: &mut UnboundedReceiver<EngineEvent>) -> Heard {
    let mut heard = Heard { text: String::new(), tokens: 0, end: None };
    while let Ok(event) = rx.try_recv() {
        match event {
            EngineEvent::Token { text, .. } => {
                heard.text.push_str(&text);
                heard.tokens += 1;
            }
            EngineEvent::Finished { reason, timings, text } => {
                heard.text.push_str(&text);
                heard.end = Some((reason, timings));
            }
            EngineEvent::Failed(m) => panic!("request failed: {m}"),
            EngineEvent::Started { .. } | EngineEvent::Logprobs(_) => {}
        }
    }
    heard
}

fn run_one(engine: &mut EngineCore, request: GenerateRequest) -> Heard {
    let (tx, mut rx) = unbounded_channel();
    engine.add(request, tx);
    while !engine.idle() {
        engine.step();
    }
    engine.check_invariants().unwrap();
    hear(&mut rx)
}

fn latency_counts(engine: &EngineCore) -> (u64, u64) {
    let m = engine.metrics();
    (m.time_to_first_token.count, m.time_per_output_token.count)
}

#[test]
fn a_stop_string_ends_the_reply_in_the_engine_and_counts_like_any_ending() {
    let mut engine = engine(256, 1, true);
    let prompt = prompt(7, &[], 12);
    let plain = run_one(&mut engine, request(prompt.clone(), 16, true));
    let (reason, timings) = plain.end.clone().expect("the reply finished");
    assert_eq!(reason, FinishReason::Length);
    assert_eq!((timings.predicted_n, plain.tokens), (16, 16));
    assert_eq!(latency_counts(&engine), (1, 1));
    // A stop string from the reply's own text, past its first characters.
    let chars: Vec<char> = plain.text.chars().collect();
    assert!(chars.len() >= 8, "the toy vocabulary decodes to text: {:?}", plain.text);
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &plain.text[..plain.text.find(&stop).unwrap()];

    let mut with_stop = request(prompt.clone(), 16, true);
    with_stop.stop_strings = vec![String::new(), stop.clone()];
    let stopped = run_one(&mut engine, with_stop);
    let (reason, stopped_timings) = stopped.end.expect("the reply finished");
    assert_eq!(reason, FinishReason::StopString(stop.clone()));
    assert_eq!(stopped.text, cut, "the text stops right before the stop string");
    assert!(stopped.tokens < 16 && stopped_timings.predicted_n == stopped.tokens);
    assert_eq!(stopped_timings.cache_n + stopped_timings.prompt_n, prompt.len());
    assert!(stopped_timings.prompt_ms >= 0.0 && stopped_timings.predicted_ms >= 0.0);
    let tpot = u64::from(stopped.tokens > 1);
    assert_eq!(latency_counts(&engine), (2, 1 + tpot), "the stopped reply is counted");
}

#[test]
fn ignore_eos_never_picks_a_stop_token_and_runs_to_the_limit() {
    let mut engine = engine(256, 1, true);
    let prompt = prompt(9, &[], 12);
    let plain = run(&mut engine, vec![request(prompt.clone(), 16, false)]).remove(0).tokens;
    assert_eq!(plain.len(), 16);
    // A token the reply picks at its fourth step, made a stop token.
    let stop = plain[3];
    let first = plain.iter().position(|&t| t == stop).unwrap();
    let mut stopping = request(prompt.clone(), 16, false);
    stopping.stop_tokens = vec![stop];
    let stopped = run(&mut engine, vec![stopping.clone()]).remove(0).tokens;
    assert_eq!(stopped, plain[..first], "the stop token ends the reply and is not sent");

    stopping.sampling.ignore_eos = true;
    let heard = run_one(&mut engine, stopping.clone());
    assert_eq!(heard.end.expect("the reply finished").0, FinishReason::Length);
    let ignoring = run(&mut engine, vec![stopping]).remove(0).tokens;
    assert_eq!(ignoring.len(), 16, "the reply runs to max_tokens");
    assert!(!ignoring.contains(&stop), "the stop token is never picked: {ignoring:?}");
    assert_eq!(ignoring[..first], plain[..first], "the same reply up to where it would have stopped");
}

#[test]
fn a_client_gone_after_its_first_tokens_counts_in_the_latency_histograms() {
    let mut engine = engine(64, 1, true);
    let (tx, mut rx) = unbounded_channel();
    engine.add(request(prompt(3, &[], 10), 100, true), tx);
    let mut tokens = 0;
    while tokens < 3 {
        engine.step();
        tokens += hear(&mut rx).tokens;
    }
    drop(rx);
    engine.step();
    assert!(engine.idle(), "the abandoned sequence ended");
    engine.check_invariants().unwrap();
    assert_eq!(latency_counts(&engine), (1, 1));
    assert_eq!(engine.metrics().generated_tokens, tokens as u64);
}

#[test]
fn a_cache_namespace_reuses_only_its_own_prefixes() {
    use radix_serve::engine::CacheNamespace;
    let mut engine = engine(256, 4, true);
    let salted = |salt: Option<&str>| GenerateRequest {
        cache_namespace: CacheNamespace::new(salt),
        ..request(prompt(3, &[], 40), 2, true)
    };
    let cached = |engine: &mut EngineCore, salt| run(engine, vec![salted(salt)])[0].cached;
    assert_eq!(cached(&mut engine, Some("a")), 0);
    assert_eq!(cached(&mut engine, Some("b")), 0, "another namespace starts cold");
    assert_eq!(cached(&mut engine, None), 0, "so does the shared one");
    assert!(cached(&mut engine, Some("a")) >= 36, "the same namespace hits");
    assert!(cached(&mut engine, None) >= 36);
}

/// Two prompts of one namespace that differ only in their first tokens share nothing: the
/// second is served none of the first's K/V and answers as it does with the cache off. (A key
/// that wrote the salt over the first two tokens served it the first's 38 tokens.)
#[test]
fn salted_prompts_that_differ_only_in_their_first_tokens_share_nothing() {
    use radix_serve::engine::CacheNamespace;
    for page_size in [1, 2] {
        let mut engine = engine(256, page_size, true);
        let tail = prompt(7, &[], 38);
        let salted = |head: [u32; 2], use_cache: bool| GenerateRequest {
            cache_namespace: CacheNamespace::new(Some("tenant")),
            ..request([head.as_slice(), &tail].concat(), 8, use_cache)
        };
        let first = run(&mut engine, vec![salted([11, 12], true)]).remove(0);
        assert_eq!(first.cached, 0);
        let second = run(&mut engine, vec![salted([13, 14], true)]).remove(0);
        assert_eq!(second.cached, 0, "page size {page_size}: another prompt's K/V was served");
        let cold = run(&mut engine, vec![salted([13, 14], false)]).remove(0);
        assert_eq!(second.tokens, cold.tokens, "page size {page_size}");
        // Only the very first token differs; one that shares the first token reuses just it.
        let third = run(&mut engine, vec![salted([15, 12], true)]).remove(0);
        assert_eq!(third.cached, 0, "page size {page_size}");
        let fourth = run(&mut engine, vec![salted([11, 16], true)]).remove(0);
        assert_eq!(fourth.cached, if page_size == 1 { 1 } else { 0 }, "page size {page_size}: whole pages only");
        // A one-token prompt works.
        let one = GenerateRequest { cache_namespace: CacheNamespace::new(Some("tenant")), ..request(vec![5], 3, true) };
        assert_eq!(run(&mut engine, vec![one.clone()]).remove(0).tokens, run(&mut engine, vec![one])[0].tokens);
        engine.check_invariants().unwrap();
    }
}

#[test]
fn counts_show_a_step_as_soon_as_it_is_scheduled() {
    let mut engine = engine(256, 4, true);
    let (tx, _rx) = unbounded_channel();
    engine.add(request(prompt(5, &[], 12), 2, true), tx);
    assert_eq!((engine.stats().running, engine.stats().waiting), (0, 1));
    let scheduled = engine.schedule_step().expect("a prompt to prefill");
    assert_eq!((engine.stats().running, engine.stats().waiting), (1, 0), "admitted before the forward pass");
    engine.run_step(scheduled);
}
