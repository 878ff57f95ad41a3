//! The disk tier over a real (tiny) KV pool: pages written and read back bit for bit, from the
//! writer's queue and from disk, after a reopen, within the budget, and never when damaged.

use std::path::PathBuf;

use radix_models::{KvDType, KvPool, ModelConfig};

use super::*;

fn config() -> ModelConfig {
    ModelConfig::from_hf_json(
        r#"{"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 32,
            "rms_norm_eps": 1e-6}"#,
    )
    .unwrap()
}

/// A pool of 64 pages of `page_size` tokens with random K/V.
fn pool(page_size: usize, seed: f32) -> KvPool {
    let mut pool = KvPool::new(&config(), page_size, 64, KvDType::F16).unwrap();
    pool.fill_random(seed).unwrap();
    pool
}

/// A fresh directory for one test.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("radix-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A made-up identity per test model name (distinct names, distinct ids).
fn identity(name: &str) -> ModelIdentity {
    let mut id = [0u8; 16];
    for (i, b) in name.bytes().enumerate() {
        id[i % 16] = id[i % 16].wrapping_mul(31).wrapping_add(b);
    }
    ModelIdentity { id, model_key: id, description: format!("test model {name}\n") }
}

fn page_bytes(pool: &KvPool, page: u32) -> Vec<u8> {
    let mut out = Vec::new();
    pool.read_page(page, &mut out).unwrap();
    out
}

fn open(dir: &TempDir, name: &str, budget: u64, pool: &KvPool) -> (DiskTier, OpenReport) {
    DiskTier::open(&dir.0, &identity(name), budget, pool).unwrap()
}

/// The files of the tier's directory, by name.
fn page_files(tier: &DiskTier) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(tier.dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kv"))
        .collect();
    files.sort();
    files
}

#[test]
fn pages_come_back_bit_identical_from_the_queue_from_disk_and_after_a_reopen() {
    let dir = TempDir::new("roundtrip");
    for page_size in [1, 4] {
        let source = pool(page_size, 1.0);
        let key: Vec<u32> = (0..10 * page_size as u32).collect();
        let pages: Vec<u32> = (20..30).collect();
        let name = format!("roundtrip-{page_size}");
        let (mut tier, _) = open(&dir, &name, 1 << 30, &source);
        tier.persist(&key, &pages, &source);
        for flushed in [false, true] {
            if flushed {
                tier.flush();
                assert_eq!(tier.stats().pending_writes, 0);
            }
            let mut target = pool(page_size, 0.5);
            let own: Vec<u32> = (40..50).collect();
            // The memory tree held the first 3 pages; the prompt's last token is never restored.
            let restored = tier.restore(&key[..key.len() - 1], 3 * page_size, &own, &mut target);
            assert_eq!(restored, 6 * page_size, "whole pages after the memory match, flushed {flushed}");
            for i in 3..9 {
                assert_eq!(page_bytes(&target, own[i]), page_bytes(&source, pages[i]), "page {i}");
            }
            assert_ne!(page_bytes(&target, own[9]), page_bytes(&source, pages[9]), "the last page is not touched");
            tier.check_invariants().unwrap();
        }
        let metrics = tier.metrics();
        assert_eq!((metrics.restores, metrics.restored_tokens), (2, 12 * page_size as u64));
        assert_eq!(metrics.files_read, 1, "the first restore read the queued bytes, the second the file");
        drop(tier);
        let (mut tier, report) = open(&dir, &name, 1 << 30, &source);
        assert_eq!((report.files, report.tokens, report.damaged, report.unusable), (1, 10 * page_size, 0, 0));
        let mut target = pool(page_size, 0.25);
        let own: Vec<u32> = (0..10).collect();
        assert_eq!(tier.restore(&key, 0, &own, &mut target), 10 * page_size);
        assert!((0..10).all(|i| page_bytes(&target, own[i]) == page_bytes(&source, pages[i])));
        tier.check_invariants().unwrap();
    }
}

#[test]
fn only_the_missing_continuation_is_written_and_branches_share_their_prefix() {
    let dir = TempDir::new("branches");
    let source = pool(1, 1.0);
    let (mut tier, _) = open(&dir, "branches", 1 << 30, &source);
    let a: Vec<u32> = (0..12).collect();
    tier.persist(&a, &(0..12).collect::<Vec<_>>(), &source);
    tier.persist(&a, &(0..12).collect::<Vec<_>>(), &source);
    assert_eq!(tier.stats().files, 1, "nothing new the second time");
    let mut b = a[..8].to_vec();
    b.extend([100, 101, 102]);
    tier.persist(&b, &[0, 1, 2, 3, 4, 5, 6, 7, 30, 31, 32], &source);
    assert_eq!((tier.stats().files, tier.stats().tokens), (2, 15));
    tier.flush();
    drop(tier);
    let (mut tier, report) = open(&dir, "branches", 1 << 30, &source);
    assert_eq!((report.files, report.tokens), (2, 15));
    let mut target = pool(1, 0.5);
    let own: Vec<u32> = (40..51).collect();
    assert_eq!(tier.restore(&b, 0, &own, &mut target), 11);
    assert_eq!(page_bytes(&target, 48), page_bytes(&source, 30));
    assert_eq!(page_bytes(&target, 47), page_bytes(&source, 7));
}

#[test]
fn a_damaged_page_is_never_served_and_its_pages_are_written_again() {
    let dir = TempDir::new("damaged");
    let source = pool(1, 1.0);
    let (mut tier, _) = open(&dir, "damaged", 1 << 30, &source);
    let key: Vec<u32> = (0..10).collect();
    let pages: Vec<u32> = (0..10).collect();
    tier.persist(&key, &pages, &source);
    tier.flush();
    let file = page_files(&tier).remove(0);
    let mut bytes = std::fs::read(&file).unwrap();
    let page_len = source.page_len_bytes();
    // A byte inside page 6's K/V.
    let at = bytes.len() - 4 * page_len + 17;
    bytes[at] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let mut target = pool(1, 0.5);
    let own: Vec<u32> = (40..50).collect();
    let before: Vec<Vec<u8>> = own.iter().map(|&p| page_bytes(&target, p)).collect();
    assert_eq!(tier.restore(&key, 0, &own, &mut target), 0, "one run of one file: nothing of it is used");
    assert_eq!(own.iter().map(|&p| page_bytes(&target, p)).collect::<Vec<_>>(), before, "nothing written");
    assert_eq!(tier.metrics().damaged_files, 1);
    assert_eq!(tier.stats().tokens, 0, "the damaged pages and everything after them left the index");
    tier.flush();
    assert!(page_files(&tier).is_empty(), "a file none of whose pages is referenced is deleted");
    // The recomputed prefix is written again and then served.
    tier.persist(&key, &pages, &source);
    assert_eq!(tier.restore(&key, 0, &own, &mut target), 10);
    tier.check_invariants().unwrap();
}

#[test]
fn a_damaged_later_file_still_serves_the_files_before_it() {
    let dir = TempDir::new("later");
    let source = pool(1, 1.0);
    let (mut tier, _) = open(&dir, "later", 1 << 30, &source);
    let key: Vec<u32> = (0..10).collect();
    tier.persist(&key[..4], &[0, 1, 2, 3], &source);
    tier.persist(&key, &(0..10).collect::<Vec<_>>(), &source);
    tier.flush();
    let later = page_files(&tier).pop().unwrap();
    let bytes = std::fs::read(&later).unwrap();
    std::fs::write(&later, &bytes[..bytes.len() - 5]).unwrap();
    let mut target = pool(1, 0.5);
    let own: Vec<u32> = (40..50).collect();
    assert_eq!(tier.restore(&key, 0, &own, &mut target), 4, "the first file's pages, then the truncated one stops it");
    assert_eq!(page_bytes(&target, 43), page_bytes(&source, 3));
    assert_eq!(tier.stats().tokens, 4);
}

#[test]
fn a_reopen_removes_damaged_unreachable_and_half_written_files() {
    let dir = TempDir::new("reopen");
    let source = pool(1, 1.0);
    let (mut tier, _) = open(&dir, "reopen", 1 << 30, &source);
    let key: Vec<u32> = (0..9).collect();
    tier.persist(&key[..3], &[0, 1, 2], &source);
    tier.persist(&key[..6], &[0, 1, 2, 3, 4, 5], &source);
    tier.persist(&key, &(0..9).collect::<Vec<_>>(), &source);
    let other: Vec<u32> = vec![50, 51, 52];
    tier.persist(&other, &[7, 8, 9], &source);
    tier.flush();
    let files = page_files(&tier);
    let dir_path = tier.dir().to_path_buf();
    drop(tier);
    // The first file loses its tail: the two after it (its continuation) cannot be reached.
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() - 1]).unwrap();
    std::fs::write(dir_path.join("00000000000000ff.kv.tmp"), b"half a write").unwrap();
    let (mut tier, report) = open(&dir, "reopen", 1 << 30, &source);
    assert_eq!((report.files, report.damaged, report.unusable), (1, 1, 2));
    assert_eq!(page_files(&tier), vec![files[3].clone()]);
    assert!(!dir_path.join("00000000000000ff.kv.tmp").exists());
    let mut target = pool(1, 0.5);
    assert_eq!(tier.restore(&key, 0, &[40, 41, 42, 43, 44, 45, 46, 47, 48], &mut target), 0);
    assert_eq!(tier.restore(&other, 0, &[40, 41, 42], &mut target), 3);
}

#[test]
fn the_budget_holds_and_the_least_recently_used_prefix_goes_first() {
    let dir = TempDir::new("budget");
    let source = pool(1, 1.0);
    let layout = Layout { identity: [0; 16], page_size: 1, page_bytes: source.page_len_bytes() };
    let file_bytes = |pages: usize| format::file_len(&layout, pages, pages);
    // Room for three prefixes of 8 tokens.
    let budget = 3 * file_bytes(8) + 10;
    let (mut tier, _) = open(&dir, "budget", budget, &source);
    let prefix = |i: u32| (0..8).map(|t| 1000 * i + t).collect::<Vec<u32>>();
    let pages: Vec<u32> = (0..8).collect();
    for i in 0..3 {
        tier.persist(&prefix(i), &pages, &source);
    }
    let mut target = pool(1, 0.5);
    let own: Vec<u32> = (40..48).collect();
    assert_eq!(tier.restore(&prefix(0), 0, &own, &mut target), 8, "prefix 0 is now the most recently used");
    for i in 3..10 {
        tier.persist(&prefix(i), &pages, &source);
        assert!(tier.stats().bytes <= budget);
        tier.check_invariants().unwrap();
        if i == 3 {
            assert_eq!(tier.restore(&prefix(1), 0, &own, &mut target), 0, "prefix 1 was the least recently used");
            assert_eq!(tier.restore(&prefix(0), 0, &own, &mut target), 8);
        }
    }
    assert_eq!(tier.stats().files, 3);
    assert!(tier.metrics().evicted_files >= 7);
    tier.flush();
    assert_eq!(page_files(&tier).len(), 3, "evicted files are deleted");
    // A prefix larger than the whole budget is written as far as it fits.
    let long: Vec<u32> = (0..40).map(|t| 77_000 + t).collect();
    tier.persist(&long, &(0..40).collect::<Vec<_>>(), &source);
    assert!(tier.stats().bytes <= budget);
    tier.check_invariants().unwrap();
    let restored = tier.restore(&long, 0, &(0..40).collect::<Vec<_>>(), &mut target);
    assert!(restored > 8 && restored < 40, "{restored} of 40 tokens fit");
    // A smaller budget at the next start evicts down to it.
    tier.flush();
    drop(tier);
    let (tier, report) = open(&dir, "budget", file_bytes(8) + 10, &source);
    assert!(report.bytes <= file_bytes(8) + 10 && tier.stats().files <= 1);
}

#[test]
fn a_full_budget_gives_way_to_a_new_prompt_that_shares_an_old_files_start() {
    let dir = TempDir::new("shared");
    let source = pool(1, 1.0);
    let layout = Layout { identity: [0; 16], page_size: 1, page_bytes: source.page_len_bytes() };
    // Room for one prompt of 20 tokens, not two.
    let budget = format::file_len(&layout, 20, 20) + 100;
    let (mut tier, _) = open(&dir, "shared", budget, &source);
    let prompt = |i: u32| (0..20).map(|t| if t < 6 { t } else { 1000 * i + t }).collect::<Vec<u32>>();
    let pages: Vec<u32> = (0..20).collect();
    let mut target = pool(1, 0.5);
    let own: Vec<u32> = (40..60).collect();
    for i in 1..5 {
        // Each prompt's file holds the shared six tokens and its own fourteen; the new prompt
        // cannot continue the old file within the budget, so the old one goes.
        tier.persist(&prompt(i), &pages, &source);
        tier.check_invariants().unwrap();
        assert!(tier.stats().bytes <= budget);
        assert_eq!(tier.restore(&prompt(i), 0, &own, &mut target), 20, "prompt {i} is all on disk");
        assert_eq!(tier.restore(&prompt(i - 1), 0, &own, &mut target), 6, "the shared start");
    }
    tier.flush();
    assert_eq!(page_files(&tier).len(), 1);
}

#[test]
fn another_model_in_the_same_directory_reuses_nothing() {
    let dir = TempDir::new("models");
    let source = pool(1, 1.0);
    let key: Vec<u32> = (0..6).collect();
    let (mut a, _) = open(&dir, "model-a", 1 << 30, &source);
    a.persist(&key, &(0..6).collect::<Vec<_>>(), &source);
    a.flush();
    let (mut b, report) = open(&dir, "model-b", 1 << 30, &source);
    assert_eq!(report, OpenReport::default());
    let mut target = pool(1, 0.5);
    assert_eq!(b.restore(&key, 0, &(40..46).collect::<Vec<_>>(), &mut target), 0);
    // Page files copied into another model's directory are refused by their header.
    for file in page_files(&a) {
        std::fs::copy(&file, b.dir().join(file.file_name().unwrap())).unwrap();
    }
    drop(b);
    let (_, report) = open(&dir, "model-b", 1 << 30, &source);
    assert_eq!((report.files, report.damaged), (0, 1));
}

#[test]
fn another_build_removes_its_predecessors_and_older_formats_directories_and_no_other() {
    let weights_dir = TempDir::new("build-weights");
    let weights = weights_dir.0.join("m.gguf");
    std::fs::write(&weights, b"the weights").unwrap();
    let other_weights = weights_dir.0.join("n.gguf");
    std::fs::write(&other_weights, b"other weights").unwrap();
    let dir = TempDir::new("builds");
    let source = pool(1, 1.0);
    let key: Vec<u32> = (0..6).collect();
    let write = |identity: &ModelIdentity| {
        let (mut tier, report) = DiskTier::open(&dir.0, identity, 1 << 30, &source).unwrap();
        tier.persist(&key, &(0..6).collect::<Vec<_>>(), &source);
        tier.flush();
        (tier.dir().to_owned(), report)
    };
    let old_build = ModelIdentity::of(&weights, "f16", "build 1").unwrap();
    let other_model = ModelIdentity::of(&other_weights, "f16", "build 1").unwrap();
    let (old_dir, _) = write(&old_build);
    let (other_dir, _) = write(&other_model);
    // A directory of the first identity format, any model's.
    let v1_dir = dir.0.join("00112233445566778899aabbccddeeff");
    std::fs::create_dir_all(&v1_dir).unwrap();
    std::fs::write(v1_dir.join("model.txt"), "radix-serve disk tier v1\nkv dtype F16\n").unwrap();
    let new_build = ModelIdentity::of(&weights, "f16", "build 2").unwrap();
    let (mut tier, report) = DiskTier::open(&dir.0, &new_build, 1 << 30, &source).unwrap();
    assert_eq!((report.other_builds_removed, report.files), (2, 0));
    assert!(!old_dir.exists(), "the old build's pages are gone");
    assert!(!v1_dir.exists(), "so is the older format's directory");
    assert!(other_dir.exists(), "another model's cache stays");
    let mut target = pool(1, 0.5);
    assert_eq!(tier.restore(&key, 0, &(40..46).collect::<Vec<_>>(), &mut target), 0);
    // Reopening the same build removes nothing.
    drop(tier);
    let (_, report) = write(&new_build);
    assert_eq!(report.other_builds_removed, 0);
}

/// Page files keep their namespace: the same tokens under another salt, or none, restore
/// nothing, before a reopen and after; two prompts of one salt that differ only in their first
/// tokens share nothing either.
#[test]
fn a_salted_prefix_is_restored_only_in_its_own_namespace() {
    use crate::engine::cache_key::{CacheKey, CacheNamespace};
    let dir = TempDir::new("namespaces");
    let source = pool(1, 1.0);
    let tokens: Vec<u32> = (0..8).collect();
    let (a, b) = (CacheNamespace::new(Some("a")), CacheNamespace::new(Some("b")));
    let pages: Vec<u32> = (0..8).collect();
    let own: Vec<u32> = (40..48).collect();
    for reopen in [false, true] {
        let (mut tier, _) = open(&dir, "salted", 1 << 30, &source);
        if !reopen {
            tier.persist(CacheKey::new(a, &tokens), &pages, &source);
            tier.flush();
        }
        let mut target = pool(1, 0.5);
        assert_eq!(tier.restore(CacheKey::new(b, &tokens), 0, &own, &mut target), 0, "reopened: {reopen}");
        assert_eq!(tier.restore(&tokens, 0, &own, &mut target), 0, "the shared namespace, reopened: {reopen}");
        let mut other_start = tokens.clone();
        other_start[0] = 99;
        assert_eq!(tier.restore(CacheKey::new(a, &other_start), 0, &own, &mut target), 0, "reopened: {reopen}");
        assert_eq!(tier.restore(CacheKey::new(a, &tokens), 0, &own, &mut target), 8, "reopened: {reopen}");
        assert_eq!(page_bytes(&target, 47), page_bytes(&source, 7));
        tier.check_invariants().unwrap();
    }
}
