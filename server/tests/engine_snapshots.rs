//! Recurrent-state snapshots on the radix tree (ARCHITECTURE.md §3), on the tiny Qwen3.5 and
//! Qwen3.5-MoE: agent-shaped conversations (a shared system block, sessions that grow turn by
//! turn, prompts that diverge inside a message, at a message boundary, or not at all) answer
//! with the same greedy tokens and log-probabilities as a cold prefill of the same prompt; every
//! snapshot left in the tree is the state of exactly its prefix; and under a tight snapshot
//! budget with more sessions than slots, the snapshots stay within it and nothing leaks.

use radix_models::StatePool;
use radix_serve::engine::{EngineConfig, EngineCore, GenerateRequest, SamplingParams};

mod common;

use common::hybrid::{cold, cold_state, engine, model, relative_l2};
use common::{Outcome, request, run};

/// Reply length of every request.
const REPLY: usize = 6;

/// A deterministic token source (a linear congruential generator over the toy vocabulary).
struct Tokens(u64);

impl Tokens {
    fn take(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((self.0 >> 33) % 120) as u32 + 4
            })
            .collect()
    }

    fn below(&mut self, n: usize) -> usize {
        self.take(1)[0] as usize % n.max(1)
    }
}

/// A conversation's tokens and its message boundaries, as the chat API would mark them.
#[derive(Debug, Clone, Default)]
struct Prompt {
    tokens: Vec<u32>,
    boundaries: Vec<usize>,
}

/// The two-token stand-in for a template's generation prompt.
const GENERATION_PROMPT: [u32; 2] = [1, 2];

impl Prompt {
    /// The conversation with one more message (of `body`), which starts at a boundary.
    fn message(&self, body: Vec<u32>) -> Prompt {
        let mut p = self.clone();
        if !p.tokens.is_empty() {
            p.boundaries.push(p.tokens.len());
        }
        p.tokens.extend(body);
        p
    }

    /// The prompt asking for a reply: the generation prompt, whose start is a boundary.
    fn ask(&self) -> Prompt {
        let mut p = self.message(GENERATION_PROMPT.to_vec());
        p.boundaries.dedup();
        p
    }

    /// The first `len` tokens, with the boundaries inside them.
    fn cut(&self, len: usize) -> Prompt {
        let boundaries = self.boundaries.iter().copied().filter(|&b| b < len).collect();
        Prompt { tokens: self.tokens[..len].to_vec(), boundaries }
    }

    /// Where the last message before the generation prompt starts.
    fn last_message_start(&self) -> usize {
        let end = self.tokens.len() - GENERATION_PROMPT.len();
        self.boundaries.iter().copied().filter(|&b| b < end).max().unwrap_or(0)
    }

    fn request(&self) -> GenerateRequest {
        let mut r = request(self.tokens.clone(), REPLY, true);
        r.sampling = SamplingParams { temperature: 0.0, logprobs: Some(3), ..Default::default() };
        r.snapshot_points = self.boundaries.clone();
        r
    }
}

/// How a session's request relates to its previous one.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// The next turn: the previous prompt, its reply, a new message.
    NextTurn,
    /// The same prompt again.
    Repeat,
    /// The previous prompt cut inside its last message, then other text.
    InsideMessage,
    /// The previous prompt cut where its last message starts, then another message.
    AtBoundary,
}

impl Shape {
    /// The request of this shape after `previous` answered `reply`, and the fewest prompt tokens
    /// it must resume with: a repeat everything before the generation prompt, a next turn the
    /// previous prompt and reply (the state saved where generation ended), a divergence the
    /// prefix before the last message (the state saved at its boundary); in whole pages of 4.
    fn next(self, previous: &Prompt, reply: &[u32], source: &mut Tokens) -> (Prompt, usize) {
        let len = previous.tokens.len();
        let last_start = previous.last_message_start();
        let page = |n: usize| n / 4 * 4;
        match self {
            Shape::NextTurn => {
                let mut grown = previous.clone();
                grown.tokens.extend(reply);
                let n = 6 + source.below(10);
                (grown.message(source.take(n)).ask(), page(len + reply.len() - 1))
            }
            Shape::Repeat => (previous.clone(), page(len - GENERATION_PROMPT.len())),
            Shape::InsideMessage => {
                let cut = last_start + 1 + source.below(len - GENERATION_PROMPT.len() - last_start - 1);
                let tail = source.take(8);
                let mut p = previous.cut(cut);
                p.tokens.extend(tail);
                (p.ask(), page(last_start))
            }
            Shape::AtBoundary => (previous.cut(last_start).message(source.take(9)).ask(), page(last_start)),
        }
    }
}

/// Checks each outcome against a cold prefill: the same tokens, log-probabilities within the
/// chunking tolerance.
fn check_against_cold(arch: &str, model: &radix_models::Model, prompts: &[Prompt], outcomes: &[Outcome]) {
    for (p, outcome) in prompts.iter().zip(outcomes) {
        let (tokens, logprobs) = cold(model, &p.tokens, REPLY, 3);
        assert_eq!(outcome.tokens, tokens, "{arch}: a prompt of {} tokens, {} cached", p.tokens.len(), outcome.cached);
        for (got, want) in outcome.logprobs.iter().zip(&logprobs) {
            for ((gt, gl), (wt, wl)) in got.top.iter().zip(&want.top) {
                assert!(
                    gt == wt && (gl - wl).abs() < 1e-3,
                    "{arch}: top log-probabilities {:?} vs {:?}",
                    got.top,
                    want.top
                );
            }
        }
    }
}

/// Every snapshot in the tree equals the state of its prefix computed from zero.
fn check_snapshot_states(arch: &str, model: &radix_models::Model, engine: &EngineCore) -> usize {
    let snapshots = engine.snapshot_states();
    for (prefix, state) in &snapshots {
        let error = relative_l2(state, &cold_state(model, prefix));
        assert!(error < 1e-4, "{arch}: the snapshot after {} tokens is off by {error:e}", prefix.len());
    }
    snapshots.len()
}

#[test]
fn snapshot_reuse_answers_what_a_cold_prefill_answers() {
    for arch in ["qwen35", "qwen35moe"] {
        let alone = model(arch);
        let mut config = EngineConfig::new(3, 24, true, 512);
        config.snapshot_interval = 12;
        let mut engine = engine(arch, config);
        let mut source = Tokens(7);
        let system = Prompt::default().message(source.take(26)).message(source.take(14));
        let mut sent: Vec<Prompt> = (0..3).map(|_| system.message(source.take(10)).ask()).collect();
        let mut outcomes = run(&mut engine, sent.iter().map(Prompt::request).collect());
        check_against_cold(arch, &alone, &sent, &outcomes);
        let shapes = [Shape::NextTurn, Shape::Repeat, Shape::NextTurn, Shape::InsideMessage, Shape::AtBoundary];
        let mut requests = sent.len();
        for round in 0..17 {
            // Three sessions' requests run together, each of its own shape this round.
            let mut floors = Vec::new();
            for (s, (previous, outcome)) in sent.iter_mut().zip(&outcomes).enumerate() {
                let shape = shapes[(round + s) % shapes.len()];
                let (next, floor) = shape.next(previous, &outcome.tokens, &mut source);
                floors.push((shape, floor));
                *previous = next;
            }
            outcomes = run(&mut engine, sent.iter().map(Prompt::request).collect());
            check_against_cold(arch, &alone, &sent, &outcomes);
            for ((shape, floor), outcome) in floors.iter().zip(&outcomes) {
                assert!(
                    outcome.cached >= *floor,
                    "{arch} round {round}: {shape:?} resumed at {}, not {floor}",
                    outcome.cached
                );
            }
            requests += sent.len();
        }
        assert!(requests >= 50, "{requests} requests");
        let snapshots = check_snapshot_states(arch, &alone, &engine);
        assert!(snapshots > 10, "{arch}: only {snapshots} snapshots were kept");
        let stats = engine.stats();
        assert_eq!(stats.state_slots_free, stats.state_slots, "{arch}: idle, every sequence state slot is free");
        assert_eq!(stats.snapshots + stats.snapshot_slots_free, stats.snapshot_slots, "{arch}: a snapshot slot leaked");
    }
}

#[test]
fn eight_interleaved_sessions_stay_within_a_tight_snapshot_budget() {
    let arch = "qwen35";
    let alone = model(arch);
    let mut config = EngineConfig::new(4, 32, true, 512);
    config.state_cache_bytes = 6 * StatePool::slot_bytes(alone.config()).unwrap();
    let mut engine = engine(arch, config);
    let mut source = Tokens(11);
    let system = Prompt::default().message(source.take(30)).message(source.take(10));
    let mut sessions: Vec<Prompt> = (0..8).map(|_| system.message(source.take(8)).ask()).collect();
    for turn in 0..3 {
        let outcomes = run(&mut engine, sessions.iter().map(Prompt::request).collect());
        check_against_cold(arch, &alone, &sessions, &outcomes);
        let stats = engine.stats();
        assert_eq!(stats.snapshot_slots, 6);
        assert!(stats.snapshots <= stats.snapshot_slots, "turn {turn}: {} snapshots", stats.snapshots);
        assert_eq!(stats.snapshots + stats.snapshot_slots_free, stats.snapshot_slots, "turn {turn}: a slot leaked");
        assert_eq!(stats.state_slots_free, stats.state_slots, "turn {turn}: a sequence state slot leaked");
        for (session, outcome) in sessions.iter_mut().zip(&outcomes) {
            *session = Shape::NextTurn.next(session, &outcome.tokens, &mut source).0;
        }
    }
    assert!(engine.metrics().evicted_snapshots > 0, "8 sessions in 6 slots must evict snapshots");
    check_snapshot_states(arch, &alone, &engine);
}

#[test]
fn a_prompt_branching_inside_a_message_leaves_a_snapshot_at_the_branch() {
    let arch = "qwen35";
    let alone = model(arch);
    let mut engine = engine(arch, EngineConfig::new(2, 32, true, 512));
    let mut source = Tokens(3);
    let (system, shared) = (source.take(40), source.take(24));
    // Three sessions whose first message starts alike and then differs (another folder's
    // working directory inside one system text).
    let session = |tail: Vec<u32>| {
        let mut text = shared.clone();
        text.extend(tail);
        Prompt::default().message(system.clone()).message(text).ask()
    };
    let first = session(source.take(12));
    let second = session(source.take(12));
    let third = session(source.take(12));
    let mut cached = Vec::new();
    for p in [&first, &second, &third] {
        let outcome = run(&mut engine, vec![p.request()]);
        check_against_cold(arch, &alone, std::slice::from_ref(p), &outcome);
        cached.push(outcome[0].cached);
    }
    // The second resumes at the message boundary (40) though its KV matched to the branch (64);
    // the third resumes at the branch, from the snapshot the second left there.
    assert_eq!(cached, vec![0, 40, 64], "resumed at");
}
