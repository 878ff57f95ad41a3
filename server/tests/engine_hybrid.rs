//! The engine on a tiny hybrid model (Qwen3.5: Gated DeltaNet layers with a recurrent state
//! per sequence, `models/tests/fixtures/tiny/qwen35`): concurrent requests whose prefill
//! chunks and decode steps share batches answer exactly what each request alone answers, state
//! slots are handed back and reused cleanly, and a repeated prompt resumes from a snapshot.

use radix_serve::engine::EngineConfig;

mod common;

use common::hybrid::{cold, engine, model};
use common::{request, run};

fn prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..30).map(|i| (i * 11 + 3) % 128).collect();
    (0..6u32)
        .map(|seed| {
            let mut p = shared.clone();
            p.extend((0..3 + seed).map(|i| (seed * 31 + i * 7) % 128));
            p
        })
        .collect()
}

#[test]
fn concurrent_hybrid_requests_answer_what_each_alone_answers() {
    for arch in ["qwen35", "qwen35moe"] {
        let alone_model = model(arch);
        let want: Vec<Vec<u32>> = prompts().iter().map(|p| cold(&alone_model, p, 6, 0).0).collect();
        assert!(want.iter().any(|w| w != &want[0]), "{arch}: the prompts must lead to different replies");
        // Four running at once, 16 tokens a pass: prefill chunks and decode steps share batches,
        // and later requests take the state slots earlier ones gave back.
        let mut engine = engine(arch, EngineConfig::new(4, 16, true, 512));
        for round in 0..2 {
            let out = run(&mut engine, prompts().into_iter().map(|p| request(p, 6, true)).collect());
            for (i, (outcome, want)) in out.iter().zip(&want).enumerate() {
                assert_eq!(&outcome.tokens, want, "{arch} round {round} request {i}");
                if round == 1 {
                    // A raw prompt's snapshot is all but its last token, in whole pages of 4.
                    let len = prompts()[i].len();
                    assert_eq!(outcome.cached, (len - 1) / 4 * 4, "{arch}: request {i} sent again resumes");
                }
            }
        }
        let stats = engine.stats();
        assert_eq!(stats.state_slots_free, stats.state_slots, "{arch}: idle, every state slot is free");
    }
}
