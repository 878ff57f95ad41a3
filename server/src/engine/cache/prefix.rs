//! The radix tree and the page allocator under one set of rules: place a prompt (match, lock,
//! allocate), share its prefill while it runs, grow its pages while it decodes, insert what it
//! computed when it ends, release the rest, and evict unused cache to make room
//! (ARCHITECTURE.md §3). The request cache (`mod.rs`) drives these for each lease.
//!
//! Page ownership (ARCHITECTURE.md §3 invariant 1): every page is free, in the tree, or private to
//! exactly one running sequence. A sequence's page table starts with the pages of its matched
//! prefix (the tree's; locked while it runs) and continues with its own. Matches end on a page
//! boundary and new tokens start there, so nobody writes into a page the tree holds.
//!
//! Hybrid models (ARCHITECTURE.md §3, "Recurrent-state snapshots"): a prefix is reused only up
//! to the deepest snapshot on its path, whose state the sequence resumes from. Snapshot slots of
//! the state pool are, like pages, each free, in the tree, or held by exactly one running
//! sequence (taken during its prefill or decode and not yet filed in the tree).

use std::collections::HashSet;
use std::ops::Range;

use super::lease::CacheLease;
use super::pages::PageAllocator;
use crate::engine::radix::{RadixCache, SnapshotPrefix};
use crate::engine::sequence::SequenceView;

/// What [`PrefixCache::place`] found for a hybrid model's sequence.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    /// The snapshot slot holding the state to resume from (none: the state starts afresh).
    pub(crate) resume_from: Option<u32>,
}

/// The radix tree and the page allocator, and every rule about who owns which page.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    tree: RadixCache,
    alloc: PageAllocator,
    page_size: usize,
    /// Reuse cached prefixes at all (`--no-prefix-cache` turns it off).
    enabled: bool,
    /// Pages evicted to make room since start-up.
    evicted_pages: u64,
    /// Hybrid models: the state-pool slots that hold snapshots.
    snapshots: Option<SnapshotSlots>,
}

/// The state-pool slots set aside for snapshots, and which of them are free.
#[derive(Debug, Clone)]
struct SnapshotSlots {
    all: Range<u32>,
    free: Vec<u32>,
    /// Snapshots dropped to make room since start-up (with their node or on their own).
    evicted: u64,
}

impl SnapshotSlots {
    fn new(all: Range<u32>) -> Self {
        SnapshotSlots { free: all.clone().rev().collect(), all, evicted: 0 }
    }
}

impl PrefixCache {
    /// An empty cache over a pool of `num_pages` pages of `page_size` tokens; a hybrid model's
    /// cache also gets the state-pool slots `snapshot_slots` for its snapshots.
    pub(crate) fn new(page_size: usize, num_pages: usize, enabled: bool, snapshot_slots: Option<Range<u32>>) -> Self {
        PrefixCache {
            tree: RadixCache::new(page_size),
            alloc: PageAllocator::new(num_pages),
            page_size,
            enabled,
            evicted_pages: 0,
            snapshots: snapshot_slots.map(SnapshotSlots::new),
        }
    }

    /// Snapshots in the tree.
    pub(crate) fn snapshots_cached(&self) -> usize {
        self.tree.snapshots()
    }

    /// Slots set aside for snapshots (0 for a dense model).
    pub(crate) fn snapshot_slots(&self) -> usize {
        self.snapshots.as_ref().map_or(0, |s| s.all.len())
    }

    /// Every snapshot in the tree: its prefix and its slot.
    pub(crate) fn snapshot_prefixes(&self) -> Vec<SnapshotPrefix> {
        self.tree.snapshot_prefixes()
    }

    /// Snapshot slots neither in the tree nor held by a running sequence.
    pub(crate) fn snapshot_slots_free(&self) -> usize {
        self.snapshots.as_ref().map_or(0, |s| s.free.len())
    }

    /// Snapshots dropped to make room since start-up.
    pub(crate) fn evicted_snapshots(&self) -> u64 {
        self.snapshots.as_ref().map_or(0, |s| s.evicted)
    }

    /// A slot to save a snapshot in: a free one, else that of the snapshot GreedyDual-Size ranks
    /// lowest (see [`RadixCache::evict_snapshot`]); `None` when every slot is held by running sequences.
    pub(crate) fn take_snapshot_slot(&mut self) -> Option<u32> {
        let slots = self.snapshots.as_mut()?;
        if let Some(slot) = slots.free.pop() {
            return Some(slot);
        }
        let slot = self.tree.evict_snapshot()?;
        slots.evicted += 1;
        Some(slot)
    }

    /// Gives back a snapshot slot the tree did not take.
    pub(crate) fn free_snapshot(&mut self, slot: u32) {
        if let Some(slots) = self.snapshots.as_mut() {
            debug_assert!(slots.all.contains(&slot) && !slots.free.contains(&slot), "snapshot slot {slot} freed twice");
            slots.free.push(slot);
        }
    }

    /// Files the sequence's snapshots of at most `upto` tokens in the tree (its KV must be
    /// there), freeing those the tree does not take.
    fn file_snapshots(&mut self, seq: SequenceView, lease: &mut CacheLease, upto: usize) {
        let mut later = Vec::new();
        for (len, slot) in std::mem::take(&mut lease.snapshots) {
            let expected =
                lease.expects_resume_at(len, seq.prompt_len) || lease.branch_expected.binary_search(&len).is_ok();
            if len > upto {
                later.push((len, slot));
            } else if let Err(slot) = self.tree.attach_snapshot(seq.cache_key(len), slot, expected) {
                self.free_snapshot(slot);
            }
        }
        lease.snapshots = later;
    }

    /// Tokens per page.
    pub(crate) fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages in the pool.
    pub(crate) fn pages_total(&self) -> usize {
        self.alloc.num_pages()
    }

    /// Free pages.
    pub(crate) fn pages_free(&self) -> usize {
        self.alloc.free_pages()
    }

    /// Pages the tree holds.
    pub(crate) fn pages_cached(&self) -> usize {
        self.tree.cached_pages()
    }

    /// Pages evicted to make room since start-up (a flush is not counted).
    pub(crate) fn evicted_pages(&self) -> u64 {
        self.evicted_pages
    }

    /// A cache like this one, empty: every page free, no tree.
    pub(crate) fn emptied(&self) -> Self {
        PrefixCache::new(
            self.page_size(),
            self.pages_total(),
            self.enabled,
            self.snapshots.as_ref().map(|s| s.all.clone()),
        )
    }

    /// Whether a request reads and extends the cache.
    pub(crate) fn serves(&self, use_cache: bool) -> bool {
        self.enabled && use_cache
    }

    /// How much of the first `len` tokens of `seq` the cache holds for it (a hybrid model's:
    /// up to the deepest snapshot), without touching the tree: nothing is used yet.
    pub(crate) fn cached_len(&self, seq: SequenceView, len: usize) -> usize {
        if !self.serves(seq.request.use_cache) {
            return 0;
        }
        let peek = self.tree.peek_prefix(seq.cache_key(len));
        match self.snapshots {
            Some(_) => peek.snapshot.unwrap_or(0),
            None => peek.tokens,
        }
    }

    /// Matches the prompt's cached prefix (all but its last token, whose logits are needed),
    /// locks it, and allocates pages for the rest of the prompt. On `None` nothing changed.
    /// A hybrid model's match ends at its deepest snapshot, which the sequence is to resume
    /// from; `kv_matched` keeps how far the KV alone matched.
    pub(crate) fn place(&mut self, seq: SequenceView, lease: &mut CacheLease) -> Option<Placed> {
        let (mut node, mut cached, mut pages, mut kv_matched, mut restore) = (None, 0, Vec::new(), 0, None);
        if self.serves(seq.request.use_cache) {
            let m = self.tree.match_prefix(seq.cache_key(seq.prompt_len - 1));
            kv_matched = m.tokens;
            if self.snapshots.is_some() {
                lease.expected_points = expected_points(seq, self.page_size);
                // The system block's line starts: a conversation starting there (its match ends
                // inside the block) expects others to branch there too (a subagent, often many
                // requests later); a request going on past the block leaves them as they are.
                let mut lines: Vec<usize> =
                    seq.request.branch_points.iter().map(|&p| p / self.page_size * self.page_size).collect();
                lines.dedup();
                let starts_here = lines.last().is_some_and(|&last| m.tokens <= last);
                if starts_here {
                    let mut marked = lease.expected_points.clone();
                    marked.extend(&lines);
                    lease.branch_expected = lines;
                    marked.sort_unstable();
                    marked.dedup();
                    self.tree.mark_expected(m.node, m.tokens, &marked);
                } else {
                    lease.branch_expected.clear();
                    self.tree.mark_expected_keeping(m.node, m.tokens, &lease.expected_points, &lines);
                }
            }
            match (&self.snapshots, m.snapshot) {
                (None, _) => (node, cached, pages) = (Some(m.node), m.tokens, m.pages),
                (Some(_), Some(hit)) => {
                    (node, cached, restore) = (Some(hit.node), hit.tokens, Some(hit.slot));
                    pages = m.pages[..hit.tokens / self.page_size].to_vec();
                }
                (Some(_), None) => {}
            }
        }
        if let Some(node) = node {
            self.tree.lock(node);
        }
        let needed = seq.prompt_len.div_ceil(self.page_size) - pages.len();
        match self.allocate(needed) {
            Some(own) => pages.extend(own),
            None => {
                if let Some(node) = node {
                    self.tree.unlock(node);
                }
                return None;
            }
        }
        lease.node = node;
        lease.locked_tokens = cached;
        lease.cached_tokens = cached;
        lease.computed = cached;
        lease.pages = pages;
        lease.kv_matched = kv_matched;
        Some(Placed { resume_from: restore })
    }

    /// Gives a decoding sequence a page for its next token when it crosses a page boundary;
    /// `false` when the pool is full even after eviction.
    pub(crate) fn grow(&mut self, seq: SequenceView, lease: &mut CacheLease) -> bool {
        let need = seq.tokens.len().div_ceil(self.page_size);
        if lease.pages.len() >= need {
            return true;
        }
        match self.allocate(need - lease.pages.len()) {
            Some(pages) => {
                lease.pages.extend(pages);
                true
            }
            None => false,
        }
    }

    /// Gives a decoding sequence pages for its first `positions` positions (its tokens and the
    /// drafts verified after them), evicting unused cache if needed; returns how many positions
    /// its pages hold, `positions` or fewer when the pool cannot give more.
    pub(crate) fn reserve(&mut self, lease: &mut CacheLease, positions: usize) -> usize {
        let need = positions.div_ceil(self.page_size);
        if lease.pages.len() < need
            && let Some(pages) = self.allocate(need - lease.pages.len())
        {
            lease.pages.extend(pages);
        }
        positions.min(lease.pages.len() * self.page_size)
    }

    /// Gives back the sequence's pages past its first `positions` positions (those a verify
    /// pass wrote for rejected drafts). They are its own: the prefix it shares with the tree
    /// ends before.
    pub(crate) fn trim(&mut self, lease: &mut CacheLease, positions: usize) {
        let keep = positions.div_ceil(self.page_size);
        debug_assert!(keep * self.page_size >= lease.locked_tokens, "trimming into the locked prefix");
        if lease.pages.len() > keep {
            self.alloc.release(lease.pages.split_off(keep));
        }
    }

    /// Puts a sequence's just-prefilled prompt (its first `computed` tokens) into the tree while
    /// it keeps running, so that requests sharing the prompt (subagents, parallel sessions)
    /// reuse it instead of computing it again. Its page table switches to the tree's pages
    /// wherever the tree already held the same tokens, and its lock moves to the end of the
    /// prompt.
    pub(crate) fn share_prompt(&mut self, seq: SequenceView, lease: &mut CacheLease, computed: usize) {
        if !self.serves(seq.request.use_cache) {
            for (_, slot) in std::mem::take(&mut lease.snapshots) {
                self.free_snapshot(slot);
            }
            return;
        }
        let key = seq.cache_key(computed);
        let inserted = self.tree.insert(key, &lease.pages);
        if !inserted.duplicate_pages.is_empty() {
            let tree_pages = self.tree.match_prefix(key.prefix(inserted.present_tokens)).pages;
            lease.pages[..tree_pages.len()].copy_from_slice(&tree_pages);
            self.alloc.release(inserted.duplicate_pages);
        }
        self.tree.lock(inserted.node);
        if let Some(old) = lease.node.replace(inserted.node) {
            self.tree.unlock(old);
        }
        lease.locked_tokens = computed / self.page_size * self.page_size;
        self.file_snapshots(seq, lease, computed);
    }

    /// Inserts what an ending sequence computed into the tree (prompt and output, so the next
    /// turn of a conversation hits) with its snapshots, frees the pages and snapshot slots the
    /// tree does not take, and unlocks its prefix.
    pub(crate) fn release(&mut self, seq: SequenceView, lease: &mut CacheLease) {
        let kept = if self.serves(seq.request.use_cache) {
            let inserted = self.tree.insert(seq.cache_key(lease.computed), &lease.pages);
            self.alloc.release(inserted.duplicate_pages);
            self.file_snapshots(seq, lease, lease.computed);
            lease.computed / self.page_size
        } else {
            // Without the cache, only a matched prefix (none) belongs to the tree.
            0
        };
        for (_, slot) in std::mem::take(&mut lease.snapshots) {
            self.free_snapshot(slot);
        }
        self.alloc.release(lease.pages[kept..].iter().copied());
        if let Some(node) = lease.node.take() {
            self.tree.unlock(node);
        }
        lease.pages.clear();
        lease.locked_tokens = 0;
    }

    /// The deepest snapshot in the tree at or before `len` tokens on the prefix the lease has
    /// locked (its length and slot): one the sequence can go back to.
    pub(crate) fn snapshot_on_locked_path(
        &mut self,
        seq: SequenceView,
        lease: &CacheLease,
        len: usize,
    ) -> Option<(usize, u32)> {
        let depth = len.min(lease.locked_tokens);
        if lease.node.is_none() || depth == 0 || !self.serves(seq.request.use_cache) {
            return None;
        }
        let hit = self.tree.match_prefix(seq.cache_key(depth)).snapshot?;
        Some((hit.tokens, hit.slot))
    }

    /// Cuts the lease's page table to hold `len` tokens of which the first `keep` stay computed
    /// (`keep <= len`, `keep <= lease.computed`) and returns how many do: `keep`, or its page
    /// boundary when it falls inside the prefix the lease shares with the tree, whose lock then
    /// moves back there (nobody writes into a page the tree holds; the tree keeps its pages).
    /// The sequence's own pages fill the table past the shared prefix, the pool gives what is
    /// missing and takes back what is left over. `None`, with nothing changed, when the pool
    /// cannot give them.
    pub(crate) fn truncate(
        &mut self,
        seq: SequenceView,
        lease: &mut CacheLease,
        keep: usize,
        len: usize,
    ) -> Option<usize> {
        debug_assert!(keep <= len && keep <= lease.computed, "truncating to {len} keeping {keep}");
        let p = self.page_size;
        let relock = keep < lease.locked_tokens;
        let shared = if relock { keep / p * p } else { lease.locked_tokens };
        let (own_from, old_own_from, need) = (shared / p, lease.locked_tokens / p, len.div_ceil(p));
        let want_own = need - own_from;
        let fresh = want_own.saturating_sub(lease.pages.len() - old_own_from);
        // Taken first: a failure leaves the lease as it was, and the locked prefix cannot be
        // evicted to make the room.
        let fresh_pages = self.allocate(fresh)?;
        if relock {
            let node = (shared > 0).then(|| self.tree.match_prefix(seq.cache_key(shared)).node);
            if let Some(node) = node {
                self.tree.lock(node);
            }
            if let Some(old) = std::mem::replace(&mut lease.node, node) {
                self.tree.unlock(old);
            }
            lease.locked_tokens = shared;
        }
        // Kept in order: below `keep` their K/V stay where they are.
        let mut own = lease.pages.split_off(old_own_from);
        lease.pages.truncate(own_from);
        if own.len() > want_own {
            self.alloc.release(own.split_off(want_own));
        }
        lease.pages.extend(own);
        lease.pages.extend(fresh_pages);
        debug_assert_eq!(lease.pages.len(), need);
        Some(if relock { shared } else { keep })
    }

    /// Drops every unlocked cached prefix (all of them when nothing runs).
    pub(crate) fn flush(&mut self) {
        let freed = self.tree.evict(usize::MAX);
        self.alloc.release(freed.pages);
        for slot in freed.snapshots {
            self.free_snapshot(slot);
        }
    }

    /// Takes `n` free pages, evicting unlocked cache, least recently used first, if needed.
    /// When even evicting everything unlocked would not make room, nothing is evicted: the
    /// cache is not thrown away for a request that has to wait anyway.
    fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        let free = self.alloc.free_pages();
        if free < n {
            if free + self.tree.evictable_pages() < n {
                return None;
            }
            let freed = self.tree.evict(n - free);
            self.evicted_pages += freed.pages.len() as u64;
            self.alloc.release(freed.pages);
            if let Some(slots) = self.snapshots.as_mut() {
                slots.evicted += freed.snapshots.len() as u64;
            }
            for slot in freed.snapshots {
                self.free_snapshot(slot);
            }
        }
        self.alloc.allocate(n)
    }

    /// Every page is free, in the tree, or private to exactly one of the `running` sequences;
    /// locks are zero when nothing runs; the tree itself is sound.
    pub(crate) fn check_invariants(&self, running: &[&CacheLease]) -> Result<(), String> {
        self.tree.check_invariants()?;
        let mut owner = vec![0u8; self.alloc.num_pages()];
        let mut mark = |page: u32, what: &str| -> Result<(), String> {
            let slot = owner.get_mut(page as usize).ok_or(format!("page {page} outside the pool"))?;
            *slot += 1;
            if *slot > 1 { Err(format!("page {page} counted twice (last as {what})")) } else { Ok(()) }
        };
        for &page in self.alloc.free_list() {
            mark(page, "free")?;
        }
        let tree_pages = self.tree.pages();
        for &page in &tree_pages {
            mark(page, "cached")?;
        }
        let tree_set: HashSet<u32> = tree_pages.into_iter().collect();
        for lease in running {
            for &page in lease.pages.iter().filter(|p| !tree_set.contains(p)) {
                mark(page, "private")?;
            }
        }
        if let Some(page) = owner.iter().position(|&n| n == 0) {
            return Err(format!("page {page} is neither free, cached nor used"));
        }
        if running.is_empty() && self.tree.any_locked() {
            return Err("a node is locked while nothing runs".into());
        }
        if let Some(slots) = &self.snapshots {
            let tree = self.tree.snapshot_prefixes().into_iter().map(|s| s.slot);
            let held = running.iter().flat_map(|lease| lease.held_snapshot_slots());
            let mut all: Vec<u32> = slots.free.iter().copied().chain(tree).chain(held).collect();
            all.sort_unstable();
            if all != slots.all.clone().collect::<Vec<_>>() {
                return Err(format!("snapshot slots are not each free, cached or held once: {all:?}"));
            }
        }
        Ok(())
    }
}

/// A sequence's expected points (`GenerateRequest::expected_points`) and its prompt's
/// all-but-last token (where the same prompt sent again resumes, and where the next turn does
/// when the template writes the reply's start differently, merging the last prompt token with
/// what follows), rounded down to whole pages, ascending.
fn expected_points(seq: SequenceView, page_size: usize) -> Vec<usize> {
    let named = seq.request.expected_points.iter().copied().filter(|&p| p < seq.prompt_len);
    let mut points: Vec<usize> = named.chain([seq.prompt_len - 1]).map(|p| p / page_size * page_size).collect();
    points.sort_unstable();
    points.dedup();
    points
}
