//! The page allocator: which KV pages are free. Allocation never blocks; when it fails, the
//! scheduler evicts cached pages or holds requests back.

/// Free KV pages, handed out and returned by id.
#[derive(Debug, Clone)]
pub struct PageAllocator {
    free: Vec<u32>,
    num_pages: usize,
}

impl PageAllocator {
    /// All `num_pages` pages free.
    pub fn new(num_pages: usize) -> Self {
        // Handed out lowest id first, which keeps early pages warm in caches.
        PageAllocator { free: (0..num_pages as u32).rev().collect(), num_pages }
    }

    /// Pages currently free.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// Pages in the pool.
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Takes `n` pages, or none if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        Some(self.free.split_off(self.free.len() - n))
    }

    /// Returns pages to the free list.
    pub fn release(&mut self, pages: impl IntoIterator<Item = u32>) {
        for page in pages {
            debug_assert!((page as usize) < self.num_pages, "page {page} outside the pool");
            debug_assert!(!self.free.contains(&page), "page {page} released twice");
            self.free.push(page);
        }
    }

    /// The free pages (for invariant checks).
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }
}
