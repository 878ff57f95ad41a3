//! The engine on a tiny hybrid model (Qwen3.5: Gated DeltaNet layers with a recurrent state
//! per sequence, `models/tests/fixtures/tiny/qwen35`): concurrent requests whose prefill
//! chunks and decode steps share batches answer exactly what each request alone answers, state
//! slots are handed back and reused cleanly, and no prefix is reused (its state is not kept).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_models::{ForwardBatch, KvDType, KvPool, LoadOptions, Model};
use radix_serve::engine::{EngineConfig, EngineCore};

mod common;

use common::{request, run};

fn fixture(arch: &str, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny").join(arch).join(file)
}

fn model(arch: &str) -> Model {
    let options = LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() };
    Model::load(&fixture(arch, "model-f32.gguf"), &options).unwrap()
}

fn engine(arch: &str, max_running: usize, batch_tokens: usize) -> EngineCore {
    let model = model(arch);
    let pool = KvPool::new(model.config(), 4, 512, KvDType::F32).unwrap();
    let config = EngineConfig { max_running, batch_tokens, prefix_cache: true, max_context: 512 };
    let tokenizer = Arc::new(Tokenizer::from_gguf_file(fixture(arch, "model-f32.gguf")).unwrap());
    EngineCore::new(model, pool, config, tokenizer)
}

/// Greedy tokens from the model alone: one prefill, then one token at a time.
fn greedy(model: &Model, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut kv = model.new_kv_pool(4, 128, KvDType::F32).unwrap();
    let mut state = model.new_state_pool(1).unwrap();
    let pages: Vec<u32> = (0..128).collect();
    let (mut tokens, mut out) = (prompt.to_vec(), Vec::new());
    let mut done = 0;
    for _ in 0..steps {
        let mut batch = ForwardBatch::default();
        batch.push_with_state(&tokens[done..], tokens.len(), pages.clone(), true, Some(0));
        let logits = model.forward_with_state(&batch, &mut kv, Some(&mut state)).unwrap();
        let next = logits.get(0).unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap();
        done = tokens.len();
        tokens.push(next);
        out.push(next);
    }
    out
}

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
        let want: Vec<Vec<u32>> = prompts().iter().map(|p| greedy(&alone_model, p, 6)).collect();
        assert!(want.iter().any(|w| w != &want[0]), "{arch}: the prompts must lead to different replies");
        // Four running at once, 16 tokens a pass: prefill chunks and decode steps share batches,
        // and later requests take the state slots earlier ones gave back.
        let mut engine = engine(arch, 4, 16);
        for round in 0..2 {
            let out = run(&mut engine, prompts().into_iter().map(|p| request(p, 6, true)).collect());
            for (i, (outcome, want)) in out.iter().zip(&want).enumerate() {
                assert_eq!(&outcome.tokens, want, "{arch} round {round} request {i}");
                assert_eq!(outcome.cached, 0, "{arch}: a hybrid model reuses no prefix without its recurrent state");
            }
        }
    }
}
