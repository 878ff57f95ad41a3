//! Where a task's K/V tiles come from: converted into scratch once (tasks of
//! many rows) or read from the pool in place (tasks of few rows).

use super::tile::{self, TILE, TileElement, TileRows};
use crate::KvElement;

/// Where a task's K/V tiles come from.
pub(super) trait TileSource {
    /// The element type of the K rows handed to the tile kernels.
    type KElem: TileElement;
    /// The element type of the V rows.
    type VElem: TileElement;
    /// The K and V rows of positions `t0..t0 + TILE` of the task's kv head
    /// (zeros from the end of the task's context on).
    fn rows(&mut self, t0: usize) -> (TileRows<'_, Self::KElem>, TileRows<'_, Self::VElem>);
}

/// Where each context position's row of one kv head sits in the pool.
#[derive(Clone, Copy)]
pub(super) struct PageWalk<'a> {
    pub page_table: &'a [u32],
    pub page_size: usize,
    pub slot_len: usize,
    pub kv_off: usize,
    /// Positions from here on are past the task's last token.
    pub end: usize,
    pub d: usize,
}

impl PageWalk<'_> {
    /// Offset of position `p`'s row in the pool, `None` from `end` on.
    #[inline(always)]
    fn row(&self, p: usize) -> Option<usize> {
        (p < self.end).then(|| {
            let page = self.page_table[p / self.page_size] as usize;
            (page * self.page_size + p % self.page_size) * self.slot_len + self.kv_off
        })
    }

    /// Asks the cache for the K and V rows of positions `t0..t0 + TILE`: they are scattered
    /// over pages (a row per position, a slot apart), so asking a tile ahead hides the memory
    /// latency the hardware prefetcher leaves.
    #[inline(always)]
    fn prefetch_tile<K: KvElement, V: KvElement>(&self, k: &[K], v: &[V], t0: usize) {
        for j in 0..TILE {
            if let Some(b) = self.row(t0 + j) {
                prefetch_row(k, b, self.d);
                prefetch_row(v, b, self.d);
            }
        }
    }
}

/// Tiles converted to f32 into scratch once, for tasks whose many rows share
/// each tile.
pub(super) struct Converted<'a, K, V, const AVX2: bool> {
    pub k: &'a [K],
    pub v: &'a [V],
    pub walk: PageWalk<'a>,
    pub kt: &'a mut [f32],
    pub vt: &'a mut [f32],
}

impl<K: KvElement, V: KvElement, const AVX2: bool> TileSource for Converted<'_, K, V, AVX2> {
    type KElem = f32;
    type VElem = f32;

    #[inline(always)]
    fn rows(&mut self, t0: usize) -> (TileRows<'_, f32>, TileRows<'_, f32>) {
        let d = self.walk.d;
        self.walk.prefetch_tile(self.k, self.v, t0 + TILE);
        for (j, (kr, vr)) in self.kt.chunks_exact_mut(d).zip(self.vt.chunks_exact_mut(d)).enumerate() {
            match self.walk.row(t0 + j) {
                // Rows start at a whole unit: `validate` checked head_dim against both types.
                Some(b) => {
                    tile::convert::<AVX2, K>(&self.k[b / K::VALUES..(b + d) / K::VALUES], kr);
                    tile::convert::<AVX2, V>(&self.v[b / V::VALUES..(b + d) / V::VALUES], vr);
                }
                None => {
                    kr.fill(0.0);
                    vr.fill(0.0);
                }
            }
        }
        let (kt, vt) = (&*self.kt, &*self.vt);
        (std::array::from_fn(|j| &kt[j * d..(j + 1) * d]), std::array::from_fn(|j| &vt[j * d..(j + 1) * d]))
    }
}

/// Rows of the pool read in place (converted in registers by the kernels),
/// for tasks of few rows, where converting into scratch would cost more than
/// the rows' arithmetic.
pub(super) struct InPlace<'a, EK, EV> {
    pub k: &'a [EK],
    pub v: &'a [EV],
    pub walk: PageWalk<'a>,
}

impl<EK: TileElement, EV: TileElement> TileSource for InPlace<'_, EK, EV> {
    type KElem = EK;
    type VElem = EV;

    #[inline(always)]
    fn rows(&mut self, t0: usize) -> (TileRows<'_, EK>, TileRows<'_, EV>) {
        let d = self.walk.d;
        let walk = self.walk;
        let (k, v) = (self.k, self.v);
        let offsets: [Option<usize>; TILE] = std::array::from_fn(|j| walk.row(t0 + j));
        walk.prefetch_tile(k, v, t0 + TILE);
        // Rows start at a whole unit: `validate` checked head_dim against both types.
        (std::array::from_fn(|j| row_units(k, offsets[j], d)), std::array::from_fn(|j| row_units(v, offsets[j], d)))
    }
}

/// Asks the cache for the row of `d` values at value offset `at` of `pool` (a hint: no
/// effect on results).
#[inline(always)]
fn prefetch_row<E: KvElement>(pool: &[E], at: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let row = &pool[at / E::VALUES..][..d / E::VALUES];
        let (start, bytes) = (row.as_ptr().cast::<u8>(), std::mem::size_of_val(row));
        for offset in (0..bytes).step_by(64) {
            // SAFETY: a prefetch of an address inside `row`; it reads nothing into the program.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(start.add(offset).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (pool, at, d);
}

/// The units of the row of `d` values at value offset `at` of `pool`, or a row of zeros.
#[inline(always)]
fn row_units<E: TileElement>(pool: &[E], at: Option<usize>, d: usize) -> &[E] {
    let units = d / E::VALUES;
    match at {
        Some(b) => &pool[b / E::VALUES..][..units],
        None => &E::zeros()[..units],
    }
}
