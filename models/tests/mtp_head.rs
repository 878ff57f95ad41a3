//! The multi-token-prediction head (`LoadOptions::mtp`; the `qwen35mtp` and `qwen35moemtp`
//! fixtures are the tiny Qwen3.5 and Qwen3.5-MoE with a head appended by
//! `examples/add_mtp_head.rs`): loaded only when asked, one
//! more KV layer and a carried hidden row when loaded, the decoder's logits unchanged by it,
//! and its drafts the same however the prompt was computed (one pass, chunks, token by token,
//! resumed from a copied state slot), bit for bit, as the prefix cache needs: the head's K/V
//! and carried row are cached with the prefix whatever chunks computed it. The same head from
//! a transformers checkpoint (`qwen35mtp/hf`, written by `examples/mtp_head_to_hf.rs`) drafts
//! as the GGUF's.

use std::path::PathBuf;

use radix_models::{ForwardBatch, KvDType, KvPool, LoadOptions, Model, MtpDraftRequest, StatePool};

const PAGE_SIZE: usize = 4;
/// The fixtures with a head: the tiny Qwen3.5 and Qwen3.5-MoE (its head's MLP sparse too).
const HEADED: [&str; 2] = ["qwen35mtp", "qwen35moemtp"];
const PAGES: usize = 32;

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch).join("model-f32.gguf")
}

fn load(arch: &str, mtp: bool) -> Model {
    Model::load(&fixture(arch), &LoadOptions { threads: 2, mtp, ..LoadOptions::default() }).unwrap()
}

/// A prompt of the toy vocabulary's ordinary ids.
fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + 11) % 100 + 4).collect()
}

/// One pool of pages (page `i` is table entry `i`) and two state slots.
struct Pools {
    kv: KvPool,
    state: StatePool,
    table: Vec<u32>,
}

impl Pools {
    fn new(model: &Model) -> Self {
        Pools {
            kv: KvPool::new(model.config(), PAGE_SIZE, PAGES, KvDType::F32).unwrap(),
            state: model.new_state_pool(2).unwrap(),
            table: (0..PAGES as u32).collect(),
        }
    }

    /// Computes `tokens[from..]` in chunks of at most `chunk` on `slot`; the logits of each
    /// chunk's last token.
    fn prefill(&mut self, model: &Model, tokens: &[u32], from: usize, chunk: usize, slot: u32) -> Vec<Vec<f32>> {
        let mut logits = Vec::new();
        let mut done = from;
        while done < tokens.len() {
            let end = (done + chunk).min(tokens.len());
            let mut batch = ForwardBatch::default();
            batch.push_with_state(
                &tokens[done..end],
                end,
                self.table[..end.div_ceil(PAGE_SIZE)].to_vec(),
                true,
                Some(slot),
            );
            let out = model.forward_with_state(&batch, &mut self.kv, Some(&mut self.state)).unwrap();
            logits.push(out.get(0).unwrap().to_vec1::<f32>().unwrap());
            done = end;
        }
        logits
    }

    /// The head's draft of up to `max_tokens` after `token` at `position`, on `slot`.
    fn draft(
        &mut self,
        model: &Model,
        token: u32,
        position: usize,
        slot: u32,
        max_tokens: usize,
        p_min: f32,
    ) -> Vec<u32> {
        let request = MtpDraftRequest {
            token,
            position,
            page_table: &self.table[..(position + max_tokens.max(1)).div_ceil(PAGE_SIZE)],
            state_slot: slot,
            max_tokens,
        };
        model.draft_mtp(&mut self.kv, &self.state, &[request], p_min).unwrap().remove(0)
    }
}

#[test]
fn the_head_loads_only_when_asked() {
    let plain = load("qwen35mtp", false);
    assert!(!plain.has_mtp_head());
    assert_eq!((plain.config().mtp_layers, plain.config().num_kv_layers()), (1, 2));
    assert!(
        plain.load_notes().iter().any(|n| n.contains("skipped the multi-token-prediction head's 1 layer")),
        "{:?}",
        plain.load_notes()
    );
    let with = load("qwen35mtp", true);
    assert!(with.has_mtp_head() && with.config().mtp_head);
    assert_eq!(with.config().num_kv_layers(), 3, "the head's attention is one more KV layer");
    let carried = StatePool::slot_bytes(with.config()).unwrap() - StatePool::slot_bytes(plain.config()).unwrap();
    assert_eq!(carried, with.config().hidden_size * 4, "a state slot carries one hidden row more");
    // Pools made for one cannot run the other.
    let mut pools = Pools::new(&plain);
    let mut batch = ForwardBatch::default();
    batch.push_with_state(&[5, 6], 2, vec![0], true, Some(0));
    assert!(with.forward_with_state(&batch, &mut pools.kv, Some(&mut pools.state)).is_err());
    // A file without a head has nothing to load or say; asking it to draft is an error.
    let none = load("qwen35", true);
    assert!(!none.has_mtp_head() && none.load_notes().iter().all(|n| !n.contains("multi-token")));
    let mut pools = Pools::new(&none);
    let request = MtpDraftRequest { token: 5, position: 0, page_table: &[0], state_slot: 0, max_tokens: 1 };
    assert!(none.draft_mtp(&mut pools.kv, &pools.state, &[request], 0.0).is_err());
}

/// The decoder's logits are the same bits with the head loaded (it only adds work beside them).
#[test]
fn the_head_changes_no_logits() {
    for arch in HEADED {
        let (plain, with) = (load(arch, false), load(arch, true));
        let tokens = prompt(30);
        let (mut a, mut b) = (Pools::new(&plain), Pools::new(&with));
        for chunk in [30, 7, 1] {
            let want = a.prefill(&plain, &tokens, 0, chunk, 0);
            let got = b.prefill(&with, &tokens, 0, chunk, 0);
            assert!(want == got, "{arch}, chunks of {chunk}: logits differ with the head loaded");
        }
    }
}

/// The head's K/V and carried row depend on the tokens only: its drafts and the slot's state are
/// the same bits after one pass, chunks, single tokens, and a slot resumed from a copy.
#[test]
fn drafts_do_not_depend_on_how_the_prompt_was_computed() {
    for arch in HEADED {
        drafts_do_not_depend_on_how_the_prompt_was_computed_for(arch);
    }
}

fn drafts_do_not_depend_on_how_the_prompt_was_computed_for(arch: &str) {
    let model = load(arch, true);
    assert!(model.has_mtp_head(), "{arch}: {:?}", model.load_notes());
    let tokens = prompt(37);
    let next = 42;
    let mut results = Vec::new();
    for chunk in [37, 5, 1] {
        let mut pools = Pools::new(&model);
        pools.prefill(&model, &tokens, 0, chunk, 0);
        let state = pools.state.read_slot(0).unwrap();
        results.push((format!("chunks of {chunk}"), pools.draft(&model, next, tokens.len(), 0, 5, 0.0), state));
    }
    // Resumed: the first 20 tokens on slot 0, copied to slot 1 (a snapshot restored), the rest there.
    let mut pools = Pools::new(&model);
    pools.prefill(&model, &tokens[..20], 0, 8, 0);
    pools.state.copy_slot(0, 1).unwrap();
    pools.state.clear_slot(0).unwrap();
    pools.prefill(&model, &tokens, 20, 6, 1);
    let state = pools.state.read_slot(1).unwrap();
    results.push(("resumed from a copied slot".into(), pools.draft(&model, next, tokens.len(), 1, 5, 0.0), state));
    let (_, want_draft, want_state) = &results[0];
    assert_eq!(want_draft.len(), 5, "p_min 0 drafts all 5");
    for (how, draft, state) in &results[1..] {
        assert_eq!(draft, want_draft, "{arch}, {how}: the head drafts otherwise");
        assert!(state == want_state, "{arch}, {how}: the state slot (with its carried row) differs");
    }
    // Drafting twice from the same point drafts the same: its steps' K/V are overwritten, not read.
    assert_eq!(&pools.draft(&model, next, tokens.len(), 1, 5, 0.0), want_draft);
    // A threshold no token reaches drafts nothing; so does a limit of zero.
    assert!(pools.draft(&model, next, tokens.len(), 1, 5, 1.0).is_empty());
    assert!(pools.draft(&model, next, tokens.len(), 1, 0, 0.0).is_empty());
}

/// A transformers checkpoint's head (`mtp.fc`, `mtp.layers.0.*`, ...: the fixture's `hf/`, the
/// same head written by `examples/mtp_head_to_hf.rs`) loads as the GGUF's does: the decoder's
/// logits and the head's drafts agree after prompts of several lengths, and without `mtp` it is
/// skipped with the same note.
#[test]
fn a_transformers_checkpoint_s_head_drafts_as_the_gguf_s() {
    let dir = fixture("qwen35mtp").parent().unwrap().join("hf");
    let hf = |mtp| Model::load(&dir, &LoadOptions { threads: 2, mtp, ..LoadOptions::default() }).unwrap();
    let plain = hf(false);
    assert!(!plain.has_mtp_head());
    assert!(
        plain.load_notes().iter().any(|n| n.contains("`--spec-type draft-mtp` runs it")),
        "{:?}",
        plain.load_notes()
    );
    let (hf, gguf) = (hf(true), load("qwen35mtp", true));
    assert!(hf.has_mtp_head() && hf.config().num_kv_layers() == gguf.config().num_kv_layers());
    let rel = |a: &[f32], b: &[f32]| {
        let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        (d / b.iter().map(|y| y * y).sum::<f32>()).sqrt()
    };
    let mut drafted = 0;
    for len in [5, 19, 37] {
        let tokens = prompt(len);
        let (mut a, mut b) = (Pools::new(&gguf), Pools::new(&hf));
        let (want, got) = (a.prefill(&gguf, &tokens, 0, 8, 0), b.prefill(&hf, &tokens, 0, 8, 0));
        for (w, g) in want.iter().zip(&got) {
            assert!(rel(g, w) < 1e-5, "prompt of {len}: decoder logits differ by {}", rel(g, w));
        }
        let draft = a.draft(&gguf, 42, len, 0, 4, 0.0);
        assert_eq!(b.draft(&hf, 42, len, 0, 4, 0.0), draft, "prompt of {len}");
        drafted += draft.len();
    }
    assert_eq!(drafted, 12, "every draft runs to its 4 tokens with p_min 0");
}
