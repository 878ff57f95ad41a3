//! The AVX2+FMA(+F16C) build of the tile kernels.

// The micro-kernels index their register blocks (rows x keys or columns)
// with plain ranges: constant trip counts that unroll into registers.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::{ElementKind, TILE, TileElement, TileRow, TileRows};
use crate::{KV_BLOCK, KvQ4_0, KvQ8_0};

/// f16 to f32, 8 at a time with F16C.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `src.len() == dst.len()`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    let n8 = src.len().min(dst.len()) / 8 * 8;
    // SAFETY: every 8-element access starts below `n8`.
    unsafe {
        for i in (0..n8).step_by(8) {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for (d, s) in dst[n8..].iter_mut().zip(&src[n8..]) {
        *d = s.to_f32();
    }
}

/// bf16 to f32 (the bf16 bits are the f32's upper half), 8 at a time.
///
/// # Safety
/// The CPU must support AVX2; `src.len() == dst.len()`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    let n8 = src.len().min(dst.len()) / 8 * 8;
    // SAFETY: every 8-element access starts below `n8`.
    unsafe {
        for i in (0..n8).step_by(8) {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            let x = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_castsi256_ps(x));
        }
    }
    for (d, s) in dst[n8..].iter_mut().zip(&src[n8..]) {
        *d = s.to_f32();
    }
}

/// A row of q8_0 or q4_0 blocks to f32, 8 values at a time, the bits [`load8`] gives them.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `dst.len() == src.len() * KV_BLOCK`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn blocks_to_f32<E: TileElement>(src: &[E], dst: &mut [f32]) {
    assert!(E::VALUES == KV_BLOCK && dst.len() == src.len() * KV_BLOCK);
    // SAFETY: every 8 values at `e < dst.len()` lie in `src`'s blocks and in `dst`.
    unsafe {
        for e in (0..dst.len()).step_by(8) {
            _mm256_storeu_ps(dst.as_mut_ptr().add(e), load8(src.as_ptr(), e));
        }
    }
}

/// [`super::online_softmax`] on the tile held in two registers, with a
/// vector `exp` like [`crate::vector::exp_in_place`]'s (same polynomial,
/// fused multiply-adds).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn online_softmax(tile: &mut TileRow, max: &mut f32, sum: &mut f32) -> Option<f32> {
    // SAFETY: both 8-lane accesses are within the 16-lane tile.
    unsafe {
        let (lo, hi) = (_mm256_loadu_ps(tile.as_ptr()), _mm256_loadu_ps(tile.as_ptr().add(8)));
        let tile_max = hreduce(_mm256_max_ps(lo, hi), |a, b| _mm_max_ps(a, b));
        let corr = super::raise_max(tile, tile_max, max, sum)?;
        let m = _mm256_set1_ps(*max);
        let (lo, hi) = (exp(_mm256_sub_ps(lo, m)), exp(_mm256_sub_ps(hi, m)));
        _mm256_storeu_ps(tile.as_mut_ptr(), lo);
        _mm256_storeu_ps(tile.as_mut_ptr().add(8), hi);
        *sum += hreduce(_mm256_add_ps(lo, hi), |a, b| _mm_add_ps(a, b));
        corr
    }
}

/// Reduces the 8 lanes of `x` with `f` pairwise (halves, then pairs of
/// the remaining 4, then the last 2).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hreduce(x: __m256, f: impl Fn(__m128, __m128) -> __m128) -> f32 {
    let x4 = f(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let x2 = f(x4, _mm_movehl_ps(x4, x4));
    _mm_cvtss_f32(f(x2, _mm_movehdup_ps(x2)))
}

/// `exp` of 8 lanes: Cephes `expf` as in [`crate::vector::exp_in_place`]
/// (inputs below -87, `-inf` included, give 0; NaN stays NaN).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn exp(x: __m256) -> __m256 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
    let splat = _mm256_set1_ps;
    // max/min return their second operand for NaN, so NaN passes.
    let xc = _mm256_min_ps(splat(88.0), _mm256_max_ps(splat(-87.0), x));
    // t = ROUND + n, n = round(x / ln 2) in -126..=127.
    let t = _mm256_fmadd_ps(xc, splat(std::f32::consts::LOG2_E), splat(ROUND));
    let n = _mm256_sub_ps(t, splat(ROUND));
    let r = _mm256_fnmadd_ps(n, splat(LN2_LO), _mm256_fnmadd_ps(n, splat(LN2_HI), xc));
    let mut p = splat(P[0]);
    for &c in &P[1..] {
        p = _mm256_fmadd_ps(p, r, splat(c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), splat(1.0));
    let bits = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND.to_bits() as i32));
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(bits, _mm256_set1_epi32(127))));
    // Zero where x < -87 (not for NaN: the comparison is unordered).
    let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, splat(-87.0));
    _mm256_and_ps(keep, _mm256_mul_ps(y, pow2))
}

/// Query rows per block of the score kernel: 3 rows x 4 keys keep 12
/// accumulators plus the 3 query vectors in the 16 ymm registers.
const SCORE_ROWS: usize = 3;
/// Keys per block of the score kernel.
const SCORE_KEYS: usize = 4;
/// Query rows per block of the weighted sum: 4 rows x 16 columns.
const SUM_ROWS: usize = 6;

/// Values `e..e + 8` of the row at `p` as f32 lanes, the bits converting the row to f32
/// gives them (`e` a multiple of 8).
///
/// # Safety
/// The CPU must support AVX2 and F16C; the row at `p` must hold values `e..e + 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<E: TileElement>(p: *const E, e: usize) -> __m256 {
    // SAFETY: the caller guarantees the values are in the row; a block's 8 values at `e`
    // (a multiple of 8) lie within one block.
    unsafe {
        match E::KIND {
            ElementKind::F32 => _mm256_loadu_ps(p.add(e).cast()),
            ElementKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(e).cast())),
            ElementKind::BF16 => {
                let h = _mm_loadu_si128(p.add(e).cast());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
            ElementKind::Q8_0 => {
                let b = &*p.cast::<KvQ8_0>().add(e / KV_BLOCK);
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.qs.as_ptr().add(e % KV_BLOCK).cast()));
                _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale8(b.d))
            }
            ElementKind::Q4_0 => {
                let b = &*p.cast::<KvQ4_0>().add(e / KV_BLOCK);
                let o = e % KV_BLOCK;
                let bytes = _mm_loadl_epi64(b.qs.as_ptr().add(o % (KV_BLOCK / 2)).cast());
                // Values 0..16 of a block are its bytes' low nibbles, 16..32 the high ones.
                let nibbles = if o < KV_BLOCK / 2 { bytes } else { _mm_srli_epi16::<4>(bytes) };
                let q = _mm256_cvtepu8_epi32(_mm_and_si128(nibbles, _mm_set1_epi8(0x0F)));
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))), scale8(b.d))
            }
        }
    }
}

/// A block's f16 scale in all 8 lanes, exactly.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale8(d: f16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(d.to_bits() as i16))
}

/// [`super::scores`] with AVX2+FMA.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `q.len() == s.len() * d` and
/// every row of `k` holds `d` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores<E: TileElement>(q: &[f32], k: &TileRows<E>, d: usize, s: &mut [TileRow]) {
    let rows = s.len();
    let mut r = 0;
    // SAFETY (all calls): the CPU has the features (our contract), and
    // rows r..r + MR exist in `q` and `s`.
    while r + SCORE_ROWS <= rows {
        unsafe { score_block::<SCORE_ROWS, E>(q, k, d, r, s) };
        r += SCORE_ROWS;
    }
    match rows - r {
        2 => unsafe { score_block::<2, E>(q, k, d, r, s) },
        1 => unsafe { score_block::<1, E>(q, k, d, r, s) },
        _ => {}
    }
}

/// Scores of rows `r0..r0 + MR` against the whole tile, [`SCORE_KEYS`]
/// keys at a time: each loaded K vector serves MR rows from registers.
///
/// # Safety
/// As [`scores`], and `r0 + MR <= s.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn score_block<const MR: usize, E: TileElement>(
    q: &[f32],
    k: &TileRows<E>,
    d: usize,
    r0: usize,
    s: &mut [TileRow],
) {
    debug_assert!(r0 + MR <= s.len() && q.len() == s.len() * d && k.iter().all(|row| row.len() * E::VALUES == d));
    let d8 = d / 8 * 8;
    // SAFETY: every pointer offset stays below `d` within a row that the
    // length contract guarantees exists.
    unsafe {
        let qp: [*const f32; MR] = std::array::from_fn(|i| q.as_ptr().add((r0 + i) * d));
        for j0 in (0..TILE).step_by(SCORE_KEYS) {
            let kp: [*const E; SCORE_KEYS] = std::array::from_fn(|c| k[j0 + c].as_ptr());
            let mut acc = [[_mm256_setzero_ps(); SCORE_KEYS]; MR];
            let mut e = 0;
            while e < d8 {
                let qv: [__m256; MR] = std::array::from_fn(|i| _mm256_loadu_ps(qp[i].add(e)));
                for c in 0..SCORE_KEYS {
                    let kv = load8(kp[c], e);
                    for i in 0..MR {
                        acc[i][c] = _mm256_fmadd_ps(qv[i], kv, acc[i][c]);
                    }
                }
                e += 8;
            }
            for i in 0..MR {
                let out = s[r0 + i][j0..j0 + SCORE_KEYS].as_mut_ptr();
                _mm_storeu_ps(out, hsum4(acc[i]));
                // Head dims that are not a multiple of 8.
                for c in 0..SCORE_KEYS {
                    for e in d8..d {
                        *out.add(c) = (*qp[i].add(e)).mul_add(E::value(k[j0 + c], e), *out.add(c));
                    }
                }
            }
        }
    }
}

/// The lane sums of four vectors, as one 4-lane vector.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum4(a: [__m256; 4]) -> __m128 {
    let ab = _mm256_hadd_ps(a[0], a[1]);
    let cd = _mm256_hadd_ps(a[2], a[3]);
    let abcd = _mm256_hadd_ps(ab, cd);
    _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps::<1>(abcd))
}

/// [`super::weighted_sum`] with AVX2+FMA.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `acc.len() == p.len() * d`
/// and every row of `v` holds `d` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_sum<E: TileElement>(p: &[TileRow], v: &TileRows<E>, d: usize, acc: &mut [f32]) {
    let rows = p.len();
    let mut r = 0;
    // SAFETY (all calls): the CPU has the features (our contract), and
    // rows r..r + MR exist in `p` and `acc`.
    while r + SUM_ROWS <= rows {
        unsafe { sum_block::<SUM_ROWS, E>(p, v, d, r, acc) };
        r += SUM_ROWS;
    }
    match rows - r {
        5 => unsafe { sum_block::<5, E>(p, v, d, r, acc) },
        4 => unsafe { sum_block::<4, E>(p, v, d, r, acc) },
        3 => unsafe { sum_block::<3, E>(p, v, d, r, acc) },
        2 => unsafe { sum_block::<2, E>(p, v, d, r, acc) },
        1 => unsafe { sum_block::<1, E>(p, v, d, r, acc) },
        _ => {}
    }
}

/// Weighted sum into rows `r0..r0 + MR`, 16 then 8 columns at a time,
/// keeping those columns' accumulators in registers over the whole tile.
/// Every element is `fma(p[r][j], v[j][c], acc)` for j = 0.. in order,
/// whichever of the three column loops handles it.
///
/// # Safety
/// As [`weighted_sum`], and `r0 + MR <= p.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum_block<const MR: usize, E: TileElement>(
    p: &[TileRow],
    v: &TileRows<E>,
    d: usize,
    r0: usize,
    acc: &mut [f32],
) {
    debug_assert!(r0 + MR <= p.len() && acc.len() == p.len() * d && v.iter().all(|row| row.len() * E::VALUES == d));
    let (d16, d8) = (d / 16 * 16, d / 8 * 8);
    let w: &[TileRow; MR] = p[r0..r0 + MR].try_into().expect("MR rows");
    // SAFETY: every pointer offset stays below `d` within a row that the
    // length contract guarantees exists; rows of `acc` do not overlap.
    unsafe {
        let ap: [*mut f32; MR] = std::array::from_fn(|i| acc.as_mut_ptr().add((r0 + i) * d));
        let vp: [*const E; TILE] = std::array::from_fn(|j| v[j].as_ptr());
        let mut c = 0;
        while c < d16 {
            let mut o: [[__m256; 2]; MR] =
                std::array::from_fn(|i| [_mm256_loadu_ps(ap[i].add(c)), _mm256_loadu_ps(ap[i].add(c + 8))]);
            for j in 0..TILE {
                let v0 = load8(vp[j], c);
                let v1 = load8(vp[j], c + 8);
                for i in 0..MR {
                    let wv = _mm256_set1_ps(w[i][j]);
                    o[i][0] = _mm256_fmadd_ps(wv, v0, o[i][0]);
                    o[i][1] = _mm256_fmadd_ps(wv, v1, o[i][1]);
                }
            }
            for i in 0..MR {
                _mm256_storeu_ps(ap[i].add(c), o[i][0]);
                _mm256_storeu_ps(ap[i].add(c + 8), o[i][1]);
            }
            c += 16;
        }
        if c < d8 {
            let mut o: [__m256; MR] = std::array::from_fn(|i| _mm256_loadu_ps(ap[i].add(c)));
            for j in 0..TILE {
                let v0 = load8(vp[j], c);
                for i in 0..MR {
                    o[i] = _mm256_fmadd_ps(_mm256_set1_ps(w[i][j]), v0, o[i]);
                }
            }
            for i in 0..MR {
                _mm256_storeu_ps(ap[i].add(c), o[i]);
            }
        }
        for c in d8..d {
            for i in 0..MR {
                let mut x = *ap[i].add(c);
                for j in 0..TILE {
                    x = w[i][j].mul_add(E::value(v[j], c), x);
                }
                *ap[i].add(c) = x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        if !crate::attention::has_avx2() {
            return;
        }
        let mut worst = 0.0f64;
        for i in 0..=250_000u32 {
            // -87 ..= 1, 8 at a time.
            let xs: [f32; 8] = std::array::from_fn(|l| (-87.0 + 88.0 * (8 * i + l as u32) as f64 / 2e6) as f32);
            let mut got = [0.0f32; 8];
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp(_mm256_loadu_ps(xs.as_ptr()))) };
            for (x, y) in xs.iter().zip(got) {
                let want = (*x as f64).exp();
                worst = worst.max((y as f64 - want).abs() / want);
            }
        }
        // A few ulp (f32 ulp is 1.2e-7 relative).
        assert!(worst <= 4e-7, "worst relative error {worst:e}");
        let xs = [0.0, f32::NEG_INFINITY, -87.5, -1e30, f32::NAN, 88.0, 1e30, -0.0];
        let mut got = [0.0f32; 8];
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp(_mm256_loadu_ps(xs.as_ptr()))) };
        assert_eq!(got[0], 1.0);
        assert_eq!(&got[1..4], &[0.0, 0.0, 0.0]);
        assert!(got[4].is_nan());
        assert!(got[5].is_finite() && got[5] > 1e38 && got[6] == got[5]);
        assert_eq!(got[7], 1.0);
    }
}
