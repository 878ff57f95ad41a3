//! A hybrid model's recurrent state in the cache (ARCHITECTURE.md §3, "Recurrent-state
//! snapshots"): a state slot per running sequence, and the copies between it and the snapshot
//! slots the prefix cache files in the tree: where a sequence resumes, at the prompt's
//! structural points, at page boundaries decoding crosses, and where a sequence ends.

use radix_models::{KvPool, StatePool};

use super::lease::CacheLease;
use super::prefix::PrefixCache;
use crate::engine::cache_key::CacheKey;
use crate::engine::disk_tier::DiskTier;
use crate::engine::sequence::SequenceView;

/// Where a hybrid sequence's prefill saves its state between the request's snapshot points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SnapshotSpacing {
    /// A snapshot at least every this many prompt tokens (at least 1).
    pub interval: usize,
    /// Inside the leading system block, one at a line start (`GenerateRequest::branch_points`)
    /// at least this many tokens after the point before it (0: none).
    pub branch: usize,
}

/// The state pool: its first `running` slots for running sequences, then the snapshot slots.
pub(super) struct RunningStates {
    pool: StatePool,
    running: usize,
    /// Running-sequence slots no running sequence holds.
    free: Vec<u32>,
    /// Bytes of one slot.
    slot_bytes: usize,
    /// Where prefills save the state besides the request's points.
    spacing: SnapshotSpacing,
}

impl RunningStates {
    /// `pool` (of `slot_bytes` a slot), its first `running` slots for running sequences.
    pub(super) fn new(pool: StatePool, slot_bytes: usize, running: usize, spacing: SnapshotSpacing) -> Self {
        RunningStates {
            pool,
            running,
            free: (0..running as u32).rev().collect(),
            slot_bytes,
            spacing: SnapshotSpacing { interval: spacing.interval.max(1), ..spacing },
        }
    }

    pub(super) fn pool(&self) -> &StatePool {
        &self.pool
    }

    pub(super) fn pool_mut(&mut self) -> &mut StatePool {
        &mut self.pool
    }

    /// Bytes of one state (one snapshot).
    pub(super) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Slots for running sequences.
    pub(super) fn running_slots(&self) -> usize {
        self.running
    }

    /// Of which free.
    pub(super) fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Every running slot free again (after a failed step dropped its sequences).
    pub(super) fn free_all(&mut self) {
        self.free = (0..self.running as u32).rev().collect();
    }

    /// Gives a placed sequence its state slot, with the state of the snapshot it resumes from.
    pub(super) fn start(&mut self, lease: &mut CacheLease, resume_from: Option<u32>) {
        // The scheduler runs at most as many sequences as there are slots.
        let slot = self.free.pop().expect("a state slot for every running sequence");
        lease.state_slot = Some(slot);
        if let Some(from) = resume_from {
            // Placed a moment ago: its node is locked, and only a step hands out slots.
            self.copy(from, slot);
        }
    }

    /// Takes back an ended sequence's slot.
    pub(super) fn end(&mut self, lease: &mut CacheLease) {
        if let Some(slot) = lease.state_slot.take() {
            self.free.push(slot);
        }
    }

    fn copy(&mut self, from: u32, to: u32) {
        self.pool.copy_slot(from, to).expect("snapshot and sequence slots are in the pool");
    }

    /// Reads more of the prompt back from `disk` past the memory match, with the state at its
    /// end into the sequence's slot; the state read back also goes into the tree with the
    /// prompt's K/V, so the next request with this prefix finds it in memory. Returns the
    /// tokens restored.
    pub(super) fn restore_from_disk(
        &mut self,
        disk: &mut DiskTier,
        key: CacheKey,
        lease: &mut CacheLease,
        pool: &mut KvPool,
        prefix: &mut PrefixCache,
    ) -> usize {
        let slot = lease.state_slot.expect("a placed sequence has a state slot");
        let restored = disk.restore_resumable(key, lease.computed, &lease.pages, pool, &mut self.pool, slot);
        if restored > 0
            && let Some(snapshot) = prefix.take_snapshot_slot()
        {
            self.copy(slot, snapshot);
            lease.snapshots.push((lease.computed + restored, snapshot));
        }
        restored
    }

    /// Where a hybrid sequence's prefill saves its state: the request's structural points
    /// (message boundaries, from the API); inside the leading system block, line starts at
    /// least `spacing.branch` tokens apart, so a prompt that branches inside it (a subagent's
    /// tools, another project's paragraph) resumes close by; one every `spacing.interval`
    /// tokens between them so a long message is not recomputed whole; all but the last prompt
    /// token (the same prompt sent again resumes there, and so does the next turn of a template that writes the
    /// reply's start in other tokens than the generation prompt's last), and where its KV
    /// match ended when that was past the snapshot it resumed from: a branch point the traffic
    /// has shown (a session in another folder whose system prompt differs inside one message),
    /// so the next prompt branching there resumes there. Each rounded down to a page boundary
    /// (a prefix is reused in whole pages anyway), past what is cached; descending, the next
    /// one last.
    pub(super) fn snapshot_points(&self, seq: SequenceView, lease: &CacheLease, page_size: usize) -> Vec<usize> {
        let reusable = seq.prompt_len - 1;
        let mut marks: Vec<usize> = seq.request.snapshot_points.iter().copied().filter(|&p| p <= reusable).collect();
        marks.push(reusable);
        if lease.kv_matched > lease.cached_tokens {
            marks.push(lease.kv_matched);
        }
        marks.sort_unstable();
        marks.dedup();
        // Where the KV match ends a snapshot is taken anyway: lines before it are cached.
        let lines: Vec<usize> =
            seq.request.branch_points.iter().copied().filter(|&l| l > lease.kv_matched && l <= reusable).collect();
        let points = spaced_points(&marks, &lines, self.spacing);
        let mut points: Vec<usize> =
            points.into_iter().map(|p| p / page_size * page_size).filter(|&p| p > lease.cached_tokens).collect();
        points.dedup();
        points.reverse();
        points
    }

    /// After a forward pass computed the sequence up to `end`: its state at a snapshot point
    /// it reached (the one a prefill chunk ended at), and with pages of more than one token the
    /// state at a page boundary decoding reached (the rolling snapshot).
    pub(super) fn save_at(
        &mut self,
        seq: SequenceView,
        lease: &mut CacheLease,
        end: usize,
        prefix: &mut PrefixCache,
        mut disk: Option<&mut DiskTier>,
    ) {
        let Some(from) = lease.state_slot else { return };
        while let Some(point) = lease.snapshot_points.pop_if(|p| *p <= end) {
            if point == end
                && let Some(slot) = prefix.take_snapshot_slot()
            {
                self.copy(from, slot);
                lease.snapshots.push((point, slot));
                // Where a later request is expected to resume: worth keeping past a restart or
                // the snapshot's eviction.
                if let Some(disk) = disk.as_deref_mut()
                    && lease.expects_resume_at(point, seq.prompt_len)
                {
                    disk.persist_snapshot(seq.cache_key(point), &self.pool, slot);
                }
            }
        }
        let page_size = prefix.page_size();
        let decoded_to_page_end = end > seq.prompt_len && end.is_multiple_of(page_size);
        if page_size > 1 && decoded_to_page_end && prefix.serves(seq.request.use_cache) {
            let reuse = lease.rolling_snapshot.take().map(|(_, slot)| slot);
            if let Some(slot) = reuse.or_else(|| prefix.take_snapshot_slot()) {
                self.copy(from, slot);
                lease.rolling_snapshot = Some((end, slot));
            }
        }
    }

    /// A sequence's state where its cached KV will end, so that the next turn (prompt, this
    /// reply, more) resumes there: the state itself when it ends on a page boundary, else the
    /// last boundary decoding crossed. Not after a failed step, which may have written the
    /// state past what was computed.
    pub(super) fn save_final(
        &mut self,
        seq: SequenceView,
        lease: &mut CacheLease,
        failed: bool,
        prefix: &mut PrefixCache,
        disk: Option<&mut DiskTier>,
    ) {
        let rolling = lease.rolling_snapshot.take();
        let Some(from) = lease.state_slot else { return };
        let end = lease.computed;
        let wanted = !failed && end > 0 && prefix.serves(seq.request.use_cache);
        let have = |len: usize| lease.snapshots.iter().any(|&(l, _)| l == len);
        if wanted && end.is_multiple_of(prefix.page_size()) && !have(end) {
            if let Some((_, slot)) = rolling {
                prefix.free_snapshot(slot);
            }
            if let Some(slot) = prefix.take_snapshot_slot() {
                self.copy(from, slot);
                lease.snapshots.push((end, slot));
                if let Some(disk) = disk {
                    disk.persist_snapshot(seq.cache_key(end), &self.pool, slot);
                }
            }
            return;
        }
        if let Some((len, slot)) = rolling {
            match wanted && !have(len) {
                true => {
                    lease.snapshots.push((len, slot));
                    if let Some(disk) = disk {
                        disk.persist_snapshot(seq.cache_key(len), &self.pool, slot);
                    }
                }
                false => prefix.free_snapshot(slot),
            }
        }
    }

    /// The deepest snapshot at or before `len` tokens that the sequence holds or that its
    /// locked prefix has in the tree (length and slot): where it can go back to.
    pub(super) fn deepest_snapshot(
        &self,
        seq: SequenceView,
        lease: &CacheLease,
        len: usize,
        prefix: &mut PrefixCache,
    ) -> Option<(usize, u32)> {
        let held = lease.snapshots.iter().chain(&lease.rolling_snapshot).copied().filter(|&(at, _)| at <= len);
        held.chain(prefix.snapshot_on_locked_path(seq, lease, len)).max_by_key(|&(at, _)| at)
    }

    /// Puts `snapshot`'s state into the sequence's slot (none: the state starts afresh at the
    /// next prefill) and lets go of the snapshots it holds past it.
    pub(super) fn resume(&mut self, lease: &mut CacheLease, snapshot: Option<(usize, u32)>, prefix: &mut PrefixCache) {
        let slot = lease.state_slot.expect("a running hybrid sequence has a state slot");
        if let Some((_, from)) = snapshot {
            self.copy(from, slot);
        }
        let at = snapshot.map_or(0, |(at, _)| at);
        for (_, slot) in lease.snapshots.extract_if(.., |&mut (len, _)| len > at) {
            prefix.free_snapshot(slot);
        }
        if let Some((_, slot)) = lease.rolling_snapshot.take_if(|&mut (len, _)| len > at) {
            prefix.free_snapshot(slot);
        }
    }

    /// Each running slot is free or held by exactly one of the running sequences' `leases`.
    pub(super) fn check_invariants(&self, leases: &[&CacheLease]) -> Result<(), String> {
        let mut slots: Vec<u32> = leases.iter().filter_map(|l| l.state_slot).collect();
        if slots.len() != leases.len() {
            return Err("a running sequence of a hybrid model has no state slot".into());
        }
        slots.extend(&self.free);
        slots.sort_unstable();
        if slots != (0..self.running as u32).collect::<Vec<_>>() {
            return Err(format!("state slots are not each held once: {slots:?}"));
        }
        Ok(())
    }
}

/// Where a prefill saves its state: every one of `marks` (ascending, distinct), those of `lines`
/// (ascending) at least `spacing.branch` tokens after the point before them, and between these
/// one every `spacing.interval` tokens. Ascending.
fn spaced_points(marks: &[usize], lines: &[usize], spacing: SnapshotSpacing) -> Vec<usize> {
    let SnapshotSpacing { interval, branch } = spacing;
    let mut lines = lines.iter().copied().filter(|_| branch > 0).peekable();
    let mut points = Vec::new();
    let mut previous = 0;
    for &mark in marks {
        while let Some(line) = lines.next_if(|&line| line < mark) {
            if line >= previous + branch {
                points.push(line);
                previous = line;
            }
        }
        points.extend((previous + interval..mark).step_by(interval));
        points.push(mark);
        previous = mark;
    }
    points
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{SnapshotSpacing, spaced_points};

    proptest! {
        #[test]
        fn points_keep_their_spacing(
            mut marks in proptest::collection::vec(1usize..5000, 1..8),
            mut lines in proptest::collection::vec(1usize..5000, 0..200),
            interval in 600usize..3000,
            branch in 0usize..600,
        ) {
            marks.sort_unstable();
            marks.dedup();
            lines.sort_unstable();
            lines.dedup();
            let points = spaced_points(&marks, &lines, SnapshotSpacing { interval, branch });
            prop_assert!(points.windows(2).all(|w| w[0] < w[1]), "ascending: {points:?}");
            prop_assert!(marks.iter().all(|m| points.contains(m)), "every mark");
            let mut previous = 0;
            for &p in &points {
                prop_assert!(p - previous <= interval || lines.contains(&p) || marks.contains(&p));
                if !marks.contains(&p) && lines.contains(&p) {
                    prop_assert!(branch > 0 && p - previous >= branch, "a line {p} too close to {previous}");
                }
                previous = p;
            }
            let last = *marks.last().unwrap();
            // Nothing past the last mark (the prompt's reusable end).
            prop_assert!(points.iter().all(|&p| p <= last));
        }

        #[test]
        fn a_branch_is_at_most_the_spacing_past_a_point(
            lines in proptest::collection::btree_set(1usize..4000, 1..100),
            branch in 1usize..600,
        ) {
            let lines: Vec<usize> = lines.into_iter().collect();
            let points = spaced_points(&[4000], &lines, SnapshotSpacing { interval: 1 << 20, branch });
            // A prompt that branches at any line resumes at most `branch` tokens before it.
            for &line in &lines {
                let before = points.iter().copied().filter(|&p| p <= line).max().unwrap_or(0);
                prop_assert!(line - before < branch, "line {line}, point {before}, {points:?}");
            }
        }
    }
}
