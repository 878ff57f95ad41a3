//! The disk tier under the engine, on a tiny random model: prefixes read back from disk after a
//! restart or an eviction give exactly the answers of a cold prefill; damaged page files are
//! recomputed, never served; the disk budget holds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_models::{KvDType, KvPool, LoadOptions, Model};
use radix_serve::engine::{DiskTier, EngineConfig, EngineCore, GenerateRequest, ModelIdentity};

mod common;

use common::{Outcome, TempDir, request, run};

fn fixture(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny/qwen3").join(file)
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_gguf_file(fixture("model-f32.gguf")).unwrap())
}

/// Where an engine keeps its disk tier, and how many bytes.
struct Disk<'a> {
    dir: &'a Path,
    budget: u64,
}

/// An engine over `pages` pages of `page_size` tokens, with the prefix cache when `cache` and
/// a disk tier when `disk` is given.
fn engine(pages: usize, page_size: usize, cache: bool, disk: Option<Disk>) -> EngineCore {
    let weights = fixture("model.safetensors");
    let model =
        Model::load(&weights, &LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() }).unwrap();
    let pool = KvPool::new(model.config(), page_size, pages, KvDType::F32).unwrap();
    let tier = disk.map(|d| {
        let identity = ModelIdentity::of(&weights, &format!("f32, page size {page_size}"), "test").unwrap();
        DiskTier::open(d.dir, &identity, d.budget, &pool).unwrap().0
    });
    let core = EngineCore::new(model, pool, EngineConfig::new(4, 16, cache, 512), tokenizer());
    match tier {
        Some(tier) => core.with_disk_tier(tier),
        None => core,
    }
}

/// 24 agent-like requests: three sessions, each a 48-token system prompt of its own and turns
/// that grow on it, 6 greedy tokens each.
fn workload() -> Vec<GenerateRequest> {
    let mut requests = Vec::new();
    for session in 0..3u32 {
        let system: Vec<u32> = (0..48).map(|i| (session * 37 + i * 5 + 1) % 128).collect();
        for turn in 0..8u32 {
            let mut prompt = system.clone();
            prompt.extend((0..4 + 3 * turn).map(|i| (session * 11 + i * 13 + 7) % 128));
            requests.push(request(prompt, 6, true));
        }
    }
    requests
}

/// Runs the requests in groups of four (so that groups share prefixes in the tree).
fn run_all(engine: &mut EngineCore, requests: &[GenerateRequest]) -> Vec<Outcome> {
    requests.chunks(4).flat_map(|group| run(engine, group.to_vec())).collect()
}

fn tokens(outcomes: &[Outcome]) -> Vec<Vec<u32>> {
    outcomes.iter().map(|o| o.tokens.clone()).collect()
}

#[test]
fn prefixes_read_back_after_a_restart_give_the_answers_of_a_cold_prefill() {
    let requests = workload();
    for page_size in [1, 4] {
        let dir = TempDir::new(&format!("disk-restart-{page_size}"));
        let cold = tokens(&run_all(&mut engine(512, page_size, false, None), &requests));
        let disk = || Some(Disk { dir: &dir.0, budget: 1 << 30 });
        let first = run_all(&mut engine(512, page_size, true, disk()), &requests);
        assert_eq!(tokens(&first), cold, "page size {page_size}: the first run");
        // The engine is dropped: its writer finishes the queue, as a graceful shutdown does.
        let mut restarted = engine(512, page_size, true, disk());
        let stats = restarted.stats().disk;
        assert!(stats.enabled && stats.tokens > 0 && stats.files > 0, "{stats:?}");
        let again = run_all(&mut restarted, &requests);
        assert_eq!(tokens(&again), cold, "page size {page_size}: after the restart");
        for (o, r) in again.iter().zip(&requests) {
            assert!(o.cached + page_size >= r.prompt.len(), "{} of {} cached", o.cached, r.prompt.len());
        }
        let m = restarted.metrics().disk;
        assert!(m.restores >= 3 && m.restored_tokens >= 3 * 48, "every session's prefix came from disk: {m:?}");
        assert_eq!(m.damaged_files, 0);
    }
}

#[test]
fn pages_evicted_under_memory_pressure_come_back_from_disk() {
    let dir = TempDir::new("disk-pressure");
    // 70 one-token pages: a 30-token prompt and its reply fit twice, so earlier ones are evicted.
    let mut engine = engine(70, 1, true, Some(Disk { dir: &dir.0, budget: 1 << 30 }));
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|s| (0..30).map(|i| (s * 29 + i * 3 + 2) % 128).collect()).collect();
    let requests: Vec<_> = prompts.iter().map(|p| request(p.clone(), 6, true)).collect();
    let cold = tokens(&run_all(&mut self::engine(256, 1, false, None), &requests));
    for r in &requests {
        run(&mut engine, vec![r.clone()]);
    }
    assert!(engine.metrics().evicted_pages > 0, "the pool was too small to keep everything");
    let again: Vec<Outcome> = requests.iter().flat_map(|r| run(&mut engine, vec![r.clone()])).collect();
    assert_eq!(tokens(&again), cold);
    assert!(again.iter().all(|o| o.cached == 29), "every prompt but its last token was reused");
    assert!(engine.metrics().disk.restored_tokens >= 29, "{:?}", engine.metrics().disk);
}

#[test]
fn damaged_page_files_are_recomputed_with_the_same_answers_and_written_again() {
    let dir = TempDir::new("disk-damaged");
    let requests = workload();
    let disk = || Some(Disk { dir: &dir.0, budget: 1 << 30 });
    let cold = tokens(&run_all(&mut engine(512, 1, false, None), &requests));
    run_all(&mut engine(512, 1, true, disk()), &requests);
    // Every other file gets a flipped byte in its last page; every third loses its end.
    for (i, file) in dir.files("kv").iter().enumerate() {
        let mut bytes = std::fs::read(file).unwrap();
        match i % 3 {
            0 => {
                let at = bytes.len() - 3;
                bytes[at] ^= 0x10;
            }
            1 => bytes.truncate(bytes.len() - 100),
            _ => continue,
        }
        std::fs::write(file, bytes).unwrap();
    }
    let mut damaged = engine(512, 1, true, disk());
    let again = run_all(&mut damaged, &requests);
    assert_eq!(tokens(&again), cold, "damaged pages were recomputed, not served");
    let m = damaged.metrics().disk;
    assert!(m.damaged_files > 0, "{m:?}");
    drop(damaged);
    // What was recomputed was written again: the next start serves it all.
    let mut healed = engine(512, 1, true, disk());
    let third = run_all(&mut healed, &requests);
    assert_eq!(tokens(&third), cold);
    assert_eq!(healed.metrics().disk.damaged_files, 0);
    assert!(third.iter().zip(&requests).all(|(o, r)| o.cached + 1 >= r.prompt.len()));
}

#[test]
fn the_disk_budget_holds_under_a_larger_workload() {
    let dir = TempDir::new("disk-budget");
    // About 30 tokens of the tiny model's K/V (1 KiB a token at f32), far less than the workload.
    let budget = 32 << 10;
    let requests = workload();
    let cold = tokens(&run_all(&mut engine(512, 1, false, None), &requests));
    let mut small = engine(512, 1, true, Some(Disk { dir: &dir.0, budget }));
    let out = run_all(&mut small, &requests);
    assert_eq!(tokens(&out), cold);
    let stats = small.stats().disk;
    assert!(stats.bytes <= budget && stats.files > 0, "{stats:?}");
    assert!(small.metrics().disk.evicted_files > 0, "the budget forced evictions");
    drop(small);
    let on_disk: u64 = dir.files("kv").iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    assert!(on_disk <= budget, "{on_disk} bytes of page files on disk, budget {budget}");
}
