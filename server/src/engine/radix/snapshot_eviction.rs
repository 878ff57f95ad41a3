//! Which snapshot goes first (`radix/snapshots.rs`): redundant ones before the rest, and within
//! each group GreedyDual-Size, where the cost of losing a snapshot is what a resume would
//! recompute without it and resuming from a snapshot renews it (peeking at one does not).

use super::RadixCache;

/// A tree holding one sequence of `len` tokens (pages of one token) with snapshots at `points`,
/// slot `i` at `points[i]`, those at `expected` named expected.
fn tree_with(len: usize, points: &[usize], expected: &[usize]) -> (RadixCache, Vec<u32>) {
    let mut tree = RadixCache::new(1);
    let tokens: Vec<u32> = (0..len as u32).collect();
    tree.insert(&tokens, &(0..len as u32).collect::<Vec<_>>());
    for (slot, &p) in points.iter().enumerate() {
        tree.attach_snapshot(&tokens[..p], slot as u32, expected.contains(&p)).unwrap();
    }
    (tree, tokens)
}

/// Two sessions of 1,200 tokens that share their first 1,000 (pages of one token).
fn two_sessions() -> (RadixCache, Vec<u32>, Vec<u32>) {
    let mut tree = RadixCache::new(1);
    let a: Vec<u32> = (0..1200).collect();
    let b: Vec<u32> = (0..1000).chain(5000..5200).collect();
    tree.insert(&a, &(0..1200).collect::<Vec<_>>());
    tree.insert(&b, &(1200..2400).collect::<Vec<_>>());
    (tree, a, b)
}

fn evict_all(tree: &mut RadixCache) -> Vec<u32> {
    std::iter::from_fn(|| tree.evict_snapshot()).collect()
}

#[test]
fn the_long_system_prefix_outlives_short_messages() {
    // A 3,000-token system + tools block, then messages of 40 tokens each; all expected, as a
    // request ending at the last one names them, so GreedyDual-Size alone decides.
    let points = [3000, 3040, 3080, 3120, 3160];
    let (mut tree, _) = tree_with(3200, &points, &points);
    let evicted: Vec<u32> = (0..4).map(|_| tree.evict_snapshot().unwrap()).collect();
    assert!(!evicted.contains(&0), "the system snapshot went before a message's: {evicted:?}");
    // With the others gone, it is the one left.
    assert_eq!(tree.evict_snapshot(), Some(0));
    assert_eq!(tree.evict_snapshot(), None);
}

#[test]
fn resuming_from_a_snapshot_renews_it() {
    let points = [3000, 3040, 3080, 3120, 3160];
    let (mut tree, tokens) = tree_with(3200, &points, &points);
    // Two evictions raise the inflation past the message snapshots' credit...
    let first = tree.evict_snapshot().unwrap();
    let second = tree.evict_snapshot().unwrap();
    // ...and a resume at the deepest one left renews it, so the next goes first.
    let survivors: Vec<u32> = [1, 2, 3, 4].into_iter().filter(|s| ![first, second].contains(s)).collect();
    let deepest = *survivors.iter().max().unwrap();
    let at = points[deepest as usize];
    let hit = tree.match_prefix(&tokens[..at + 5]).snapshot.unwrap();
    assert_eq!(hit.slot, deepest);
    let other = survivors.into_iter().find(|&s| s != deepest).unwrap();
    assert_eq!(tree.evict_snapshot(), Some(other), "the snapshot not resumed from goes first");
}

#[test]
fn intermediate_boundaries_go_before_the_tip_and_the_expected_points() {
    // The system block (expected), three message boundaries, the point the next user turn
    // re-renders from (expected), two more boundaries, and the tip.
    let points = [3000, 3040, 3080, 3120, 3160, 3200, 3240];
    let (mut tree, _) = tree_with(3300, &points, &[3000, 3160]);
    let order = evict_all(&mut tree);
    let (redundant, kept) = order.split_at(4);
    let mut redundant = redundant.to_vec();
    redundant.sort_unstable();
    assert_eq!(redundant, [1, 2, 3, 5], "the unnamed boundaries below the tip go first: {order:?}");
    assert!(kept.contains(&6) && kept.contains(&0) && kept.contains(&4), "{order:?}");
}

#[test]
fn a_snapshot_where_the_tree_branches_is_kept_like_a_tip() {
    // Two sessions share a 1,000-token prefix with a snapshot at its end, then each has a
    // boundary and a tip of its own.
    let (mut tree, a, b) = two_sessions();
    tree.attach_snapshot(&a[..1000], 0, false).unwrap();
    tree.attach_snapshot(&a[..1100], 1, false).unwrap();
    tree.attach_snapshot(&a[..1200], 2, false).unwrap();
    tree.attach_snapshot(&b[..1100], 3, false).unwrap();
    tree.attach_snapshot(&b[..1200], 4, false).unwrap();
    let order = evict_all(&mut tree);
    let mut first: Vec<u32> = order[..2].to_vec();
    first.sort_unstable();
    assert_eq!(first, [1, 3], "the sessions' own boundaries go first, not the shared prefix: {order:?}");
}

#[test]
fn a_request_that_goes_past_an_expected_point_without_naming_it_unmarks_it() {
    let points = [3000, 3040, 3080];
    let (mut tree, tokens) = tree_with(3200, &points, &[3000, 3040]);
    // The next request runs through all three and names only the system block.
    let m = tree.match_prefix(&tokens[..3100]);
    tree.mark_expected(m.node, m.tokens, &[3000]);
    assert_eq!(tree.evict_snapshot(), Some(1), "3040 is redundant now");
    // A request that names 3080 too keeps it; 3000 is the only other left, and is expected.
    let m = tree.match_prefix(&tokens[..3100]);
    tree.mark_expected(m.node, m.tokens, &[3000, 3080]);
    assert_eq!(evict_all(&mut tree).len(), 2);
}

#[test]
fn a_turn_that_resumes_from_its_history_supersedes_the_reply_grown_there() {
    // A prompt of 3,000 tokens with its end expected, and the reply generated after it (whose
    // end is expected too: the agent may send it back).
    let mut tree = RadixCache::new(1);
    let prompt: Vec<u32> = (0..3000).collect();
    let reply: Vec<u32> = prompt.iter().copied().chain(9000..9016).collect();
    tree.insert(&reply, &(0..3016).collect::<Vec<_>>());
    tree.attach_snapshot(&prompt[..2000], 0, false).unwrap();
    tree.attach_snapshot(&prompt, 1, true).unwrap();
    tree.attach_snapshot(&reply, 2, true).unwrap();
    // The agent sent another reply back: the next turn resumes from the prompt's end and names
    // its own points, not that one; the generated reply is superseded and goes first.
    let next: Vec<u32> = prompt.iter().copied().chain(7000..7100).collect();
    let m = tree.match_prefix(&next);
    tree.mark_expected(m.node, m.tokens, &[2000]);
    tree.insert(&next, &(4000..7100).collect::<Vec<_>>());
    assert_eq!(tree.evict_snapshot(), Some(2), "the superseded reply's end goes first");
}

#[test]
fn a_turn_that_resumes_where_sessions_branch_supersedes_nothing() {
    // Two sessions branch at 1,000 tokens; one has a point its next turn is expected at, below
    // its tip. A third session resumes at the branch without naming it.
    let (mut tree, a, b) = two_sessions();
    tree.attach_snapshot(&a[..1000], 0, false).unwrap();
    tree.attach_snapshot(&a[..1100], 1, true).unwrap();
    tree.attach_snapshot(&a, 2, true).unwrap();
    tree.attach_snapshot(&b, 3, true).unwrap();
    let c: Vec<u32> = (0..1000).chain(8000..8100).collect();
    let m = tree.match_prefix(&c);
    assert_eq!(m.snapshot.map(|h| h.tokens), Some(1000));
    tree.mark_expected(m.node, m.tokens, &[]);
    // The first session's expected point stays expected, so nothing is redundant: the deeper of
    // the two 100-token gaps goes first, not the expected point.
    assert_eq!(tree.evict_snapshot(), Some(2));
}

#[test]
fn peeking_at_a_snapshot_does_not_renew_it() {
    let points = [3000, 3040, 3080, 3120, 3160];
    let (mut tree, tokens) = tree_with(3200, &points, &points);
    // Two evictions raise the inflation past the survivors' credit, as above.
    let gone = [tree.evict_snapshot().unwrap(), tree.evict_snapshot().unwrap()];
    let deepest = (1..5).rev().find(|s| !gone.contains(s)).unwrap();
    let key = &tokens[..points[deepest as usize] + 5];
    let peek = tree.peek_prefix(key);
    assert_eq!((peek.tokens, peek.snapshot), (key.len(), Some(points[deepest as usize])));
    let mut matched = tree.clone();
    matched.match_prefix(key);
    let untouched = evict_all(&mut tree.clone());
    assert_ne!(evict_all(&mut matched), untouched, "a match renews the snapshot it resumes from");
    assert_eq!(evict_all(&mut tree), untouched, "a peek renews nothing");
}

#[test]
fn a_request_going_past_kept_points_leaves_them_expected() {
    // A system block's branch point at 1,500, named expected by the conversation that started
    // there, and that conversation's next prompt end at 1,600.
    let run = |keep: &[usize]| {
        let (mut tree, tokens) = tree_with(3000, &[1500, 1600], &[1500, 1600]);
        // The next turn goes past both, naming only its own end.
        let m = tree.match_prefix(&tokens);
        tree.mark_expected_keeping(m.node, m.tokens, &[1600], keep);
        tree.evict_snapshot()
    };
    // Kept: both stay expected, and the cheaper loss (100 tokens from the point above) goes.
    assert_eq!(run(&[1500]), Some(1));
    // Not kept: the branch point is redundant under the deeper one and goes first.
    assert_eq!(run(&[]), Some(0));
}

#[test]
fn a_redundant_snapshot_going_first_does_not_age_the_rest() {
    // 3100 is redundant (unnamed, a deeper snapshot on the same unbranched path); evicting it
    // out of priority order must leave the inflation where it was, or the kept snapshots'
    // credits would all look as old as that fresh one's and go in LRU order.
    let (mut tree, _) = tree_with(3300, &[3000, 3100, 3200], &[3000, 3200]);
    tree.snapshot_inflation = 50;
    for node in tree.tree.nodes().map(|(id, _)| id).collect::<Vec<_>>() {
        tree.renew_snapshot(node);
    }
    assert_eq!(tree.evict_snapshot(), Some(1));
    assert_eq!(tree.snapshot_inflation, 50, "a redundant eviction leaves the inflation");
    tree.evict_snapshot().unwrap();
    assert!(tree.snapshot_inflation > 50, "an eviction in priority order raises it");
}

#[test]
fn a_point_every_turn_names_outlives_a_tip_named_once() {
    // A line start, the system block's end 256 tokens below it, and a session's tip 300
    // tokens further: by their gaps alone the block's end would go first.
    let points = [2744, 3000, 3300];
    let (mut tree, tokens) = tree_with(3400, &points, &points);
    // Four turns of other sessions run past the block's end and name it (not the tip).
    for _ in 0..4 {
        let m = tree.match_prefix(&tokens[..3100]);
        tree.mark_expected_keeping(m.node, m.tokens, &[3000], &[2744]);
    }
    assert_eq!(tree.evict_snapshot(), Some(2), "the tip named once goes before the block's end");
    let (mut once, _) = tree_with(3400, &points, &points);
    assert_eq!(once.evict_snapshot(), Some(1), "named once, the block's end is the cheapest");
}
