//! The radix tree over token ids that maps every cached prefix to the KV pages holding it,
//! shared by all requests (ARCHITECTURE.md §3). Its structure (the node arena, edges, splits,
//! the LRU clock) is `radix/tree.rs`, which the disk index is built on too; this file adds what
//! only memory has: locks, the evictable count, the eviction order and snapshots.
//!
//! Matching works in whole pages: an edge always holds a multiple of `page_size` tokens, a
//! child is found by its first page of tokens, and a prefix is only reused up to its last full
//! page (so a match loses at most `page_size - 1` tokens). Nobody ever writes into a page the
//! tree holds. A node's lock count is the number of running sequences whose matched path goes
//! through it; locked nodes are never evicted.
//!
//! The pages of unlocked nodes (what eviction could free) are counted as locks change and nodes
//! come and go, like SGLang's `evictable_size_`, so asking "can these pages be had" costs
//! nothing; `check_invariants` compares the count with a full scan.
//!
//! Hybrid models: a node may also carry a recurrent-state snapshot (a state-pool slot), valid
//! after exactly its last token; a prefix is usable only up to the deepest snapshot on its
//! path ([`PrefixMatch::snapshot`]). A split leaves the snapshot with the lower node, whose end
//! it is. Snapshots are evicted on their own by GreedyDual-Size-Frequency (Cao and Irani, 1997;
//! Cherkasova, 1998), the cost of losing one being the tokens a resume would recompute without
//! it (its distance to the next snapshot above) times the requests that used it. Each gets the
//! priority `inflation + cost x uses` when taken, resumed from or named expected, the lowest
//! goes first and the inflation rises to it; so a 5k-token system + tools snapshot outlives
//! many small message-to-message ones, and so does the end of a system block every turn names. Before any of that, a snapshot that a deeper
//! one on the same unbranched path makes redundant goes first, unless the last request through
//! it expected a later one to resume there (`radix/snapshots.rs`): an idle session keeps its
//! tip and the points its next turn diverges at rather than losing them to a busy session's
//! intermediate message boundaries. A leaf whose end has no snapshot (KV nobody can resume
//! from) is evicted before any other leaf.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use self::tree::{Node, NodeData, ROOT, Tree};
use super::cache_key::{CacheKey, CacheNamespace};

pub use self::tree::NodeId;

/// What a node of the memory tree holds besides its edge of pool pages.
#[derive(Debug, Clone, Default)]
struct Held {
    /// Running sequences whose matched path goes through the node.
    lock: u32,
    /// The state after this node's last token.
    snapshot: Option<Snapshot>,
}

impl NodeData for Held {
    fn upper_part(&self) -> Self {
        // Every path through the lower part runs through the upper one, and the snapshot is the
        // state after the original edge's last token, the lower part's end.
        Held { lock: self.lock, snapshot: None }
    }
}

/// A node of the memory tree: its pages are KV pool pages.
type MemNode = Node<u32, Held>;

/// A node's snapshot: where its state is, and what its eviction weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    slot: u32,
    /// The tree's inflation when the snapshot was taken, last resumed from, or last named
    /// expected (GreedyDual-Size-Frequency).
    credit: u64,
    /// The last request whose prefix runs through it named it as a point where a later request
    /// is expected to resume ([`RadixCache::mark_expected`]).
    expected: bool,
    /// Requests that filed it, resumed from it or named it expected (GreedyDual-Size-Frequency:
    /// a system block's end that every turn of a session names is worth more than a point one
    /// request named once).
    uses: u32,
}

/// The deepest snapshot on a matched path: where a hybrid model's sequence can resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHit {
    /// The node the snapshot belongs to (lock it while the prefix is used).
    pub node: NodeId,
    /// Tokens from the root to the node's end.
    pub tokens: usize,
    /// The state-pool slot holding the state.
    pub slot: u32,
}

/// A snapshot in the tree and the prefix it is the state after ([`RadixCache::snapshot_prefixes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPrefix {
    /// The prefix's namespace.
    pub namespace: CacheNamespace,
    /// The prefix's tokens.
    pub tokens: Vec<u32>,
    /// The state-pool slot holding the state.
    pub slot: u32,
}

impl SnapshotPrefix {
    /// The prefix's key.
    pub fn key(&self) -> CacheKey<'_> {
        CacheKey::new(self.namespace, &self.tokens)
    }
}

/// What [`RadixCache::evict`] freed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evicted {
    /// KV pages.
    pub pages: Vec<u32>,
    /// State-pool slots of the evicted nodes' snapshots.
    pub snapshots: Vec<u32>,
}

/// The result of [`RadixCache::match_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    /// The node where the match ends (lock it to keep the prefix while it is used).
    pub node: NodeId,
    /// Matched tokens, a multiple of the page size.
    pub tokens: usize,
    /// The pages holding the matched tokens, in order.
    pub pages: Vec<u32>,
    /// The deepest snapshot at or before the match's end.
    pub snapshot: Option<SnapshotHit>,
}

/// The result of [`RadixCache::insert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inserted {
    /// The node holding the end of the inserted sequence.
    pub node: NodeId,
    /// Leading tokens that were already in the tree.
    pub present_tokens: usize,
    /// Pages the caller passed for the already-present part that the tree does not use (it
    /// holds the same tokens in other pages): the caller frees them.
    pub duplicate_pages: Vec<u32>,
}

/// What [`RadixCache::peek_prefix`] sees of a key, without touching the tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixPeek {
    /// Tokens of the key the tree holds, a multiple of the page size (what
    /// [`PrefixMatch::tokens`] would be).
    pub tokens: usize,
    /// Tokens from the root to the deepest snapshot within them (where
    /// [`PrefixMatch::snapshot`] would resume).
    pub snapshot: Option<usize>,
}

/// A token-level radix tree whose nodes own KV pages.
#[derive(Debug, Clone)]
pub struct RadixCache {
    tree: Tree<u32, Held>,
    /// Pages held by unlocked nodes, kept up to date by every change of a lock or a node.
    evictable_pages: usize,
    /// Nodes carrying a snapshot.
    snapshots: usize,
    /// GreedyDual-Size's inflation: the priority of the last snapshot evicted.
    snapshot_inflation: u64,
}

impl RadixCache {
    /// An empty tree over pages of `page_size` tokens.
    pub fn new(page_size: usize) -> Self {
        RadixCache { tree: Tree::new(page_size), evictable_pages: 0, snapshots: 0, snapshot_inflation: 0 }
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.tree.page_size()
    }

    /// Pages the tree holds.
    pub fn cached_pages(&self) -> usize {
        self.tree.pages()
    }

    /// Finds the longest cached page-aligned prefix of `tokens`, splitting an edge where the
    /// match ends inside it, and marks the path as just used.
    pub fn match_prefix<'a>(&mut self, key: impl Into<CacheKey<'a>>) -> PrefixMatch {
        let found = self.tree.visit(key.into(), true);
        let snapshot = self.deepest_snapshot(found.node, found.tokens);
        if let Some(hit) = snapshot {
            // Resumed from (or about to be).
            self.renew_snapshot(hit.node);
        }
        PrefixMatch { node: found.node, tokens: found.tokens, pages: self.tree.path_pages(&found), snapshot }
    }

    /// What [`match_prefix`](Self::match_prefix) would find of `key` (its tokens and the depth
    /// of its snapshot), for weighing requests before any of them is admitted: the LRU clock,
    /// the edges and the snapshots' credit stay as they are.
    pub fn peek_prefix<'a>(&self, key: impl Into<CacheKey<'a>>) -> PrefixPeek {
        let found = self.tree.find(key.into());
        let node = self.tree.node(found.node);
        // A match that ends inside an edge stops short of the node's end, where its snapshot is;
        // the split `match_prefix` would make leaves that snapshot below.
        let (end, depth) = if found.edge_pages < node.pages().len() {
            (node.parent(), found.tokens - found.edge_pages * self.page_size())
        } else {
            (found.node, found.tokens)
        };
        PrefixPeek { tokens: found.tokens, snapshot: self.deepest_snapshot(end, depth).map(|hit| hit.tokens) }
    }

    /// Inserts `key` (cut to whole pages) whose K/V are in `pages`, and returns how much was
    /// already present. `pages` must cover the whole pages of `key`.
    pub fn insert<'a>(&mut self, key: impl Into<CacheKey<'a>>, pages: &[u32]) -> Inserted {
        let p = self.page_size();
        let key = key.into();
        let whole = key.len() / p;
        assert!(pages.len() >= whole, "{} pages cannot hold {} tokens", pages.len(), whole * p);
        let key = key.prefix(whole * p);
        self.tree.tick();
        let found = self.tree.descend(key);
        let (node, matched) = (found.node, found.tokens);
        let tree_pages = self.tree.path_pages(&found);
        let duplicate_pages =
            pages[..matched / p].iter().zip(&tree_pages).filter(|(ours, tree)| ours != tree).map(|(o, _)| *o).collect();
        let end = if matched < key.len() {
            let new_pages = pages[matched / p..whole].to_vec();
            // A new leaf is unlocked: its pages can be evicted until someone locks it.
            self.evictable_pages += new_pages.len();
            self.tree.add_leaf(node, key, matched, new_pages, Held::default())
        } else {
            node
        };
        self.tree.touch(end);
        self.debug_check();
        Inserted { node: end, present_tokens: matched, duplicate_pages }
    }

    /// Marks `node` and its ancestors as used by one more running sequence.
    pub fn lock(&mut self, node: NodeId) {
        let mut n = node;
        while n != ROOT {
            let (parent, pages) = (self.tree.node(n).parent(), self.tree.node(n).pages().len());
            let held = self.tree.data_mut(n);
            if held.lock == 0 {
                self.evictable_pages -= pages;
            }
            held.lock += 1;
            n = parent;
        }
    }

    /// Undoes one [`lock`](Self::lock) of `node`.
    pub fn unlock(&mut self, node: NodeId) {
        let mut n = node;
        while n != ROOT {
            let (parent, pages) = (self.tree.node(n).parent(), self.tree.node(n).pages().len());
            let held = self.tree.data_mut(n);
            debug_assert!(held.lock > 0, "unlock of node {n} that is not locked");
            if held.lock == 1 {
                self.evictable_pages += pages;
            }
            held.lock = held.lock.saturating_sub(1);
            n = parent;
        }
    }

    /// Pages that eviction could free now (held by unlocked nodes).
    pub fn evictable_pages(&self) -> usize {
        self.evictable_pages
    }

    /// [`evictable_pages`](Self::evictable_pages) counted the slow way, to check the count.
    fn evictable_pages_by_scan(&self) -> usize {
        self.tree.nodes().skip(1).filter(|(_, n)| n.data.lock == 0).map(|(_, n)| n.pages().len()).sum()
    }

    /// Evicts unlocked leaves, least recently used first (but leaves without a snapshot at
    /// their end before those with one, see the module doc), until at least `needed` pages are
    /// freed or nothing unlocked is left; returns the freed pages and snapshots.
    pub fn evict(&mut self, needed: usize) -> Evicted {
        let rank = |n: &MemNode| (n.data.snapshot.is_none(), Reverse(n.last_use()));
        let mut heap: BinaryHeap<((bool, Reverse<u64>), NodeId)> = self
            .tree
            .leaves()
            .filter(|&id| self.tree.node(id).data.lock == 0)
            .map(|id| (rank(self.tree.node(id)), id))
            .collect();
        let mut evicted = Evicted::default();
        while evicted.pages.len() < needed {
            let Some((_, id)) = heap.pop() else { break };
            let parent = self.tree.node(id).parent();
            let removed = self.tree.remove_subtree(id);
            self.evictable_pages -= removed.pages.len();
            evicted.pages.extend(removed.pages);
            for snapshot in removed.data.into_iter().filter_map(|held| held.snapshot) {
                evicted.snapshots.push(snapshot.slot);
                self.snapshots -= 1;
            }
            let parent_node = self.tree.node(parent);
            if parent != ROOT && parent_node.child_count() == 0 && parent_node.data.lock == 0 {
                heap.push((rank(parent_node), parent));
            }
        }
        self.debug_check();
        evicted
    }

    /// Every snapshot with its node's prefix (for `/v1/cache`, the disk tier and tests).
    pub fn snapshot_prefixes(&self) -> Vec<SnapshotPrefix> {
        let with = self.tree.nodes().filter_map(|(id, n)| Some((id, n.namespace(), n.data.snapshot?)));
        with.map(|(id, namespace, snapshot)| SnapshotPrefix {
            namespace,
            tokens: self.tree.path_tokens(id),
            slot: snapshot.slot,
        })
        .collect()
    }

    /// Every page the tree holds.
    pub fn pages(&self) -> Vec<u32> {
        self.tree.all_pages().collect()
    }

    /// Every cached sequence that ends at a leaf, as tokens.
    #[cfg(test)]
    pub(crate) fn leaf_sequences(&self) -> Vec<Vec<u32>> {
        self.tree.leaves().map(|id| self.tree.path_tokens(id)).collect()
    }

    /// Whether any node is locked.
    pub fn any_locked(&self) -> bool {
        self.tree.nodes().any(|(_, n)| n.data.lock > 0)
    }

    fn debug_check(&self) {
        tree::debug_check("radix cache", || self.check_invariants());
    }

    /// Checks the tree's structure: edges are non-empty whole pages with one page id per page,
    /// children are keyed by their first page, no page or snapshot slot is held twice, a node's
    /// lock count covers its children's, and the evictable and snapshot counts match the nodes.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.tree.check()?;
        let mut slots = HashSet::new();
        for (id, node) in self.tree.nodes() {
            let child_locks: u32 = node.children().map(|c| self.tree.node(c).data.lock).sum();
            if id != ROOT && node.data.lock < child_locks {
                return Err(format!("node {id} lock {} below its children's {child_locks}", node.data.lock));
            }
            if let Some(Snapshot { slot, .. }) = node.data.snapshot
                && (id == ROOT || !slots.insert(slot))
            {
                return Err(format!("snapshot slot {slot} is held twice or by the root"));
            }
        }
        if slots.len() != self.snapshots {
            return Err(format!("{} snapshots in nodes but {} counted", slots.len(), self.snapshots));
        }
        let evictable = self.evictable_pages_by_scan();
        if evictable != self.evictable_pages {
            return Err(format!("{evictable} pages in unlocked nodes but {} counted", self.evictable_pages));
        }
        Ok(())
    }
}

mod snapshots;
pub(crate) mod tree;

#[cfg(test)]
mod props;
#[cfg(test)]
mod snapshot_eviction;
