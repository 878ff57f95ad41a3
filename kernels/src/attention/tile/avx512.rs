//! The AVX-512 build of the two tile kernels (scores and weighted sum): 16 lanes per
//! instruction where the AVX2 build has 8. The weighted sum computes every element in the same
//! order as the AVX2 build (bitwise equal); the scores sum each dot product in 16 lane
//! stripes instead of 8, so they round differently from the AVX2 build.
//!
//! The kernels mirror `avx2.rs` line for line on purpose: one version generic over the vector
//! type, instantiated for both, measured 11% slower on prefill attention (SmolLM2, 2048
//! tokens, the attention kernel alone: 697-723 ms written out, 779-815 ms generic, three
//! alternating runs), from different inlining and code layout.

// The micro-kernels index their register blocks (rows x keys or columns)
// with plain ranges: constant trip counts that unroll into registers.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{ElementKind, TILE, TileElement, TileRow, TileRows};
use crate::{KV_BLOCK, KvQ4_0, KvQ8_0};

/// Query rows per block of the score kernel: 4 rows x 4 keys keep 16
/// accumulators plus the 4 query vectors in the 32 zmm registers.
const SCORE_ROWS: usize = 4;
/// Keys per block of the score kernel.
const SCORE_KEYS: usize = 4;
/// Query rows per block of the weighted sum: 8 rows x 32 columns.
const SUM_ROWS: usize = 8;

/// Values `e..e + 16` of the row at `p` as f32 lanes, the bits converting the row to f32
/// gives them (`e` a multiple of 16).
///
/// # Safety
/// The CPU must support AVX-512F; the row at `p` must hold values `e..e + 16`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn load16<E: TileElement>(p: *const E, e: usize) -> __m512 {
    // SAFETY: the caller guarantees the values are in the row; a block's 16 values at `e`
    // (a multiple of 16) lie within one block.
    unsafe {
        match E::KIND {
            ElementKind::F32 => _mm512_loadu_ps(p.add(e).cast()),
            ElementKind::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(e).cast())),
            ElementKind::BF16 => {
                let h = _mm256_loadu_si256(p.add(e).cast());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
            ElementKind::Q8_0 => {
                let b = &*p.cast::<KvQ8_0>().add(e / KV_BLOCK);
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.qs.as_ptr().add(e % KV_BLOCK).cast()));
                _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale16(b.d))
            }
            ElementKind::Q4_0 => {
                let b = &*p.cast::<KvQ4_0>().add(e / KV_BLOCK);
                let bytes = _mm_loadu_si128(b.qs.as_ptr().cast());
                // Values 0..16 of a block are its bytes' low nibbles, 16..32 the high ones.
                let nibbles = if e.is_multiple_of(KV_BLOCK) { bytes } else { _mm_srli_epi16::<4>(bytes) };
                let q = _mm512_cvtepu8_epi32(_mm_and_si128(nibbles, _mm_set1_epi8(0x0F)));
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(8))), scale16(b.d))
            }
        }
    }
}

/// A block's f16 scale in all 16 lanes, exactly.
///
/// # Safety
/// The CPU must support AVX-512F and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn scale16(d: half::f16) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16(d.to_bits() as i16))
}

/// [`super::scores`] with AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `q.len() == s.len() * d` and every row
/// of `k` holds `d` elements.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn scores<E: TileElement>(q: &[f32], k: &TileRows<E>, d: usize, s: &mut [TileRow]) {
    let rows = s.len();
    let mut r = 0;
    // SAFETY (all calls): the CPU has the features (our contract), and rows r..r + MR exist
    // in `q` and `s`.
    while r + SCORE_ROWS <= rows {
        unsafe { score_block::<SCORE_ROWS, E>(q, k, d, r, s) };
        r += SCORE_ROWS;
    }
    match rows - r {
        3 => unsafe { score_block::<3, E>(q, k, d, r, s) },
        2 => unsafe { score_block::<2, E>(q, k, d, r, s) },
        1 => unsafe { score_block::<1, E>(q, k, d, r, s) },
        _ => {}
    }
}

/// Scores of rows `r0..r0 + MR` against the whole tile, [`SCORE_KEYS`] keys at a time.
///
/// # Safety
/// As [`scores`], and `r0 + MR <= s.len()`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn score_block<const MR: usize, E: TileElement>(
    q: &[f32],
    k: &TileRows<E>,
    d: usize,
    r0: usize,
    s: &mut [TileRow],
) {
    debug_assert!(r0 + MR <= s.len() && q.len() == s.len() * d && k.iter().all(|row| row.len() * E::VALUES == d));
    let d16 = d / 16 * 16;
    // SAFETY: every pointer offset stays below `d` within a row that the length contract
    // guarantees exists.
    unsafe {
        let qp: [*const f32; MR] = std::array::from_fn(|i| q.as_ptr().add((r0 + i) * d));
        for j0 in (0..TILE).step_by(SCORE_KEYS) {
            let kp: [*const E; SCORE_KEYS] = std::array::from_fn(|c| k[j0 + c].as_ptr());
            let mut acc = [[_mm512_setzero_ps(); SCORE_KEYS]; MR];
            let mut e = 0;
            while e < d16 {
                let qv: [__m512; MR] = std::array::from_fn(|i| _mm512_loadu_ps(qp[i].add(e)));
                for c in 0..SCORE_KEYS {
                    let kv = load16(kp[c], e);
                    for i in 0..MR {
                        acc[i][c] = _mm512_fmadd_ps(qv[i], kv, acc[i][c]);
                    }
                }
                e += 16;
            }
            for i in 0..MR {
                let out = s[r0 + i][j0..j0 + SCORE_KEYS].as_mut_ptr();
                _mm_storeu_ps(out, hsum4(acc[i]));
                // Head dims that are not a multiple of 16.
                for c in 0..SCORE_KEYS {
                    for e in d16..d {
                        *out.add(c) = (*qp[i].add(e)).mul_add(E::value(k[j0 + c], e), *out.add(c));
                    }
                }
            }
        }
    }
}

/// The lane sums of four vectors, as one 4-lane vector: each folded to 8 lanes (low half +
/// high half), then summed pairwise as the AVX2 build's `hsum4` does.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn hsum4(a: [__m512; 4]) -> __m128 {
    let fold = |x: __m512| {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        _mm256_add_ps(_mm512_castps512_ps256(x), hi)
    };
    let ab = _mm256_hadd_ps(fold(a[0]), fold(a[1]));
    let cd = _mm256_hadd_ps(fold(a[2]), fold(a[3]));
    let abcd = _mm256_hadd_ps(ab, cd);
    _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps::<1>(abcd))
}

/// [`super::weighted_sum`] with AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `acc.len() == p.len() * d` and every
/// row of `v` holds `d` elements.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn weighted_sum<E: TileElement>(p: &[TileRow], v: &TileRows<E>, d: usize, acc: &mut [f32]) {
    let rows = p.len();
    let mut r = 0;
    // SAFETY (all calls): the CPU has the features (our contract), and rows r..r + MR exist
    // in `p` and `acc`.
    while r + SUM_ROWS <= rows {
        unsafe { sum_block::<SUM_ROWS, E>(p, v, d, r, acc) };
        r += SUM_ROWS;
    }
    match rows - r {
        7 => unsafe { sum_block::<7, E>(p, v, d, r, acc) },
        6 => unsafe { sum_block::<6, E>(p, v, d, r, acc) },
        5 => unsafe { sum_block::<5, E>(p, v, d, r, acc) },
        4 => unsafe { sum_block::<4, E>(p, v, d, r, acc) },
        3 => unsafe { sum_block::<3, E>(p, v, d, r, acc) },
        2 => unsafe { sum_block::<2, E>(p, v, d, r, acc) },
        1 => unsafe { sum_block::<1, E>(p, v, d, r, acc) },
        _ => {}
    }
}

/// Weighted sum into rows `r0..r0 + MR`, 32 then 16 columns at a time, keeping those
/// columns' accumulators in registers over the whole tile. Every element is
/// `fma(p[r][j], v[j][c], acc)` for j = 0.. in order, as in the AVX2 build.
///
/// # Safety
/// As [`weighted_sum`], and `r0 + MR <= p.len()`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn sum_block<const MR: usize, E: TileElement>(
    p: &[TileRow],
    v: &TileRows<E>,
    d: usize,
    r0: usize,
    acc: &mut [f32],
) {
    debug_assert!(r0 + MR <= p.len() && acc.len() == p.len() * d && v.iter().all(|row| row.len() * E::VALUES == d));
    let (d32, d16) = (d / 32 * 32, d / 16 * 16);
    let w: &[TileRow; MR] = p[r0..r0 + MR].try_into().expect("MR rows");
    // SAFETY: every pointer offset stays below `d` within a row that the length contract
    // guarantees exists; rows of `acc` do not overlap.
    unsafe {
        let ap: [*mut f32; MR] = std::array::from_fn(|i| acc.as_mut_ptr().add((r0 + i) * d));
        let vp: [*const E; TILE] = std::array::from_fn(|j| v[j].as_ptr());
        let mut c = 0;
        while c < d32 {
            let mut o: [[__m512; 2]; MR] =
                std::array::from_fn(|i| [_mm512_loadu_ps(ap[i].add(c)), _mm512_loadu_ps(ap[i].add(c + 16))]);
            for j in 0..TILE {
                let v0 = load16(vp[j], c);
                let v1 = load16(vp[j], c + 16);
                for i in 0..MR {
                    let wv = _mm512_set1_ps(w[i][j]);
                    o[i][0] = _mm512_fmadd_ps(wv, v0, o[i][0]);
                    o[i][1] = _mm512_fmadd_ps(wv, v1, o[i][1]);
                }
            }
            for i in 0..MR {
                _mm512_storeu_ps(ap[i].add(c), o[i][0]);
                _mm512_storeu_ps(ap[i].add(c + 16), o[i][1]);
            }
            c += 32;
        }
        if c < d16 {
            let mut o: [__m512; MR] = std::array::from_fn(|i| _mm512_loadu_ps(ap[i].add(c)));
            for j in 0..TILE {
                let v0 = load16(vp[j], c);
                for i in 0..MR {
                    o[i] = _mm512_fmadd_ps(_mm512_set1_ps(w[i][j]), v0, o[i]);
                }
            }
            for i in 0..MR {
                _mm512_storeu_ps(ap[i].add(c), o[i]);
            }
        }
        for c in d16..d {
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
