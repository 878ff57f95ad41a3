//! Property test of the radix cache against a naive model (a set of token vectors): random
//! inserts, matches, locks, unlocks and evictions agree with the model, the tree's invariants
//! hold after every operation, the evictable count kept as locks change equals what evicting
//! everything frees, and every page is either free or in the tree exactly once. Snapshots ride
//! along: each slot's "state" is the prefix it was taken after, every snapshot the tree holds
//! sits at the end of exactly that prefix, a match resumes from the deepest one at or before its
//! end, and no slot is lost or held twice; eviction gives up a redundant snapshot (one a deeper
//! snapshot on an unbranched path makes redundant, not named expected) while there is one. A
//! peek (`peek_prefix`) on random trees finds what a match would and changes nothing.

use std::collections::{HashMap, HashSet};

use super::{Evicted, NodeId, PrefixPeek, RadixCache};
use crate::engine::PageAllocator;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u32>),
    Match(Vec<u32>),
    LockMatch(Vec<u32>),
    Unlock(usize),
    Evict(usize),
    /// Snapshot the first `n` tokens of a cached sequence (picked by index), expected or not.
    Snapshot(usize, usize, bool),
    /// A request's prefix through the tree names the snapshots at these depths expected.
    MarkExpected(Vec<u32>, Vec<usize>),
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
        3 => (any::<usize>(), 0usize..24, any::<bool>()).prop_map(|(i, n, e)| Op::Snapshot(i, n, e)),
        2 => (tokens(), prop::collection::vec(0usize..24, 0..4)).prop_map(|(t, d)| Op::MarkExpected(t, d)),
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

/// Whether the snapshot after `prefix` is redundant in the model: not expected, a deeper
/// snapshot extends it, and the cached sequences do not branch right after it.
fn redundant(
    prefix: &[u32],
    expected: bool,
    states: &HashMap<u32, Vec<u32>>,
    cached: &HashSet<Vec<u32>>,
    p: usize,
) -> bool {
    let deeper = states.values().any(|s| s.len() > prefix.len() && s.starts_with(prefix));
    !expected && deeper && branches_after(prefix, cached, p) < 2
}

/// How many different pages follow `prefix` in the cached sequences (the tree's children there).
fn branches_after(prefix: &[u32], cached: &HashSet<Vec<u32>>, p: usize) -> usize {
    let next_pages: HashSet<&[u32]> = cached
        .iter()
        .filter(|c| c.len() > prefix.len() && c.starts_with(prefix))
        .map(|c| &c[prefix.len()..prefix.len() + p])
        .collect();
    next_pages.len()
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
        // Whether each slot in the tree is expected.
        let mut expected: HashMap<u32, bool> = HashMap::new();
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
                Op::Snapshot(i, n, named) => {
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
                    match tree.attach_snapshot(&prefix, slot, named) {
                        Ok(_) => {
                            prop_assert!(!taken && !prefix.is_empty(), "attached twice or at the root");
                            states.insert(slot, prefix);
                            expected.insert(slot, named);
                        }
                        Err(back) => {
                            prop_assert!(taken || prefix.is_empty(), "a cached prefix refused a snapshot");
                            free_slots.push(back);
                        }
                    }
                }
                Op::MarkExpected(seq, mut depths) => {
                    let m = tree.match_prefix(&seq);
                    depths.sort_unstable();
                    depths.dedup();
                    let path = &seq[..m.tokens];
                    // The deepest snapshot on the path, if it supersedes what grew from it.
                    let resumed = states.values().filter(|s| path.starts_with(s)).max_by_key(|s| s.len()).cloned();
                    let resumed = resumed.filter(|r| !depths.contains(&r.len()) && branches_after(r, &cached, page_size) < 2);
                    tree.mark_expected(m.node, m.tokens, &depths);
                    for (slot, s) in &states {
                        if path.starts_with(s) {
                            expected.insert(*slot, depths.contains(&s.len()));
                        } else if resumed.as_ref().is_some_and(|r| s.starts_with(r)) {
                            expected.insert(*slot, false);
                        }
                    }
                }
                Op::EvictSnapshot => {
                    let any_redundant = states.iter().any(|(slot, s)| redundant(s, expected[slot], &states, &cached, page_size));
                    let oldest = tree.evict_snapshot();
                    prop_assert_eq!(oldest.is_some(), !states.is_empty());
                    if let Some(slot) = oldest {
                        let was = redundant(&states[&slot], expected[&slot], &states, &cached, page_size);
                        prop_assert!(was || !any_redundant, "slot {} went while a redundant snapshot was left", slot);
                        states.remove(&slot);
                        expected.remove(&slot);
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
                        expected.remove(&slot);
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
            let held: HashMap<u32, Vec<u32>> = tree.snapshot_prefixes().into_iter().map(|s| (s.slot, s.tokens)).collect();
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

proptest! {
    /// Prefixes of several namespaces in one tree: a match finds exactly the longest prefix
    /// cached in its own namespace (every token counts, the first ones too), never another
    /// namespace's, with the tree sound after every insert and eviction.
    #[test]
    fn namespaces_share_no_prefix(
        page_size in 1usize..4,
        ops in prop::collection::vec((0u8..3, 0usize..3, tokens()), 1..60),
    ) {
        use crate::engine::cache_key::{CacheKey, CacheNamespace};
        let namespaces = [CacheNamespace::default(), CacheNamespace::new(Some("a")), CacheNamespace::new(Some("b"))];
        let mut tree = RadixCache::new(page_size);
        let mut alloc = PageAllocator::new(10_000);
        let mut cached: Vec<HashSet<Vec<u32>>> = vec![HashSet::new(); namespaces.len()];
        for (op, ns, tokens) in ops {
            let key = CacheKey::new(namespaces[ns], &tokens);
            match op {
                0 => {
                    let whole = aligned(tokens.len(), page_size);
                    let pages = alloc.allocate(whole / page_size).expect("pages");
                    // Our pages for what the tree held already come back as duplicates.
                    alloc.release(tree.insert(key, &pages).duplicate_pages);
                    cached[ns].insert(tokens[..whole].to_vec());
                }
                1 => {
                    let found = tree.match_prefix(key).tokens;
                    prop_assert_eq!(found, reference_match(&cached[ns], &tokens, page_size), "namespace {}", ns);
                }
                _ => {
                    let freed = tree.evict(usize::MAX);
                    alloc.release(freed.pages);
                    cached.iter_mut().for_each(HashSet::clear);
                }
            }
            prop_assert_eq!(tree.check_invariants(), Ok(()));
            prop_assert_eq!(alloc.free_pages() + tree.cached_pages(), alloc.num_pages(), "a page was lost");
        }
    }
}

/// Applies `op` with no model to check against: grows the random trees the peek is tried on.
fn drive(
    tree: &mut RadixCache,
    alloc: &mut PageAllocator,
    free_slots: &mut Vec<u32>,
    locked: &mut Vec<NodeId>,
    op: Op,
) {
    let p = tree.page_size();
    match op {
        Op::Insert(seq) => {
            if let Some(pages) = alloc.allocate(seq.len() / p) {
                alloc.release(tree.insert(&seq, &pages).duplicate_pages);
            }
        }
        Op::Match(seq) => {
            tree.match_prefix(&seq);
        }
        Op::LockMatch(seq) => {
            let m = tree.match_prefix(&seq);
            if m.tokens > 0 {
                tree.lock(m.node);
                locked.push(m.node);
            }
        }
        Op::Unlock(i) => {
            if !locked.is_empty() {
                tree.unlock(locked.remove(i % locked.len()));
            }
        }
        Op::Evict(n) => {
            let freed = tree.evict(n);
            alloc.release(freed.pages);
            free_slots.extend(freed.snapshots);
        }
        Op::Snapshot(i, n, named) => {
            let mut sequences = tree.leaf_sequences();
            sequences.sort();
            if let (false, Some(slot)) = (sequences.is_empty(), free_slots.pop()) {
                let chosen = &sequences[i % sequences.len()];
                let prefix = &chosen[..aligned(n.min(chosen.len()), p)];
                if let Err(back) = tree.attach_snapshot(prefix, slot, named) {
                    free_slots.push(back);
                }
            }
        }
        Op::MarkExpected(seq, mut depths) => {
            let m = tree.match_prefix(&seq);
            depths.sort_unstable();
            tree.mark_expected(m.node, m.tokens, &depths);
        }
        Op::EvictSnapshot => free_slots.extend(tree.evict_snapshot()),
    }
}

/// What a tree would do next, as far as its public API shows: the order eviction would free
/// its pages and snapshots in, and the order snapshots alone would go in.
fn eviction_order(tree: &RadixCache) -> (Evicted, Vec<u32>) {
    let mut snapshots = tree.clone();
    (tree.clone().evict(usize::MAX), std::iter::from_fn(|| snapshots.evict_snapshot()).collect())
}

proptest! {
    /// On random trees, a peek finds what a match would (its tokens and the depth of its
    /// snapshot) and leaves the tree as it was: the same structure, clock and credits (the
    /// Debug dump), and the same eviction order of pages and snapshots.
    #[test]
    fn a_peek_sees_what_a_match_would_and_changes_nothing(
        page_size in 1usize..=4,
        ops in prop::collection::vec(op(), 1..40),
        queries in prop::collection::vec(tokens(), 1..6),
    ) {
        let mut tree = RadixCache::new(page_size);
        let mut alloc = PageAllocator::new(64);
        let mut free_slots: Vec<u32> = (0..8).collect();
        let mut locked = Vec::new();
        for op in ops {
            drive(&mut tree, &mut alloc, &mut free_slots, &mut locked, op);
            // The cached sequences themselves and one page past them, as well as random keys.
            let mut keys = queries.clone();
            for leaf in tree.leaf_sequences() {
                keys.push([&leaf[..], &[0; 4][..page_size]].concat());
                keys.push(leaf);
            }
            for key in keys {
                let (dump, order) = (format!("{tree:?}"), eviction_order(&tree));
                let peek = tree.peek_prefix(&key);
                prop_assert_eq!(format!("{tree:?}"), dump, "a peek changed the tree");
                prop_assert_eq!(eviction_order(&tree), order);
                let m = tree.clone().match_prefix(&key);
                prop_assert_eq!(peek, PrefixPeek { tokens: m.tokens, snapshot: m.snapshot.map(|hit| hit.tokens) });
            }
            prop_assert_eq!(tree.check_invariants(), Ok(()));
        }
    }
}
