//! The request cache: one home for everything a request holds between admission and its end
//! (ARCHITECTURE.md §3). Behind [`RequestCache`] live the radix tree and the page allocator
//! (`prefix.rs`), the KV pool, a hybrid model's state pool with its running slots and snapshot
//! copies (`hybrid.rs`), and the disk tier. A request's life in it:
//!
//! - [`RequestCache::place`]: match its prompt, lock the prefix, take pages and a state slot,
//!   resume from a snapshot, read more of the prompt back from disk;
//! - [`RequestCache::grow`]: a page for the next decoded token;
//! - [`RequestCache::advance`]: after each forward pass, save states at snapshot points and
//!   share a finished prefill with other requests;
//! - [`RequestCache::write_through`]: after the step's tokens are out, queue what is new for the
//!   disk;
//! - [`RequestCache::finish`]: file its final state and K/V in the tree (and on disk), release
//!   the rest;
//! - [`RequestCache::reserve_draft`], [`RequestCache::accept_verified`]: pages for drafted
//!   tokens before a verify pass, and after it the accepted ones' state, the rest's pages back
//!   (speculative decoding);
//! - [`RequestCache::truncate`]: cut a running sequence back to an earlier length (no caller
//!   yet).
//!
//! Each sequence's [`CacheLease`] records its part; only this module changes it.

mod hybrid;
pub(crate) mod lease;
pub mod pages;
mod prefix;
#[cfg(test)]
mod tests;
mod truncate;

use radix_models::{KvPool, Model, StatePool};

use self::hybrid::RunningStates;
pub(crate) use self::hybrid::SnapshotSpacing;
pub(crate) use self::lease::CacheLease;
use self::prefix::PrefixCache;
use super::cache_key::CacheKeyBuf;
use super::disk_tier::DiskTier;
use super::metrics::EngineMetrics;
use super::sequence::Sequence;
use super::stats::EngineStats;

/// Where a request's prompt was found when it was placed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Prompt tokens read back from the disk tier past what memory held.
    pub(crate) restored_from_disk: usize,
}

/// The prefix cache with everything it hands out: pages, state slots, snapshots, the disk tier.
pub(crate) struct RequestCache {
    prefix: PrefixCache,
    pool: KvPool,
    /// Hybrid models: the state pool, its slots for running sequences and the snapshot points.
    states: Option<RunningStates>,
    /// The prefix cache's pages (and a hybrid model's snapshots) on disk too (`--cache-dir`).
    disk: Option<DiskTier>,
    /// Prefixes whose pages are to be written to disk once the step's tokens are out.
    pending_writes: Vec<(CacheKeyBuf, Vec<u32>)>,
}

impl RequestCache {
    /// A cache over `pool`; a hybrid model's `state` pool (of its bytes a slot) holds `running`
    /// slots for running sequences followed by its snapshot slots. `enabled: false` (`--no-prefix-cache`) reuses
    /// nothing; a hybrid model's prefills save their state as `spacing` says.
    pub(crate) fn new(
        pool: KvPool,
        state: Option<(StatePool, usize)>,
        running: usize,
        enabled: bool,
        spacing: SnapshotSpacing,
    ) -> Self {
        let snapshot_range = state.as_ref().map(|(s, _)| running as u32..s.num_slots() as u32);
        let prefix = PrefixCache::new(pool.page_size(), pool.num_pages(), enabled, snapshot_range);
        let states = state.map(|(pool, bytes)| RunningStates::new(pool, bytes, running, spacing));
        RequestCache { prefix, pool, states, disk: None, pending_writes: Vec::new() }
    }

    /// Keeps the prefix cache's pages in `disk` too: written as the tree takes them in, read
    /// back when a prompt continues past what the tree holds (ARCHITECTURE.md §3, "Disk tier").
    /// A hybrid model's prefix needs its recurrent state as well: it gets a disk tier only if
    /// that keeps snapshots ([`DiskTier::open_hybrid`]).
    pub(crate) fn with_disk_tier(mut self, disk: DiskTier) -> Self {
        if self.prefix.serves(true) && (self.states.is_none() || disk.keeps_snapshots()) {
            self.disk = Some(disk);
        }
        self
    }

    /// Tokens per page.
    pub(crate) fn page_size(&self) -> usize {
        self.prefix.page_size()
    }

    /// Pages in the pool.
    pub(crate) fn num_pages(&self) -> usize {
        self.prefix.pages_total()
    }

    /// Whether a request reads and extends the cache.
    pub(crate) fn serves(&self, use_cache: bool) -> bool {
        self.prefix.serves(use_cache)
    }

    /// How much of a waiting sequence's prompt (all but its last token) the cache holds for it:
    /// how the scheduler ranks waiting requests. A read-only peek: scoring moves no LRU clock,
    /// splits no edge and renews no snapshot.
    pub(crate) fn cached_prompt(&self, seq: &Sequence) -> usize {
        let (view, len) = (seq.view(), seq.prompt_len() - 1);
        self.prefix.cached_len(view, len)
    }

    /// Admits `seq`: matches its prompt's cached prefix (all but its last token, whose logits
    /// are needed), locks it, takes pages for the rest of the prompt, and for a hybrid model a
    /// state slot, filled from the snapshot it resumes at. The disk tier may hold more of the
    /// prompt than memory: that is read into the sequence's own pages now, before its prefill.
    /// `None`, with nothing changed, when the pages cannot be had even after evicting unused
    /// cache.
    pub(crate) fn place(&mut self, seq: &mut Sequence) -> Option<Placement> {
        let (view, lease) = seq.cache_parts();
        let placed = self.prefix.place(view, lease)?;
        if let Some(states) = self.states.as_mut() {
            states.start(lease, placed.resume_from);
        }
        let mut placement = Placement::default();
        if let Some(disk) = self.disk.as_mut()
            && self.prefix.serves(view.request.use_cache)
        {
            let key = view.cache_key(view.prompt_len - 1);
            let restored = match self.states.as_mut() {
                Some(states) => states.restore_from_disk(disk, key, lease, &mut self.pool, &mut self.prefix),
                None => disk.restore(key, lease.computed, &lease.pages, &mut self.pool),
            };
            lease.cached_tokens += restored;
            lease.computed += restored;
            lease.kv_matched = lease.kv_matched.max(lease.cached_tokens);
            placement.restored_from_disk = restored;
        }
        if let Some(states) = &self.states
            && self.prefix.serves(view.request.use_cache)
        {
            lease.snapshot_points = states.snapshot_points(view, lease, self.prefix.page_size());
        }
        Some(placement)
    }

    /// Gives a decoding sequence a page for its next token when it crosses a page boundary;
    /// `false` when the pool is full even after eviction.
    pub(crate) fn grow(&mut self, seq: &mut Sequence) -> bool {
        let (view, lease) = seq.cache_parts();
        self.prefix.grow(view, lease)
    }

    /// Gives a decoding sequence pages for `drafted` tokens verified after its last one;
    /// returns how many of them its pages hold (the draft is cut to that).
    pub(crate) fn reserve_draft(&mut self, seq: &mut Sequence, drafted: usize) -> usize {
        let (view, lease) = seq.cache_parts();
        self.prefix.reserve(lease, view.tokens.len() + drafted).saturating_sub(view.tokens.len())
    }

    /// Gives back the pages [`reserve_draft`](Self::reserve_draft) held past `seq`'s tokens
    /// and the first `drafted` of its draft (the multi-token-prediction head drafted fewer).
    pub(crate) fn release_draft(&mut self, seq: &mut Sequence, drafted: usize) {
        let (view, lease) = seq.cache_parts();
        self.prefix.trim(lease, view.tokens.len() + drafted);
    }

    /// After a pass verified drafted tokens for `seq` and the postprocess took what it
    /// accepted: its K/V and state are those of its first `end` tokens. A hybrid model's state,
    /// which the verify pass only read, is advanced over the accepted rows by `model`, with the
    /// rolling snapshot at a page boundary among them; the pages past its tokens go back. The
    /// tree and the snapshots only ever see accepted tokens. On an error (the model's) the
    /// sequence's state cannot be trusted: the caller fails it.
    pub(crate) fn accept_verified(&mut self, seq: &mut Sequence, end: usize, model: &Model) -> Result<(), String> {
        let (view, lease) = seq.cache_parts();
        let start = lease.computed;
        debug_assert!(start < end && end <= view.tokens.len(), "accepting up to {end} from {start}");
        if let Some(states) = self.states.as_mut() {
            let slot = lease.state_slot.expect("a running hybrid sequence has a state slot");
            let fail = |e: radix_models::ModelError| format!("cannot apply the verified tokens' state: {e}");
            let page_size = self.prefix.page_size();
            let boundary = (end - 1) / page_size * page_size;
            let mut applied = start;
            if boundary > start && !end.is_multiple_of(page_size) {
                model.apply_verified(states.pool_mut(), slot, 0..boundary - start).map_err(fail)?;
                states.save_at(view, lease, boundary, &mut self.prefix, self.disk.as_mut());
                applied = boundary;
            }
            model.apply_verified(states.pool_mut(), slot, applied - start..end - start).map_err(fail)?;
            states.pool_mut().discard_verified(slot);
            states.save_at(view, lease, end, &mut self.prefix, self.disk.as_mut());
        }
        lease.computed = end;
        self.prefix.trim(lease, view.tokens.len());
        Ok(())
    }

    /// The pools a forward pass reads and writes.
    pub(crate) fn pools(&mut self) -> (&mut KvPool, Option<&mut StatePool>) {
        (&mut self.pool, self.states.as_mut().map(RunningStates::pool_mut))
    }

    /// Records that a forward pass computed `seq` up to `end` tokens: saves the states it
    /// reached at snapshot points (a hybrid model's), and shares a prompt just prefilled at
    /// once; its pages are written to disk by the next [`RequestCache::write_through`].
    pub(crate) fn advance(&mut self, seq: &mut Sequence, end: usize) {
        let (view, lease) = seq.cache_parts();
        if let Some(states) = self.states.as_mut() {
            states.save_at(view, lease, end, &mut self.prefix, self.disk.as_mut());
        }
        if lease.computed < view.prompt_len && end >= view.prompt_len {
            self.prefix.share_prompt(view, lease, end);
            if self.disk.is_some() && self.prefix.serves(view.request.use_cache) {
                self.pending_writes.push((view.cache_key(end).to_buf(), lease.pages.clone()));
            }
        }
        lease.computed = end;
    }

    /// Queues for the disk the pages of the prompts the last step shared: called once the
    /// step's tokens are out, so that copying pages is not on the path of the first token.
    /// Nothing has written the pool since, and the sharing sequences still lock those pages.
    pub(crate) fn write_through(&mut self) {
        let Some(disk) = self.disk.as_mut() else { return };
        for (key, pages) in self.pending_writes.drain(..) {
            disk.persist(key.as_key(), &pages, &self.pool);
        }
    }

    /// Ends `seq` (`failed`: after a failed step, whose K/V and state may be half written, and
    /// are not kept): its final state is filed as a snapshot, what it computed enters the tree
    /// and the disk, its other pages and its state slot go back.
    pub(crate) fn finish(&mut self, seq: &mut Sequence, failed: bool) {
        self.write_through();
        let (view, lease) = seq.cache_parts();
        if let Some(states) = self.states.as_mut() {
            states.save_final(view, lease, failed, &mut self.prefix, self.disk.as_mut());
        }
        if let Some(disk) = self.disk.as_mut()
            && !failed
            && self.prefix.serves(view.request.use_cache)
        {
            disk.persist(view.cache_key(lease.computed), &lease.pages, &self.pool);
        }
        self.prefix.release(view, lease);
        if let Some(states) = self.states.as_mut() {
            states.end(lease);
        }
    }

    /// Waits until the disk tier has written everything queued (a graceful shutdown). A hybrid
    /// model's snapshots that only memory kept (those no request was expected to resume from:
    /// message boundaries, intervals) are written first, so a restart after a graceful stop
    /// resumes where memory would have; after a SIGKILL only the expected ones are there.
    pub(crate) fn flush_disk(&mut self) {
        self.write_through();
        let Some(disk) = self.disk.as_mut() else { return };
        if let Some(states) = &self.states {
            for snapshot in self.prefix.snapshot_prefixes() {
                disk.persist_snapshot(snapshot.key(), states.pool(), snapshot.slot);
            }
        }
        disk.flush();
    }

    /// After a step panicked half-way (its running sequences dropped): starts the prefix cache
    /// afresh, since what the step left in it cannot be trusted; every state slot is free.
    pub(crate) fn recover(&mut self) {
        self.pending_writes.clear();
        self.prefix = self.prefix.emptied();
        if let Some(states) = self.states.as_mut() {
            states.free_all();
        }
    }

    /// Drops every cached prefix (nothing may be running).
    pub(crate) fn flush(&mut self) {
        self.prefix.flush();
    }

    /// The cache's counts for `/health`; the scheduler's (running, waiting) are left at zero.
    pub(crate) fn stats(&self) -> EngineStats {
        EngineStats {
            pages_total: self.prefix.pages_total(),
            pages_free: self.prefix.pages_free(),
            pages_cached: self.prefix.pages_cached(),
            page_size: self.prefix.page_size(),
            snapshots: self.prefix.snapshots_cached(),
            snapshot_slots: self.prefix.snapshot_slots(),
            snapshot_slots_free: self.prefix.snapshot_slots_free(),
            snapshot_bytes: self.states.as_ref().map_or(0, RunningStates::slot_bytes),
            state_slots: self.states.as_ref().map_or(0, RunningStates::running_slots),
            state_slots_free: self.states.as_ref().map_or(0, RunningStates::free_slots),
            disk: self.disk.as_ref().map(DiskTier::stats).unwrap_or_default(),
            ..EngineStats::default()
        }
    }

    /// `metrics` with the cache's counters filled in.
    pub(crate) fn metrics(&self, metrics: EngineMetrics) -> EngineMetrics {
        let evicted = self.prefix.evicted_pages();
        EngineMetrics {
            evicted_pages: evicted,
            evicted_tokens: evicted * self.prefix.page_size() as u64,
            evicted_snapshots: self.prefix.evicted_snapshots(),
            disk: self.disk.as_ref().map(DiskTier::metrics).unwrap_or_default(),
            ..metrics
        }
    }

    /// Every snapshot in the prefix cache: the token key of its prefix and its state (conv then
    /// SSM per layer, as [`StatePool::read_slot`]), to check them against a cold prefill.
    pub(crate) fn snapshot_states(&self) -> Vec<(Vec<u32>, Vec<f32>)> {
        let Some(states) = &self.states else { return Vec::new() };
        let snapshots = self.prefix.snapshot_prefixes();
        snapshots.into_iter().map(|s| (s.tokens, states.pool().read_slot(s.slot).expect("a snapshot slot"))).collect()
    }

    /// Every page is free, in the tree, or private to exactly one running sequence; locks are
    /// zero when nothing runs; each state slot for running sequences is free or held by one,
    /// and each snapshot slot free, in the tree, or held by one; the disk index is sound.
    pub(crate) fn check_invariants(&self, running: &[Sequence]) -> Result<(), String> {
        let leases: Vec<&CacheLease> = running.iter().map(Sequence::lease).collect();
        self.prefix.check_invariants(&leases)?;
        if let Some(disk) = &self.disk {
            disk.check_invariants()?;
        }
        if let Some(states) = &self.states {
            states.check_invariants(&leases)?;
        }
        Ok(())
    }
}
