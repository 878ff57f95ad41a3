//! The disk tier for hybrid models, on the tiny Qwen3.5 and Qwen3.5-MoE: recurrent-state
//! snapshots are written beside the page files, so after a restart the next turn of every
//! session resumes from disk and answers what a cold prefill answers; damaged snapshot files are
//! recomputed, never served; snapshots keep to half the disk budget and the whole budget holds.

use std::path::Path;
use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_models::{KvDType, KvPool, StatePool};
use radix_serve::engine::{DiskTier, EngineConfig, EngineCore, ModelIdentity};

mod common;

use common::hybrid::{cold, fixture, model};
use common::{Outcome, TempDir, request, run};

const REPLY: usize = 5;
const PAGE: usize = 4;

/// An engine over the tiny model of `arch` (pages of 4 tokens) with a disk tier in `dir` of
/// `budget` bytes.
fn engine(arch: &str, dir: &Path, budget: u64) -> EngineCore {
    let model = model(arch);
    let pool = KvPool::new(model.config(), PAGE, 1024, KvDType::F32).unwrap();
    let identity = ModelIdentity::of(&fixture(arch, "model-f32.gguf"), "f32, page size 4", "test").unwrap();
    let state_bytes = StatePool::slot_bytes(model.config()).unwrap();
    let tier = DiskTier::open_hybrid(dir, &identity, budget, &pool, state_bytes).unwrap().0;
    let tokenizer = Arc::new(Tokenizer::from_gguf_file(fixture(arch, "model-f32.gguf")).unwrap());
    let mut config = EngineConfig::new(3, 24, true, 512);
    config.snapshot_interval = 16;
    EngineCore::new(model, pool, config, tokenizer).with_disk_tier(tier)
}

/// Three sessions' first prompts: a 30-token system block of its own and a question.
fn first_prompts() -> Vec<Vec<u32>> {
    (0..3u32)
        .map(|s| {
            (0..30).map(|i| (s * 37 + i * 5 + 4) % 120 + 4).chain((0..7).map(|i| (s * 11 + i * 13) % 120 + 4)).collect()
        })
        .collect()
}

/// Each session's next turn: its prompt, the reply it got, and a new question.
fn next_prompts(prompts: &[Vec<u32>], outcomes: &[Outcome]) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .zip(outcomes)
        .enumerate()
        .map(|(s, (p, o))| {
            let mut next = p.clone();
            next.extend(&o.tokens);
            next.extend((0..6).map(|i| (s as u32 * 17 + i * 7 + 3) % 120 + 4));
            next
        })
        .collect()
}

fn run_prompts(engine: &mut EngineCore, prompts: &[Vec<u32>]) -> Vec<Outcome> {
    run(engine, prompts.iter().map(|p| request(p.clone(), REPLY, true)).collect())
}

/// Each outcome's tokens are those of a cold prefill of its prompt.
fn check_cold(arch: &str, prompts: &[Vec<u32>], outcomes: &[Outcome]) {
    let alone = model(arch);
    for (p, o) in prompts.iter().zip(outcomes) {
        assert_eq!(
            o.tokens,
            cold(&alone, p, REPLY, 1).0,
            "{arch}: a prompt of {} tokens, {} cached",
            p.len(),
            o.cached
        );
    }
}

#[test]
fn after_a_restart_the_next_turn_resumes_from_a_snapshot_on_disk() {
    for arch in ["qwen35", "qwen35moe"] {
        let dir = TempDir::new(&format!("disk-hybrid-restart-{arch}"));
        let first = first_prompts();
        let mut before = engine(arch, &dir.0, 1 << 30);
        let outcomes = run_prompts(&mut before, &first);
        check_cold(arch, &first, &outcomes);
        let second = next_prompts(&first, &outcomes);
        // A graceful shutdown: the snapshots only memory held are written too.
        before.flush_disk();
        drop(before);
        assert!(!dir.files("state").is_empty(), "{arch}: snapshots were written");
        let mut after = engine(arch, &dir.0, 1 << 30);
        assert!(after.stats().disk.snapshots > 0, "{arch}: {:?}", after.stats().disk);
        let resumed = run_prompts(&mut after, &second);
        check_cold(arch, &second, &resumed);
        for ((p, o), previous) in second.iter().zip(&resumed).zip(&first) {
            // The previous prompt's snapshot at least (its last token is recomputed, on a page).
            let floor = (previous.len() - 1) / PAGE * PAGE;
            assert!(o.cached >= floor, "{arch}: a {}-token prompt resumed at {}, not {floor}", p.len(), o.cached);
        }
        let m = after.metrics().disk;
        assert!(m.snapshots_restored >= 3 && m.damaged_files == 0, "{arch}: {m:?}");
    }
}

#[test]
fn damaged_snapshot_files_are_recomputed_never_served() {
    let arch = "qwen35";
    let dir = TempDir::new("disk-hybrid-damaged");
    let first = first_prompts();
    let outcomes = run_prompts(&mut engine(arch, &dir.0, 1 << 30), &first);
    let second = next_prompts(&first, &outcomes);
    // A flipped byte in the state of some, a cut end of others: all fail a check.
    for (i, file) in dir.files("state").iter().enumerate() {
        let mut bytes = std::fs::read(file).unwrap();
        match i % 2 {
            0 => {
                let at = bytes.len() - 9;
                bytes[at] ^= 0x40;
            }
            _ => bytes.truncate(bytes.len() - 5),
        }
        std::fs::write(file, bytes).unwrap();
    }
    let mut damaged = engine(arch, &dir.0, 1 << 30);
    let again = run_prompts(&mut damaged, &second);
    check_cold(arch, &second, &again);
    let m = damaged.metrics().disk;
    assert!(m.damaged_files > 0 && m.snapshots_restored == 0, "{m:?}");
}

#[test]
fn snapshots_keep_to_half_the_budget_and_the_whole_budget_holds() {
    let arch = "qwen35";
    let dir = TempDir::new("disk-hybrid-budget");
    let model = model(arch);
    let state_bytes = StatePool::slot_bytes(model.config()).unwrap() as u64;
    // Room for about three snapshots, fewer than the workload writes.
    let budget = 6 * state_bytes;
    let mut prompts = first_prompts();
    let mut small = engine(arch, &dir.0, budget);
    for _ in 0..3 {
        let outcomes = run_prompts(&mut small, &prompts);
        check_cold(arch, &prompts, &outcomes);
        prompts = next_prompts(&prompts, &outcomes);
    }
    let stats = small.stats().disk;
    assert!(stats.bytes <= budget && stats.snapshots > 0, "{stats:?}");
    assert!(small.metrics().disk.evicted_files > 0, "the budget forced evictions");
    drop(small);
    let on_disk = |ext: &str| -> u64 { dir.files(ext).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum() };
    assert!(on_disk("state") <= budget / 2, "{} bytes of snapshot files, budget {budget}", on_disk("state"));
    assert!(on_disk("state") + on_disk("kv") <= budget);
}
