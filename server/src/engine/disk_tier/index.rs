//! The disk tier's index: the memory tree's radix tree (`radix/tree.rs`) with references into
//! page files for pages.
//!
//! It is prefix-closed: a prefix is added only as the continuation of one the index already
//! holds, and only leaves are evicted, so every page in it can be restored once the pages
//! before it are. References are per page, so a match may end inside an edge without a split
//! (a split is made only where a new continuation branches off). Least recently used leaves go
//! first when the disk budget is full; a page found damaged takes everything below it along.

use crate::engine::cache_key::CacheKey;
use crate::engine::radix::tree::{self, Tree};

pub(crate) use crate::engine::radix::tree::{NodeId, ROOT};

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
    /// Nodes carry nothing beyond their pages: the disk has no locks or snapshots in the tree.
    tree: Tree<PageRef, ()>,
}

impl DiskIndex {
    /// An empty index over pages of `page_size` tokens.
    pub fn new(page_size: usize) -> Self {
        DiskIndex { tree: Tree::new(page_size) }
    }

    /// Pages the index holds.
    pub fn pages(&self) -> usize {
        self.tree.pages()
    }

    /// The longest whole-page prefix of `key` the index holds, marked as just used.
    pub fn lookup<'a>(&mut self, key: impl Into<CacheKey<'a>>) -> Lookup {
        // A lookup never splits: references are per page, so a match can end inside an edge.
        let found = self.tree.visit(key.into(), false);
        Lookup { tokens: found.tokens, refs: self.tree.path_pages(&found), node: found.node }
    }

    /// Adds the pages `refs` as the continuation of `key` after its first `start` tokens, which
    /// the index must hold and no further ([`lookup`](Self::lookup) of `key` gives `start`).
    /// Returns the new leaf.
    pub fn extend<'a>(&mut self, key: impl Into<CacheKey<'a>>, start: usize, refs: Vec<PageRef>) -> NodeId {
        let p = self.tree.page_size();
        let key = key.into();
        let end = start + refs.len() * p;
        assert!(!refs.is_empty() && start.is_multiple_of(p) && end <= key.len(), "whole pages of the key");
        let parent = self.node_at(key, start);
        assert!(self.tree.child(parent, key, start).is_none(), "the index already holds more of the key");
        self.tree.tick();
        let leaf = self.tree.add_leaf(parent, key, start, refs, ());
        self.debug_check();
        leaf
    }

    /// The node ending exactly `at` tokens down `key` (which the index holds that far),
    /// splitting an edge if `at` falls inside one.
    fn node_at(&mut self, key: CacheKey<'_>, at: usize) -> NodeId {
        let found = self.tree.descend(key.prefix(at));
        debug_assert_eq!(found.tokens, at, "the index holds the key that far");
        found.node
    }

    /// Removes the least recently used leaf other than `keep` and returns its pages; `None`
    /// when there is none.
    pub fn evict_lru(&mut self, keep: NodeId) -> Option<Vec<PageRef>> {
        let victim =
            self.tree.leaves().filter(|&id| id != keep).min_by_key(|&id| (self.tree.node(id).last_use(), id))?;
        let refs = self.tree.remove_subtree(victim).pages;
        self.debug_check();
        Some(refs)
    }

    /// Removes every page of `key`'s path from `at` tokens on (a whole number of pages the
    /// index holds), with everything below them, and returns their pages.
    pub fn remove_from<'a>(&mut self, key: impl Into<CacheKey<'a>>, at: usize) -> Vec<PageRef> {
        let key = key.into();
        let matched = self.tree.find(key).tokens;
        if at >= matched || !at.is_multiple_of(self.tree.page_size()) {
            return Vec::new();
        }
        let parent = self.node_at(key, at);
        let child = self.tree.child(parent, key, at).expect("the index holds the key past `at`");
        let refs = self.tree.remove_subtree(child).pages;
        self.debug_check();
        refs
    }

    /// Every page reference held, for the file counts' check.
    pub fn all_refs(&self) -> impl Iterator<Item = PageRef> + '_ {
        self.tree.all_pages()
    }

    fn debug_check(&self) {
        tree::debug_check("disk index", || self.check_invariants());
    }

    /// Edges are non-empty whole pages with one reference per page, children are keyed by their
    /// first page and point back, no page reference is held twice, and the page count matches.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.tree.check()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

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
