//! Verifying drafted tokens (speculative decoding) in one pass: for a sequence whose last
//! accepted token is followed by drafts, the pass's logits row for each token equals, bit for
//! bit, the logits plain decode steps give there; a hybrid model's state is advanced by the
//! verify pass over its first row only (the sequence's own token), and applying its first `m`
//! rows (in one call or two, the first row skipped as applied) leaves bitwise the state `m`
//! decode steps leave, from which decoding goes on exactly as it would have. The
//! drafts after the first `m` are junk, as rejected drafts are: their K/V must not matter.
//!
//! With a multi-token-prediction head (the `qwen35mtp` and `qwen35moemtp` fixtures, the first
//! from GGUF and from a transformers checkpoint) the state includes the hidden row the head
//! carries, and the head drafts the same after the accepted rows as after a cold pass over the
//! same tokens.
//!
//! Every comparison is bitwise: the engine promises greedy output identical with and without
//! speculation, which holds only if the verify pass computes what decode steps compute.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use radix_models::{ForwardBatch, KvDType, KvPool, LoadOptions, Model, StatePool};

const PAGE_SIZE: usize = 4;
const CASES: u32 = 12;

fn fixtures(arch: &str) -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch);
    match arch {
        // Made from the qwen35 and qwen35moe fixtures by `examples/add_mtp_head.rs`, with
        // `qwen35mtp/hf` the same head in a transformers checkpoint (`examples/mtp_head_to_hf.rs`).
        "qwen35mtp" => vec![dir.join("model-f32.gguf"), dir.join("hf")],
        "qwen35moemtp" => vec![dir.join("model-f32.gguf")],
        _ => vec![dir.join("model-q8_0.gguf"), dir.join("model.safetensors")],
    }
}

/// One sequence's pools: its K/V pages (page `i` is table entry `i`) and, for a hybrid model,
/// state slot 0.
struct Run<'a> {
    model: &'a Model,
    pool: KvPool,
    state: Option<StatePool>,
    table: Vec<u32>,
}

impl<'a> Run<'a> {
    fn new(model: &'a Model) -> Self {
        let config = model.config();
        Run {
            model,
            pool: KvPool::new(config, PAGE_SIZE, 64, KvDType::F16).unwrap(),
            state: config.hybrid.is_some().then(|| model.new_state_pool(1).unwrap()),
            table: (0..64).collect(),
        }
    }

    fn slot(&self) -> Option<u32> {
        self.state.as_ref().map(|_| 0)
    }

    /// Runs `tokens` ending at context `end`; the logits of every row (`verify`) or the last.
    fn pass(&mut self, tokens: &[u32], end: usize, verify: bool) -> Vec<Vec<f32>> {
        let mut batch = ForwardBatch::default();
        let table = self.table[..end.div_ceil(PAGE_SIZE)].to_vec();
        if verify {
            batch.push_verify(tokens, end, table, self.slot());
        } else {
            batch.push_with_state(tokens, end, table, true, self.slot());
        }
        self.model.forward_with_state(&batch, &mut self.pool, self.state.as_mut()).unwrap().to_vec2::<f32>().unwrap()
    }

    fn state(&self) -> Option<Vec<f32>> {
        self.state.as_ref().map(|s| s.read_slot(0).unwrap())
    }

    /// The multi-token-prediction head's greedy draft of 3 tokens after `token` at `position`.
    fn draft(&mut self, token: u32, position: usize) -> Vec<u32> {
        let request = radix_models::MtpDraftRequest {
            token,
            position,
            page_table: &self.table[..(position + 3).div_ceil(PAGE_SIZE)],
            state_slot: 0,
            max_tokens: 3,
        };
        let state = self.state.as_ref().unwrap();
        self.model.draft_mtp(&mut self.pool, state, &[request], 0.0).unwrap().remove(0)
    }
}

fn check(arch: &str) {
    for path in fixtures(arch) {
        let headed = arch.ends_with("mtp");
        let model = Model::load(&path, &LoadOptions { mtp: headed, ..LoadOptions::default() }).unwrap();
        assert_eq!(model.has_mtp_head(), headed);
        let vocab = model.config().vocab_size as u32;
        let mut runner = TestRunner::new(Config { cases: CASES, failure_persistence: None, ..Config::default() });
        let case = (
            prop::collection::vec(0..vocab, 1..12),
            prop::collection::vec(0..vocab, 2..10),
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            0..vocab,
        );
        runner
            .run(&case, |(prompt, continuation, accept, split, junk)| {
                let span = continuation.len();
                let accepted = accept.index(span) + 1;
                // Decode steps, one token at a time: the logits and state after each.
                let mut plain = Run::new(&model);
                plain.pass(&prompt, prompt.len(), false);
                let mut steps = Vec::new();
                for (i, &token) in continuation.iter().enumerate() {
                    let logits = plain.pass(&[token], prompt.len() + i + 1, false).remove(0);
                    steps.push((logits, plain.state()));
                }
                // The same continuation verified in one pass, its drafts past `accepted` junk.
                let mut spec = Run::new(&model);
                spec.pass(&prompt, prompt.len(), false);
                let before = spec.state();
                let mut drafted = continuation.clone();
                for t in &mut drafted[accepted..] {
                    *t = (*t + junk) % vocab;
                }
                let rows = spec.pass(&drafted, prompt.len() + span, true);
                prop_assert_eq!(rows.len(), span, "a logits row per verified token");
                for (i, row) in rows.iter().enumerate().take(accepted) {
                    prop_assert!(row == &steps[i].0, "{}: row {} of the verify pass differs from decode", arch, i);
                }
                // The verify pass advances the recurrent state over its first row (the
                // sequence's own token) and no further; a head's carried row waits for
                // `apply_verified`.
                if let (Some(after), Some(before), Some(first)) = (spec.state(), before, steps[0].1.clone()) {
                    let n = after.len() - if model.has_mtp_head() { model.config().hidden_size } else { 0 };
                    prop_assert!(after[..n] == first[..n], "{}: the verify pass's state is not one step's", arch);
                    prop_assert!(after[n..] == before[n..], "{}: the verify pass moved the carried row", arch);
                }
                if let Some(state) = spec.state.as_mut() {
                    let split = split.index(accepted + 1);
                    model.apply_verified(state, 0, 0..split).unwrap();
                    if split < accepted {
                        model.apply_verified(state, 0, split..accepted).unwrap();
                    }
                    state.discard_verified(0);
                    prop_assert!(model.apply_verified(state, 0, accepted..accepted).is_err(), "span discarded");
                }
                prop_assert!(
                    spec.state() == steps[accepted - 1].1,
                    "{}: the state after {} accepted rows differs from decode's",
                    arch,
                    accepted
                );
                // Decoding goes on from the accepted length as it would have.
                if accepted < span {
                    let logits = spec.pass(&[continuation[accepted]], prompt.len() + accepted + 1, false).remove(0);
                    prop_assert!(logits == steps[accepted].0, "{}: decode after the rejected drafts differs", arch);
                    prop_assert!(spec.state() == steps[accepted].1);
                    if model.has_mtp_head() {
                        // After one more token: the head's draft equals a cold pass's there.
                        let end = prompt.len() + accepted + 1;
                        let mut cold = Run::new(&model);
                        cold.pass(&[&prompt[..], &continuation[..=accepted]].concat(), end, false);
                        let next = (continuation[accepted] + 1) % vocab;
                        let (want, got) = (cold.draft(next, end), spec.draft(next, end));
                        prop_assert_eq!(want.len(), 3);
                        prop_assert_eq!(want, got, "{}: the head drafts otherwise after verified rows", arch);
                    }
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{arch} ({}): {e}", path.display()));
    }
}

#[test]
fn qwen3_verifies_drafts_as_decode_steps() {
    check("qwen3");
}

#[test]
fn qwen35_verifies_drafts_as_decode_steps() {
    check("qwen35");
}

#[test]
fn qwen35moe_verifies_drafts_as_decode_steps() {
    check("qwen35moe");
}

#[test]
fn qwen35_with_mtp_head_verifies_drafts_as_decode_steps() {
    check("qwen35mtp");
}

#[test]
fn qwen35moe_with_mtp_head_verifies_drafts_as_decode_steps() {
    check("qwen35moemtp");
}

#[test]
fn llama_verifies_drafts_as_decode_steps() {
    check("llama");
}

/// Rows out of order, past the span, or on a slot with nothing verified are refused.
#[test]
fn applying_a_span_out_of_order_is_refused() {
    let path = fixtures("qwen35").remove(1);
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let mut run = Run::new(&model);
    run.pass(&[1, 2, 3], 3, false);
    let mut state = run.state.take().unwrap();
    assert!(model.apply_verified(&mut state, 0, 0..1).is_err(), "nothing verified yet");
    run.state = Some(state);
    run.pass(&[4, 5, 6], 6, true);
    let mut state = run.state.take().unwrap();
    // The pass applied row 0 itself: a call starts at row 0 or row 1.
    assert!(model.apply_verified(&mut state, 0, 2..3).is_err(), "must start at row 0 or 1");
    assert!(model.apply_verified(&mut state, 0, 0..4).is_err(), "only 3 rows");
    model.apply_verified(&mut state, 0, 0..2).unwrap();
    assert!(model.apply_verified(&mut state, 0, 1..3).is_err(), "must continue at row 2");
    assert!(model.apply_verified(&mut state, 0, 0..3).is_err(), "must continue at row 2, not restart");
    model.apply_verified(&mut state, 0, 2..3).unwrap();
    assert!(model.apply_verified(&mut state, 0, 3..3).is_err(), "the last row frees the span");
}

/// The engine's reading of a pass ([`Model::forward_pass`]: each sequence's first logits row
/// computed with the pass, a verified span's others on first use) gives every row, its argmax
/// and the whole tensor bitwise as the eager pass does, for a batch mixing a plain decode step,
/// a prefill chunk and two verified spans.
#[test]
fn deferred_logits_rows_are_the_eager_ones() {
    for arch in ["qwen3", "qwen35", "qwen35mtp"] {
        let model =
            Model::load(&fixtures(arch)[0], &LoadOptions { mtp: arch == "qwen35mtp", ..LoadOptions::default() })
                .unwrap();
        let config = model.config();
        let hybrid = config.hybrid.is_some();
        let pools = || {
            let kv = KvPool::new(config, PAGE_SIZE, 64, KvDType::F16).unwrap();
            (kv, hybrid.then(|| model.new_state_pool(4).unwrap()))
        };
        let tables: Vec<Vec<u32>> = (0..4u32).map(|s| (s * 16..s * 16 + 16).collect()).collect();
        let slot = |s: u32| hybrid.then_some(s);
        let run = |kv: &mut KvPool, state: &mut Option<StatePool>, lazy: bool| {
            for (s, prompt) in [[5u32, 6, 7], [8, 9, 10], [11, 12, 13]].iter().enumerate() {
                let mut warm = ForwardBatch::default();
                warm.push_with_state(prompt, 3, tables[s][..1].to_vec(), false, slot(s as u32));
                model.forward_with_state(&warm, kv, state.as_mut()).unwrap();
            }
            let mut batch = ForwardBatch::default();
            batch.push_with_state(&[20], 4, tables[0][..1].to_vec(), true, slot(0));
            batch.push_verify(&[21, 22, 23, 24], 6, tables[1][..2].to_vec(), slot(1));
            batch.push_with_state(&[25, 26, 27], 3, tables[3][..1].to_vec(), true, slot(3));
            batch.push_verify(&[28, 29], 4, tables[2][..1].to_vec(), slot(2));
            if lazy {
                let pass = model.forward_pass(&batch, kv, state.as_mut()).unwrap();
                let rows: Vec<Vec<f32>> = (0..pass.len()).rev().map(|i| pass.row(i).unwrap()).rev().collect();
                (rows, pass.argmax().unwrap(), pass.to_tensor().unwrap().to_vec2::<f32>().unwrap())
            } else {
                let t = model.forward_with_state(&batch, kv, state.as_mut()).unwrap();
                let argmax = t.argmax(1).unwrap().to_vec1::<u32>().unwrap();
                let rows = t.to_vec2::<f32>().unwrap();
                (rows.clone(), argmax, rows)
            }
        };
        let ((mut kv_a, mut st_a), (mut kv_b, mut st_b)) = (pools(), pools());
        let (eager, eager_argmax, _) = run(&mut kv_a, &mut st_a, false);
        let (rows, argmax, whole) = run(&mut kv_b, &mut st_b, true);
        assert_eq!(rows.len(), 1 + 4 + 1 + 2, "{arch}: a row per logits row");
        assert!(rows == eager, "{arch}: a deferred row differs from the eager pass's");
        assert_eq!(argmax, eager_argmax, "{arch}");
        assert!(whole == eager, "{arch}: the whole tensor differs");
    }
}
