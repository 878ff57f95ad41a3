//! The page file: a run of KV pages of one cached prefix, self-describing so that the directory
//! alone is the disk tier's index (ARCHITECTURE.md §3, "Disk tier").
//!
//! ```text
//! magic "RXKVPAGE" | version u32 | header_len u32
//! identity [u8; 16] | page_size u32 | page_bytes u32 | start u32 | pages u32 | key_len u32
//! namespace u64 (the prefix's cache namespace, 0 for requests without a `cache_salt`)
//! key: key_len x u32 (the tokens from the root to the end of the last page)
//! page checksums: pages x u32 (CRC-32 of each page's bytes)
//! header checksum u32 (CRC-32 of every header byte before it)
//! pages x page_bytes of K/V (`KvPool::read_page`'s layout)
//! ```
//!
//! All integers little-endian. A file is valid only at its exact length, so a truncated one is
//! refused when its header is read; a flipped byte fails the header's checksum or its page's.
//! Files are written under a temporary name, synced and renamed, so a crash leaves either the
//! whole file or none.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use crate::engine::cache_key::{CacheKey, CacheNamespace};

/// The first bytes of every page file.
pub(crate) const MAGIC: [u8; 8] = *b"RXKVPAGE";
/// The format's version; a file of another version is refused.
pub(crate) const VERSION: u32 = 2;
/// Bytes before the variable part of the header (magic through namespace).
const FIXED: usize = 8 + 4 + 4 + 16 + 5 * 4 + 8;
/// A header longer than this is refused unread (a damaged length field).
const MAX_HEADER: usize = 64 << 20;

/// Why a page file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FormatError {
    /// Reading failed (missing file, I/O error).
    #[error("cannot read it: {0}")]
    Io(String),
    /// Not a page file of this version.
    #[error("not a page file of version {VERSION}")]
    NotAPageFile,
    /// Shorter or longer than its header says (a truncated write, a damaged file).
    #[error("{actual} bytes where its header says {expected}")]
    Length {
        /// What the header implies.
        expected: u64,
        /// What is there.
        actual: u64,
    },
    /// The header's checksum does not match.
    #[error("its header checksum does not match")]
    HeaderChecksum,
    /// Written for another model or other KV settings.
    #[error("it belongs to another model or KV layout")]
    OtherModel,
    /// The header is self-consistent but describes an impossible file.
    #[error("its header is inconsistent: {0}")]
    Inconsistent(&'static str),
    /// A page's checksum does not match.
    #[error("page {0} fails its checksum")]
    PageChecksum(usize),
    /// The file holds other tokens than the prefix it was looked up for.
    #[error("it holds another prefix than the one looked up")]
    OtherPrefix,
}

impl From<std::io::Error> for FormatError {
    fn from(e: std::io::Error) -> Self {
        FormatError::Io(e.to_string())
    }
}

/// What a page file must match to be read: the model and its KV layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The model identity (`identity.rs`).
    pub identity: [u8; 16],
    /// Tokens per page.
    pub page_size: usize,
    /// Bytes per page.
    pub page_bytes: usize,
}

/// A page file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// Tokens before the file's first page.
    pub start: usize,
    /// The prefix's namespace.
    pub namespace: CacheNamespace,
    /// The tokens from the root to the end of the file's last page.
    pub key: Vec<u32>,
    /// CRC-32 of each page.
    pub checksums: Vec<u32>,
}

impl Header {
    /// The prefix the file's pages end, as the cache keys it.
    pub fn cache_key(&self) -> CacheKey<'_> {
        CacheKey::new(self.namespace, &self.key)
    }

    /// Pages in the file.
    pub fn pages(&self) -> usize {
        self.checksums.len()
    }

    /// Bytes of the encoded header.
    pub fn len_bytes(&self) -> usize {
        FIXED + 4 * self.key.len() + 4 * self.checksums.len() + 4
    }

    /// Bytes of the whole file.
    pub fn file_bytes(&self, layout: &Layout) -> u64 {
        file_len(layout, self.key.len(), self.pages())
    }
}

/// Bytes of a page file of `pages` pages whose key has `key_len` tokens.
pub(crate) fn file_len(layout: &Layout, key_len: usize, pages: usize) -> u64 {
    (FIXED + 4 * key_len + 4 * pages + 4 + pages * layout.page_bytes) as u64
}

/// A whole page file: the header for `key` (whose pages from `start` on are `data`) and the data.
pub(crate) fn encode(layout: &Layout, start: usize, cache_key: CacheKey<'_>, data: &[u8]) -> Vec<u8> {
    let key = cache_key.tokens;
    let pages = data.len() / layout.page_bytes;
    debug_assert_eq!(pages * layout.page_bytes, data.len(), "whole pages");
    debug_assert_eq!(start + pages * layout.page_size, key.len(), "the key ends with the last page");
    let checksums: Vec<u32> = data.chunks_exact(layout.page_bytes).map(crc32fast::hash).collect();
    let header = Header { start, namespace: cache_key.namespace, key: key.to_vec(), checksums };
    let mut out = Vec::with_capacity(header.len_bytes() + data.len());
    out.extend_from_slice(&MAGIC);
    for value in [VERSION, header.len_bytes() as u32] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&layout.identity);
    for value in [layout.page_size, layout.page_bytes, start, pages, key.len()] {
        out.extend_from_slice(&(value as u32).to_le_bytes());
    }
    out.extend_from_slice(&header.namespace.to_bits().to_le_bytes());
    key.iter().chain(&header.checksums).for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(data);
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The header's length from the file's first 16 bytes.
fn header_len(first: &[u8]) -> Result<usize, FormatError> {
    if first.len() < 16 || first[..8] != MAGIC || u32_at(first, 8) != VERSION {
        return Err(FormatError::NotAPageFile);
    }
    let len = u32_at(first, 12) as usize;
    if !(FIXED + 4..=MAX_HEADER).contains(&len) {
        return Err(FormatError::Inconsistent("header length"));
    }
    Ok(len)
}

/// Decodes a header from its bytes (exactly `header_len` of them) and checks it against
/// `layout` and the file's length `file_len`.
fn decode_header(bytes: &[u8], layout: &Layout, file_len: u64) -> Result<Header, FormatError> {
    let len = header_len(bytes)?;
    if bytes.len() < len {
        return Err(FormatError::Length { expected: len as u64, actual: bytes.len() as u64 });
    }
    let bytes = &bytes[..len];
    if crc32fast::hash(&bytes[..len - 4]) != u32_at(bytes, len - 4) {
        return Err(FormatError::HeaderChecksum);
    }
    let field = |i: usize| u32_at(bytes, 32 + 4 * i) as usize;
    let (page_size, page_bytes, start, pages, key_len) = (field(0), field(1), field(2), field(3), field(4));
    if bytes[16..32] != layout.identity || page_size != layout.page_size || page_bytes != layout.page_bytes {
        return Err(FormatError::OtherModel);
    }
    if FIXED + 4 * key_len + 4 * pages + 4 != len {
        return Err(FormatError::Inconsistent("header length against its counts"));
    }
    if pages == 0 || !start.is_multiple_of(page_size) || start + pages * page_size != key_len {
        return Err(FormatError::Inconsistent("pages against the key"));
    }
    let words = |from: usize, n: usize| (0..n).map(|i| u32_at(bytes, from + 4 * i)).collect::<Vec<u32>>();
    let namespace = CacheNamespace::from_bits(u64::from_le_bytes(bytes[52..60].try_into().expect("8 bytes")));
    let header = Header { start, namespace, key: words(FIXED, key_len), checksums: words(FIXED + 4 * key_len, pages) };
    let expected = header.file_bytes(layout);
    if expected != file_len {
        return Err(FormatError::Length { expected, actual: file_len });
    }
    Ok(header)
}

/// Where a page file's bytes are: still in memory (queued for writing) or on disk.
pub(crate) enum Source<'a> {
    /// The whole file's bytes.
    Memory(&'a [u8]),
    /// An open file.
    File(File),
}

impl Source<'_> {
    /// The file's length in bytes.
    pub fn len(&mut self) -> Result<u64, FormatError> {
        Ok(match self {
            Source::Memory(bytes) => bytes.len() as u64,
            Source::File(file) => file.metadata()?.len(),
        })
    }

    /// `len` bytes from byte `at`; past the end is an error.
    pub fn read_at(&mut self, at: usize, len: usize) -> Result<Vec<u8>, FormatError> {
        match self {
            Source::Memory(bytes) => bytes
                .get(at..at + len)
                .map(<[u8]>::to_vec)
                .ok_or(FormatError::Length { expected: (at + len) as u64, actual: bytes.len() as u64 }),
            Source::File(file) => {
                let mut data = vec![0u8; len];
                file.seek(SeekFrom::Start(at as u64))?;
                file.read_exact(&mut data)?;
                Ok(data)
            }
        }
    }

    /// Reads and checks the header.
    pub fn header(&mut self, layout: &Layout) -> Result<Header, FormatError> {
        let file_len = self.len()?;
        let first = self.read_at(0, 16).map_err(|_| FormatError::NotAPageFile)?;
        let len = header_len(&first)?;
        if (len as u64) > file_len {
            return Err(FormatError::Length { expected: len as u64, actual: file_len });
        }
        decode_header(&self.read_at(0, len)?, layout, file_len)
    }

    /// Pages `pages` of the file described by `header`, each checked against its checksum.
    pub fn pages(
        &mut self,
        header: &Header,
        layout: &Layout,
        pages: std::ops::Range<usize>,
    ) -> Result<Vec<u8>, FormatError> {
        if pages.end > header.pages() {
            return Err(FormatError::Inconsistent("pages past the end"));
        }
        let at = header.len_bytes() + pages.start * layout.page_bytes;
        let len = pages.len() * layout.page_bytes;
        let data = self.read_at(at, len)?;
        for (i, page) in data.chunks_exact(layout.page_bytes).enumerate() {
            if crc32fast::hash(page) != header.checksums[pages.start + i] {
                return Err(FormatError::PageChecksum(pages.start + i));
            }
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LAYOUT: Layout = Layout { identity: [7; 16], page_size: 2, page_bytes: 12 };

    fn file(pages: usize, seed: u8) -> (Vec<u32>, Vec<u8>, Vec<u8>) {
        let key: Vec<u32> = (0..(3 + pages) as u32 * 2).map(|t| t * 3 + seed as u32).collect();
        let data: Vec<u8> = (0..pages * 12).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        let bytes = encode(&LAYOUT, 6, CacheKey::from(&key), &data);
        (key, data, bytes)
    }

    fn read_all(bytes: &[u8], layout: &Layout) -> Result<(Header, Vec<u8>), FormatError> {
        let mut source = Source::Memory(bytes);
        let header = source.header(layout)?;
        let data = source.pages(&header, layout, 0..header.pages())?;
        Ok((header, data))
    }

    #[test]
    fn a_file_reads_back_its_header_and_pages_from_memory_and_from_disk() {
        let (key, data, bytes) = file(4, 1);
        let (header, read) = read_all(&bytes, &LAYOUT).unwrap();
        assert_eq!((header.start, header.key.as_slice(), read.as_slice()), (6, key.as_slice(), data.as_slice()));
        let path = std::env::temp_dir().join(format!("radix-format-{}.kv", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let mut source = Source::File(File::open(&path).unwrap());
        let header = source.header(&LAYOUT).unwrap();
        assert_eq!(source.pages(&header, &LAYOUT, 1..3).unwrap(), data[12..36]);
        assert!(source.pages(&header, &LAYOUT, 3..5).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn another_model_or_layout_is_refused() {
        let (_, _, bytes) = file(2, 3);
        for layout in [
            Layout { identity: [8; 16], ..LAYOUT },
            Layout { page_size: 1, ..LAYOUT },
            Layout { page_bytes: 6, ..LAYOUT },
        ] {
            assert_eq!(read_all(&bytes, &layout).unwrap_err(), FormatError::OtherModel);
        }
        let mut other_version = bytes.clone();
        other_version[8] = 1;
        assert_eq!(read_all(&other_version, &LAYOUT).unwrap_err(), FormatError::NotAPageFile);
        assert_eq!(read_all(b"", &LAYOUT).unwrap_err(), FormatError::NotAPageFile);
    }

    #[test]
    fn a_file_truncated_on_disk_is_refused_before_its_pages_are_read() {
        let (_, _, bytes) = file(3, 5);
        let path = std::env::temp_dir().join(format!("radix-format-cut-{}.kv", std::process::id()));
        for cut in [bytes.len() - 1, bytes.len() - 12, 40, 17, 3, 0] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let mut source = Source::File(File::open(&path).unwrap());
            assert!(source.header(&LAYOUT).is_err(), "cut at {cut}");
        }
        std::fs::remove_file(&path).unwrap();
    }

    proptest! {
        /// Any one byte changed anywhere is caught: by the header checks or the page's checksum.
        #[test]
        fn any_flipped_byte_is_detected(pages in 1usize..5, seed: u8, at: usize, flip in 1u8..=255) {
            let (_, _, mut bytes) = file(pages, seed);
            let at = at % bytes.len();
            bytes[at] ^= flip;
            prop_assert!(read_all(&bytes, &LAYOUT).is_err(), "byte {} of {}", at, bytes.len());
        }

        /// Any truncation (or extension) of a file is refused by its header.
        #[test]
        fn any_other_length_is_refused(pages in 1usize..5, seed: u8, len: usize, extra in 1usize..20) {
            let (_, _, bytes) = file(pages, seed);
            let cut = len % bytes.len();
            prop_assert!(read_all(&bytes[..cut], &LAYOUT).is_err());
            let mut longer = bytes.clone();
            longer.extend(std::iter::repeat_n(0, extra));
            prop_assert!(read_all(&longer, &LAYOUT).is_err());
        }

        /// Arbitrary bytes never panic the reader and are never taken for a page file.
        #[test]
        fn garbage_is_refused_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            prop_assert!(read_all(&bytes, &LAYOUT).is_err());
        }
    }
}
