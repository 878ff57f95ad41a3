//! Register-blocked kernels over one tile of [`TILE`] context positions: the
//! scores `Q·Kᵀ` of a task's query rows and their weighted sum `P·V`.
//!
//! Each kernel has a portable build and an AVX2+FMA build. Within a build,
//! every output element goes through a fixed sequence of operations that
//! depends only on its own row's data and its column index, never on which or
//! how many other rows share the call, so the task plan (and with it the
//! thread count) cannot change results. The two builds round differently
//! (fused multiply-adds, summation order).

use half::{bf16, f16};

use crate::vector::{axpy_with, dot_with, exp_in_place};
use crate::{KV_BLOCK, KvElement, KvQ4_0, KvQ8_0};

/// Context positions per tile: K/V rows converted to f32 together and shared
/// by every query row of a task.
pub(super) const TILE: usize = 16;

/// One query row's scores (then weights) over a tile.
pub(super) type TileRow = [f32; TILE];

/// The largest head size the kernels read in place, the length of
/// [`TileElement::zeros`]; larger heads are converted into scratch.
pub(super) const MAX_IN_PLACE_ROW: usize = 512;

/// The K (or V) rows of one tile's positions, `head_dim` elements each:
/// either converted f32 rows in scratch or rows of the pool read in place.
pub(super) type TileRows<'a, E> = [&'a [E]; TILE];

/// Which element type a [`TileElement`] is, for the vector loads.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum ElementKind {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
}

/// An element the tile kernels read K/V rows of: f32 scratch, or an f16, bf16, f32, q8_0 or
/// q4_0 pool read in place. Every kernel gets each value as the bits converting its row to
/// f32 gives ([`KvElement::slice_to_f32`]), so the kernels compute the same bits from either
/// source. A row of `d` values is `d / VALUES` units; a block never spans two rows.
pub(super) trait TileElement: KvElement {
    /// This type, for the vector loads.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const KIND: ElementKind;
    /// [`MAX_IN_PLACE_ROW`] values of zeros: the row of positions past a sequence's end,
    /// which may have no page.
    fn zeros() -> &'static [Self];
    /// Value `e` of `row`, as f32.
    fn value(row: &[Self], e: usize) -> f32;
}

macro_rules! float_tile_element {
    ($t:ty, $kind:ident, $zero:expr) => {
        impl TileElement for $t {
            const KIND: ElementKind = ElementKind::$kind;
            fn zeros() -> &'static [Self] {
                static ZEROS: [$t; MAX_IN_PLACE_ROW] = [$zero; MAX_IN_PLACE_ROW];
                &ZEROS
            }
            #[inline(always)]
            fn value(row: &[Self], e: usize) -> f32 {
                row[e].into()
            }
        }
    };
}

float_tile_element!(f32, F32, 0.0);
float_tile_element!(f16, F16, f16::ZERO);
float_tile_element!(bf16, BF16, bf16::ZERO);

macro_rules! block_tile_element {
    ($t:ty, $kind:ident) => {
        impl TileElement for $t {
            const KIND: ElementKind = ElementKind::$kind;
            fn zeros() -> &'static [Self] {
                static ZEROS: [$t; MAX_IN_PLACE_ROW / KV_BLOCK] = [<$t>::ZERO; MAX_IN_PLACE_ROW / KV_BLOCK];
                &ZEROS
            }
            #[inline(always)]
            fn value(row: &[Self], e: usize) -> f32 {
                row[e / KV_BLOCK].value(e % KV_BLOCK)
            }
        }
    };
}

block_tile_element!(KvQ8_0, Q8_0);
block_tile_element!(KvQ4_0, Q4_0);

/// Converts one K/V row to f32: with F16C (part of the AVX2 path) for f16 and the
/// blocks' scales, a shift for bf16, in line rather than through `half`'s per-call
/// dispatch.
#[inline(always)]
pub(super) fn convert<const AVX2: bool, T: KvElement>(src: &[T], dst: &mut [f32]) {
    assert_eq!(src.len() * T::VALUES, dst.len());
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        if let Some(src) = T::as_f16_slice(src) {
            // SAFETY: `AVX2` is only set when the CPU supports AVX2, FMA and
            // F16C (`run_attention`'s contract); lengths are asserted above.
            unsafe { avx2::f16_to_f32(src, dst) };
            return;
        }
        if let Some(src) = T::as_bf16_slice(src) {
            // SAFETY: as above.
            unsafe { avx2::bf16_to_f32(src, dst) };
            return;
        }
        if let Some(src) = T::as_q8_0_slice(src) {
            // SAFETY: as above.
            unsafe { avx2::blocks_to_f32(src, dst) };
            return;
        }
        if let Some(src) = T::as_q4_0_slice(src) {
            // SAFETY: as above.
            unsafe { avx2::blocks_to_f32(src, dst) };
            return;
        }
    }
    T::slice_to_f32(src, dst);
}

/// Folds one row's tile of scores into its running softmax state: raises the
/// running maximum (rescaling `sum` to it), turns `tile` into the weights
/// `exp(score - max)` and adds them to `sum`. Returns the factor by which the
/// caller must rescale the row's accumulator when the maximum rose.
#[inline(always)]
pub(super) fn online_softmax<const AVX2: bool>(tile: &mut TileRow, max: &mut f32, sum: &mut f32) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: as in `convert`.
        return unsafe { avx2::online_softmax(tile, max, sum) };
    }
    let tile_max = tree_reduce(tile, |a, b| if a >= b { a } else { b });
    let corr = raise_max(tile, tile_max, max, sum)?;
    let m = *max;
    for w in tile.iter_mut() {
        *w -= m;
    }
    exp_in_place(tile);
    *sum += tree_reduce(tile, |a, b| a + b);
    corr
}

/// The scalar part of [`online_softmax`] once the tile's maximum is known:
/// `None` when the tile holds no weight (then it is zeroed), else the
/// accumulator's rescale factor if the running maximum rose.
#[inline(always)]
fn raise_max(tile: &mut TileRow, tile_max: f32, max: &mut f32, sum: &mut f32) -> Option<Option<f32>> {
    if tile_max == f32::NEG_INFINITY {
        // Only reachable with -inf scores from non-finite inputs.
        tile.fill(0.0);
        return None;
    }
    if tile_max > *max {
        // exp(-inf) = 0 on the row's first tile, when the accumulator is
        // still zero.
        let corr = (*max - tile_max).exp();
        *sum *= corr;
        *max = tile_max;
        return Some(Some(corr));
    }
    Some(None)
}

/// Reduces a tile pairwise, halving it each step (lane i with lane i + 8,
/// then i + 4, ...): a fixed order, unlike a left fold's, that vectorizes.
#[inline(always)]
fn tree_reduce(tile: &TileRow, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut v = *tile;
    let mut half = TILE / 2;
    while half > 0 {
        for i in 0..half {
            v[i] = f(v[i], v[i + half]);
        }
        half /= 2;
    }
    v[0]
}

/// `s[r][j] = q[r] · k[j]` for the rows of `s`: `q` is `[s.len(), d]`
/// row-major f32, every row of `k` holds `d` elements.
#[inline(always)]
///
/// `wide` (with `AVX2`) runs the AVX-512 build.
pub(super) fn scores<const AVX2: bool, E: TileElement>(
    q: &[f32],
    k: &TileRows<E>,
    d: usize,
    s: &mut [TileRow],
    wide: bool,
) {
    assert!(q.len() == s.len() * d && k.iter().all(|row| row.len() * E::VALUES == d));
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is only set when the CPU supports AVX2, FMA and F16C,
        // and `wide` only when it also supports AVX-512F (`run_attention`'s
        // contract); slice lengths are asserted above.
        unsafe {
            if wide {
                avx512::scores(q, k, d, s);
            } else {
                avx2::scores(q, k, d, s);
            }
        }
        return;
    }
    let _ = wide;
    for (qrow, srow) in q.chunks_exact(d).zip(s.iter_mut()) {
        for (w, krow) in srow.iter_mut().zip(k) {
            *w = dot_with(qrow, |e| E::value(krow, e));
        }
    }
}

/// `acc[r] += Σ_j p[r][j] * v[j]` for the rows of `p`: `acc` is `[p.len(), d]`
/// row-major f32, every row of `v` holds `d` elements. `wide` as in
/// [`scores`].
#[inline(always)]
pub(super) fn weighted_sum<const AVX2: bool, E: TileElement>(
    p: &[TileRow],
    v: &TileRows<E>,
    d: usize,
    acc: &mut [f32],
    wide: bool,
) {
    assert!(acc.len() == p.len() * d && v.iter().all(|row| row.len() * E::VALUES == d));
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: as in `scores`.
        unsafe {
            if wide {
                avx512::weighted_sum(p, v, d, acc);
            } else {
                avx2::weighted_sum(p, v, d, acc);
            }
        }
        return;
    }
    let _ = wide;
    for (prow, arow) in p.iter().zip(acc.chunks_exact_mut(d)) {
        for (&w, vrow) in prow.iter().zip(v) {
            // Masked positions have weight 0: skipping them keeps a stray
            // non-finite V of a later token out of earlier rows.
            if w != 0.0 {
                axpy_with(arow, w, |c| E::value(vrow, c));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
