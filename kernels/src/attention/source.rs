//! Where a task's K/V tiles come from: converted into scratch once (tasks of
//! many rows) or read from the pool in place (tasks of few rows).

use super::tile::{self, TILE, TileElement, TileRows};
use crate::KvElement;

/// Where a task's K/V tiles come from.
pub(super) trait TileSource {
    /// The element type of the rows handed to the tile kernels.
    type Elem: TileElement;
    /// The K and V rows of positions `t0..t0 + TILE` of the task's kv head
    /// (zeros from the end of the task's context on).
    fn rows(&mut self, t0: usize) -> (TileRows<'_, Self::Elem>, TileRows<'_, Self::Elem>);
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
    type Elem = f32;

    #[inline(always)]
    fn rows(&mut self, t0: usize) -> (TileRows<'_, f32>, TileRows<'_, f32>) {
        let d = self.walk.d;
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
pub(super) struct InPlace<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub walk: PageWalk<'a>,
}

impl<E: TileElement> TileSource for InPlace<'_, E> {
    type Elem = E;

    #[inline(always)]
    fn rows(&mut self, t0: usize) -> (TileRows<'_, E>, TileRows<'_, E>) {
        let d = self.walk.d;
        let zeros: &[E] = &E::zeros()[..d];
        let walk = self.walk;
        let (k, v) = (self.k, self.v);
        let offsets: [Option<usize>; TILE] = std::array::from_fn(|j| walk.row(t0 + j));
        (
            std::array::from_fn(|j| offsets[j].map_or(zeros, |b| &k[b..b + d])),
            std::array::from_fn(|j| offsets[j].map_or(zeros, |b| &v[b..b + d])),
        )
    }
}
