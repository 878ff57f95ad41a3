//! Property test of the radix cache against a naive model (a set of token vectors): random
//! inserts, matches, locks, unlocks and evictions agree with the model, the tree's invariants
//! hold after every operation, the evictable count kept as locks change equals what evicting
//! everything frees, and every page is either free or in the tree exactly once.

use std::collections::HashSet;

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
                    prop_assert!(freed.len() >= n.min(evictable) || freed.len() == evictable);
                    alloc.release(freed);
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
            prop_assert_eq!(tree.evictable_pages(), tree.clone().evict(usize::MAX).len());
            check_pages(&tree, &alloc);
        }
        for (node, _) in locked.drain(..) {
            tree.unlock(node);
        }
        prop_assert!(!tree.any_locked(), "locks balance to zero when nothing runs");
        alloc.release(tree.evict(usize::MAX));
        prop_assert_eq!(tree.cached_pages(), 0);
        prop_assert_eq!(alloc.free_pages(), alloc.num_pages(), "every page is free after a flush");
    }
}
