//! The disk tier's side of hybrid models: their recurrent-state snapshots written beside the
//! page files, and a restore that ends at the deepest snapshot on disk whose K/V pages the
//! disk holds too (a prefix of a hybrid model is resumable only there).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use radix_models::{KvPool, StatePool};

use super::format::FormatError;
use super::format::Source;
use super::index::{FileId, ROOT};
use super::snapshots::prefix_hashes;
use super::writer::Job;
use super::{DiskTier, OpenReport, TOUCH_EVERY, state_file_name};
use crate::engine::cache_key::CacheKey;

impl DiskTier {
    /// Whether this tier keeps recurrent-state snapshots (opened with
    /// [`open_hybrid`](Self::open_hybrid)).
    pub fn keeps_snapshots(&self) -> bool {
        self.state_layout.is_some()
    }

    /// Takes in the snapshot files found at start-up, least recently used (by modification
    /// time) first; damaged ones, and any of a tier without snapshots, are removed.
    pub(super) fn load_snapshots(
        &mut self,
        mut found: Vec<(FileId, PathBuf)>,
        report: &mut OpenReport,
    ) -> std::io::Result<()> {
        let modified =
            |path: &PathBuf| std::fs::metadata(path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
        found.sort_by_cached_key(|(id, path)| (modified(path), *id));
        for (id, path) in found {
            let Some(layout) = self.state_layout else {
                std::fs::remove_file(&path)?;
                report.unusable += 1;
                continue;
            };
            let key = std::fs::File::open(&path).map_err(FormatError::from).and_then(|file| {
                let mut source = Source::File(file);
                source.snapshot_key(&layout)
            });
            match key {
                Ok(key) if !key.tokens.is_empty() => {
                    let depth = key.tokens.len();
                    let hash = prefix_hashes(key.as_key())[depth];
                    self.snapshots.insert(id, depth, hash, layout.file_len(depth), Default::default());
                }
                Ok(_) | Err(_) => {
                    let why = key.err().map_or("it holds no prefix".to_owned(), |e| e.to_string());
                    eprintln!("radix-serve: warning: disk cache: {} is not used: {why}; removed", path.display());
                    std::fs::remove_file(&path)?;
                    report.damaged += 1;
                    self.metrics.damaged_files += 1;
                }
            }
        }
        // A smaller budget than last time: the oldest go.
        while self.snapshots.bytes > self.budget / 2 && self.evict_snapshot() {}
        report.snapshots = self.snapshots.len();
        Ok(())
    }

    /// Forgets the least recently used snapshot file and deletes it; `false` when there is none.
    pub(super) fn evict_snapshot(&mut self) -> bool {
        let Some((id, bytes)) = self.snapshots.evict_lru() else { return false };
        self.metrics.evicted_files += 1;
        self.metrics.evicted_bytes += bytes;
        self.writer.send(Job::Delete { name: state_file_name(id) });
        true
    }

    /// Writes the state in `state`'s slot `slot`, which is that after `key`, unless the disk
    /// has it already. Snapshots keep to half the budget, least recently used going first, and
    /// the whole budget holds, page files giving way as they do to each other. A snapshot not
    /// on a page boundary is not written: a restore reads whole pages.
    pub(crate) fn persist_snapshot<'a>(&mut self, key: impl Into<CacheKey<'a>>, state: &StatePool, slot: u32) {
        let Some(layout) = self.state_layout else { return };
        let key = key.into();
        let depth = key.len();
        if depth == 0 || !depth.is_multiple_of(self.layout.page_size) {
            return;
        }
        let hash = prefix_hashes(key)[depth];
        if self.snapshots.holds(depth, hash) {
            return;
        }
        let bytes = layout.file_len(depth);
        if bytes > self.budget / 2 {
            return;
        }
        while self.snapshots.bytes + bytes > self.budget / 2 {
            if !self.evict_snapshot() {
                return;
            }
        }
        if !self.make_room(bytes, ROOT) {
            return;
        }
        let values = match state.read_slot(slot) {
            Ok(values) => values,
            Err(e) => {
                eprintln!("radix-serve: warning: disk cache: cannot read state slot {slot}: {e}");
                return;
            }
        };
        let data = Arc::new(super::snapshots::encode(&layout, key, &values));
        debug_assert_eq!(data.len() as u64, bytes);
        let id = self.next_file;
        self.next_file += 1;
        self.snapshots.insert(id, depth, hash, bytes, Arc::downgrade(&data));
        self.writer.send(Job::Write { name: state_file_name(id), data });
    }

    /// For a hybrid model: reads the K/V pages of `key` past its first `from` tokens (the
    /// memory match, where the sequence's state in `slot` already is) up to the deepest
    /// snapshot on disk past `from` whose pages the disk holds, and that snapshot into `slot`;
    /// returns how many tokens were restored (0: the memory match stands, `slot` untouched).
    /// A snapshot file that fails a check is removed, with a warning, and the next shallower
    /// one is tried.
    pub(crate) fn restore_resumable<'a>(
        &mut self,
        key: impl Into<CacheKey<'a>>,
        from: usize,
        pages: &[u32],
        pool: &mut KvPool,
        state: &mut StatePool,
        slot: u32,
    ) -> usize {
        let Some(layout) = self.state_layout else { return 0 };
        let key = key.into();
        let on_disk = self.index.lookup(key).tokens;
        let hashes = prefix_hashes(key);
        for (id, depth) in self.snapshots.candidates(&hashes, from, on_disk) {
            if !depth.is_multiple_of(self.layout.page_size) {
                continue;
            }
            let values = match self.read_snapshot(id, key.prefix(depth), &layout) {
                Ok(values) => values,
                Err(e) => {
                    let name = self.dir.join(state_file_name(id));
                    eprintln!("radix-serve: warning: disk cache: {} is not used: {e}; removed", name.display());
                    self.metrics.damaged_files += 1;
                    if let Some(bytes) = self.snapshots.remove(id) {
                        self.metrics.evicted_files += 1;
                        self.metrics.evicted_bytes += bytes;
                    }
                    self.writer.send(Job::Delete { name: state_file_name(id) });
                    continue;
                }
            };
            // Pages short of the snapshot (one was damaged): it cannot be resumed from.
            if from + self.restore(key.prefix(depth), from, pages, pool) != depth {
                return 0;
            }
            if let Err(e) = state.write_slot(slot, &values) {
                eprintln!("radix-serve: warning: disk cache: cannot write state slot {slot}: {e}");
                return 0;
            }
            self.snapshots.used(id);
            if let Some(entry) = self.snapshots.get_mut(id)
                && entry.touched.elapsed() >= TOUCH_EVERY
            {
                entry.touched = Instant::now();
                self.writer.send(Job::Touch { name: state_file_name(id) });
            }
            self.metrics.snapshots_restored += 1;
            return depth - from;
        }
        0
    }

    /// The state in snapshot file `id`, checked, which must be that after `key`.
    fn read_snapshot(
        &mut self,
        id: FileId,
        key: CacheKey<'_>,
        layout: &super::snapshots::StateLayout,
    ) -> Result<Vec<f32>, FormatError> {
        let entry = self.snapshots.get_mut(id).ok_or(FormatError::Inconsistent("a file the index lost"))?;
        let pending = entry.pending.upgrade();
        let mut source = match &pending {
            Some(bytes) => Source::Memory(bytes),
            None => Source::File(std::fs::File::open(self.dir.join(state_file_name(id)))?),
        };
        let (held, values) = source.snapshot(layout)?;
        if held.as_key() != key {
            return Err(FormatError::OtherPrefix);
        }
        if pending.is_none() {
            self.metrics.files_read += 1;
        }
        Ok(values)
    }
}
