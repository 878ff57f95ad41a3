//! Hybrid models' recurrent-state snapshots on disk, beside the page files (ARCHITECTURE.md §3,
//! "Disk tier"): a cached prefix of a hybrid model is resumable only where its state was saved,
//! so the disk keeps the snapshots a later request is expected to resume from, one file each,
//! and a disk match ends at the deepest one whose K/V pages the disk also holds.
//!
//! ```text
//! magic "RXSTATE1" | version u32 | identity [u8; 16] | state_bytes u32 | key_len u32
//! namespace u64 (the prefix's cache namespace, 0 for requests without a `cache_salt`)
//! key: key_len x u32 (the tokens of the prefix whose state this is)
//! header checksum u32 (CRC-32 of every header byte before it)
//! state: state_bytes bytes (f32 little-endian, `StatePool::read_slot`'s order)
//! state checksum u32
//! ```
//!
//! A file is valid only at its exact length and with both checksums; written under a temporary
//! name, synced and renamed, as page files are.

use std::collections::{BTreeMap, HashMap};
use std::sync::Weak;
use std::time::Instant;

use super::format::{FormatError, Source};
use super::index::FileId;
use crate::engine::cache_key::{CacheKey, CacheKeyBuf, CacheNamespace};

/// The first bytes of every snapshot file.
const MAGIC: [u8; 8] = *b"RXSTATE1";
/// The format's version; a file of another version is refused.
const VERSION: u32 = 2;
/// Bytes before the key.
const FIXED: usize = 8 + 4 + 16 + 4 + 4 + 8;
/// A key longer than this is refused unread (a damaged length field).
const MAX_KEY: usize = 16 << 20;

/// What a snapshot file must match to be read: the model, and its state's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateLayout {
    /// The model identity (`identity.rs`).
    pub identity: [u8; 16],
    /// Bytes of one sequence's recurrent state.
    pub state_bytes: usize,
}

impl StateLayout {
    /// Bytes of the file of a snapshot after `key_len` tokens.
    pub fn file_len(&self, key_len: usize) -> u64 {
        (FIXED + 4 * key_len + 4 + self.state_bytes + 4) as u64
    }
}

/// The file of the state after `key`.
pub(crate) fn encode<'a>(layout: &StateLayout, key: impl Into<CacheKey<'a>>, state: &[f32]) -> Vec<u8> {
    let key = key.into();
    debug_assert_eq!(state.len() * 4, layout.state_bytes, "a whole state");
    let mut out = Vec::with_capacity(layout.file_len(key.len()) as usize);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&layout.identity);
    for value in [layout.state_bytes, key.len()] {
        out.extend_from_slice(&(value as u32).to_le_bytes());
    }
    out.extend_from_slice(&key.namespace.to_bits().to_le_bytes());
    key.tokens.iter().for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    let start = out.len();
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(state));
    } else {
        state.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    }
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The key of a snapshot file from its first bytes (at least the header), checked against
/// `layout` and the file's length.
fn decode_header(bytes: &[u8], layout: &StateLayout, file_len: u64) -> Result<CacheKeyBuf, FormatError> {
    if bytes.len() < FIXED || bytes[..8] != MAGIC || u32_at(bytes, 8) != VERSION {
        return Err(FormatError::NotAPageFile);
    }
    let key_len = u32_at(bytes, 32) as usize;
    if key_len > MAX_KEY {
        return Err(FormatError::Inconsistent("key length"));
    }
    let header_len = FIXED + 4 * key_len + 4;
    if bytes.len() < header_len {
        return Err(FormatError::Length { expected: header_len as u64, actual: bytes.len() as u64 });
    }
    if crc32fast::hash(&bytes[..header_len - 4]) != u32_at(bytes, header_len - 4) {
        return Err(FormatError::HeaderChecksum);
    }
    if bytes[12..28] != layout.identity || u32_at(bytes, 28) as usize != layout.state_bytes {
        return Err(FormatError::OtherModel);
    }
    let expected = layout.file_len(key_len);
    if expected != file_len {
        return Err(FormatError::Length { expected, actual: file_len });
    }
    let namespace = CacheNamespace::from_bits(u64::from_le_bytes(bytes[36..44].try_into().expect("8 bytes")));
    Ok(CacheKeyBuf { namespace, tokens: (0..key_len).map(|i| u32_at(bytes, FIXED + 4 * i)).collect() })
}

impl Source<'_> {
    /// Reads and checks a snapshot file's header; the snapshot's prefix.
    pub fn snapshot_key(&mut self, layout: &StateLayout) -> Result<CacheKeyBuf, FormatError> {
        let file_len = self.len()?;
        let fixed = self.read_at(0, FIXED).map_err(|_| FormatError::NotAPageFile)?;
        let key_len = (u32_at(&fixed, 32) as usize).min(MAX_KEY + 1);
        let header_len = (FIXED + 4 * key_len + 4) as u64;
        if header_len > file_len {
            return Err(FormatError::Length { expected: header_len, actual: file_len });
        }
        decode_header(&self.read_at(0, header_len as usize)?, layout, file_len)
    }

    /// A whole snapshot file, checked: its prefix and its state.
    pub fn snapshot(&mut self, layout: &StateLayout) -> Result<(CacheKeyBuf, Vec<f32>), FormatError> {
        let key = self.snapshot_key(layout)?;
        let data = self.read_at(FIXED + 4 * key.tokens.len() + 4, layout.state_bytes + 4)?;
        let (state, crc) = data.split_at(layout.state_bytes);
        if crc32fast::hash(state) != u32_at(crc, 0) {
            return Err(FormatError::PageChecksum(0));
        }
        let mut values = vec![0f32; state.len() / 4];
        if cfg!(target_endian = "little") {
            bytemuck::cast_slice_mut(&mut values).copy_from_slice(state);
        } else {
            for (v, b) in values.iter_mut().zip(state.chunks_exact(4)) {
                *v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
            }
        }
        Ok((key, values))
    }
}

/// A hash of every prefix of `key`: `hashes[i]` is that of `key[..i]` in its namespace. Only
/// narrows the search (a file's own key is compared before it is used).
pub(crate) fn prefix_hashes<'a>(key: impl Into<CacheKey<'a>>) -> Vec<u64> {
    let key = key.into();
    let mut hashes = Vec::with_capacity(key.len() + 1);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ key.namespace.to_bits();
    hashes.push(h);
    for &t in key.tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17);
        hashes.push(h);
    }
    hashes
}

/// One snapshot file.
#[derive(Debug)]
pub(crate) struct SnapshotEntry {
    /// Tokens of its prefix.
    pub depth: usize,
    /// [`prefix_hashes`] of its prefix.
    pub hash: u64,
    /// Its size.
    pub bytes: u64,
    /// When it was last used, on the index's clock (least recently used goes first).
    used: u64,
    /// Its bytes while they wait in the writer's queue.
    pub pending: Weak<Vec<u8>>,
    /// When its modification time was last renewed.
    pub touched: Instant,
}

/// The snapshot files: which prefix each holds, and their use order.
#[derive(Debug, Default)]
pub(crate) struct SnapshotIndex {
    entries: HashMap<FileId, SnapshotEntry>,
    by_prefix: HashMap<(usize, u64), FileId>,
    /// How many files end at each depth, to look only where one may be.
    depths: BTreeMap<usize, usize>,
    clock: u64,
    /// Bytes of every file.
    pub bytes: u64,
}

impl SnapshotIndex {
    /// Files.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether a file holds the prefix of `depth` tokens whose hash is `hash`.
    pub fn holds(&self, depth: usize, hash: u64) -> bool {
        self.by_prefix.contains_key(&(depth, hash))
    }

    /// Takes in file `id`, the snapshot after `depth` tokens hashing to `hash`, as the most
    /// recently used.
    pub fn insert(&mut self, id: FileId, depth: usize, hash: u64, bytes: u64, pending: Weak<Vec<u8>>) {
        self.clock += 1;
        let entry = SnapshotEntry { depth, hash, bytes, used: self.clock, pending, touched: Instant::now() };
        if let Some(old) = self.by_prefix.insert((depth, hash), id) {
            self.remove(old);
            self.by_prefix.insert((depth, hash), id);
        }
        self.entries.insert(id, entry);
        *self.depths.entry(depth).or_default() += 1;
        self.bytes += bytes;
    }

    /// The file, if kept.
    pub fn get_mut(&mut self, id: FileId) -> Option<&mut SnapshotEntry> {
        self.entries.get_mut(&id)
    }

    /// Marks file `id` as just used.
    pub fn used(&mut self, id: FileId) {
        self.clock += 1;
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.used = self.clock;
        }
    }

    /// The files that may hold a prefix of the key whose prefix hashes are `hashes`, deeper
    /// than `above` tokens and at most `upto`, deepest first.
    pub fn candidates(&self, hashes: &[u64], above: usize, upto: usize) -> Vec<(FileId, usize)> {
        let upto = upto.min(hashes.len().saturating_sub(1));
        if upto <= above {
            return Vec::new();
        }
        self.depths
            .range(above + 1..=upto)
            .rev()
            .filter_map(|(&depth, _)| self.by_prefix.get(&(depth, hashes[depth])).map(|&id| (id, depth)))
            .collect()
    }

    /// Forgets file `id`; its size, if it was kept.
    pub fn remove(&mut self, id: FileId) -> Option<u64> {
        let entry = self.entries.remove(&id)?;
        if self.by_prefix.get(&(entry.depth, entry.hash)) == Some(&id) {
            self.by_prefix.remove(&(entry.depth, entry.hash));
        }
        if let Some(n) = self.depths.get_mut(&entry.depth) {
            *n -= 1;
            if *n == 0 {
                self.depths.remove(&entry.depth);
            }
        }
        self.bytes -= entry.bytes;
        Some(entry.bytes)
    }

    /// The least recently used file, forgotten, and its size.
    pub fn evict_lru(&mut self) -> Option<(FileId, u64)> {
        let (&id, _) = self.entries.iter().min_by_key(|(_, e)| e.used)?;
        let bytes = self.remove(id)?;
        Some((id, bytes))
    }

    /// The lookup maps agree with the files, and the bytes add up.
    pub fn check_invariants(&self) -> Result<(), String> {
        let bytes: u64 = self.entries.values().map(|e| e.bytes).sum();
        let depths: usize = self.depths.values().sum();
        if bytes != self.bytes || depths != self.entries.len() || self.by_prefix.len() != self.entries.len() {
            return Err(format!(
                "snapshot files: {} kept, {} by prefix, {depths} by depth; {bytes} bytes, {} counted",
                self.entries.len(),
                self.by_prefix.len(),
                self.bytes
            ));
        }
        for (&(depth, hash), id) in &self.by_prefix {
            let entry = self.entries.get(id).ok_or("a prefix names a file that is not kept")?;
            if (entry.depth, entry.hash) != (depth, hash) {
                return Err(format!("snapshot file {id} is listed under another prefix"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use proptest::prelude::*;

    use super::*;

    const LAYOUT: StateLayout = StateLayout { identity: [3; 16], state_bytes: 24 };

    fn file(key_len: usize, seed: u32) -> (Vec<u32>, Vec<f32>, Vec<u8>) {
        let key: Vec<u32> = (0..key_len as u32).map(|t| t * 7 + seed).collect();
        let state: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - seed as f32).collect();
        let bytes = encode(&LAYOUT, &key, &state);
        (key, state, bytes)
    }

    #[test]
    fn a_file_reads_back_its_prefix_and_state_from_memory_and_from_disk() {
        let (key, state, bytes) = file(9, 2);
        assert_eq!(bytes.len() as u64, LAYOUT.file_len(9));
        let held = CacheKeyBuf { namespace: CacheNamespace::default(), tokens: key.clone() };
        assert_eq!(Source::Memory(&bytes).snapshot(&LAYOUT).unwrap(), (held.clone(), state.clone()));
        let path = std::env::temp_dir().join(format!("radix-state-format-{}.state", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(Source::File(File::open(&path).unwrap()).snapshot_key(&LAYOUT).unwrap(), held);
        assert_eq!(Source::File(File::open(&path).unwrap()).snapshot(&LAYOUT).unwrap().1, state);
        std::fs::remove_file(&path).unwrap();
        let other = StateLayout { identity: [4; 16], ..LAYOUT };
        assert_eq!(Source::Memory(&bytes).snapshot(&other).unwrap_err(), FormatError::OtherModel);
    }

    #[test]
    fn the_index_finds_the_deepest_held_prefix_of_a_key_and_evicts_least_recently_used() {
        let key: Vec<u32> = (0..20).collect();
        let hashes = prefix_hashes(&key);
        let mut index = SnapshotIndex::default();
        index.insert(1, 4, hashes[4], 10, Weak::new());
        index.insert(2, 12, hashes[12], 10, Weak::new());
        index.insert(3, 8, prefix_hashes(&[9; 8])[8], 10, Weak::new());
        assert_eq!(index.candidates(&hashes, 0, 19), [(2, 12), (1, 4)]);
        assert_eq!(index.candidates(&hashes, 4, 11), []);
        assert_eq!(index.candidates(&hashes, 3, 12), [(2, 12), (1, 4)]);
        index.used(1);
        assert_eq!(index.evict_lru(), Some((2, 10)));
        assert_eq!(index.evict_lru(), Some((3, 10)));
        index.check_invariants().unwrap();
        assert_eq!((index.len(), index.bytes), (1, 10));
        index.insert(4, 4, hashes[4], 12, Weak::new());
        assert_eq!((index.len(), index.bytes, index.candidates(&hashes, 0, 19)), (1, 12, vec![(4, 4)]));
        index.check_invariants().unwrap();
    }

    proptest! {
        /// Any one byte changed anywhere is caught by a checksum or a header check.
        #[test]
        fn any_flipped_byte_is_detected(key_len in 0usize..12, seed in 0u32..50, at: usize, flip in 1u8..=255) {
            let (_, _, mut bytes) = file(key_len, seed);
            let at = at % bytes.len();
            bytes[at] ^= flip;
            prop_assert!(Source::Memory(&bytes).snapshot(&LAYOUT).is_err(), "byte {} of {}", at, bytes.len());
        }

        /// Any other length is refused, and arbitrary bytes never panic the reader.
        #[test]
        fn other_lengths_and_garbage_are_refused(key_len in 0usize..12, cut: usize, junk in proptest::collection::vec(any::<u8>(), 0..120)) {
            let (_, _, bytes) = file(key_len, 1);
            prop_assert!(Source::Memory(&bytes[..cut % bytes.len()]).snapshot(&LAYOUT).is_err());
            prop_assert!(Source::Memory(&junk).snapshot(&LAYOUT).is_err());
        }
    }
}
