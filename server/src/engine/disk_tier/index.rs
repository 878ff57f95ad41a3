//! The disk tier's index: a radix tree over token ids, like the memory tree (`radix.rs`), whose
//! pages are references into page files instead of pool pages.
//!
//! It is prefix-closed: a prefix is added only as the continuation of one the index already
//! holds, and only leaves are evicted, so every page in it can be restored once the pages
//! before it are. References are per page, so a match may end inside an edge without a split
//! (a split is made only where a new continuation branches off). Least recently used leaves go
//! first when the disk budget is full; a page found damaged takes everything below it along.

use std::collections::HashMap;

use crate::engine::cache_key::{CacheKey, CacheNamespace};

/// A page file's number (its name on disk).
pub(crate) type FileId = u64;

/// Where one page's K/V is: a page of a page file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PageRef {
    /// The file.
    pub file: FileId,
    /// The page's position in the file.
    pub index: u32,
}

/// Index of a node in the index's arena.
pub(crate) type NodeId = usize;

pub(crate) const ROOT: NodeId = 0;

#[derive(Debug, Clone)]
struct Node {
    parent: NodeId,
    /// The namespace of every prefix through this node (the root's is unused).
    namespace: CacheNamespace,
    tokens: Vec<u32>,
    refs: Vec<PageRef>,
    children: HashMap<Vec<u32>, NodeId>,
    last_use: u64,
    alive: bool,
}

impl Node {
    fn new(parent: NodeId, namespace: CacheNamespace, tokens: Vec<u32>, refs: Vec<PageRef>, last_use: u64) -> Self {
        Node { parent, namespace, tokens, refs, children: HashMap::new(), last_use, alive: true }
    }
}

/// What [`DiskIndex::lookup`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lookup {
    /// Tokens of the key the index holds, a whole number of pages.
    pub tokens: usize,
    /// Their pages, in order.
    pub refs: Vec<PageRef>,
    /// The deepest node the match reached (perhaps only part of its edge).
    pub node: NodeId,
}

/// A radix tree of cached prefixes whose pages are in page files.
#[derive(Debug, Clone)]
pub(crate) struct DiskIndex {
    nodes: Vec<Node>,
    free_nodes: Vec<NodeId>,
    page_size: usize,
    clock: u64,
    pages: usize,
}

impl DiskIndex {
    /// An empty index over pages of `page_size` tokens.
    pub fn new(page_size: usize) -> Self {
        assert!(page_size > 0, "page size must be positive");
        DiskIndex {
            nodes: vec![Node::new(ROOT, CacheNamespace::default(), Vec::new(), Vec::new(), 0)],
            free_nodes: Vec::new(),
            page_size,
            clock: 0,
            pages: 0,
        }
    }

    /// Pages the index holds.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// The longest whole-page prefix of `key` the index holds, marked as just used.
    pub fn lookup<'a>(&mut self, key: impl Into<CacheKey<'a>>) -> Lookup {
        self.clock += 1;
        let (node, tokens, refs, _) = self.walk(key.into());
        let mut n = node;
        while n != ROOT {
            self.nodes[n].last_use = self.clock;
            n = self.nodes[n].parent;
        }
        Lookup { tokens, refs, node }
    }

    /// Follows `key` down in whole pages: the deepest node reached, the tokens matched, their
    /// pages, and how many pages of that node's edge matched.
    fn walk(&self, key: CacheKey<'_>) -> (NodeId, usize, Vec<PageRef>, usize) {
        let p = self.page_size;
        let (namespace, key) = (key.namespace, key.tokens);
        let (mut node, mut matched, mut refs) = (ROOT, 0, Vec::new());
        while key.len() - matched >= p {
            let child_key = namespace.child_key(node == ROOT, &key[matched..matched + p]);
            let Some(&child) = self.nodes[node].children.get(&child_key) else { break };
            let edge = &self.nodes[child].tokens;
            let mut k = 1;
            while (k + 1) * p <= edge.len()
                && matched + (k + 1) * p <= key.len()
                && edge[k * p..(k + 1) * p] == key[matched + k * p..matched + (k + 1) * p]
            {
                k += 1;
            }
            refs.extend_from_slice(&self.nodes[child].refs[..k]);
            matched += k * p;
            if k * p < edge.len() {
                return (child, matched, refs, k);
            }
            node = child;
        }
        let pages = self.nodes[node].refs.len();
        (node, matched, refs, pages)
    }

    /// The node ending exactly `at` tokens down `key` (which the index holds that far),
    /// splitting an edge if `at` falls inside one.
    fn node_at(&mut self, key: CacheKey<'_>, at: usize) -> NodeId {
        let (node, matched, _, k) = self.walk(key.prefix(at));
        debug_assert_eq!(matched, at, "the index holds the key that far");
        if k < self.nodes[node].refs.len() { self.split(node, k) } else { node }
    }

    /// Adds the pages `refs` as the continuation of `key` after its first `start` tokens, which
    /// the index must hold and no further ([`lookup`](Self::lookup) of `key` gives `start`).
    /// Returns the new leaf.
    pub fn extend<'a>(&mut self, key: impl Into<CacheKey<'a>>, start: usize, refs: Vec<PageRef>) -> NodeId {
        let p = self.page_size;
        let key = key.into();
        let end = start + refs.len() * p;
        assert!(!refs.is_empty() && start.is_multiple_of(p) && end <= key.len(), "whole pages of the key");
        let parent = self.node_at(key, start);
        let first = key.namespace.child_key(parent == ROOT, &key.tokens[start..start + p]);
        assert!(!self.nodes[parent].children.contains_key(&first), "the index already holds more of the key");
        self.clock += 1;
        self.pages += refs.len();
        let leaf = self.alloc(Node::new(parent, key.namespace, key.tokens[start..end].to_vec(), refs, self.clock));
        self.nodes[parent].children.insert(first, leaf);
        self.debug_check();
        leaf
    }

    /// Removes the least recently used leaf other than `keep` and returns its pages; `None`
    /// when there is none.
    pub fn evict_lru(&mut self, keep: NodeId) -> Option<Vec<PageRef>> {
        let victim = (1..self.nodes.len())
            .filter(|&id| id != keep && self.nodes[id].alive && self.nodes[id].children.is_empty())
            .min_by_key(|&id| (self.nodes[id].last_use, id))?;
        let refs = self.remove_subtree(victim);
        self.debug_check();
        Some(refs)
    }

    /// Removes every page of `key`'s path from `at` tokens on (a whole number of pages the
    /// index holds), with everything below them, and returns their pages.
    pub fn remove_from<'a>(&mut self, key: impl Into<CacheKey<'a>>, at: usize) -> Vec<PageRef> {
        let p = self.page_size;
        let key = key.into();
        let (_, matched, _, _) = self.walk(key);
        if at >= matched || !at.is_multiple_of(p) {
            return Vec::new();
        }
        let parent = self.node_at(key, at);
        let child = self.nodes[parent].children[&key.namespace.child_key(parent == ROOT, &key.tokens[at..at + p])];
        let refs = self.remove_subtree(child);
        self.debug_check();
        refs
    }

    /// Every page reference held, for the file counts' check.
    pub fn all_refs(&self) -> impl Iterator<Item = PageRef> + '_ {
        self.nodes.iter().filter(|n| n.alive).flat_map(|n| n.refs.iter().copied())
    }

    fn remove_subtree(&mut self, top: NodeId) -> Vec<PageRef> {
        let parent = self.nodes[top].parent;
        let first = self.child_key_of(top);
        self.nodes[parent].children.remove(&first);
        let (mut stack, mut refs) = (vec![top], Vec::new());
        while let Some(id) = stack.pop() {
            let node = &mut self.nodes[id];
            stack.extend(node.children.drain().map(|(_, c)| c));
            node.alive = false;
            node.tokens.clear();
            self.pages -= node.refs.len();
            refs.append(&mut node.refs);
            self.free_nodes.push(id);
        }
        refs
    }

    /// Splits `child`'s edge after `pages` pages; returns the new upper node.
    fn split(&mut self, child: NodeId, pages: usize) -> NodeId {
        let at = pages * self.page_size;
        let node = &mut self.nodes[child];
        let upper_tokens: Vec<u32> = node.tokens.drain(..at).collect();
        let upper_refs: Vec<PageRef> = node.refs.drain(..pages).collect();
        let (parent, namespace, last_use) = (node.parent, node.namespace, node.last_use);
        let lower_key = node.tokens[..self.page_size].to_vec();
        let upper_key = namespace.child_key(parent == ROOT, &upper_tokens[..self.page_size]);
        let upper = self.alloc(Node::new(parent, namespace, upper_tokens, upper_refs, last_use));
        self.nodes[upper].children.insert(lower_key, child);
        self.nodes[child].parent = upper;
        self.nodes[parent].children.insert(upper_key, upper);
        upper
    }

    /// The key `id` is filed under in its parent's children.
    fn child_key_of(&self, id: NodeId) -> Vec<u32> {
        let node = &self.nodes[id];
        node.namespace.child_key(node.parent == ROOT, &node.tokens[..self.page_size])
    }

    fn alloc(&mut self, node: Node) -> NodeId {
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

    fn debug_check(&self) {
        if cfg!(debug_assertions)
            && let Err(problem) = self.check_invariants()
        {
            panic!("disk index invariant broken: {problem}");
        }
    }

    /// Edges are non-empty whole pages with one reference per page, children are keyed by their
    /// first page and point back, no page reference is held twice, and the page count matches.
    pub fn check_invariants(&self) -> Result<(), String> {
        let p = self.page_size;
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        for (id, node) in self.nodes.iter().enumerate().filter(|(_, n)| n.alive) {
            if id != ROOT {
                if node.tokens.is_empty() || node.refs.len() * p != node.tokens.len() {
                    return Err(format!("node {id}: {} tokens with {} pages", node.tokens.len(), node.refs.len()));
                }
                let parent = &self.nodes[node.parent];
                if !parent.alive || parent.children.get(&self.child_key_of(id)) != Some(&id) {
                    return Err(format!("node {id} is not its parent's child under its first page"));
                }
                if node.parent != ROOT && parent.namespace != node.namespace {
                    return Err(format!("node {id} is in another namespace than its parent"));
                }
            }
            for (key, &c) in &node.children {
                let child = &self.nodes[c];
                if !child.alive || child.parent != id || self.child_key_of(c) != *key {
                    return Err(format!("node {id} child {c} is dead, reparented or keyed wrongly"));
                }
            }
            for r in &node.refs {
                if !seen.insert(*r) {
                    return Err(format!("page {} of file {} is referenced twice", r.index, r.file));
                }
            }
            total += node.refs.len();
        }
        if total != self.pages {
            return Err(format!("{total} pages in nodes but {} counted", self.pages));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn refs(file: FileId, n: u32) -> Vec<PageRef> {
        (0..n).map(|index| PageRef { file, index }).collect()
    }

    #[test]
    fn a_lookup_ends_inside_an_edge_and_a_branch_splits_it() {
        let mut index = DiskIndex::new(2);
        let a: Vec<u32> = (0..8).collect();
        index.extend(&a, 0, refs(1, 4));
        let mut b = a[..4].to_vec();
        b.extend([90, 91, 92, 93]);
        let found = index.lookup(&b);
        assert_eq!((found.tokens, found.refs.clone()), (4, refs(1, 2)));
        index.extend(&b, 4, refs(2, 2));
        assert_eq!(index.lookup(&b).refs, [refs(1, 2), refs(2, 2)].concat());
        assert_eq!(index.lookup(&a).refs, refs(1, 4));
        assert_eq!(index.lookup(&a[..5]).tokens, 4, "whole pages only");
        assert_eq!(index.pages(), 6);
    }

    #[test]
    fn removing_from_a_page_drops_it_and_everything_below_but_not_other_branches() {
        let mut index = DiskIndex::new(1);
        let a: Vec<u32> = (0..6).collect();
        index.extend(&a, 0, refs(1, 6));
        let mut b = a[..2].to_vec();
        b.extend([50, 51]);
        index.extend(&b, 2, refs(2, 2));
        let mut removed = index.remove_from(&a, 3);
        removed.sort_by_key(|r| (r.file, r.index));
        assert_eq!(removed, (3..6).map(|index| PageRef { file: 1, index }).collect::<Vec<_>>());
        assert_eq!(index.lookup(&a).tokens, 3);
        assert_eq!(index.lookup(&b).tokens, 4, "the other branch stays");
        let removed = index.remove_from(&a, 1);
        assert_eq!(removed.len(), 2 + 2, "pages 1 and 2 of a, and b's own two");
        assert_eq!(index.lookup(&b).tokens, 1);
    }

    #[test]
    fn the_least_recently_used_leaf_goes_first_and_the_kept_one_never() {
        let mut index = DiskIndex::new(1);
        let (a, b, c) = (vec![1, 2, 3], vec![1, 5, 6], vec![1, 8]);
        index.extend(&a, 0, refs(1, 3));
        index.extend(&b, 1, refs(2, 2));
        let leaf_c = index.extend(&c, 1, refs(3, 1));
        index.lookup(&a);
        assert_eq!(index.evict_lru(leaf_c), Some(refs(2, 2)), "b is older than a; c is kept");
        assert_eq!(index.evict_lru(leaf_c).unwrap(), refs(1, 3)[1..].to_vec());
        assert_eq!(index.evict_lru(leaf_c), None, "only c and its parent, which has a child, are left");
    }

    proptest! {
        /// Random extensions, lookups, removals and evictions keep the tree sound, and a lookup
        /// finds exactly the pages added for the key's longest held prefix.
        #[test]
        fn random_operations_keep_the_index_consistent(
            ops in proptest::collection::vec((0u8..4, proptest::collection::vec(0u32..3, 1..12), 0usize..12), 1..60)
        ) {
            let mut index = DiskIndex::new(2);
            // What a reference model expects: for each page-aligned prefix, the page it ends with.
            let mut model: HashMap<Vec<u32>, PageRef> = HashMap::new();
            let mut file = 0;
            for (op, key, at) in ops {
                let whole = key.len() / 2 * 2;
                let key = &key[..whole];
                match op {
                    0 | 1 => {
                        let found = index.lookup(key);
                        if found.tokens < key.len() {
                            file += 1;
                            let n = ((key.len() - found.tokens) / 2) as u32;
                            index.extend(key, found.tokens, refs(file, n));
                            for i in 0..n as usize {
                                model.insert(key[..found.tokens + 2 * (i + 1)].to_vec(), PageRef { file, index: i as u32 });
                            }
                        }
                    }
                    2 => {
                        let at = at / 2 * 2;
                        for r in index.remove_from(key, at) {
                            model.retain(|_, v| *v != r);
                        }
                    }
                    _ => {
                        if let Some(gone) = index.evict_lru(usize::MAX) {
                            model.retain(|_, v| !gone.contains(v));
                        }
                    }
                }
                prop_assert!(index.check_invariants().is_ok());
                prop_assert_eq!(index.pages(), model.len());
                let found = index.lookup(key);
                for (i, r) in found.refs.iter().enumerate() {
                    prop_assert_eq!(model.get(&key[..2 * (i + 1)]), Some(r));
                }
                prop_assert!(found.tokens == key.len() || !model.contains_key(&key[..found.tokens + 2]));
            }
        }
    }
}
