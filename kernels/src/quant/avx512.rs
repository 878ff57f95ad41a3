//! The 512-bit K-quant dot products (x86_64, AVX-512 F + BW + VNNI): sixteen weight rows, read
//! in place, against up to four Q8_K activation rows. A 512-bit register holds 64 values of a
//! row (two Q4_K/Q5_K sub-blocks, four Q6_K ones), `maddubs` makes 16-bit pairs and one
//! `vpdpwssd` scales and adds them; each row's exact integer sums are then reduced into one lane,
//! and the f32 steps are [`super::portable`]'s, sixteen rows at a time. The 32-value types run
//! on the 256-bit VNNI kernels of [`super::avx2`].

use std::arch::x86_64::*;

use super::acts::Q8KRow;
use super::blocks::{QK_K, QuantType};
use super::kernel::{Acts, check_tile};

/// Weight rows per tile: one f32 lane each.
pub(crate) const LANES: usize = 16;

/// The most activation rows one tile takes.
pub(crate) const MAX_ACTS: usize = 4;

/// Lane `r` = the sum of `v[r]`'s lanes (exact): a transposing tree of unpacks and adds.
#[inline(always)]
unsafe fn reduce16(v: &[__m512i; LANES]) -> __m512i {
    unsafe {
        // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3].
        let t: [__m512i; 8] = std::array::from_fn(|i| {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
        });
        // Per 128-bit lane: rows 4g..4g+4, each that lane's sum.
        let q: [__m512i; 4] = std::array::from_fn(|g| {
            let (a, b) = (t[2 * g], t[2 * g + 1]);
            _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
        });
        let pair = |a: __m512i, b: __m512i| {
            _mm512_add_epi32(_mm512_shuffle_i32x4::<0x88>(a, b), _mm512_shuffle_i32x4::<0xDD>(a, b))
        };
        pair(pair(q[0], q[1]), pair(q[2], q[3]))
    }
}

/// The f16 at byte `off` of each row, as sixteen f32.
#[inline(always)]
unsafe fn f16x16(rows: &[*const u8; LANES], off: usize) -> __m512 {
    // SAFETY (callers): `off + 2` is inside every row.
    let h: [i16; LANES] = std::array::from_fn(|r| unsafe { (rows[r].add(off) as *const i16).read_unaligned() });
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().cast())) }
}

/// `[a | b]`.
#[inline(always)]
unsafe fn join(a: __m256i, b: __m256i) -> __m512i {
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b) }
}

/// Bit `s` of each byte of `h`, moved to bit 4.
#[inline(always)]
unsafe fn bit_to_4(h: __m256i, s: i32) -> __m256i {
    unsafe {
        let b = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
        _mm256_slli_epi16::<4>(b)
    }
}

/// `vpermw` indices: 16-bit lanes `0..16` take element `a`, `16..32` element `b`.
#[inline(always)]
unsafe fn two_lanes(a: i16, b: i16) -> __m512i {
    unsafe { join(_mm256_set1_epi16(a), _mm256_set1_epi16(b)) }
}

/// `vpermw` indices: each 128-bit lane `j` takes element `first + j`.
#[inline(always)]
unsafe fn four_lanes(first: i16) -> __m512i {
    unsafe {
        let lo = _mm256_set_m128i(_mm_set1_epi16(first + 1), _mm_set1_epi16(first));
        let hi = _mm256_set_m128i(_mm_set1_epi16(first + 3), _mm_set1_epi16(first + 2));
        join(lo, hi)
    }
}

/// A Q4_K/Q5_K block's scales (16-bit, in the low eight lanes) and each minimum twice
/// (16-bit), from its 12 packed bytes (llama.cpp's `utmp` unpacking).
#[inline(always)]
unsafe fn scales_mins(p: *const u8) -> (__m512i, __m256i) {
    const K1: u32 = 0x3f3f3f3f;
    const K2: u32 = 0x0f0f0f0f;
    const K3: u32 = 0x03030303;
    let u = |i: usize| unsafe { (p.add(4 * i) as *const u32).read_unaligned() };
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let u3 = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    let mins = u1 & K1;
    let u1 = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let u0 = u0 & K1;
    unsafe {
        let sc = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, u1 as i32, u0 as i32));
        let m8 = _mm_set_epi32(0, 0, u3 as i32, mins as i32);
        (_mm512_castsi128_si512(sc), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)))
    }
}

const Q4_K: u8 = 5;
const Q5_K: u8 = 6;
const Q6_K: u8 = 7;

/// Sixteen rows of a K-quant against `N` Q8_K rows.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` and `half` index several arrays in step
unsafe fn tile_k<const T: u8, const N: usize>(
    rows: &[*const u8; LANES],
    nb: usize,
    x: &[Q8KRow; N],
    out: &mut [[f32; LANES]],
) {
    let bb = QuantType::ALL[T as usize].block_bytes();
    // SAFETY: `check_tile` checked every row for `nb` blocks and every activation row for
    // `nb * 256` values and `nb * 16` sums; the features are the caller's.
    unsafe {
        let low4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            let bs: [__m256i; N] = std::array::from_fn(|n| _mm256_loadu_si256(x[n].bsums.as_ptr().add(16 * b).cast()));
            let xq = |n: usize, off: usize| _mm512_loadu_si512(x[n].qs.as_ptr().add(b * QK_K + off).cast());
            let mut isums = [[_mm512_setzero_si512(); LANES]; N];
            let mut msum = [[_mm512_setzero_si512(); LANES]; N];
            for (r, row) in rows.iter().enumerate() {
                let blk = row.add(b * bb);
                let mut p = [_mm512_setzero_si512(); N];
                if T == Q6_K {
                    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192).cast()));
                    let sc = _mm512_castsi256_si512(sc16);
                    for half in 0..2 {
                        let ql0 = _mm256_loadu_si256(blk.add(64 * half).cast());
                        let ql1 = _mm256_loadu_si256(blk.add(64 * half + 32).cast());
                        let qh = _mm256_loadu_si256(blk.add(128 + 32 * half).cast());
                        let high = |shift: i32| {
                            let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift));
                            _mm256_slli_epi16::<4>(_mm256_and_si256(h, _mm256_set1_epi8(3)))
                        };
                        let v0 = _mm256_or_si256(_mm256_and_si256(ql0, low4), high(0));
                        let v1 = _mm256_or_si256(_mm256_and_si256(ql1, low4), high(2));
                        let v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4), high(4));
                        let v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4), high(6));
                        for (j, v) in [join(v0, v1), join(v2, v3)].into_iter().enumerate() {
                            // Sub-blocks 8 half + 4 j .. + 4, one per 128-bit lane.
                            let first = (8 * half + 4 * j) as i16;
                            let scv = _mm512_permutexvar_epi16(four_lanes(first), sc);
                            for n in 0..N {
                                let pairs = _mm512_maddubs_epi16(v, xq(n, 128 * half + 64 * j));
                                p[n] = _mm512_dpwssd_epi32(p[n], pairs, scv);
                            }
                        }
                    }
                    for n in 0..N {
                        // The values are stored plus 32: take 32 Σ_s sc_s Σ x back off.
                        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs[n], sc16));
                        isums[n][r] = _mm512_sub_epi32(p[n], _mm512_zextsi256_si512(offset));
                    }
                } else {
                    let (scales, mins) = scales_mins(blk.add(4));
                    let (qs, qh) = if T == Q5_K {
                        (blk.add(48), _mm256_loadu_si256(blk.add(16).cast()))
                    } else {
                        (blk.add(16), _mm256_setzero_si256())
                    };
                    for c in 0..4 {
                        let raw = _mm256_loadu_si256(qs.add(32 * c).cast());
                        let mut lo = _mm256_and_si256(raw, low4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4);
                        if T == Q5_K {
                            lo = _mm256_or_si256(lo, bit_to_4(qh, 2 * c as i32));
                            hi = _mm256_or_si256(hi, bit_to_4(qh, 2 * c as i32 + 1));
                        }
                        let v = join(lo, hi);
                        let scv = _mm512_permutexvar_epi16(two_lanes(2 * c as i16, 2 * c as i16 + 1), scales);
                        for n in 0..N {
                            p[n] = _mm512_dpwssd_epi32(p[n], _mm512_maddubs_epi16(v, xq(n, 64 * c)), scv);
                        }
                    }
                    for n in 0..N {
                        isums[n][r] = p[n];
                        msum[n][r] = _mm512_zextsi256_si512(_mm256_madd_epi16(bs[n], mins));
                    }
                }
            }
            let d = f16x16(rows, b * bb + if T == Q6_K { 208 } else { 0 });
            let dmin = if T == Q6_K { _mm512_setzero_ps() } else { f16x16(rows, b * bb + 2) };
            for n in 0..N {
                let dx = _mm512_set1_ps(x[n].d[b]);
                acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce16(&isums[n])), _mm512_mul_ps(d, dx), acc[n]);
                if T != Q6_K {
                    let prod = _mm512_castps_si512(_mm512_mul_ps(dmin, dx));
                    let neg = _mm512_castsi512_ps(_mm512_xor_si512(prod, _mm512_set1_epi32(i32::MIN)));
                    acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce16(&msum[n])), neg, acc[n]);
                }
            }
        }
        for n in 0..N {
            _mm512_storeu_ps(out[n].as_mut_ptr(), acc[n]);
        }
    }
}

/// One tile: `out[n][r]` = row `r` of `rows` times activation row `n` (K-quants).
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile(ty: QuantType, rows: &[&[u8]; LANES], acts: Acts, out: &mut [[f32; LANES]]) {
    let nb = check_tile(ty, rows, acts, out.len());
    let ptrs: [*const u8; LANES] = std::array::from_fn(|r| rows[r].as_ptr());
    let Acts::Q8K(x) = acts else { unreachable!("{ty:?} reads Q8_K activations") };
    macro_rules! by_n {
        ($t:expr) => {
            match x.len() {
                1 => tile_k::<{ $t }, 1>(&ptrs, nb, x.try_into().expect("length matched"), out),
                2 => tile_k::<{ $t }, 2>(&ptrs, nb, x.try_into().expect("length matched"), out),
                3 => tile_k::<{ $t }, 3>(&ptrs, nb, x.try_into().expect("length matched"), out),
                4 => tile_k::<{ $t }, 4>(&ptrs, nb, x.try_into().expect("length matched"), out),
                n => unreachable!("{n} activation rows for one tile"),
            }
        };
    }
    // SAFETY: `check_tile` checked the lengths the kernels read; the features are the caller's.
    unsafe {
        match ty {
            QuantType::Q4_K => by_n!(Q4_K),
            QuantType::Q5_K => by_n!(Q5_K),
            QuantType::Q6_K => by_n!(Q6_K),
            other => unreachable!("{other:?} is not a K-quant"),
        }
    }
}
