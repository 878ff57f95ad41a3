//! Test helpers: the SmolLM2 tokenizer and a decode loop over random logits.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use radix_models::tokenizer::Tokenizer;

use super::Constraint;
use crate::engine::{Sampler, SamplingParams};

/// SmolLM2-135M's tokenizer (49152 tokens, byte-level BPE), from the pinned test assets.
pub(crate) fn smollm2() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    Arc::clone(TOKENIZER.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
        let out = Command::new("bash")
            .arg(root.join("scripts/assets.sh"))
            .args(["path", "smollm2"])
            .output()
            .expect("bash runs");
        assert!(out.status.success(), "scripts/assets.sh path smollm2: {}", String::from_utf8_lossy(&out.stderr));
        let path = String::from_utf8(out.stdout).expect("utf-8 path");
        Arc::new(Tokenizer::from_gguf_file(path.trim()).expect("SmolLM2's GGUF tokenizer loads"))
    }))
}

/// What a decode loop under a constraint produced.
pub(crate) struct Walk {
    pub(crate) text: String,
    /// It ended on a stop token or a complete grammar (not on the step limit).
    pub(crate) ended: bool,
}

/// Decodes from seeded random logits (a stand-in for a model that knows nothing) through the
/// mask and the real sampler, checking each sampled token against the mask, the way the engine
/// step does it.
pub(crate) fn walk(mut constraint: Constraint, tokenizer: &Tokenizer, temperature: f32, seed: u64) -> Walk {
    let stop: Vec<u32> = tokenizer.eos_token_ids().iter().copied().collect();
    let params = SamplingParams { temperature, seed: Some(seed), ..Default::default() };
    let mut sampler = Sampler::new(params, &[]);
    let mut state = seed ^ 0x5DEE_CE66;
    let mut tokens = Vec::new();
    // The model's logits rows may be wider than the vocabulary; the extra ids must stay masked.
    let width = tokenizer.vocab_size() + 64;
    for _ in 0..400 {
        let mut logits: Vec<f32> = (0..width)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 8.0
            })
            .collect();
        constraint.mask_logits(&mut logits, &stop).expect("the grammar allows some token");
        let token = sampler.sample(&mut logits.clone());
        assert!(logits[token as usize] > f32::NEG_INFINITY, "sampled a masked token {token}");
        assert!((token as usize) < tokenizer.vocab_size(), "sampled a padding id {token}");
        if stop.contains(&token) {
            return Walk { text: tokenizer.decode(&tokens, false).unwrap(), ended: true };
        }
        constraint.accept(token).expect("a masked sample keeps the grammar alive");
        tokens.push(token);
        if constraint.is_finished() {
            return Walk { text: tokenizer.decode(&tokens, false).unwrap(), ended: true };
        }
    }
    Walk { text: tokenizer.decode(&tokens, false).unwrap(), ended: false }
}
