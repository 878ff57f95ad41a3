//! The 256-bit dot products (x86_64): eight weight rows, read in place, against up to four
//! activation rows, with each row's exact integer sums reduced into one lane of a vector per
//! activation row, then the f32 steps of [`super::portable`] eight rows at a time. The 8-bit
//! products are AVX2's `maddubs` + `madd`, or one VNNI `vpdpbusd` (`vpdpwssd` for the scaled
//! K-quant sums): the integers are the same either way, and so are the results.

use std::arch::x86_64::*;

use super::acts::{Q8KRow, Q8Row};
use super::blocks::{QK_K, QK8_0, QuantType};
use super::kernel::{Acts, check_tile};

/// Weight rows per tile: one f32 lane each.
pub(crate) const LANES: usize = 8;

/// The 8-bit products of one instruction set, into 32-bit lanes (each the exact sum of four
/// neighbouring products).
pub(crate) trait Dot8 {
    /// `Σ w x` of unsigned `w` and signed `x`.
    unsafe fn dot_u8(w: __m256i, x: __m256i) -> __m256i;
    /// `Σ w x` of signed `w` and `x`.
    unsafe fn dot_i8(w: __m256i, x: __m256i) -> __m256i;
    /// `acc + Σ sc (w x + w' x')` over neighbouring pairs, `sc` 16-bit.
    unsafe fn dot_u8_scaled(acc: __m256i, w: __m256i, x: __m256i, sc: __m256i) -> __m256i;
}

/// AVX2: `maddubs` into 16-bit pairs (never saturating: weights are at most 63 here, or 128 in
/// magnitude for Q8_0, against activations in `-127..=127`), then `madd`.
pub(crate) struct Avx2;

impl Dot8 for Avx2 {
    #[inline(always)]
    unsafe fn dot_u8(w: __m256i, x: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)) }
    }
    #[inline(always)]
    unsafe fn dot_i8(w: __m256i, x: __m256i) -> __m256i {
        unsafe { Self::dot_u8(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)) }
    }
    #[inline(always)]
    unsafe fn dot_u8_scaled(acc: __m256i, w: __m256i, x: __m256i, sc: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sc)) }
    }
}

/// One set of VNNI products per encoding of `vpdpbusd`.
macro_rules! vnni {
    ($name:ident, $dpbusd:ident, $dpwssd:ident) => {
        /// VNNI: `vpdpbusd` for the plain sums, `maddubs` + `vpdpwssd` for the scaled ones.
        pub(crate) struct $name;

        impl Dot8 for $name {
            #[inline(always)]
            unsafe fn dot_u8(w: __m256i, x: __m256i) -> __m256i {
                unsafe { $dpbusd(_mm256_setzero_si256(), w, x) }
            }
            #[inline(always)]
            unsafe fn dot_i8(w: __m256i, x: __m256i) -> __m256i {
                unsafe { Self::dot_u8(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)) }
            }
            #[inline(always)]
            unsafe fn dot_u8_scaled(acc: __m256i, w: __m256i, x: __m256i, sc: __m256i) -> __m256i {
                unsafe { $dpwssd(acc, _mm256_maddubs_epi16(w, x), sc) }
            }
        }
    };
}

vnni!(AvxVnni, _mm256_dpbusd_avx_epi32, _mm256_dpwssd_avx_epi32);
vnni!(Avx512Vnni, _mm256_dpbusd_epi32, _mm256_dpwssd_epi32);

/// The lanes of `h` (two `hadd` levels of eight vectors) summed into one lane per vector.
#[inline(always)]
unsafe fn finish(h: [__m256i; 4]) -> __m256i {
    unsafe {
        let a = _mm256_hadd_epi32(h[0], h[1]);
        let b = _mm256_hadd_epi32(h[2], h[3]);
        _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(a, b), _mm256_permute2x128_si256::<0x31>(a, b))
    }
}

/// Lane `r` = the sum of `v[r]`'s lanes (exact).
#[inline(always)]
pub(crate) unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    unsafe { finish(std::array::from_fn(|i| _mm256_hadd_epi32(v[2 * i], v[2 * i + 1]))) }
}

/// The f16 at byte `off` of each row, as eight f32.
#[inline(always)]
unsafe fn f16x8(rows: &[*const u8; LANES], off: usize) -> __m256 {
    // SAFETY (callers): `off + 2` is inside every row.
    let h = |r: usize| unsafe { (rows[r].add(off) as *const i16).read_unaligned() };
    unsafe { _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7))) }
}

/// 16 bytes of nibbles as 32 values: low nibbles first, then high ones (GGML's order).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let t = _mm_loadu_si128(p as *const __m128i);
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(t), t), _mm256_set1_epi8(0x0F))
    }
}

/// 32 bits as 32 bytes: `0x10` where the bit is set (the fifth bit of Q5 values).
#[inline(always)]
pub(crate) unsafe fn fifth_bits(p: *const u8) -> __m256i {
    unsafe {
        let x = (p as *const i32).read_unaligned();
        let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bits = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        let bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf), bits);
        _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10))
    }
}

/// The 32 values of a 32-value type's block at `p`, and whether they are signed (Q8_0).
#[inline(always)]
unsafe fn values32<const T: u8>(p: *const u8) -> __m256i {
    unsafe {
        match T {
            Q4_0 => nibbles(p.add(2)),
            Q4_1 => nibbles(p.add(4)),
            Q5_0 => _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2))),
            Q5_1 => _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))),
            _ => _mm256_loadu_si256(p.add(2) as *const __m256i),
        }
    }
}

/// Type tags for const generics (enums cannot be const parameters).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const Q4_K: u8 = 5;
const Q5_K: u8 = 6;
const Q6_K: u8 = 7;

/// Eight rows of a 32-value type against `N` Q8_0 rows.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` indexes several arrays in step
unsafe fn tile32<D: Dot8, const T: u8, const N: usize>(
    rows: &[*const u8; LANES],
    nb: usize,
    x: &[Q8Row; N],
    out: &mut [[f32; LANES]],
) {
    let ty = TYPES[T as usize];
    let bb = ty.block_bytes();
    let offset = match T {
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    };
    let has_min = T == Q4_1 || T == Q5_1;
    // SAFETY: a register of zeros.
    let mut acc = [unsafe { _mm256_setzero_ps() }; N];
    for b in 0..nb {
        // SAFETY: `check_tile` checked every row for `nb` blocks and every activation row for
        // `nb * 32` values.
        unsafe {
            let xv: [__m256i; N] =
                std::array::from_fn(|n| _mm256_loadu_si256(x[n].qs.as_ptr().add(b * QK8_0) as *const __m256i));
            let mut h = [[_mm256_setzero_si256(); 4]; N];
            for (p, pair) in rows.chunks_exact(2).enumerate() {
                let w0 = values32::<T>(pair[0].add(b * bb));
                let w1 = values32::<T>(pair[1].add(b * bb));
                for n in 0..N {
                    let (s0, s1) = if T == Q8_0 {
                        (D::dot_i8(w0, xv[n]), D::dot_i8(w1, xv[n]))
                    } else {
                        (D::dot_u8(w0, xv[n]), D::dot_u8(w1, xv[n]))
                    };
                    h[n][p] = _mm256_hadd_epi32(s0, s1);
                }
            }
            let dw = f16x8(rows, b * bb);
            let m = if has_min { f16x8(rows, b * bb + 2) } else { _mm256_setzero_ps() };
            for n in 0..N {
                let mut s = finish(h[n]);
                let sx = x[n].sums[b];
                if offset != 0 {
                    s = _mm256_sub_epi32(s, _mm256_set1_epi32(offset * sx));
                }
                let dx = _mm256_set1_ps(x[n].d[b]);
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, dx), acc[n]);
                if has_min {
                    acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(sx as f32), _mm256_mul_ps(m, dx), acc[n]);
                }
            }
        }
    }
    for n in 0..N {
        // SAFETY: `out[n]` holds eight f32.
        unsafe { _mm256_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
}

/// `_mm256_shuffle_epi8` masks repeating 16-bit lane `s` of each 128-bit half.
const fn lane_masks() -> [[u8; 32]; 8] {
    let mut m = [[0u8; 32]; 8];
    let mut s = 0;
    while s < 8 {
        let mut i = 0;
        while i < 16 {
            m[s][2 * i] = 2 * s as u8 % 16;
            m[s][2 * i + 1] = 2 * s as u8 % 16 + 1;
            i += 1;
        }
        s += 1;
    }
    m
}

/// Masks for Q6_K: the low half repeats 16-bit lane `2j`, the high half lane `2j + 1`.
const fn pair_masks() -> [[u8; 32]; 4] {
    let mut m = [[0u8; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut i = 0;
        while i < 8 {
            m[j][2 * i] = 4 * j as u8;
            m[j][2 * i + 1] = 4 * j as u8 + 1;
            m[j][16 + 2 * i] = 4 * j as u8 + 2;
            m[j][16 + 2 * i + 1] = 4 * j as u8 + 3;
            i += 1;
        }
        j += 1;
    }
    m
}

const LANE_MASKS: [[u8; 32]; 8] = lane_masks();
const PAIR_MASKS: [[u8; 32]; 4] = pair_masks();

#[inline(always)]
unsafe fn mask(m: &[u8; 32]) -> __m256i {
    unsafe { _mm256_loadu_si256(m.as_ptr() as *const __m256i) }
}

/// A Q4_K/Q5_K block's 12 bytes of 6-bit scales and minimums (llama.cpp's `utmp` unpacking):
/// the eight scales as 16-bit values in both halves, and each minimum twice, as 16-bit values.
#[inline(always)]
unsafe fn scales_mins(p: *const u8) -> (__m256i, __m256i) {
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
        (_mm256_broadcastsi128_si256(sc), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)))
    }
}

/// Bit `s` of each byte of `h`, moved to bit 4.
#[inline(always)]
unsafe fn bit_to_4(h: __m256i, s: i32) -> __m256i {
    unsafe {
        let b = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
        _mm256_slli_epi16::<4>(b)
    }
}

/// Eight rows of a K-quant against `N` Q8_K rows.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` and `half` index several arrays in step
unsafe fn tile_k<D: Dot8, const T: u8, const N: usize>(
    rows: &[*const u8; LANES],
    nb: usize,
    x: &[Q8KRow; N],
    out: &mut [[f32; LANES]],
) {
    let bb = TYPES[T as usize].block_bytes();
    // SAFETY: constants.
    let (low4, mut acc) = unsafe { (_mm256_set1_epi8(0x0F), [_mm256_setzero_ps(); N]) };
    for b in 0..nb {
        // SAFETY: `check_tile` checked every row for `nb` blocks and every activation row for
        // `nb * 256` values and `nb * 16` sums.
        unsafe {
            let bs: [__m256i; N] =
                std::array::from_fn(|n| _mm256_loadu_si256(x[n].bsums.as_ptr().add(16 * b) as *const __m256i));
            let xq = |n: usize, off: usize| _mm256_loadu_si256(x[n].qs.as_ptr().add(b * QK_K + off) as *const __m256i);
            let mut isum = [[_mm256_setzero_si256(); LANES]; N];
            let mut msum = [[_mm256_setzero_si256(); LANES]; N];
            for (r, row) in rows.iter().enumerate() {
                let blk = row.add(b * bb);
                let mut p = [_mm256_setzero_si256(); N];
                if T == Q6_K {
                    let sc = _mm_loadu_si128(blk.add(192) as *const __m128i);
                    let sc16 = _mm256_cvtepi8_epi16(sc);
                    let halves = [
                        _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc)),
                        _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128::<8>(sc))),
                    ];
                    for half in 0..2 {
                        let ql0 = _mm256_loadu_si256(blk.add(64 * half) as *const __m256i);
                        let ql1 = _mm256_loadu_si256(blk.add(64 * half + 32) as *const __m256i);
                        let qh = _mm256_loadu_si256(blk.add(128 + 32 * half) as *const __m256i);
                        let three = _mm256_set1_epi8(3);
                        let high = |shift: i32| {
                            let h = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), three);
                            _mm256_slli_epi16::<4>(h)
                        };
                        let v = [
                            _mm256_or_si256(_mm256_and_si256(ql0, low4), high(0)),
                            _mm256_or_si256(_mm256_and_si256(ql1, low4), high(2)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4), high(4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4), high(6)),
                        ];
                        for (j, v) in v.into_iter().enumerate() {
                            let scv = _mm256_shuffle_epi8(halves[half], mask(&PAIR_MASKS[j]));
                            for n in 0..N {
                                p[n] = D::dot_u8_scaled(p[n], v, xq(n, 128 * half + 32 * j), scv);
                            }
                        }
                    }
                    for n in 0..N {
                        // The values are stored plus 32: take 32 Σ_s sc_s Σ x back off.
                        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs[n], sc16));
                        isum[n][r] = _mm256_sub_epi32(p[n], offset);
                    }
                } else {
                    let (scales, mins) = scales_mins(blk.add(4));
                    let (qs, qh) = if T == Q5_K {
                        (blk.add(48), _mm256_loadu_si256(blk.add(16) as *const __m256i))
                    } else {
                        (blk.add(16), _mm256_setzero_si256())
                    };
                    for c in 0..4 {
                        let raw = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
                        let mut lo = _mm256_and_si256(raw, low4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4);
                        if T == Q5_K {
                            lo = _mm256_or_si256(lo, bit_to_4(qh, 2 * c as i32));
                            hi = _mm256_or_si256(hi, bit_to_4(qh, 2 * c as i32 + 1));
                        }
                        let sl = _mm256_shuffle_epi8(scales, mask(&LANE_MASKS[2 * c]));
                        let sh = _mm256_shuffle_epi8(scales, mask(&LANE_MASKS[2 * c + 1]));
                        for n in 0..N {
                            p[n] = D::dot_u8_scaled(p[n], lo, xq(n, 64 * c), sl);
                            p[n] = D::dot_u8_scaled(p[n], hi, xq(n, 64 * c + 32), sh);
                        }
                    }
                    for n in 0..N {
                        isum[n][r] = p[n];
                        msum[n][r] = _mm256_madd_epi16(bs[n], mins);
                    }
                }
            }
            let d = f16x8(rows, b * bb + if T == Q6_K { 208 } else { 0 });
            let dmin = if T == Q6_K { _mm256_setzero_ps() } else { f16x8(rows, b * bb + 2) };
            for n in 0..N {
                let dx = _mm256_set1_ps(x[n].d[b]);
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&isum[n])), _mm256_mul_ps(d, dx), acc[n]);
                if T != Q6_K {
                    let neg = _mm256_xor_ps(_mm256_mul_ps(dmin, dx), _mm256_set1_ps(-0.0));
                    acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&msum[n])), neg, acc[n]);
                }
            }
        }
    }
    for n in 0..N {
        // SAFETY: `out[n]` holds eight f32.
        unsafe { _mm256_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
}

/// The types in tag order.
const TYPES: [QuantType; 8] = QuantType::ALL;

/// Calls the kernel for `ty` and `acts.len()` rows.
#[inline(always)]
unsafe fn dispatch<D: Dot8>(ty: QuantType, rows: &[&[u8]; LANES], acts: Acts, out: &mut [[f32; LANES]]) {
    let nb = check_tile(ty, rows, acts, out.len());
    let ptrs: [*const u8; LANES] = std::array::from_fn(|r| rows[r].as_ptr());
    macro_rules! by_n {
        ($f:ident, $t:expr, $x:expr, [$($n:literal),*]) => {
            match $x.len() {
                $($n => $f::<D, { $t }, $n>(&ptrs, nb, $x.try_into().expect("length matched"), out),)*
                n => unreachable!("{n} activation rows for one tile"),
            }
        };
    }
    // SAFETY: `check_tile` checked the lengths the kernels read; the features are the caller's.
    unsafe {
        match (ty, acts) {
            (QuantType::Q4_0, Acts::Q8(x)) => by_n!(tile32, Q4_0, x, [1, 2]),
            (QuantType::Q4_1, Acts::Q8(x)) => by_n!(tile32, Q4_1, x, [1, 2]),
            (QuantType::Q5_0, Acts::Q8(x)) => by_n!(tile32, Q5_0, x, [1, 2]),
            (QuantType::Q5_1, Acts::Q8(x)) => by_n!(tile32, Q5_1, x, [1, 2]),
            (QuantType::Q8_0, Acts::Q8(x)) => by_n!(tile32, Q8_0, x, [1, 2]),
            (QuantType::Q4_K, Acts::Q8K(x)) => by_n!(tile_k, Q4_K, x, [1, 2, 3, 4]),
            (QuantType::Q5_K, Acts::Q8K(x)) => by_n!(tile_k, Q5_K, x, [1, 2, 3, 4]),
            (QuantType::Q6_K, Acts::Q8K(x)) => by_n!(tile_k, Q6_K, x, [1, 2, 3, 4]),
            (ty, _) => unreachable!("{ty:?} with the other activation format"),
        }
    }
}

/// The most activation rows one tile call takes for `ty`.
pub(crate) fn max_acts(ty: QuantType) -> usize {
    match ty.act_format() {
        super::blocks::ActFormat::Q8_0 => 2,
        super::blocks::ActFormat::Q8K => 4,
    }
}

/// One tile on AVX2: `out[n][r]` = row `r` of `rows` times activation row `n`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_avx2(ty: QuantType, rows: &[&[u8]; LANES], acts: Acts, out: &mut [[f32; LANES]]) {
    unsafe { dispatch::<Avx2>(ty, rows, acts, out) }
}

/// [`tile_avx2`] with AVX-VNNI's products.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) unsafe fn tile_avxvnni(ty: QuantType, rows: &[&[u8]; LANES], acts: Acts, out: &mut [[f32; LANES]]) {
    unsafe { dispatch::<AvxVnni>(ty, rows, acts, out) }
}

/// [`tile_avx2`] with AVX-512 VNNI's 256-bit products.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX-512 VNNI and VL.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(crate) unsafe fn tile_avx512vnni(ty: QuantType, rows: &[&[u8]; LANES], acts: Acts, out: &mut [[f32; LANES]]) {
    unsafe { dispatch::<Avx512Vnni>(ty, rows, acts, out) }
}
