//! The disk tier under the prefix cache (`--cache-dir`, ARCHITECTURE.md §3 "Disk tier"): the
//! K/V pages of every prefix the radix tree takes in are also written to page files, so that a
//! prefix the tree has evicted, or one computed before a restart, is read back instead of
//! prefilled again.
//!
//! - **Write-through**: when a prefill is shared and when a sequence ends, the pages the tree
//!   takes in that the disk lacks are copied out of the pool on the engine thread and written by
//!   the writer thread (`writer.rs`). Eviction from the tree then loses nothing that fits the
//!   budget, and a crash loses at most the writes still queued.
//! - **Restore**: at admission, after the memory match, the disk index is asked for more of the
//!   prompt; those pages are read (synchronously, on the engine thread) into the sequence's own
//!   freshly allocated pages before its prefill, and enter the tree with the rest of its prompt.
//! - **Safety**: a page file carries its model identity, its prefix's tokens and a CRC-32 per
//!   page (`format.rs`); a file that fails any check is never served: the restore stops there,
//!   that page and everything below it leave the index, and the prefill recomputes them.
//! - **Budget**: `--cache-disk` bytes of page files; least recently used leaves of the index
//!   (`index.rs`) go first.
//! - **Restart**: the files are self-describing, so the directory is the index; at start-up the
//!   headers are read (pages only when a prompt needs them), damaged and orphaned files removed.
//!
//! - **Hybrid models**: a prefix is resumable only where its recurrent state was saved, so the
//!   snapshots a later request is expected to resume from are written too, a file each
//!   (`snapshots.rs`), and a restore ends at the deepest snapshot on disk whose pages the disk
//!   also holds. Snapshots take at most half the budget.

mod format;
mod hybrid;
pub mod identity;
mod index;
mod snapshots;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use radix_models::KvPool;

use self::format::{FormatError, Header, Layout, Source};
use self::index::{DiskIndex, FileId, NodeId, PageRef};
use self::snapshots::{SnapshotIndex, StateLayout};
use self::writer::{Job, Writer};
use super::cache_key::CacheKey;
use super::metrics::DiskMetrics;
pub use identity::ModelIdentity;

/// The largest page file (a long prefix is split into several): what one damaged file costs,
/// and the granularity of the budget.
const MAX_FILE_BYTES: usize = 16 << 20;

/// A file's modification time is renewed on use at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(30);

/// The disk tier's state for `/health`, `/metrics` and `/v1/cache`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskStats {
    /// A disk tier is configured.
    pub enabled: bool,
    /// Bytes of page and snapshot files.
    pub bytes: u64,
    /// `--cache-disk` in bytes.
    pub budget_bytes: u64,
    /// Page files.
    pub files: usize,
    /// Tokens whose K/V are on disk.
    pub tokens: usize,
    /// Files queued and not yet written.
    pub pending_writes: usize,
    /// Recurrent-state snapshot files (hybrid models).
    pub snapshots: usize,
}

/// One page file the index refers to.
#[derive(Debug)]
struct FileEntry {
    /// Pages of it the index refers to; at zero the file goes.
    live: u32,
    /// Its size.
    bytes: u64,
    /// Its bytes while they wait in the writer's queue (the writer drops them once written).
    pending: Weak<Vec<u8>>,
    /// When its modification time was last renewed.
    touched: Instant,
}

/// What [`DiskTier::open`] found in the directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Page files kept.
    pub files: usize,
    /// Tokens they hold.
    pub tokens: usize,
    /// Bytes they take.
    pub bytes: u64,
    /// Files refused (damaged, truncated, another layout) and removed.
    pub damaged: usize,
    /// Files removed because the pages before theirs are gone, or because other files hold
    /// the same prefix.
    pub unusable: usize,
    /// Snapshot files kept (hybrid models).
    pub snapshots: usize,
    /// Directories left by other builds of the server, removed: this model's under another
    /// build, and any of an older identity format. No build reads them again.
    pub other_builds_removed: usize,
}

/// The disk tier: its index, its files, its writer.
pub struct DiskTier {
    dir: PathBuf,
    layout: Layout,
    budget: u64,
    max_pages_per_file: usize,
    index: DiskIndex,
    files: HashMap<FileId, FileEntry>,
    next_file: FileId,
    /// Bytes of page files (snapshot files are counted in `snapshots`).
    bytes: u64,
    /// Hybrid models: the layout of a state, and the snapshot files.
    state_layout: Option<StateLayout>,
    snapshots: SnapshotIndex,
    writer: Writer,
    metrics: DiskMetrics,
}

/// Removes the directories under `root` that no build of this format reads again, this model's
/// from other builds and any of an older format ([`ModelIdentity::is_dead_directory`]);
/// returns how many. One that cannot be read or removed is left with a warning: it costs disk
/// space, never a wrong answer.
fn remove_dead_directories(root: &Path, identity: &ModelIdentity) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let (path, name) = (entry.path(), entry.file_name().to_string_lossy().into_owned());
        let Ok(description) = std::fs::read_to_string(path.join("model.txt")) else { continue };
        if !identity.is_dead_directory(&description, &name) {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => removed += 1,
            Err(e) => eprintln!(
                "radix-serve: warning: disk cache: {} was left by another build and could not be \
                 removed: {e}",
                path.display()
            ),
        }
    }
    removed
}

fn file_name(id: FileId) -> String {
    format!("{id:016x}.kv")
}

fn state_file_name(id: FileId) -> String {
    format!("{id:016x}.state")
}

impl DiskTier {
    /// Opens (creating it if needed) the disk tier of the model `identity` under `root`, for
    /// pages laid out as `pool`'s, keeping at most `budget_bytes` of page files. Reads every
    /// page file's header, removes those that fail a check or cannot be reached, and rebuilds
    /// the index from the rest (least recently used by modification time).
    pub fn open(
        root: &Path,
        identity: &ModelIdentity,
        budget_bytes: u64,
        pool: &KvPool,
    ) -> std::io::Result<(Self, OpenReport)> {
        Self::open_with_states(root, identity, budget_bytes, pool, None)
    }

    /// [`open`](Self::open) for a hybrid model whose recurrent state takes `state_bytes`
    /// (`StatePool::slot_bytes`): its snapshots are kept too.
    pub fn open_hybrid(
        root: &Path,
        identity: &ModelIdentity,
        budget_bytes: u64,
        pool: &KvPool,
        state_bytes: usize,
    ) -> std::io::Result<(Self, OpenReport)> {
        Self::open_with_states(root, identity, budget_bytes, pool, Some(state_bytes))
    }

    fn open_with_states(
        root: &Path,
        identity: &ModelIdentity,
        budget_bytes: u64,
        pool: &KvPool,
        state_bytes: Option<usize>,
    ) -> std::io::Result<(Self, OpenReport)> {
        let dir = root.join(identity.hex());
        std::fs::create_dir_all(&dir)?;
        #[cfg(unix)]
        {
            // Prompts' tokens are in these files: only this user reads them.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        std::fs::write(dir.join("model.txt"), &identity.description)?;
        let other_builds_removed = remove_dead_directories(root, identity);
        let layout = Layout { identity: identity.id, page_size: pool.page_size(), page_bytes: pool.page_len_bytes() };
        let mut tier = DiskTier {
            writer: Writer::start(dir.clone())?,
            dir,
            layout,
            budget: budget_bytes,
            max_pages_per_file: (MAX_FILE_BYTES / layout.page_bytes.max(1)).max(1),
            index: DiskIndex::new(layout.page_size),
            files: HashMap::new(),
            next_file: 0,
            bytes: 0,
            state_layout: state_bytes.map(|state_bytes| StateLayout { identity: identity.id, state_bytes }),
            snapshots: SnapshotIndex::default(),
            metrics: DiskMetrics::default(),
        };
        let report = OpenReport { other_builds_removed, ..tier.load()? };
        Ok((tier, report))
    }

    /// Rebuilds the index from the page files in the directory.
    fn load(&mut self) -> std::io::Result<OpenReport> {
        let mut report = OpenReport::default();
        let mut found: Vec<(FileId, Header, SystemTime, u64)> = Vec::new();
        let mut states = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            if name.ends_with(".kv.tmp") || name.ends_with(".state.tmp") {
                // A write a crash interrupted.
                std::fs::remove_file(&path)?;
                continue;
            }
            if let Some(hex) = name.strip_suffix(".state") {
                if let Ok(id) = FileId::from_str_radix(hex, 16) {
                    self.next_file = self.next_file.max(id + 1);
                    states.push((id, path));
                }
                continue;
            }
            let Some(id) = name.strip_suffix(".kv").and_then(|hex| FileId::from_str_radix(hex, 16).ok()) else {
                continue;
            };
            self.next_file = self.next_file.max(id + 1);
            let header = std::fs::File::open(&path).map_err(FormatError::from).and_then(|file| {
                let mut source = Source::File(file);
                source.header(&self.layout)
            });
            match header {
                Ok(header) => {
                    let meta = std::fs::metadata(&path)?;
                    found.push((id, header, meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len()));
                }
                Err(e) => {
                    eprintln!("radix-serve: warning: disk cache: {} is not used: {e}; removed", path.display());
                    std::fs::remove_file(&path)?;
                    report.damaged += 1;
                    self.metrics.damaged_files += 1;
                }
            }
        }
        // Shallow files first, so each finds the prefix before its pages already in the index.
        found.sort_by_key(|(id, header, modified, _)| (header.start, *modified, *id));
        let mut kept = Vec::new();
        for (id, header, modified, bytes) in found {
            let have = self.index.lookup(header.cache_key()).tokens;
            if have >= header.key.len() || have < header.start {
                std::fs::remove_file(self.dir.join(file_name(id)))?;
                report.unusable += 1;
                continue;
            }
            let p = self.layout.page_size;
            let skip = (have - header.start) / p;
            let refs = (skip..header.pages()).map(|i| PageRef { file: id, index: i as u32 }).collect::<Vec<_>>();
            let live = refs.len() as u32;
            self.index.extend(header.cache_key(), have, refs);
            let entry = FileEntry { live, bytes, pending: Weak::new(), touched: Instant::now() };
            self.files.insert(id, entry);
            self.bytes += bytes;
            kept.push((modified, header.cache_key().to_buf()));
        }
        // Least recently used first: the order of their last use before the restart.
        kept.sort_by_key(|(modified, _)| *modified);
        for (_, key) in &kept {
            self.index.lookup(key.as_key());
        }
        self.load_snapshots(states, &mut report)?;
        self.make_room(0, 0);
        report.files = self.files.len();
        report.tokens = self.index.pages() * self.layout.page_size;
        report.bytes = self.bytes;
        Ok(report)
    }

    /// The directory of this model's page files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the pages of `key` (`pages` hold its K/V, whole pages) that the disk lacks, as
    /// far as the budget allows after evicting less recently used prefixes.
    pub(crate) fn persist<'a>(&mut self, key: impl Into<CacheKey<'a>>, pages: &[u32], pool: &KvPool) {
        let p = self.layout.page_size;
        let key = key.into();
        let key = key.prefix((key.len() / p).min(pages.len()) * p);
        let found = self.index.lookup(key);
        self.touch(&found.refs);
        let (mut start, mut keep) = (found.tokens, found.node);
        // The pages of the key's path, and how many of them come from files of earlier calls.
        let (mut path, mut old) = (found.refs.clone(), found.refs.len());
        while start < key.len() {
            let count = ((key.len() - start) / p).min(self.max_pages_per_file).min(self.pages_that_fit(start));
            if count == 0 {
                return;
            }
            let end = start + count * p;
            let file_bytes = self.file_bytes(start, count);
            if !self.make_room(file_bytes, keep) {
                // What is left is the files this prefix continues, whose other pages (another
                // prompt's, evicted) cannot go while this prefix holds them. This prefix is the
                // most recently used: the last of those files goes, and its pages of this
                // prefix are written again from the pool, in a file of their own.
                let Some(last) = old.checked_sub(1).filter(|&i| i < start / p) else { return };
                let first = path[..=last].iter().rposition(|r| r.file != path[last].file).map_or(0, |i| i + 1);
                let dropped = self.index.remove_from(key, first * p);
                self.drop_refs(dropped);
                path.truncate(first);
                old = first;
                start = first * p;
                keep = self.index.lookup(key.prefix(start)).node;
                continue;
            }
            let mut data = Vec::with_capacity(count * self.layout.page_bytes);
            for &page in &pages[start / p..end / p] {
                if let Err(e) = pool.read_page(page, &mut data) {
                    eprintln!("radix-serve: warning: disk cache: cannot read page {page} from the KV pool: {e}");
                    return;
                }
            }
            let bytes = Arc::new(format::encode(&self.layout, start, key.prefix(end), &data));
            debug_assert_eq!(bytes.len() as u64, file_bytes);
            let id = self.next_file;
            self.next_file += 1;
            let refs: Vec<PageRef> = (0..count as u32).map(|index| PageRef { file: id, index }).collect();
            path.extend_from_slice(&refs);
            keep = self.index.extend(key, start, refs);
            let entry = FileEntry {
                live: count as u32,
                bytes: file_bytes,
                pending: Arc::downgrade(&bytes),
                touched: Instant::now(),
            };
            self.files.insert(id, entry);
            self.bytes += file_bytes;
            self.writer.send(Job::Write { name: file_name(id), data: bytes });
            start = end;
        }
    }

    /// Bytes of a page file of `pages` pages after the first `start` tokens of its key.
    fn file_bytes(&self, start: usize, pages: usize) -> u64 {
        format::file_len(&self.layout, start + pages * self.layout.page_size, pages)
    }

    /// The most pages after `start` tokens one file may hold within the whole budget.
    fn pages_that_fit(&self, start: usize) -> usize {
        let (empty, one) = (self.file_bytes(start, 0), self.file_bytes(start, 1));
        (self.budget.saturating_sub(empty) / (one - empty)) as usize
    }

    /// Reads the pages of `key` past its first `from` tokens (the memory match) that the disk
    /// holds into `pages` (the sequence's page table, the pages from `from` on its own) and
    /// returns how many tokens were restored. A file that fails a check ends the restore there
    /// and leaves the index with everything below it, with a warning; its tokens are recomputed.
    pub(crate) fn restore<'a>(
        &mut self,
        key: impl Into<CacheKey<'a>>,
        from: usize,
        pages: &[u32],
        pool: &mut KvPool,
    ) -> usize {
        let p = self.layout.page_size;
        let key = key.into();
        let found = self.index.lookup(key);
        if found.tokens <= from {
            return 0;
        }
        let started = Instant::now();
        let (mut done, end) = (from / p, found.tokens / p);
        while done < end {
            let first = found.refs[done];
            let mut run = done + 1;
            while run < end
                && found.refs[run].file == first.file
                && found.refs[run].index == found.refs[run - 1].index + 1
            {
                run += 1;
            }
            let pages_in_file = first.index as usize..first.index as usize + (run - done);
            let read = self.read_pages(first.file, pages_in_file, key, done * p).and_then(|data| {
                for (page, bytes) in pages[done..run].iter().zip(data.chunks_exact(self.layout.page_bytes)) {
                    pool.write_page(*page, bytes).map_err(|e| FormatError::Io(format!("into the KV pool: {e}")))?;
                }
                Ok(())
            });
            if let Err(e) = read {
                let name = self.dir.join(file_name(first.file));
                eprintln!(
                    "radix-serve: warning: disk cache: {} is not used from token {} on: {e}; recomputing",
                    name.display(),
                    done * p
                );
                self.metrics.damaged_files += 1;
                let dropped = self.index.remove_from(key, done * p);
                self.drop_refs(dropped);
                break;
            }
            self.touch(&found.refs[done..run]);
            done = run;
        }
        let restored = (done * p).saturating_sub(from);
        if restored > 0 {
            self.metrics.restores += 1;
            self.metrics.restored_tokens += restored as u64;
            self.metrics.read_seconds.observe(started.elapsed());
        }
        restored
    }

    /// Pages `range` of file `file`, checked, which must hold `key`'s pages from token `at`.
    fn read_pages(
        &mut self,
        file: FileId,
        range: std::ops::Range<usize>,
        key: CacheKey<'_>,
        at: usize,
    ) -> Result<Vec<u8>, FormatError> {
        let entry = self.files.get(&file).ok_or(FormatError::Inconsistent("a file the index lost"))?;
        let pending = entry.pending.upgrade();
        let mut source = match &pending {
            Some(bytes) => Source::Memory(bytes),
            None => Source::File(std::fs::File::open(self.dir.join(file_name(file)))?),
        };
        let header = source.header(&self.layout)?;
        let end = header.start + range.end * self.layout.page_size;
        let holds_key = header.namespace == key.namespace
            && end <= header.key.len()
            && end <= key.len()
            && header.key[..end] == key.tokens[..end];
        if header.start + range.start * self.layout.page_size != at || !holds_key {
            return Err(FormatError::OtherPrefix);
        }
        let data = source.pages(&header, &self.layout, range.clone())?;
        if pending.is_none() {
            self.metrics.files_read += 1;
        }
        self.metrics.pages_read += range.len() as u64;
        Ok(data)
    }

    /// Frees room for a file of `need` bytes by evicting least recently used prefixes (never
    /// the node `keep`, which the new file continues); `false` when even that cannot.
    /// Snapshot files go when no page can.
    fn make_room(&mut self, need: u64, keep: NodeId) -> bool {
        if need > self.budget {
            return false;
        }
        while self.bytes + self.snapshots.bytes + need > self.budget {
            match self.index.evict_lru(keep) {
                Some(refs) => self.drop_refs(refs),
                None if self.evict_snapshot() => {}
                None => return false,
            }
        }
        true
    }

    /// Forgets the pages `refs`; a file none of whose pages are referenced any more is deleted.
    fn drop_refs(&mut self, refs: Vec<PageRef>) {
        for r in refs {
            let Some(entry) = self.files.get_mut(&r.file) else { continue };
            entry.live -= 1;
            if entry.live == 0 {
                let bytes = entry.bytes;
                self.files.remove(&r.file);
                self.bytes -= bytes;
                self.metrics.evicted_files += 1;
                self.metrics.evicted_bytes += bytes;
                self.writer.send(Job::Delete { name: file_name(r.file) });
            }
        }
    }

    /// Renews the modification time of the files of `refs` (at most every [`TOUCH_EVERY`]), so
    /// that a restart knows which prefixes were used last.
    fn touch(&mut self, refs: &[PageRef]) {
        let mut last = None;
        for r in refs {
            if last == Some(r.file) {
                continue;
            }
            last = Some(r.file);
            if let Some(entry) = self.files.get_mut(&r.file)
                && entry.touched.elapsed() >= TOUCH_EVERY
            {
                entry.touched = Instant::now();
                self.writer.send(Job::Touch { name: file_name(r.file) });
            }
        }
    }

    /// Waits until every queued write is on disk (a graceful shutdown).
    pub fn flush(&self) {
        self.writer.flush();
    }

    /// Current sizes.
    pub fn stats(&self) -> DiskStats {
        DiskStats {
            enabled: true,
            bytes: self.bytes + self.snapshots.bytes,
            budget_bytes: self.budget,
            files: self.files.len(),
            tokens: self.index.pages() * self.layout.page_size,
            pending_writes: self.writer.counters.queued.load(Ordering::Relaxed),
            snapshots: self.snapshots.len(),
        }
    }

    /// Totals since start-up.
    pub fn metrics(&self) -> DiskMetrics {
        let c = &self.writer.counters;
        DiskMetrics {
            files_written: c.files_written.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            write_errors: c.write_errors.load(Ordering::Relaxed),
            ..self.metrics.clone()
        }
    }

    /// The index is sound, each file's count of referenced pages is right, the bytes add up
    /// and stay within the budget.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.index.check_invariants()?;
        let mut live: HashMap<FileId, u32> = HashMap::new();
        for r in self.index.all_refs() {
            *live.entry(r.file).or_default() += 1;
        }
        for (id, entry) in &self.files {
            if live.get(id).copied().unwrap_or(0) != entry.live {
                return Err(format!(
                    "file {id}: {} pages referenced but {} counted",
                    live.get(id).unwrap_or(&0),
                    entry.live
                ));
            }
        }
        if live.len() != self.files.len() {
            return Err("the index refers to a file that is not kept".into());
        }
        self.snapshots.check_invariants()?;
        let total: u64 = self.files.values().map(|f| f.bytes).sum();
        if total != self.bytes || self.bytes + self.snapshots.bytes > self.budget {
            return Err(format!(
                "{total} bytes in page files, {} counted, {} in snapshot files, budget {}",
                self.bytes, self.snapshots.bytes, self.budget
            ));
        }
        if self.snapshots.bytes > self.budget / 2 {
            return Err(format!("{} bytes of snapshot files, over half the budget", self.snapshots.bytes));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
