//! Property test of the radix cache against a naive model (a set of token vectors): random
//! inserts, matches, locks, unlocks and evictions agree with the model, the tree's invariants
//! hold after every operation, the evictable count kept as locks change equals what evicting
//! everything frees, and every page is either free or in the tree exactly once. Snapshots ride
//! along: each slot's "state" is the prefix it was taken after, every snapshot the tree holds
//! sits at the end of exactly that prefix, a match resumes from the deepest one at or before its
//! end, and no slot is lost or held twice.

use std::collections::{HashMap, HashSet};

use super::{NodeId, RadixCache};
use crate::engine::PageAllocator;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u32>),
    Match(Vec<u32>),
    LockMatch(Vec<u32>),
    Unlock(usize),
    Evict(usize),
    /// Snapshot the first `n` tokens of a cached sequence (picked by index).
    Snapshot(usize, usize),
    EvictSnapshot,
}

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    // A tiny alphabet makes shared prefixes and splits frequent.
    prop::collection::vec(0u32..3, 0..24)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => tokens().prop_map(Op::Insert),
        3 => tokens().prop_map(Op::Match),
        2 => tokens().prop_map(Op::LockMatch),
        2 => any::<usize>().prop_map(Op::Unlock),
        1 => (0usize..12).prop_map(Op::Evict),
        3 => (any::<usize>(), 0usize..24).prop_map(|(i, n)| Op::Snapshot(i, n)),
        1 => Just(Op::EvictSnapshot),
    ]
}

fn aligned(len: usize, p: usize) -> usize {
    len / p * p
}

/// Longest page-aligned prefix of `query` shared with any cached sequence.
fn reference_match(cached: &HashSet<Vec<u32>>, query: &[u32], p: usize) -> usize {
    cached.iter().map(|s| aligned(s.iter().zip(query).take_while(|(a, b)| a == b).count(), p)).max().unwrap_or(0)
}

fn check_pages(tree: &RadixCache, alloc: &PageAllocator) {
    let mut seen = HashSet::new();
    for page in tree.pages().into_iter().chain(alloc.free_list().iter().copied()) {
        assert!(seen.insert(page), "page {page} is both free and cached, or cached twice");
    }
    assert_eq!(seen.len(), alloc.num_pages(), "a page is neither free nor cached");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn radix_cache_agrees_with_a_naive_model(page_size in 1usize..=4, ops in prop::collection::vec(op(), 1..60)) {
        let mut tree = RadixCache::new(page_size);
        let mut alloc = PageAllocator::new(64);
        let mut cached: HashSet<Vec<u32>> = HashSet::new();
        let mut locked: Vec<(NodeId, Vec<u32>)> = Vec::new();
        let mut free_slots: Vec<u32> = (0..8).collect();
        // What each slot in the tree "holds": the prefix it is the state after.
        let mut states: HashMap<u32, Vec<u32>> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(seq) => {
                    let whole = aligned(seq.len(), page_size);
                    let Some(pages) = alloc.allocate(whole / page_size) else {
                        continue;
                    };
                    let expected_present = reference_match(&cached, &seq[..whole], page_size);
                    let inserted = tree.insert(&seq, &pages);
                    prop_assert_eq!(inserted.present_tokens, expected_present);
                    // Our pages for the present part were all fresh, so all are duplicates.
                    prop_assert_eq!(inserted.duplicate_pages.len(), expected_present / page_size);
                    alloc.release(inserted.duplicate_pages);
                    if whole > 0 {
                        cached.insert(seq[..whole].to_vec());
                    }
                }
                Op::Match(seq) => {
                    let m = tree.match_prefix(&seq);
                    prop_assert_eq!(m.tokens, reference_match(&cached, &seq, page_size));
                    prop_assert_eq!(m.pages.len() * page_size, m.tokens);
                    let deepest = states.values().filter(|s| s.len() <= m.tokens && seq.starts_with(s)).map(Vec::len).max();
                    prop_assert_eq!(m.snapshot.map(|h| h.tokens), deepest);
                    if let Some(hit) = m.snapshot {
                        prop_assert_eq!(&states[&hit.slot][..], &seq[..hit.tokens]);
                    }
                }
                Op::Snapshot(i, n) => {
                    // Sorted: a set's order would differ between runs and defeat shrinking.
                    let mut sequences: Vec<&Vec<u32>> = cached.iter().collect();
                    sequences.sort();
                    if sequences.is_empty() || free_slots.is_empty() {
                        continue;
                    }
                    let chosen = sequences[i % sequences.len()];
                    let prefix = chosen[..aligned(n.min(chosen.len()), page_size)].to_vec();
                    let slot = free_slots.pop().expect("checked");
                    let taken = states.values().any(|s| *s == prefix);
                    match tree.attach_snapshot(&prefix, slot) {
                        Ok(_) => {
                            prop_assert!(!taken && !prefix.is_empty(), "attached twice or at the root");
                            states.insert(slot, prefix);
                        }
                        Err(back) => {
                            prop_assert!(taken || prefix.is_empty(), "a cached prefix refused a snapshot");
                            free_slots.push(back);
                        }
                    }
                }
                Op::EvictSnapshot => {
                    let oldest = tree.evict_snapshot();
                    prop_assert_eq!(oldest.is_some(), !states.is_empty());
                    if let Some(slot) = oldest {
                        states.remove(&slot);
                        free_slots.push(slot);
                    }
                }
                Op::LockMatch(seq) => {
                    let m = tree.match_prefix(&seq);
                    prop_assert_eq!(m.tokens, reference_match(&cached, &seq, page_size));
                    if m.tokens > 0 {
                        tree.lock(m.node);
                        locked.push((m.node, seq[..m.tokens].to_vec()));
                    }
                }
                Op::Unlock(i) => {
                    if !locked.is_empty() {
                        let (node, _) = locked.remove(i % locked.len());
                        tree.unlock(node);
                    }
                }
                Op::Evict(n) => {
                    let before: HashSet<Vec<u32>> = cached.clone();
                    let evictable = tree.evictable_pages();
                    let freed = tree.evict(n);
                    prop_assert!(freed.pages.len() >= n.min(evictable) || freed.pages.len() == evictable);
                    alloc.release(freed.pages);
                    for slot in freed.snapshots {
                        prop_assert!(states.remove(&slot).is_some(), "slot {} freed twice", slot);
                        free_slots.push(slot);
                    }
                    // What is left is a prefix-closed part of what was cached...
                    cached = tree.leaf_sequences().into_iter().collect();
                    for s in &cached {
                        prop_assert!(before.iter().any(|b| b.starts_with(s)), "{s:?} appeared from nowhere");
                    }
                    // ...and every locked prefix survived.
                    for (_, prefix) in &locked {
                        prop_assert_eq!(tree.match_prefix(prefix).tokens, prefix.len());
                    }
                }
            }
            prop_assert_eq!(tree.check_invariants(), Ok(()));
            // The incrementally kept evictable count is what evicting everything would free.
            prop_assert_eq!(tree.evictable_pages(), tree.clone().evict(usize::MAX).pages.len());
            check_pages(&tree, &alloc);
            // Every snapshot sits at the end of the prefix it was taken after.
            let held: HashMap<u32, Vec<u32>> = tree.snapshot_prefixes().into_iter().map(|(t, s)| (s, t)).collect();
            prop_assert_eq!(&held, &states);
            prop_assert_eq!(free_slots.len() + states.len(), 8, "a snapshot slot was lost");
        }
        for (node, _) in locked.drain(..) {
            tree.unlock(node);
        }
        prop_assert!(!tree.any_locked(), "locks balance to zero when nothing runs");
        let flushed = tree.evict(usize::MAX);
        alloc.release(flushed.pages);
        prop_assert_eq!(flushed.snapshots.len(), states.len(), "a flush frees every snapshot");
        prop_assert_eq!(tree.cached_pages(), 0);
        prop_assert_eq!(alloc.free_pages(), alloc.num_pages(), "every page is free after a flush");
    }
}
