//! The radix tree both prefix trees are built on: the memory tree (`radix.rs`, a page is a pool
//! page) and the disk index (`disk_tier/index.rs`, a page is a page of a page file).
//!
//! Nodes live in an arena and are reused once removed. An edge holds whole pages of tokens with
//! one payload `P` per page, so any page boundary inside an edge can become a node by a split
//! and a match never has to look inside a page. A child is filed under its first page, behind
//! its namespace's tag at the root ([`CacheNamespace::child_key`]), so namespaces never share a
//! node. A node also carries whatever its tree needs (`X`: locks and a snapshot in memory,
//! nothing on disk) and the clock tick of its last use. What to evict, what to lock and when
//! to split are the two trees' own policies; this file only keeps the structure sound.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

use crate::engine::cache_key::{CacheKey, CacheNamespace};

/// Index of a node in a tree's arena.
pub type NodeId = usize;

/// The root: the empty prefix of every namespace (it has no edge, pages or data of its own).
pub(crate) const ROOT: NodeId = 0;

/// What a node carries besides its edge.
pub(crate) trait NodeData: Default {
    /// The data of the upper node that a split cuts off this node's edge; this node keeps the
    /// lower part, and with it whatever describes the state after its last token.
    fn upper_part(&self) -> Self;
}

impl NodeData for () {
    fn upper_part(&self) {}
}

/// One node of a [`Tree`]: an edge of tokens, a payload per page of them, and its tree's data.
#[derive(Debug, Clone)]
pub(crate) struct Node<P, X> {
    parent: NodeId,
    /// The namespace of every prefix through this node (the root's is unused).
    namespace: CacheNamespace,
    tokens: Vec<u32>,
    pages: Vec<P>,
    children: HashMap<Vec<u32>, NodeId>,
    last_use: u64,
    alive: bool,
    /// What the tree built on this one keeps per node.
    pub data: X,
}

impl<P, X> Node<P, X> {
    fn new(parent: NodeId, namespace: CacheNamespace, tokens: Vec<u32>, pages: Vec<P>, last_use: u64, data: X) -> Self {
        Node { parent, namespace, tokens, pages, children: HashMap::new(), last_use, alive: true, data }
    }

    /// The node above (the root is its own parent).
    pub fn parent(&self) -> NodeId {
        self.parent
    }

    /// The namespace of every prefix through the node.
    pub fn namespace(&self) -> CacheNamespace {
        self.namespace
    }

    /// The edge's tokens, a whole number of pages (none at the root).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// One payload per page of the edge.
    pub fn pages(&self) -> &[P] {
        &self.pages
    }

    /// The nodes below, in no particular order.
    pub fn children(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.children.values().copied()
    }

    /// How many nodes are below (more than one where prefixes branch).
    pub fn child_count(&self) -> usize {
        self.children.len()
    }

    /// The clock tick when a match or insertion last went through the node.
    pub fn last_use(&self) -> u64 {
        self.last_use
    }
}

/// Where a walk down the tree stopped ([`Tree::find`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    /// The deepest node the key reached, perhaps only part of its edge.
    pub node: NodeId,
    /// Tokens of the key matched, a whole number of pages.
    pub tokens: usize,
    /// Pages of `node`'s edge that matched: all of them unless the match ends inside it.
    pub edge_pages: usize,
}

/// What [`Tree::remove_subtree`] took out.
#[derive(Debug, Clone)]
pub(crate) struct Removed<P, X> {
    /// The removed nodes' pages.
    pub pages: Vec<P>,
    /// The removed nodes' data.
    pub data: Vec<X>,
}

/// A radix tree over token ids with one `P` per page of an edge and an `X` per node.
#[derive(Debug, Clone)]
pub(crate) struct Tree<P, X> {
    nodes: Vec<Node<P, X>>,
    free_nodes: Vec<NodeId>,
    page_size: usize,
    clock: u64,
    /// Pages in all edges, kept as nodes come, go and split.
    pages: usize,
}

impl<P: Copy + Eq + Hash + Debug, X: NodeData> Tree<P, X> {
    /// An empty tree over pages of `page_size` tokens.
    pub fn new(page_size: usize) -> Self {
        assert!(page_size > 0, "page size must be positive");
        Tree {
            nodes: vec![Node::new(ROOT, CacheNamespace::default(), Vec::new(), Vec::new(), 0, X::default())],
            free_nodes: Vec::new(),
            page_size,
            clock: 0,
            pages: 0,
        }
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages the tree holds.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Every page the tree holds.
    pub fn all_pages(&self) -> impl Iterator<Item = P> + '_ {
        self.nodes().flat_map(|(_, n)| n.pages.iter().copied())
    }

    /// A live node.
    pub fn node(&self, id: NodeId) -> &Node<P, X> {
        debug_assert!(self.nodes[id].alive, "node {id} was removed");
        &self.nodes[id]
    }

    /// A live node's data, to change.
    pub fn data_mut(&mut self, id: NodeId) -> &mut X {
        debug_assert!(self.nodes[id].alive, "node {id} was removed");
        &mut self.nodes[id].data
    }

    /// Every live node, the root first.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &Node<P, X>)> + '_ {
        self.nodes.iter().enumerate().filter(|(_, n)| n.alive)
    }

    /// Every live node other than the root with nothing below it.
    pub fn leaves(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes().skip(1).filter(|(_, n)| n.children.is_empty()).map(|(id, _)| id)
    }

    /// Advances the LRU clock: what is touched or added from now on is newer than all before.
    pub fn tick(&mut self) {
        self.clock += 1;
    }

    /// Marks `node` and its ancestors as used at the current tick.
    pub fn touch(&mut self, mut node: NodeId) {
        while node != ROOT {
            self.nodes[node].last_use = self.clock;
            node = self.nodes[node].parent;
        }
    }

    /// The child of `parent` that continues `key` after its first `at` tokens (a page boundary
    /// that `parent` ends at), if any.
    pub fn child(&self, parent: NodeId, key: CacheKey<'_>, at: usize) -> Option<NodeId> {
        let page = key.tokens.get(at..at + self.page_size)?;
        self.nodes[parent].children.get(&key.namespace.child_key(parent == ROOT, page)).copied()
    }

    /// Follows `key` down in whole pages as far as the tree holds it, changing nothing.
    pub fn find(&self, key: CacheKey<'_>) -> Found {
        let p = self.page_size;
        let tokens = key.tokens;
        let (mut node, mut matched) = (ROOT, 0);
        while let Some(child) = self.child(node, key, matched) {
            // The first page matched: the child is filed under it.
            let edge = &self.nodes[child].tokens;
            let mut k = 1;
            while (k + 1) * p <= edge.len()
                && matched + (k + 1) * p <= tokens.len()
                && edge[k * p..(k + 1) * p] == tokens[matched + k * p..matched + (k + 1) * p]
            {
                k += 1;
            }
            matched += k * p;
            if k * p < edge.len() {
                return Found { node: child, tokens: matched, edge_pages: k };
            }
            node = child;
        }
        Found { node, tokens: matched, edge_pages: self.nodes[node].pages.len() }
    }

    /// [`find`](Self::find), splitting the last edge where the match ends inside it, so the
    /// returned node ends exactly at the match.
    pub fn descend(&mut self, key: CacheKey<'_>) -> Found {
        let found = self.find(key);
        if found.edge_pages < self.nodes[found.node].pages.len() {
            let upper = self.split(found.node, found.edge_pages);
            return Found { node: upper, ..found };
        }
        found
    }

    /// A use of the longest prefix of `key` the tree holds: [`find`](Self::find), or with
    /// `split` [`descend`](Self::descend), with the path marked as used at a new tick.
    pub fn visit(&mut self, key: CacheKey<'_>, split: bool) -> Found {
        self.tick();
        let found = if split { self.descend(key) } else { self.find(key) };
        self.touch(found.node);
        found
    }

    /// The pages of the tokens `found` matched, in order.
    pub fn path_pages(&self, found: &Found) -> Vec<P> {
        let mut pages: Vec<P> = self.path(found.node).flat_map(|n| n.pages.iter().copied()).collect();
        pages.truncate(found.tokens / self.page_size);
        pages
    }

    /// The tokens from the root to the end of `id`'s edge.
    pub fn path_tokens(&self, id: NodeId) -> Vec<u32> {
        self.path(id).flat_map(|n| n.tokens.iter().copied()).collect()
    }

    /// The nodes from below the root down to `id`, in that order.
    fn path(&self, mut id: NodeId) -> impl Iterator<Item = &Node<P, X>> {
        let mut nodes = Vec::new();
        while id != ROOT {
            nodes.push(&self.nodes[id]);
            id = self.nodes[id].parent;
        }
        nodes.into_iter().rev()
    }

    /// Adds `pages` under `parent` as a new leaf continuing `key` after its first `start`
    /// tokens, where `parent` ends; no child of `parent` may continue `key` there yet. The leaf
    /// is used at the current tick.
    pub fn add_leaf(&mut self, parent: NodeId, key: CacheKey<'_>, start: usize, pages: Vec<P>, data: X) -> NodeId {
        let p = self.page_size;
        let end = start + pages.len() * p;
        debug_assert!(!pages.is_empty() && start.is_multiple_of(p) && end <= key.len(), "whole pages of the key");
        let first = key.namespace.child_key(parent == ROOT, &key.tokens[start..start + p]);
        self.pages += pages.len();
        let node = Node::new(parent, key.namespace, key.tokens[start..end].to_vec(), pages, self.clock, data);
        let leaf = self.alloc(node);
        let previous = self.nodes[parent].children.insert(first, leaf);
        debug_assert!(previous.is_none(), "node {parent} already had a child under that page");
        leaf
    }

    /// Removes `top` (not the root) with everything below it; returns their pages and data.
    pub fn remove_subtree(&mut self, top: NodeId) -> Removed<P, X> {
        debug_assert!(top != ROOT, "the root cannot be removed");
        let parent = self.nodes[top].parent;
        let first = self.child_key_of(top);
        self.nodes[parent].children.remove(&first);
        let mut removed = Removed { pages: Vec::new(), data: Vec::new() };
        let mut stack = vec![top];
        while let Some(id) = stack.pop() {
            let node = &mut self.nodes[id];
            stack.extend(node.children.drain().map(|(_, c)| c));
            node.alive = false;
            node.tokens.clear();
            self.pages -= node.pages.len();
            removed.pages.append(&mut node.pages);
            removed.data.push(std::mem::take(&mut node.data));
            self.free_nodes.push(id);
        }
        removed
    }

    /// Splits `child`'s edge after `pages` pages; returns the new upper node.
    fn split(&mut self, child: NodeId, pages: usize) -> NodeId {
        let p = self.page_size;
        let upper_key = self.child_key_of(child);
        let node = &mut self.nodes[child];
        debug_assert!(pages > 0 && pages < node.pages.len(), "a split inside the edge");
        let upper_tokens: Vec<u32> = node.tokens.drain(..pages * p).collect();
        let upper_pages: Vec<P> = node.pages.drain(..pages).collect();
        let lower_key = node.tokens[..p].to_vec();
        let parent = node.parent;
        // The upper part was used whenever the whole edge was.
        let upper = Node::new(parent, node.namespace, upper_tokens, upper_pages, node.last_use, node.data.upper_part());
        let upper = self.alloc(upper);
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

    fn alloc(&mut self, node: Node<P, X>) -> NodeId {
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

    /// Checks the structure: edges are non-empty whole pages with one payload per page,
    /// children are keyed by their first page (and namespace at the root) and point back, a
    /// namespace never changes below the root, no page is held twice, and the page count
    /// matches the nodes.
    pub fn check(&self) -> Result<(), String> {
        let p = self.page_size;
        let mut seen = HashSet::new();
        let mut total = 0;
        for (id, node) in self.nodes() {
            if id != ROOT {
                if node.tokens.is_empty() || node.pages.len() * p != node.tokens.len() {
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
            for (key, &c) in &node.children {
                let child = &self.nodes[c];
                if !child.alive || child.parent != id || self.child_key_of(c) != *key {
                    return Err(format!("node {id} child {c} is dead, reparented or keyed wrongly"));
                }
            }
            if let Some(page) = node.pages.iter().find(|&&page| !seen.insert(page)) {
                return Err(format!("page {page:?} is held twice"));
            }
            total += node.pages.len();
        }
        if total != self.pages {
            return Err(format!("{total} pages in nodes but {} counted", self.pages));
        }
        Ok(())
    }
}

/// Panics with `what` and the problem when `check` finds one, in debug builds (after every
/// change, so a broken invariant is caught at the change that broke it).
pub(crate) fn debug_check(what: &str, check: impl FnOnce() -> Result<(), String>) {
    if cfg!(debug_assertions)
        && let Err(problem) = check()
    {
        panic!("{what} invariant broken: {problem}");
    }
}
