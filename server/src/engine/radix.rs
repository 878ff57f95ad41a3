//! The radix tree over token ids that maps every cached prefix to the KV pages holding it,
//! shared by all requests (ARCHITECTURE.md §3).
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
//! it is. Snapshots are evicted on their own by GreedyDual-Size (Cao and Irani, 1997), the cost
//! of losing one being the tokens a resume would recompute without it: its distance to the next
//! snapshot above. Each gets the priority `inflation + cost` when taken or resumed from, the
//! lowest goes first and the inflation rises to it; so a 5k-token system + tools snapshot
//! outlives many small message-to-message ones. Before any of that, a snapshot that a deeper
//! one on the same unbranched path makes redundant goes first, unless the last request through
//! it expected a later one to resume there (`radix/snapshots.rs`): an idle session keeps its
//! tip and the points its next turn diverges at rather than losing them to a busy session's
//! intermediate message boundaries. A leaf whose end has no snapshot (KV nobody can resume
//! from) is evicted before any other leaf.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use super::cache_key::{CacheKey, CacheNamespace};

/// Index of a node in the tree's arena.
pub type NodeId = usize;

const ROOT: NodeId = 0;

#[derive(Debug, Clone)]
struct Node {
    parent: NodeId,
    /// The namespace of every prefix through this node (the root's is unused).
    namespace: CacheNamespace,
    tokens: Vec<u32>,
    pages: Vec<u32>,
    children: HashMap<Vec<u32>, NodeId>,
    lock: u32,
    last_use: u64,
    alive: bool,
    /// The state after this node's last token.
    snapshot: Option<Snapshot>,
}

/// A node's snapshot: where its state is, and what its eviction weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    slot: u32,
    /// The tree's inflation when the snapshot was taken, last resumed from, or last named
    /// expected (GreedyDual-Size).
    credit: u64,
    /// The last request whose prefix runs through it named it as a point where a later request
    /// is expected to resume ([`RadixCache::mark_expected`]).
    expected: bool,
}

impl Node {
    fn new(parent: NodeId, namespace: CacheNamespace, tokens: Vec<u32>, pages: Vec<u32>, last_use: u64) -> Self {
        Node {
            parent,
            namespace,
            tokens,
            pages,
            children: HashMap::new(),
            lock: 0,
            last_use,
            alive: true,
            snapshot: None,
        }
    }
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

/// A token-level radix tree whose nodes own KV pages.
#[derive(Debug, Clone)]
pub struct RadixCache {
    nodes: Vec<Node>,
    free_nodes: Vec<NodeId>,
    page_size: usize,
    clock: u64,
    cached_pages: usize,
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
        assert!(page_size > 0, "page size must be positive");
        RadixCache {
            nodes: vec![Node::new(ROOT, CacheNamespace::default(), Vec::new(), Vec::new(), 0)],
            free_nodes: Vec::new(),
            page_size,
            clock: 0,
            cached_pages: 0,
            evictable_pages: 0,
            snapshots: 0,
            snapshot_inflation: 0,
        }
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages the tree holds.
    pub fn cached_pages(&self) -> usize {
        self.cached_pages
    }

    /// Finds the longest cached page-aligned prefix of `tokens`, splitting an edge where the
    /// match ends inside it, and marks the path as just used.
    pub fn match_prefix<'a>(&mut self, key: impl Into<CacheKey<'a>>) -> PrefixMatch {
        self.clock += 1;
        let (node, matched, pages) = self.walk(key.into());
        self.touch(node);
        let snapshot = self.deepest_snapshot(node, matched);
        if let Some(hit) = snapshot {
            // Resumed from (or about to be).
            self.renew_snapshot(hit.node);
        }
        PrefixMatch { node, tokens: matched, pages, snapshot }
    }

    /// Inserts `key` (cut to whole pages) whose K/V are in `pages`, and returns how much was
    /// already present. `pages` must cover the whole pages of `key`.
    pub fn insert<'a>(&mut self, key: impl Into<CacheKey<'a>>, pages: &[u32]) -> Inserted {
        let p = self.page_size;
        let key = key.into();
        let whole = key.len() / p;
        assert!(pages.len() >= whole, "{} pages cannot hold {} tokens", pages.len(), whole * p);
        let key = key.prefix(whole * p);
        let tokens = key.tokens;
        self.clock += 1;
        let (node, matched, tree_pages) = self.walk(key);
        let duplicate_pages =
            pages[..matched / p].iter().zip(&tree_pages).filter(|(ours, tree)| ours != tree).map(|(o, _)| *o).collect();
        let end = if matched < tokens.len() {
            let leaf = self.alloc_node(Node::new(
                node,
                key.namespace,
                tokens[matched..].to_vec(),
                pages[matched / p..whole].to_vec(),
                self.clock,
            ));
            self.cached_pages += whole - matched / p;
            // A new leaf is unlocked: its pages can be evicted until someone locks it.
            self.evictable_pages += whole - matched / p;
            let child_key = key.namespace.child_key(node == ROOT, &tokens[matched..matched + p]);
            self.nodes[node].children.insert(child_key, leaf);
            leaf
        } else {
            node
        };
        self.touch(end);
        self.debug_check();
        Inserted { node: end, present_tokens: matched, duplicate_pages }
    }

    /// Marks `node` and its ancestors as used by one more running sequence.
    pub fn lock(&mut self, node: NodeId) {
        let mut n = node;
        while n != ROOT {
            let node = &mut self.nodes[n];
            if node.lock == 0 {
                self.evictable_pages -= node.pages.len();
            }
            node.lock += 1;
            n = node.parent;
        }
    }

    /// Undoes one [`lock`](Self::lock) of `node`.
    pub fn unlock(&mut self, node: NodeId) {
        let mut n = node;
        while n != ROOT {
            let node = &mut self.nodes[n];
            debug_assert!(node.lock > 0, "unlock of node {n} that is not locked");
            if node.lock == 1 {
                self.evictable_pages += node.pages.len();
            }
            node.lock = node.lock.saturating_sub(1);
            n = node.parent;
        }
    }

    /// Pages that eviction could free now (held by unlocked nodes).
    pub fn evictable_pages(&self) -> usize {
        self.evictable_pages
    }

    /// [`evictable_pages`](Self::evictable_pages) counted the slow way, to check the count.
    fn evictable_pages_by_scan(&self) -> usize {
        self.nodes.iter().skip(1).filter(|n| n.alive && n.lock == 0).map(|n| n.pages.len()).sum()
    }

    /// Evicts unlocked leaves, least recently used first (but leaves without a snapshot at
    /// their end before those with one, see the module doc), until at least `needed` pages are
    /// freed or nothing unlocked is left; returns the freed pages and snapshots.
    pub fn evict(&mut self, needed: usize) -> Evicted {
        let rank = |n: &Node| (n.snapshot.is_none(), Reverse(n.last_use));
        let mut heap: BinaryHeap<((bool, Reverse<u64>), NodeId)> = self
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, n)| n.alive && n.children.is_empty() && n.lock == 0)
            .map(|(id, n)| (rank(n), id))
            .collect();
        let mut freed = Vec::new();
        let mut snapshots = Vec::new();
        while freed.len() < needed {
            let Some((_, id)) = heap.pop() else { break };
            let parent = self.nodes[id].parent;
            let key = self.child_key_of(id);
            self.nodes[parent].children.remove(&key);
            let node = &mut self.nodes[id];
            node.alive = false;
            node.children.clear();
            self.cached_pages -= node.pages.len();
            self.evictable_pages -= node.pages.len();
            freed.append(&mut node.pages);
            node.tokens.clear();
            if let Some(snapshot) = node.snapshot.take() {
                snapshots.push(snapshot.slot);
                self.snapshots -= 1;
            }
            self.free_nodes.push(id);
            let parent_node = &self.nodes[parent];
            if parent != ROOT && parent_node.children.is_empty() && parent_node.lock == 0 {
                heap.push((rank(parent_node), parent));
            }
        }
        self.debug_check();
        Evicted { pages: freed, snapshots }
    }

    /// Every snapshot with its node's prefix (for `/v1/cache`, the disk tier and tests).
    pub fn snapshot_prefixes(&self) -> Vec<SnapshotPrefix> {
        let with = self.nodes.iter().enumerate().filter(|(_, n)| n.alive && n.snapshot.is_some());
        with.map(|(id, n)| SnapshotPrefix {
            namespace: n.namespace,
            tokens: self.path_tokens(id),
            slot: n.snapshot.expect("filtered").slot,
        })
        .collect()
    }

    /// Every page the tree holds.
    pub fn pages(&self) -> Vec<u32> {
        self.nodes.iter().filter(|n| n.alive).flat_map(|n| n.pages.iter().copied()).collect()
    }

    /// Every cached sequence that ends at a leaf, as tokens.
    #[cfg(test)]
    pub(crate) fn leaf_sequences(&self) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        for (id, node) in self.nodes.iter().enumerate().skip(1) {
            if node.alive && node.children.is_empty() {
                out.push(self.path_tokens(id));
            }
        }
        out
    }

    /// Whether any node is locked.
    pub fn any_locked(&self) -> bool {
        self.nodes.iter().any(|n| n.alive && n.lock > 0)
    }

    fn path_tokens(&self, mut id: NodeId) -> Vec<u32> {
        let mut parts = Vec::new();
        while id != ROOT {
            parts.push(&self.nodes[id].tokens);
            id = self.nodes[id].parent;
        }
        parts.into_iter().rev().flatten().copied().collect()
    }

    /// The key `id` is filed under in its parent's children.
    fn child_key_of(&self, id: NodeId) -> Vec<u32> {
        let node = &self.nodes[id];
        node.namespace.child_key(node.parent == ROOT, &node.tokens[..self.page_size])
    }

    /// Walks as deep as `key` matches in whole pages, splitting the last edge if the match
    /// ends inside it. Returns the end node, matched tokens and their pages.
    fn walk(&mut self, key: CacheKey<'_>) -> (NodeId, usize, Vec<u32>) {
        let p = self.page_size;
        let tokens = key.tokens;
        let mut node = ROOT;
        let mut matched = 0;
        let mut pages = Vec::new();
        while tokens.len() - matched >= p {
            let child_key = key.namespace.child_key(node == ROOT, &tokens[matched..matched + p]);
            let Some(&child) = self.nodes[node].children.get(&child_key) else { break };
            let edge = &self.nodes[child].tokens;
            let mut k = 1;
            while (k + 1) * p <= edge.len()
                && matched + (k + 1) * p <= tokens.len()
                && edge[k * p..(k + 1) * p] == tokens[matched + k * p..matched + (k + 1) * p]
            {
                k += 1;
            }
            let edge_len = edge.len();
            if k * p < edge_len {
                let upper = self.split(child, k * p);
                pages.extend_from_slice(&self.nodes[upper].pages);
                matched += k * p;
                node = upper;
                break;
            }
            pages.extend_from_slice(&self.nodes[child].pages);
            matched += edge_len;
            node = child;
        }
        (node, matched, pages)
    }

    /// Splits `child`'s edge after `at` tokens; returns the new upper node.
    fn split(&mut self, child: NodeId, at: usize) -> NodeId {
        let p = self.page_size;
        debug_assert!(at > 0 && at.is_multiple_of(p) && at < self.nodes[child].tokens.len());
        let parent = self.nodes[child].parent;
        let upper_tokens = self.nodes[child].tokens[..at].to_vec();
        let upper_pages = self.nodes[child].pages[..at / p].to_vec();
        // The snapshot stays below: it is the state after the original edge's last token.
        let namespace = self.nodes[child].namespace;
        let mut upper = Node::new(parent, namespace, upper_tokens, upper_pages, self.nodes[child].last_use);
        upper.lock = self.nodes[child].lock;
        let lower_key = self.nodes[child].tokens[at..at + p].to_vec();
        let upper_key = self.child_key_of(child);
        let upper_id = self.alloc_node(upper);
        self.nodes[upper_id].children.insert(lower_key, child);
        let lower = &mut self.nodes[child];
        lower.tokens.drain(..at);
        lower.pages.drain(..at / p);
        lower.parent = upper_id;
        self.nodes[parent].children.insert(upper_key, upper_id);
        upper_id
    }

    fn alloc_node(&mut self, node: Node) -> NodeId {
        match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    fn touch(&mut self, mut node: NodeId) {
        while node != ROOT {
            self.nodes[node].last_use = self.clock;
            node = self.nodes[node].parent;
        }
    }

    fn debug_check(&self) {
        if cfg!(debug_assertions)
            && let Err(problem) = self.check_invariants()
        {
            panic!("radix cache invariant broken: {problem}");
        }
    }

    /// Checks the tree's structure: edges are non-empty whole pages with one page id per page,
    /// children are keyed by their first page, no page or snapshot slot is held twice, a node's
    /// lock count covers its children's, and the evictable and snapshot counts match the nodes.
    pub fn check_invariants(&self) -> Result<(), String> {
        let p = self.page_size;
        let mut seen = HashSet::new();
        let mut slots = HashSet::new();
        let mut total = 0;
        for (id, node) in self.nodes.iter().enumerate() {
            if !node.alive {
                continue;
            }
            if id != ROOT {
                if node.tokens.is_empty() || node.tokens.len() % p != 0 || node.pages.len() * p != node.tokens.len() {
                    return Err(format!("node {id}: {} tokens with {} pages", node.tokens.len(), node.pages.len()));
                }
                let parent = &self.nodes[node.parent];
                if !parent.alive || parent.children.get(&self.child_key_of(id)) != Some(&id) {
                    return Err(format!("node {id} is not its parent's child under its first page"));
                }
                if node.parent != ROOT && parent.namespace != node.namespace {
                    return Err(format!("node {id} is in another namespace than its parent"));
                }
            }
            let child_locks: u32 = node.children.values().map(|&c| self.nodes[c].lock).sum();
            if id != ROOT && node.lock < child_locks {
                return Err(format!("node {id} lock {} below its children's {child_locks}", node.lock));
            }
            for (key, &c) in &node.children {
                if !self.nodes[c].alive || self.nodes[c].parent != id || &self.child_key_of(c) != key {
                    return Err(format!("node {id} child {c} is dead, reparented or keyed wrongly"));
                }
            }
            for &page in &node.pages {
                if !seen.insert(page) {
                    return Err(format!("page {page} is held twice"));
                }
            }
            if let Some(Snapshot { slot, .. }) = node.snapshot
                && (id == ROOT || !slots.insert(slot))
            {
                return Err(format!("snapshot slot {slot} is held twice or by the root"));
            }
            total += node.pages.len();
        }
        if total != self.cached_pages {
            return Err(format!("{total} pages in nodes but {} counted", self.cached_pages));
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

#[cfg(test)]
mod props;
#[cfg(test)]
mod snapshot_eviction;
