//! The K-quants' interleaved dot products on x86_64 ([`super::interleaved_k`]): a group's
//! sixteen rows against up to four Q8_K activation rows. As for the 32-value types, each
//! 64-byte chunk holds four values of each row and one `vpdpbusd` (or `maddubs` + `madd`) adds
//! four products into the row's lane; a sub-block's exact sum is then multiplied by the row's
//! scale (`vpmulld`, one lane per row). The integers equal [`super::portable`]'s, and the f32
//! steps are its own, so results are bitwise the portable kernel's.

use std::arch::x86_64::*;
use std::ops::Range;

use super::acts::Q8KRow;
use super::avx2::fifth_bits;
use super::blocks::{QK_K, QuantType};
use super::interleaved::GROUP_ROWS;
use super::interleaved_k::{PartsK, parts_k};
use super::interleaved_x86::{Dot, by_n, by_stream, entry_points, four, prefetch};

/// How many group blocks ahead the first half asks for the bytes it will read. Asked for one
/// 128-byte run per chunk step, spread over the block, rather than a whole block at its start:
/// on an AVX2 EPYC the spread kept the single-thread Q6_K head (1024 → 151,936, one row) at
/// 8.4 ms against 12 ms without prefetch, where whole-block requests gained nothing.
const PREFETCH_BLOCKS: usize = 2;

/// Type tags for const generics.
const Q4_K: u8 = 0;
const Q5_K: u8 = 1;
const Q6_K: u8 = 2;

/// The types in tag order.
const TYPES: [QuantType; 3] = [QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K];

/// Sub-block `j`'s 6-bit scales and minimums of sixteen rows (Q4_K, Q5_K), from the transposed
/// packed bytes at `s` (llama.cpp's `get_scale_min_k4`, sixteen rows at a time).
#[inline(always)]
unsafe fn scale_min(s: *const u8, j: usize) -> (__m128i, __m128i) {
    // SAFETY (callers): `s` points at 12 * 16 bytes.
    unsafe {
        let q = |i: usize| _mm_loadu_si128(s.add(16 * i) as *const __m128i);
        let (m63, low4, top2) = (_mm_set1_epi8(63), _mm_set1_epi8(0x0F), _mm_set1_epi8(0xC0u8 as i8));
        if j < 4 {
            (_mm_and_si128(q(j), m63), _mm_and_si128(q(j + 4), m63))
        } else {
            // The top two bits of bytes j - 4 and j land in bits 4 and 5 (masked first, so the
            // 16-bit shift moves nothing across bytes).
            let sc = _mm_or_si128(_mm_and_si128(q(j + 4), low4), _mm_srli_epi16::<2>(_mm_and_si128(q(j - 4), top2)));
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(q(j + 4)), low4);
            let mn = _mm_or_si128(hi, _mm_srli_epi16::<2>(_mm_and_si128(q(j), top2)));
            (sc, mn)
        }
    }
}

/// A 32-bit lane's value (a scale in `-128..=127`) in both of its 16-bit halves, for `madd`.
#[inline(always)]
unsafe fn pair16(v: __m256i) -> __m256i {
    unsafe { _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32::<16>(v)) }
}

/// Q6_K's two high bits of `qh` placed at bits 4 and 5 of each byte, for a chunk whose values
/// lie in the first (`low`) or second 32 of their half, low nibbles and high nibbles.
macro_rules! q6_high {
    ($slli:ident, $srli:ident, $qh:expr, $second:expr) => {{
        let qh = $qh;
        if $second { ($slli::<2>(qh), $srli::<2>(qh)) } else { ($slli::<4>(qh), qh) }
    }};
}

/// Rows `8h..8h + 8` of a group against `N` (at most 2) Q8_K rows over group blocks `blocks`:
/// `out[n * 16 + 8h + r]`; the first half asks for the blocks ahead where `STREAM`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` indexes several arrays in step
unsafe fn half<D: Dot, const T: u8, const N: usize, const STREAM: bool>(
    g: *const u8,
    blocks: Range<usize>,
    h: usize,
    x: &[Q8KRow; N],
    out: &mut [f32],
) {
    let p: PartsK = parts_k(TYPES[T as usize]);
    // A later span goes on from the sums `out` holds: stored and reloaded f32 are exact, so the
    // result is the one pass's.
    // SAFETY: registers of zeros, or `N * 16` f32 of `out`.
    let mut acc: [__m256; N] = std::array::from_fn(|n| unsafe {
        if blocks.start == 0 { _mm256_setzero_ps() } else { _mm256_loadu_ps(out[n * GROUP_ROWS + 8 * h..].as_ptr()) }
    });
    // The first half's `j`-th chunk step asks for bytes `128 j..128 (j + 1)` of the block
    // `PREFETCH_BLOCKS` on; 32 steps cover every type's block.
    let prefetch_ahead = |gb: *const u8, j: usize| {
        if STREAM && h == 0 && 128 * j < p.bytes {
            prefetch(gb.wrapping_add(PREFETCH_BLOCKS * p.bytes + 128 * j), 128);
        }
    };
    for b in blocks {
        // SAFETY: `tile` checked the group for `nb` group blocks and every activation row for
        // `nb` super-blocks; every offset below lies inside block `b` of each.
        unsafe {
            let gb = g.add(b * p.bytes);
            let bx = |n: usize, j: usize| _mm256_set1_epi32(four(x[n].qs, b * QK_K + j));
            let bsum = |n: usize, s: usize| x[n].bsums[16 * b + s] as i32;
            let chunk = |at: usize, i: usize| _mm256_loadu_si256(gb.add(at + 64 * i + 32 * h) as *const __m256i);
            let rows8 = |v: __m128i| _mm256_cvtepu8_epi32(if h == 0 { v } else { _mm_srli_si128::<8>(v) });
            let low4 = _mm256_set1_epi8(0x0F);
            let mut isum = [_mm256_setzero_si256(); N];
            let d = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(16 * h) as *const __m128i));
            if T == Q6_K {
                let bits45 = _mm256_set1_epi8(0x30);
                for hv in 0..2 {
                    for kk in 0..4 {
                        let subs = [8 * hv + kk, 8 * hv + kk + 4];
                        let sc = subs.map(|s| {
                            let sc = _mm_loadu_si128(gb.add(p.scales + 16 * s) as *const __m128i);
                            _mm256_cvtepi8_epi32(if h == 0 { sc } else { _mm_srli_si128::<8>(sc) })
                        });
                        let sc16 = sc.map(|sc| pair16(sc));
                        let mut t = [[_mm256_setzero_si256(); 2]; N];
                        for k in 4 * kk..4 * kk + 4 {
                            let l0 = 4 * k;
                            prefetch_ahead(gb, 16 * hv + k);
                            let raw = chunk(p.qs, 16 * hv + k);
                            let qh = chunk(p.q6h, 8 * hv + l0 % 32 / 4);
                            let (hl, hh) = q6_high!(_mm256_slli_epi16, _mm256_srli_epi16, qh, l0 >= 32);
                            let lo = _mm256_or_si256(_mm256_and_si256(raw, low4), _mm256_and_si256(hl, bits45));
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4);
                            let hi = _mm256_or_si256(hi, _mm256_and_si256(hh, bits45));
                            for n in 0..N {
                                t[n][0] = D::acc_late(t[n][0], lo, bx(n, 128 * hv + l0));
                                t[n][1] = D::acc_late(t[n][1], hi, bx(n, 128 * hv + l0 + 64));
                            }
                            if D::WIDEN_LATE && k % 2 == 1 {
                                // Two chunks of 6-bit values: within 16 bits.
                                for n in 0..N {
                                    for side in 0..2 {
                                        let scaled = _mm256_madd_epi16(t[n][side], sc16[side]);
                                        isum[n] = _mm256_add_epi32(isum[n], scaled);
                                        t[n][side] = _mm256_setzero_si256();
                                    }
                                }
                            }
                        }
                        for side in 0..2 {
                            for n in 0..N {
                                // The values are stored plus 32: take 32 Σ x back off.
                                let offset = _mm256_set1_epi32(32 * bsum(n, subs[side]));
                                isum[n] = if D::WIDEN_LATE {
                                    _mm256_sub_epi32(isum[n], _mm256_mullo_epi32(offset, sc[side]))
                                } else {
                                    let v = _mm256_sub_epi32(t[n][side], offset);
                                    _mm256_add_epi32(isum[n], _mm256_mullo_epi32(v, sc[side]))
                                };
                            }
                        }
                    }
                }
                for n in 0..N {
                    let dx = _mm256_set1_ps(x[n].d[b]);
                    acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[n]), _mm256_mul_ps(d, dx), acc[n]);
                }
                continue;
            }
            let scales = gb.add(p.scales);
            // 16-bit sums hold eight chunks of 4-bit values, four of 5-bit ones.
            let flush_every = if T == Q5_K { 4 } else { 8 };
            for c in 0..4 {
                let sc = [rows8(scale_min(scales, 2 * c).0), rows8(scale_min(scales, 2 * c + 1).0)];
                let sc16 = sc.map(|sc| pair16(sc));
                let mut t = [[_mm256_setzero_si256(); 2]; N];
                for i in 8 * c..8 * c + 8 {
                    prefetch_ahead(gb, i);
                    let raw = chunk(p.qs, i);
                    let mut lo = _mm256_and_si256(raw, low4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4);
                    if T == Q5_K {
                        lo = _mm256_or_si256(lo, fifth_bits(gb.add(p.qh + 16 * i + 4 * h)));
                        hi = _mm256_or_si256(hi, fifth_bits(gb.add(p.qh + 16 * i + 8 + 4 * h)));
                    }
                    let l = 64 * c + 4 * (i % 8);
                    for n in 0..N {
                        t[n][0] = D::acc_late(t[n][0], lo, bx(n, l));
                        t[n][1] = D::acc_late(t[n][1], hi, bx(n, l + 32));
                    }
                    if D::WIDEN_LATE && i % flush_every == flush_every - 1 {
                        for n in 0..N {
                            for side in 0..2 {
                                isum[n] = _mm256_add_epi32(isum[n], _mm256_madd_epi16(t[n][side], sc16[side]));
                                t[n][side] = _mm256_setzero_si256();
                            }
                        }
                    }
                }
                if !D::WIDEN_LATE {
                    for n in 0..N {
                        let lo = _mm256_mullo_epi32(t[n][0], sc[0]);
                        let both = _mm256_add_epi32(lo, _mm256_mullo_epi32(t[n][1], sc[1]));
                        isum[n] = _mm256_add_epi32(isum[n], both);
                    }
                }
            }
            let mut msum = [_mm256_setzero_si256(); N];
            for s in 0..8 {
                let m = rows8(scale_min(scales, s).1);
                for n in 0..N {
                    let bs = _mm256_set1_epi32(bsum(n, 2 * s) + bsum(n, 2 * s + 1));
                    msum[n] = _mm256_add_epi32(msum[n], _mm256_mullo_epi32(m, bs));
                }
            }
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(32 + 16 * h) as *const __m128i));
            for n in 0..N {
                let dx = _mm256_set1_ps(x[n].d[b]);
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[n]), _mm256_mul_ps(d, dx), acc[n]);
                let neg = _mm256_xor_ps(_mm256_mul_ps(dmin, dx), _mm256_set1_ps(-0.0));
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[n]), neg, acc[n]);
            }
        }
    }
    for n in 0..N {
        // SAFETY: `out` holds `N * 16` f32.
        unsafe { _mm256_storeu_ps(out[n * GROUP_ROWS + 8 * h..].as_mut_ptr(), acc[n]) };
    }
}

/// A whole group on 512-bit vectors against `N` (at most 4) Q8_K rows: `out[n * 16 + r]`;
/// asks for the blocks ahead where `STREAM`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` indexes several arrays in step
unsafe fn whole<const T: u8, const N: usize, const STREAM: bool>(
    g: *const u8,
    nb: usize,
    x: &[Q8KRow; N],
    out: &mut [f32],
) {
    let p: PartsK = parts_k(TYPES[T as usize]);
    // SAFETY: registers of zeros.
    let mut acc = [unsafe { _mm512_setzero_ps() }; N];
    // As in `half`: the `j`-th chunk step asks for bytes `128 j..128 (j + 1)` of the block
    // `PREFETCH_BLOCKS` on.
    let prefetch_ahead = |gb: *const u8, j: usize| {
        if STREAM && 128 * j < p.bytes {
            prefetch(gb.wrapping_add(PREFETCH_BLOCKS * p.bytes + 128 * j), 128);
        }
    };
    for b in 0..nb {
        // SAFETY: as in `half`.
        unsafe {
            let gb = g.add(b * p.bytes);
            let bx = |n: usize, j: usize| _mm512_set1_epi32(four(x[n].qs, b * QK_K + j));
            let bsum = |n: usize, s: usize| x[n].bsums[16 * b + s] as i32;
            let chunk = |at: usize, i: usize| _mm512_loadu_si512(gb.add(at + 64 * i) as *const _);
            let low4 = _mm512_set1_epi8(0x0F);
            let mut isum = [_mm512_setzero_si512(); N];
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            if T == Q6_K {
                let bits45 = _mm512_set1_epi8(0x30);
                for hv in 0..2 {
                    for kk in 0..4 {
                        let mut t = [[_mm512_setzero_si512(); 2]; N];
                        for k in 4 * kk..4 * kk + 4 {
                            let l0 = 4 * k;
                            prefetch_ahead(gb, 16 * hv + k);
                            let raw = chunk(p.qs, 16 * hv + k);
                            let qh = chunk(p.q6h, 8 * hv + l0 % 32 / 4);
                            let (hl, hh) = q6_high!(_mm512_slli_epi16, _mm512_srli_epi16, qh, l0 >= 32);
                            let lo = _mm512_or_si512(_mm512_and_si512(raw, low4), _mm512_and_si512(hl, bits45));
                            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low4);
                            let hi = _mm512_or_si512(hi, _mm512_and_si512(hh, bits45));
                            for n in 0..N {
                                t[n][0] = _mm512_dpbusd_epi32(t[n][0], lo, bx(n, 128 * hv + l0));
                                t[n][1] = _mm512_dpbusd_epi32(t[n][1], hi, bx(n, 128 * hv + l0 + 64));
                            }
                        }
                        for (side, s) in [(0, 8 * hv + kk), (1, 8 * hv + kk + 4)] {
                            let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(gb.add(p.scales + 16 * s) as *const __m128i));
                            for n in 0..N {
                                // The values are stored plus 32: take 32 Σ x back off.
                                let v = _mm512_sub_epi32(t[n][side], _mm512_set1_epi32(32 * bsum(n, s)));
                                isum[n] = _mm512_add_epi32(isum[n], _mm512_mullo_epi32(v, sc));
                            }
                        }
                    }
                }
                for n in 0..N {
                    let dx = _mm512_set1_ps(x[n].d[b]);
                    acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[n]), _mm512_mul_ps(d, dx), acc[n]);
                }
                continue;
            }
            let scales = gb.add(p.scales);
            for c in 0..4 {
                let mut t = [[_mm512_setzero_si512(); 2]; N];
                for i in 8 * c..8 * c + 8 {
                    prefetch_ahead(gb, i);
                    let raw = chunk(p.qs, i);
                    let mut lo = _mm512_and_si512(raw, low4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low4);
                    if T == Q5_K {
                        let bits = |at: usize| (gb.add(at) as *const u64).read_unaligned();
                        lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(bits(p.qh + 16 * i), _mm512_set1_epi8(0x10)));
                        hi =
                            _mm512_or_si512(hi, _mm512_maskz_mov_epi8(bits(p.qh + 16 * i + 8), _mm512_set1_epi8(0x10)));
                    }
                    let l = 64 * c + 4 * (i % 8);
                    for n in 0..N {
                        t[n][0] = _mm512_dpbusd_epi32(t[n][0], lo, bx(n, l));
                        t[n][1] = _mm512_dpbusd_epi32(t[n][1], hi, bx(n, l + 32));
                    }
                }
                let s_lo = _mm512_cvtepu8_epi32(scale_min(scales, 2 * c).0);
                let s_hi = _mm512_cvtepu8_epi32(scale_min(scales, 2 * c + 1).0);
                for n in 0..N {
                    let both = _mm512_add_epi32(_mm512_mullo_epi32(t[n][0], s_lo), _mm512_mullo_epi32(t[n][1], s_hi));
                    isum[n] = _mm512_add_epi32(isum[n], both);
                }
            }
            let mut msum = [_mm512_setzero_si512(); N];
            for s in 0..8 {
                let m = _mm512_cvtepu8_epi32(scale_min(scales, s).1);
                for n in 0..N {
                    let bs = _mm512_set1_epi32(bsum(n, 2 * s) + bsum(n, 2 * s + 1));
                    msum[n] = _mm512_add_epi32(msum[n], _mm512_mullo_epi32(m, bs));
                }
            }
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(gb.add(32) as *const __m256i));
            for n in 0..N {
                let dx = _mm512_set1_ps(x[n].d[b]);
                acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[n]), _mm512_mul_ps(d, dx), acc[n]);
                let neg = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(_mm512_mul_ps(dmin, dx)),
                    _mm512_set1_epi32(i32::MIN),
                ));
                acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[n]), neg, acc[n]);
            }
        }
    }
    for n in 0..N {
        // SAFETY: `out` holds `N * 16` f32.
        unsafe { _mm512_storeu_ps(out[n * GROUP_ROWS..].as_mut_ptr(), acc[n]) };
    }
}

/// Runs `$call` with const `$t` the tag of `$ty` and const `$n` = `$acts.len()`.
macro_rules! by_type_and_n {
    ($ty:expr, $acts:expr, |$t:ident, $n:ident, $x:ident| $call:expr) => {
        match $ty {
            QuantType::Q4_K => by_n!(Q8KRow, Q4_K, $acts, |$t, $n, $x| $call),
            QuantType::Q5_K => by_n!(Q8KRow, Q5_K, $acts, |$t, $n, $x| $call),
            QuantType::Q6_K => by_n!(Q8KRow, Q6_K, $acts, |$t, $n, $x| $call),
            ty => unreachable!("{ty:?} is not a K-quant"),
        }
    };
}

/// One group on 256-bit vectors with `D`'s products: both halves, at most two activation rows
/// at a time (more would not fit the sixteen registers).
#[inline(always)]
unsafe fn halves<D: Dot>(ty: QuantType, g: *const u8, nb: usize, acts: &[Q8KRow], out: &mut [f32], stream: bool) {
    for (part, out) in acts.chunks(2).zip(out.chunks_mut(2 * GROUP_ROWS)) {
        // SAFETY: the caller's.
        unsafe {
            // Both halves of each block before the next: the half that reads a 64-byte line
            // second finds it in L1, and the memory stream never waits on a pass that reads
            // nothing new (the vocabulary head at one row ran at 17 GB/s in two whole passes).
            by_stream!(stream, |S| by_type_and_n!(ty, part, |T, N, x| for b in 0..nb {
                half::<D, T, N, S>(g, b..b + 1, 0, x, out);
                half::<D, T, N, S>(g, b..b + 1, 1, x, out)
            }))
        }
    }
}

/// A group of a K-quant on 512-bit vectors (see [`entry_points`]).
#[inline(always)]
unsafe fn whole_group(ty: QuantType, g: *const u8, nb: usize, acts: &[Q8KRow], out: &mut [f32], stream: bool) {
    // SAFETY: the caller's.
    unsafe { by_stream!(stream, |S| by_type_and_n!(ty, acts, |T, N, x| whole::<T, N, S>(g, nb, x, out))) }
}

entry_points!(Q8KRow);
