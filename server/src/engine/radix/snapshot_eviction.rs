//! GreedyDual-Size eviction of snapshots (see the module doc of `radix.rs`): the cost of losing
//! a snapshot is what a resume would recompute without it, so a long shared prefix's snapshot
//! outlives short message-to-message ones, and resuming from a snapshot renews it.

use super::RadixCache;

/// A tree holding one sequence of `len` tokens (pages of one token) with snapshots at `points`,
/// slot `i` at `points[i]`.
fn tree_with(len: usize, points: &[usize]) -> (RadixCache, Vec<u32>) {
    let mut tree = RadixCache::new(1);
    let tokens: Vec<u32> = (0..len as u32).collect();
    tree.insert(&tokens, &(0..len as u32).collect::<Vec<_>>());
    for (slot, &p) in points.iter().enumerate() {
        tree.attach_snapshot(&tokens[..p], slot as u32).unwrap();
    }
    (tree, tokens)
}

#[test]
fn the_long_system_prefix_outlives_short_messages() {
    // A 3,000-token system + tools block, then messages of 40 tokens each.
    let (mut tree, _) = tree_with(3200, &[3000, 3040, 3080, 3120, 3160]);
    let evicted: Vec<u32> = (0..4).map(|_| tree.evict_snapshot().unwrap()).collect();
    assert!(!evicted.contains(&0), "the system snapshot went before a message's: {evicted:?}");
    // With the others gone, it is the one left.
    assert_eq!(tree.evict_snapshot(), Some(0));
    assert_eq!(tree.evict_snapshot(), None);
}

#[test]
fn resuming_from_a_snapshot_renews_it() {
    let (mut tree, tokens) = tree_with(3200, &[3000, 3040, 3080, 3120, 3160]);
    // Two evictions raise the inflation past the message snapshots' credit...
    let first = tree.evict_snapshot().unwrap();
    let second = tree.evict_snapshot().unwrap();
    // ...and a resume at the deepest one left renews it, so the next goes first.
    let survivors: Vec<u32> = [1, 2, 3, 4].into_iter().filter(|s| ![first, second].contains(s)).collect();
    let deepest = *survivors.iter().max().unwrap();
    let at = [3000, 3040, 3080, 3120, 3160][deepest as usize];
    let hit = tree.match_prefix(&tokens[..at + 5]).snapshot.unwrap();
    assert_eq!(hit.slot, deepest);
    let other = survivors.into_iter().find(|&s| s != deepest).unwrap();
    assert_eq!(tree.evict_snapshot(), Some(other), "the snapshot not resumed from goes first");
}
