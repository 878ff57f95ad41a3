//! Speculative decoding on the tiny dense (Qwen3) and hybrid (Qwen3.5) models: the same
//! requests through an engine that drafts by prompt lookup and one that does not give the same
//! tokens and log-probabilities, greedy and seeded sampling alike, with grammars, stop strings,
//! penalties, `max_tokens`, prefix-cache hits, snapshots and several sequences verified side by
//! side with prefill chunks; drafts are both accepted and rejected on the way, and when
//! everything is done no page or state slot is left behind. The same on the tiny Qwen3.5 with a
//! multi-token-prediction head, drafting by prompt lookup where it matches and with the head
//! elsewhere.

use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_serve::engine::constraint::ConstraintFactory;
use radix_serve::engine::draft::{SpecConfig, SpecType};
use radix_serve::engine::{EngineConfig, EngineCore, GenerateRequest, SamplingParams};

mod common;

use common::hybrid::{engine, fixture};
use common::{Outcome, request, run};

/// Requests of each kind; all kinds together make more than 50 per model.
const PER_KIND: usize = 10;

fn config(spec: bool) -> EngineConfig {
    config_of(if spec { SpecType::Ngram } else { SpecType::None })
}

fn config_of(spec_type: SpecType) -> EngineConfig {
    let mut config = EngineConfig::new(3, 24, true, 512);
    config.snapshot_interval = 8;
    config.spec = SpecConfig { spec_type, draft_max: 12, ngram_min: 2, ..SpecConfig::default() };
    config
}

/// A deterministic stream of token ids in the toy vocabulary's ordinary range.
fn tokens(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97) >> 7) % 100 + 4).collect()
}

/// Prompts that draft well (a block repeated, so the reply is likely to copy it) and badly
/// (no repeats), some sharing a prefix with earlier ones.
fn prompt(i: usize) -> Vec<u32> {
    let seed = i as u32;
    match i % 4 {
        0 => tokens(seed, 8 + i % 17),
        1 => {
            let block = tokens(seed, 6 + i % 5);
            block.iter().chain(&tokens(seed + 50, 3)).chain(&block).chain(&block[..3]).copied().collect()
        }
        2 => {
            let mut p = prompt(i - 2);
            p.extend(tokens(seed, 5));
            p
        }
        _ => [tokens(seed, 4), tokens(seed, 4), tokens(seed, 4), tokens(seed, 4)].concat(),
    }
}

fn greedy(i: usize) -> GenerateRequest {
    let mut r = request(prompt(i), 20 + i % 13, true);
    if i.is_multiple_of(3) {
        r.sampling.logprobs = Some(2);
    }
    r.snapshot_points = vec![prompt(i).len() / 2];
    r
}

fn sampled(i: usize) -> GenerateRequest {
    let mut r = request(prompt(i + 1), 24, true);
    r.sampling = SamplingParams {
        temperature: 0.9,
        top_k: if i.is_multiple_of(2) { 0 } else { 20 },
        repetition_penalty: if i.is_multiple_of(3) { 1.2 } else { 1.0 },
        seed: Some(1_000 + i as u64),
        ..Default::default()
    };
    r
}

fn constrained(i: usize, factory: &ConstraintFactory) -> GenerateRequest {
    let mut r = request(prompt(i + 2), 30, true);
    let grammar = r#"start: item (" " item)*
item: "ab" | "ba" | "abc" | "c""#;
    r.constraint = Some(factory.lark(grammar).unwrap());
    r
}

/// The reply's text up to a stop string taken from the middle of the plain engine's reply.
fn with_stop(mut r: GenerateRequest, plain: &Outcome, tokenizer: &Tokenizer) -> GenerateRequest {
    let text = tokenizer.decode(&plain.tokens, false).unwrap();
    let chars: Vec<char> = text.chars().collect();
    let middle = chars.len() / 2;
    r.stop_strings = vec![chars[middle..(middle + 2).min(chars.len())].iter().collect()];
    r
}

fn requests(arch: &str, tokenizer: &Arc<Tokenizer>) -> Vec<GenerateRequest> {
    let factory = ConstraintFactory::new(tokenizer).unwrap();
    let mut all = Vec::new();
    for i in 0..PER_KIND {
        all.push(greedy(i));
        all.push(sampled(i));
        all.push(constrained(i, &factory));
    }
    // Stop strings from the plain engine's own replies to greedy requests.
    let mut plain = engine(arch, config(false));
    let replies = run(&mut plain, (0..PER_KIND).map(|i| greedy(i + PER_KIND)).collect());
    for (i, reply) in replies.iter().enumerate() {
        all.push(with_stop(greedy(i + PER_KIND), reply, tokenizer));
    }
    // The first requests again: full prefix-cache hits.
    for i in 0..PER_KIND {
        all.push(greedy(i));
    }
    all
}

/// Runs the requests a few at a time through a plain and a speculating engine.
fn check(arch: &str) {
    check_with(arch, SpecType::Ngram);
}

fn check_with(arch: &str, spec_type: SpecType) {
    let tokenizer = Arc::new(Tokenizer::from_gguf_file(fixture(arch, "model-f32.gguf")).unwrap());
    let (mut plain, mut spec) = (engine(arch, config(false)), engine(arch, config_of(spec_type)));
    // Twice: a grammar's constraint is a request's own.
    let (for_plain, for_spec) = (requests(arch, &tokenizer), requests(arch, &tokenizer));
    assert!(for_spec.len() >= 50);
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for (plain_wave, spec_wave) in for_plain.chunks(5).zip(for_spec.chunks(5)) {
        want.extend(run(&mut plain, plain_wave.to_vec()));
        got.extend(run(&mut spec, spec_wave.to_vec()));
    }
    for (i, (want, got)) in want.iter().zip(&got).enumerate() {
        assert_eq!(want.tokens, got.tokens, "{arch}: request {i}'s tokens differ with speculation");
        assert_eq!(want.logprobs, got.logprobs, "{arch}: request {i}'s log-probabilities differ");
    }
    let metrics = spec.metrics();
    assert_eq!(plain.metrics().spec_rounds, 0);
    assert!(metrics.spec_accepted_tokens > 20, "{arch}: drafts accepted: {}", metrics.spec_accepted_tokens);
    assert!(
        metrics.spec_accepted_tokens < metrics.spec_drafted_tokens,
        "{arch}: some drafts must be rejected to test rollback ({} of {})",
        metrics.spec_accepted_tokens,
        metrics.spec_drafted_tokens
    );
    if spec_type.mtp() {
        assert!(metrics.spec_head_drafted_tokens > 20, "{arch}: the head drafted {}", metrics.spec_head_drafted_tokens);
    } else {
        assert_eq!(metrics.spec_head_drafted_tokens, 0);
    }
    assert_no_leak(&mut spec);
}

/// Every page is free or cached (all free once the cache is flushed), every state slot free.
fn assert_no_leak(engine: &mut EngineCore) {
    let stats = engine.stats();
    assert_eq!(stats.pages_free + stats.pages_cached, stats.pages_total, "a page left behind");
    assert_eq!(stats.state_slots_free, stats.state_slots, "a state slot left behind");
    engine.flush_cache();
    let stats = engine.stats();
    assert_eq!(stats.pages_free, stats.pages_total);
    assert_eq!(stats.snapshot_slots_free, stats.snapshot_slots, "a snapshot slot left behind");
}

#[test]
fn dense_speculation_changes_no_token() {
    check("qwen3");
}

#[test]
fn hybrid_speculation_changes_no_token() {
    check("qwen35");
}

#[test]
fn mtp_head_speculation_changes_no_token() {
    check_with("qwen35mtp", SpecType::NgramAndMtp);
}

#[test]
fn moe_mtp_head_speculation_changes_no_token() {
    check_with("qwen35moemtp", SpecType::NgramAndMtp);
}

/// A request that opts out drafts nothing; the others on the same engine still do.
#[test]
fn a_request_can_opt_out() {
    let mut spec = engine("qwen3", config(true));
    let mut opted_out = request(prompt(1), 30, true);
    opted_out.draft_max = Some(0);
    run(&mut spec, vec![opted_out]);
    assert_eq!(spec.metrics().spec_rounds, 0);
    run(&mut spec, vec![request(prompt(1), 30, true)]);
    assert!(spec.metrics().spec_rounds > 0);
}
