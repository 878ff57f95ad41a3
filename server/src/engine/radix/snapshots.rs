//! Snapshots on the tree: filing them, finding the one a match resumes from, and choosing the
//! one to evict (the module doc of `radix.rs` has the overview).
//!
//! Which snapshot to give up, in order:
//! 1. A redundant one: a deeper snapshot lies on the same path below it and the tree does not
//!    branch at its node, and the last request through it did not name it expected. A prompt
//!    that extends this path resumes from the deeper one; only a divergence between the two
//!    would need it, and agents diverge where requests said they would (the next user turn's
//!    re-rendered history, the generation prompt, the shared system block: `mark_expected`;
//!    a system block's line starts, by a conversation starting there, kept by the requests
//!    that go on past them: `mark_expected_keeping`).
//! 2. Every other one: a path's deepest snapshot (where the conversation's next turn resumes),
//!    one where the tree branches (a prefix requests have shared), one the last request through
//!    it expected a resume at.
//!
//! Within each group GreedyDual-Size-Frequency decides: the priority is the credit (the
//! inflation when the snapshot was taken, resumed from, or last named expected) plus the tokens
//! from the next snapshot above times its uses (requests that filed it, resumed from it or named
//! it expected, at most [`MAX_USES`]), the lowest goes first, the older credit and then the
//! deeper node on a tie, and the inflation rises to the evicted priority. The uses matter where
//! snapshots lie close together: a system block's line starts are each a few hundred tokens
//! from the next, so by their gaps alone the block's end, which every turn of its sessions
//! names and every new session resumes from, would go as cheaply as a point named once.

use std::cmp::Reverse;
use std::collections::HashSet;

/// The most uses a snapshot's worth counts: enough for a session's system block to outlive
/// points named once, few enough that a block no session names any more still ages out.
const MAX_USES: u32 = 8;

use super::super::cache_key::CacheKey;
use super::tree::ROOT;
use super::{NodeId, RadixCache, Snapshot, SnapshotHit};

impl RadixCache {
    /// The snapshot nearest above `node` (itself included), whose end is `depth` tokens deep.
    pub(super) fn deepest_snapshot(&self, mut node: NodeId, mut depth: usize) -> Option<SnapshotHit> {
        while node != ROOT {
            let n = self.tree.node(node);
            if let Some(s) = n.data.snapshot {
                return Some(SnapshotHit { node, tokens: depth, slot: s.slot });
            }
            depth -= n.tokens().len();
            node = n.parent();
        }
        None
    }

    /// Gives `node`'s snapshot the current inflation as its credit.
    pub(super) fn renew_snapshot(&mut self, node: NodeId) {
        let inflation = self.snapshot_inflation;
        if let Some(s) = self.tree.data_mut(node).snapshot.as_mut() {
            s.credit = inflation;
            s.uses = s.uses.saturating_add(1);
        }
    }

    /// Snapshots the tree holds.
    pub fn snapshots(&self) -> usize {
        self.snapshots
    }

    /// Files `slot` as the state after `key` (a whole number of pages, all in the tree),
    /// splitting an edge to end a node there; `expected` when the request that took it expects
    /// a later request to resume there. Gives the slot back when the tree cannot use it: the
    /// prefix is not (all) cached, or its node already has an equally valid snapshot.
    pub fn attach_snapshot<'a>(
        &mut self,
        key: impl Into<CacheKey<'a>>,
        slot: u32,
        expected: bool,
    ) -> Result<NodeId, u32> {
        let key = key.into();
        if key.is_empty() || !key.len().is_multiple_of(self.page_size()) {
            return Err(slot);
        }
        let found = self.tree.descend(key);
        let node = found.node;
        if found.tokens != key.len() || self.tree.node(node).data.snapshot.is_some() {
            return Err(slot);
        }
        self.tree.data_mut(node).snapshot = Some(Snapshot { slot, credit: self.snapshot_inflation, expected, uses: 1 });
        self.snapshots += 1;
        self.debug_check();
        Ok(node)
    }

    /// A request's prefix runs from the root to `node`, whose end is `depth` tokens deep: each
    /// snapshot on it becomes expected if it sits at one of `expected` (token counts, sorted),
    /// with its credit renewed, and unexpected otherwise. The latest request through a
    /// snapshot knows best whether anyone will come back to it: a turn that went past it says
    /// so by not naming it. When the request resumes from a snapshot it does not name (its own
    /// conversation's history) where the tree does not branch, whatever else grew from that
    /// state (an earlier reply the agent did not send back) is superseded too: the expected
    /// snapshots off its path below there become unexpected.
    pub fn mark_expected(&mut self, node: NodeId, depth: usize, expected: &[usize]) {
        self.mark_expected_keeping(node, depth, expected, &[]);
    }

    /// [`Self::mark_expected`], leaving the snapshots at `keep` (sorted) as they are: a request
    /// that goes past a system block's branch points neither needs them nor knows that no other
    /// conversation will.
    pub fn mark_expected_keeping(&mut self, node: NodeId, depth: usize, expected: &[usize], keep: &[usize]) {
        debug_assert!(expected.is_sorted(), "expected points must be sorted");
        debug_assert!(keep.is_sorted(), "kept points must be sorted");
        let inflation = self.snapshot_inflation;
        // Not where the tree branches: there others' conversations grew from the same state.
        let resumed = self
            .deepest_snapshot(node, depth)
            .filter(|hit| expected.binary_search(&hit.tokens).is_err() && self.tree.node(hit.node).child_count() < 2);
        let (mut at, mut at_depth) = (node, depth);
        // The path below the resumed snapshot, deepest first.
        let mut below_resumed = Vec::new();
        while at != ROOT {
            if resumed.is_some_and(|hit| at_depth >= hit.tokens) {
                below_resumed.push(at);
            }
            let (parent, edge) = (self.tree.node(at).parent(), self.tree.node(at).tokens().len());
            if let Some(s) = self.tree.data_mut(at).snapshot.as_mut()
                && keep.binary_search(&at_depth).is_err()
            {
                s.expected = expected.binary_search(&at_depth).is_ok();
                if s.expected {
                    s.credit = inflation;
                    s.uses = s.uses.saturating_add(1);
                }
            }
            at_depth -= edge;
            at = parent;
        }
        let mut off_path: Vec<NodeId> = Vec::new();
        for (i, &on) in below_resumed.iter().enumerate() {
            // The child on the path is the previous entry (the path was walked upwards).
            let path_child = i.checked_sub(1).map(|j| below_resumed[j]);
            off_path.extend(self.tree.node(on).children().filter(|&c| Some(c) != path_child));
        }
        while let Some(id) = off_path.pop() {
            if let Some(s) = self.tree.data_mut(id).snapshot.as_mut() {
                s.expected = false;
            }
            off_path.extend(self.tree.node(id).children());
        }
    }

    /// Drops the snapshot to give up first (see the module doc) and returns its slot; its
    /// node's KV stays.
    pub fn evict_snapshot(&mut self) -> Option<u32> {
        // Nodes with a snapshot somewhere below them.
        let mut covered = HashSet::new();
        for (_, node) in self.tree.nodes().filter(|(_, n)| n.data.snapshot.is_some()) {
            let mut above = node.parent();
            while above != ROOT && covered.insert(above) {
                above = self.tree.node(above).parent();
            }
        }
        // (kept, priority, credit, deeper first) of the best candidate so far, and its node.
        type Rank = (bool, u64, u64, Reverse<usize>);
        let mut best: Option<(Rank, NodeId)> = None;
        for (id, node) in self.tree.nodes() {
            let Some(snapshot) = node.data.snapshot else { continue };
            // Tokens up to the next snapshot above (or the root): what losing this one costs.
            let mut gap = node.tokens().len();
            let mut depth = gap;
            let mut above = node.parent();
            let mut found_above = false;
            while above != ROOT {
                let n = self.tree.node(above);
                found_above |= n.data.snapshot.is_some();
                if !found_above {
                    gap += n.tokens().len();
                }
                depth += n.tokens().len();
                above = n.parent();
            }
            let redundant = !snapshot.expected && node.child_count() < 2 && covered.contains(&id);
            let worth = gap as u64 * u64::from(snapshot.uses.min(MAX_USES));
            let key = (!redundant, snapshot.credit + worth, snapshot.credit, Reverse(depth));
            if best.is_none_or(|(k, _)| key < k) {
                best = Some((key, id));
            }
        }
        let ((kept, priority, _, _), id) = best?;
        // Only an eviction in priority order ages the rest: a redundant snapshot goes first
        // whatever its priority, and a fresh one raising the inflation would make every kept
        // snapshot look as old as the last eviction's, and the kept ones go in LRU order.
        if kept {
            self.snapshot_inflation = self.snapshot_inflation.max(priority);
        }
        self.snapshots -= 1;
        self.tree.data_mut(id).snapshot.take().map(|s| s.slot)
    }
}
