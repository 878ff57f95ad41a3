//! The tiny hybrid models (`models/tests/fixtures/tiny/{qwen35,qwen35moe,qwen35mtp,qwen35moemtp}`)
//! and what the model alone answers, for the engine tests of hybrid models.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_models::{ForwardBatch, KvDType, KvPool, LoadOptions, Model};
use radix_serve::engine::{EngineConfig, EngineCore, TokenLogprobs};

/// A file of a tiny model's fixture.
pub fn fixture(arch: &str, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny").join(arch).join(file)
}

/// The tiny model of `arch` from its F32 GGUF, on one thread (`qwen35mtp`, `qwen35moemtp`: with
/// its multi-token-prediction head running).
pub fn model(arch: &str) -> Model {
    let mtp = arch.ends_with("mtp");
    let options = LoadOptions { threads: 1, dequantize_weights: false, mtp, ..Default::default() };
    Model::load(&fixture(arch, "model-f32.gguf"), &options).unwrap()
}

/// An engine over the tiny model of `arch` with KV pages of 4 tokens.
pub fn engine(arch: &str, config: EngineConfig) -> EngineCore {
    let model = model(arch);
    let pool = KvPool::new(model.config(), 4, 1024, KvDType::F32).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf_file(fixture(arch, "model-f32.gguf")).unwrap());
    EngineCore::new(model, pool, config, tokenizer)
}

/// What the model alone answers greedily: one prefill, then one token at a time, with each
/// step's log-probabilities (the `top` most likely).
pub fn cold(model: &Model, prompt: &[u32], steps: usize, top: usize) -> (Vec<u32>, Vec<TokenLogprobs>) {
    let mut kv = model.new_kv_pool(4, 256, KvDType::F32).unwrap();
    let mut state = model.new_state_pool(1).unwrap();
    let pages: Vec<u32> = (0..256).collect();
    let (mut tokens, mut out, mut logprobs) = (prompt.to_vec(), Vec::new(), Vec::new());
    let mut done = 0;
    for _ in 0..steps {
        let mut batch = ForwardBatch::default();
        batch.push_with_state(&tokens[done..], tokens.len(), pages.clone(), true, Some(0));
        let logits = model.forward_with_state(&batch, &mut kv, Some(&mut state)).unwrap();
        let row = logits.get(0).unwrap().to_vec1::<f32>().unwrap();
        let next = row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap();
        logprobs.push(TokenLogprobs::from_logits(&row, next, top));
        done = tokens.len();
        tokens.push(next);
        out.push(next);
    }
    (out, logprobs)
}

/// The recurrent state after `prefix`, computed in one pass from zero (conv then SSM per layer,
/// as `StatePool::read_slot`).
pub fn cold_state(model: &Model, prefix: &[u32]) -> Vec<f32> {
    let mut kv = model.new_kv_pool(4, 256, KvDType::F32).unwrap();
    let mut state = model.new_state_pool(1).unwrap();
    let mut batch = ForwardBatch::default();
    batch.push_with_state(prefix, prefix.len(), (0..256).collect(), true, Some(0));
    model.forward_with_state(&batch, &mut kv, Some(&mut state)).unwrap();
    state.read_slot(0).unwrap()
}

/// `|a - b| / |b|` over the whole vectors.
pub fn relative_l2(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}
