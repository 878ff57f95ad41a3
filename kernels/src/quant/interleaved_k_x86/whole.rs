//! The 512-bit kernel (AVX-512 F, BW, VNNI): all sixteen rows of a group at once.

use std::arch::x86_64::*;

use super::shared::{PREFETCH_BLOCKS, Q4_K, Q5_K, Q6_K, TYPES, q6_high, scale_min};
use crate::quant::acts::Q8KRow;
use crate::quant::blocks::{QK_K, QuantType};
use crate::quant::interleaved::GROUP_ROWS;
use crate::quant::interleaved_k::{PartsK, parts_k};
use crate::quant::interleaved_x86::{by_n, by_stream, four, passes, prefetch};

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

/// A group of a K-quant on 512-bit vectors (see [`entry_points`]).
#[inline(always)]
pub(super) unsafe fn whole_group(
    ty: QuantType,
    g: *const u8,
    nb: usize,
    acts: &[Q8KRow],
    out: &mut [f32],
    stream: bool,
) {
    for (acts, out, stream) in passes(acts, out, stream) {
        // SAFETY: the caller's.
        unsafe { by_stream!(stream, |S| by_type_and_n!(ty, acts, |T, N, x| whole::<T, N, S>(g, nb, x, out))) }
    }
}
