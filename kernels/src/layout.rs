//! Shape of one layer's paged K (or V) storage.

use crate::KernelError;

/// Shape of one layer's paged K (or V) storage: `slots = num_pages * page_size`;
/// each slot holds `[num_kv_heads, head_dim]` elements, so one layer's K is a
/// row-major `[num_pages, page_size, num_kv_heads, head_dim]` array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedLayout {
    /// KV heads per token.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Token slots per page (1 is allowed).
    pub page_size: usize,
    /// Pages in the pool.
    pub num_pages: usize,
}

impl PagedLayout {
    /// Elements of one slot: `num_kv_heads * head_dim` (saturating).
    pub fn slot_len(&self) -> usize {
        self.num_kv_heads.saturating_mul(self.head_dim)
    }

    /// Token slots of one layer: `num_pages * page_size` (saturating).
    pub fn num_slots(&self) -> usize {
        self.num_pages.saturating_mul(self.page_size)
    }

    /// Elements of one layer's K (or V) storage: `num_slots() * slot_len()`
    /// (saturating, so an absurd layout never matches a real slice).
    pub fn layer_len(&self) -> usize {
        self.num_slots().saturating_mul(self.slot_len())
    }

    /// Slot id of `offset` within `page`: `page * page_size + offset`.
    /// The caller ensures `page < num_pages` and `offset < page_size`
    /// (debug-asserted); multiply by [`slot_len`](Self::slot_len) for the
    /// element offset.
    pub fn slot(&self, page: u32, offset: usize) -> usize {
        debug_assert!((page as usize) < self.num_pages, "page {page} out of range");
        debug_assert!(offset < self.page_size, "offset {offset} out of range");
        page as usize * self.page_size + offset
    }

    /// Checks that every dimension is non-zero (`num_pages` may be zero) and
    /// that [`layer_len`](Self::layer_len) fits in `usize`.
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.num_kv_heads == 0 {
            return Err(KernelError::InvalidLayout("num_kv_heads is 0"));
        }
        if self.head_dim == 0 {
            return Err(KernelError::InvalidLayout("head_dim is 0"));
        }
        if self.page_size == 0 {
            return Err(KernelError::InvalidLayout("page_size is 0"));
        }
        self.num_kv_heads
            .checked_mul(self.head_dim)
            .and_then(|slot| self.num_pages.checked_mul(self.page_size).and_then(|n| n.checked_mul(slot)))
            .ok_or(KernelError::InvalidLayout("layer size overflows usize"))?;
        Ok(())
    }
}
