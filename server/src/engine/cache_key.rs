//! What the prefix cache files a prefix under: its namespace (vLLM's `cache_salt`) and every
//! one of its tokens.
//!
//! Both radix trees (the memory tree, `radix.rs`, and the disk index, `disk_tier/index.rs`) keep
//! a prefix's tokens as they are and tell namespaces apart at the root only: a child of the
//! root is found by its namespace's tag followed by its first page ([`CacheNamespace::child_key`]),
//! so two namespaces never share a node, while positions, pages and snapshots stay aligned with
//! the tokens. An earlier key overwrote the first two tokens with the salt's hash, so two prompts
//! of one namespace that differed only there were served each other's K/V.

use std::hash::{Hash, Hasher};

/// A part of the prefix cache: requests of one namespace share cached prefixes, requests of
/// different namespaces never do. [`CacheNamespace::default`] is every request without a
/// `cache_salt`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheNamespace(u64);

impl CacheNamespace {
    /// The namespace of a request's `cache_salt`.
    pub fn new(salt: Option<&str>) -> Self {
        match salt {
            None => CacheNamespace::default(),
            Some(salt) => {
                let mut hasher = std::hash::DefaultHasher::new();
                salt.hash(&mut hasher);
                // 0 is the shared namespace.
                CacheNamespace(hasher.finish().max(1))
            }
        }
    }

    /// The namespace a page file or snapshot file recorded ([`Self::to_bits`]).
    pub fn from_bits(bits: u64) -> Self {
        CacheNamespace(bits)
    }

    /// The namespace as one number, 0 for the shared one (what files record).
    pub fn to_bits(self) -> u64 {
        self.0
    }

    /// Whether this is the namespace of requests without a salt.
    pub fn is_shared(self) -> bool {
        self.0 == 0
    }

    /// The key under which a tree node's child starting with `first_page` is filed: the page
    /// itself below the root and in the shared namespace; at the root of a salted namespace the
    /// page after two words of the namespace's hash with the high bit set, which no token id
    /// has (vocabularies are far below 2^31), so no path of one namespace starts like another's.
    pub fn child_key(self, at_root: bool, first_page: &[u32]) -> Vec<u32> {
        if !at_root || self.is_shared() {
            return first_page.to_vec();
        }
        let tag = [self.0 as u32 | 0x8000_0000, (self.0 >> 32) as u32 | 0x8000_0000];
        tag.into_iter().chain(first_page.iter().copied()).collect()
    }
}

/// A prefix as the cache files it: its namespace and its tokens, all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheKey<'a> {
    /// Whose cache the prefix belongs to.
    pub namespace: CacheNamespace,
    /// The prefix's tokens, from the first.
    pub tokens: &'a [u32],
}

impl<'a> CacheKey<'a> {
    /// The key of `tokens` in `namespace`.
    pub fn new(namespace: CacheNamespace, tokens: &'a [u32]) -> Self {
        CacheKey { namespace, tokens }
    }

    /// Tokens in the prefix.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the prefix has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The key of the first `len` tokens.
    pub fn prefix(&self, len: usize) -> CacheKey<'a> {
        CacheKey { namespace: self.namespace, tokens: &self.tokens[..len] }
    }
}

/// An owned [`CacheKey`] (what a file records).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheKeyBuf {
    /// Whose cache the prefix belongs to.
    pub namespace: CacheNamespace,
    /// The prefix's tokens, from the first.
    pub tokens: Vec<u32>,
}

impl CacheKeyBuf {
    /// The key, borrowed.
    pub fn as_key(&self) -> CacheKey<'_> {
        CacheKey::new(self.namespace, &self.tokens)
    }
}

impl CacheKey<'_> {
    /// The key, owned.
    pub fn to_buf(&self) -> CacheKeyBuf {
        CacheKeyBuf { namespace: self.namespace, tokens: self.tokens.to_vec() }
    }
}

/// Tokens alone are a key in the shared namespace (what tests and unsalted callers pass).
impl<'a> From<&'a [u32]> for CacheKey<'a> {
    fn from(tokens: &'a [u32]) -> Self {
        CacheKey::new(CacheNamespace::default(), tokens)
    }
}

impl<'a> From<&'a Vec<u32>> for CacheKey<'a> {
    fn from(tokens: &'a Vec<u32>) -> Self {
        CacheKey::new(CacheNamespace::default(), tokens)
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for CacheKey<'a> {
    fn from(tokens: &'a [u32; N]) -> Self {
        CacheKey::new(CacheNamespace::default(), tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::CacheNamespace;
    use proptest::prelude::*;

    #[test]
    fn the_shared_namespace_files_pages_as_they_are() {
        let shared = CacheNamespace::default();
        assert!(shared.is_shared());
        assert_eq!(CacheNamespace::new(None), shared);
        assert_eq!(shared.child_key(true, &[5, 6]), [5, 6]);
        let salted = CacheNamespace::new(Some("a"));
        assert!(!salted.is_shared());
        assert_eq!(salted.child_key(false, &[5, 6]), [5, 6], "below the root, pages as they are");
        assert_eq!(CacheNamespace::from_bits(salted.to_bits()), salted);
    }

    proptest! {
        /// A salted namespace's root keys keep the whole page after their tag, never match
        /// another namespace's, and never look like a page of tokens.
        #[test]
        fn salted_root_keys_keep_the_page_and_never_collide(
            a in "[a-z]{1,8}", b in "[a-z]{1,8}", page in prop::collection::vec(0u32..200_000, 1..4),
        ) {
            let (na, nb) = (CacheNamespace::new(Some(&a)), CacheNamespace::new(Some(&b)));
            let key = na.child_key(true, &page);
            prop_assert_eq!(&key[2..], &page[..]);
            prop_assert!(key[..2].iter().all(|&w| w >= 0x8000_0000));
            prop_assert_ne!(&key, &CacheNamespace::default().child_key(true, &page));
            if a != b {
                prop_assert_ne!(key, nb.child_key(true, &page));
            }
        }
    }
}
