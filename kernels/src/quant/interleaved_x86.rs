//! The interleaved layout's dot products on x86_64 ([`super::interleaved`]): a group's sixteen
//! rows against up to four Q8_0 activation rows. Each 64-byte chunk of a group block holds four
//! values of each row; the activation's matching four values are broadcast, and one `vpdpbusd`
//! (AVX-512: all sixteen rows; 256-bit: eight, the group in two halves) or AVX2's `maddubs` +
//! `madd` adds the four products into the row's lane. The lanes end each block as the exact
//! integer sums of [`super::portable`], and the f32 steps are its own, so results are bitwise
//! the portable kernel's.

use std::arch::x86_64::*;

use super::acts::Q8Row;
use super::avx2::fifth_bits;
use super::blocks::{QK8_0, QuantType};
use super::interleaved::{GROUP_ROWS, Parts, parts};

/// Type tags for const generics (enums cannot be const parameters).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

/// The types in tag order.
const TYPES: [QuantType; 5] = [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0];

/// What is subtracted from each stored value (times the activation block's sum) before the
/// scale: GGML's offsets, and for Q8_0 the bias `bias` its signed values took to be unsigned.
const fn offset(t: u8, bias: i32) -> i32 {
    match t {
        Q4_0 => 8,
        Q5_0 => 16,
        Q8_0 => bias,
        _ => 0,
    }
}

/// The 8-bit products of one 256-bit instruction set, added into 32-bit lanes.
pub(crate) trait Dot {
    /// Added to Q8_0's signed values by [`Dot::acc_i8`] (taken back off with the block's sum).
    const I8_BIAS: i32;
    /// Whether unsigned weights' products are best added as 16-bit pairs ([`Dot::pairs`]) over
    /// a few chunks and widened once by `madd` with the K-quants' scales: AVX2, whose
    /// 32-bit products cost `maddubs` + `madd` + add each, against one `vpdpbusd`. The caller
    /// keeps the 16-bit sums within range: a pair is at most 2 * 63 * 127 = 16002, so two
    /// chunks of 6-bit values, four of 5-bit ones, eight of 4-bit ones.
    const WIDEN_LATE: bool;
    /// `acc + Σ w x` over each lane's four bytes, `w` unsigned and at most 31 (AVX2's `maddubs`
    /// never saturates on it).
    unsafe fn acc_u8(acc: __m256i, w: __m256i, x: __m256i) -> __m256i;
    /// `acc + Σ (w + I8_BIAS) x` over each lane's four bytes, `w` signed.
    unsafe fn acc_i8(acc: __m256i, w: __m256i, x: __m256i) -> __m256i;
    /// `acc + maddubs(w, x)`: neighbouring products summed in pairs, in 16 bits.
    #[inline(always)]
    unsafe fn pairs(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)) }
    }
    /// [`Dot::pairs`] where [`Dot::WIDEN_LATE`], else [`Dot::acc_u8`].
    #[inline(always)]
    unsafe fn acc_late(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        unsafe { if Self::WIDEN_LATE { Self::pairs(acc, w, x) } else { Self::acc_u8(acc, w, x) } }
    }
}

/// AVX2: `maddubs` into 16-bit pairs, `madd` into 32 bits; signed weights by `abs` / `sign`.
pub(crate) struct Avx2;

impl Dot for Avx2 {
    const I8_BIAS: i32 = 0;
    const WIDEN_LATE: bool = true;
    #[inline(always)]
    unsafe fn acc_u8(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))) }
    }
    #[inline(always)]
    unsafe fn acc_i8(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        unsafe { Self::acc_u8(acc, _mm256_abs_epi8(w), _mm256_sign_epi8(x, w)) }
    }
}

/// One VNNI encoding of `vpdpbusd`: signed weights are biased by 128 (`w ^ 0x80`).
macro_rules! vnni {
    ($name:ident, $dpbusd:ident) => {
        pub(crate) struct $name;

        impl Dot for $name {
            const I8_BIAS: i32 = 128;
            const WIDEN_LATE: bool = false;
            #[inline(always)]
            unsafe fn acc_u8(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
                unsafe { $dpbusd(acc, w, x) }
            }
            #[inline(always)]
            unsafe fn acc_i8(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
                unsafe { $dpbusd(acc, _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN)), x) }
            }
        }
    };
}

vnni!(AvxVnni, _mm256_dpbusd_avx_epi32);
vnni!(Avx512Vnni, _mm256_dpbusd_epi32);

/// Asks for the cache lines of `bytes` bytes from `at` (which may lie past the matrix: a
/// prefetch never faults). The interleaved groups are read as one forward stream, but each
/// block's parts (values, high bits, scales) are read as separate runs that the hardware
/// prefetchers follow too late: on an AVX2 EPYC the Q6_K head at one activation row stalled
/// on its first high-bits load of every block.
#[inline(always)]
pub(crate) fn prefetch(at: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint; it reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line) as *const i8) };
    }
}

/// How far ahead of its use a 32-value group block is asked for: about two K-quant group
/// blocks, as [`super::interleaved_k_x86`] asks, in whole blocks of the type.
const PREFETCH_BYTES: usize = 4096;

/// Asks, at block `b` of a group of `bytes`-byte blocks, for the block [`PREFETCH_BYTES`] on.
#[inline(always)]
fn prefetch_block(g: *const u8, b: usize, bytes: usize) {
    let ahead = (PREFETCH_BYTES / bytes).max(1);
    prefetch(g.wrapping_add((b + ahead) * bytes), bytes);
}

/// The most activation rows one kernel pass keeps in registers.
pub(crate) const PASS_ROWS: usize = 4;

/// `acts` and their outputs in passes of [`PASS_ROWS`] rows, each with whether it streams the
/// group from memory (`stream` and the first pass: later ones find it in cache).
pub(crate) fn passes<'a, R>(
    acts: &'a [R],
    out: &'a mut [f32],
    stream: bool,
) -> impl Iterator<Item = (&'a [R], &'a mut [f32], bool)> {
    let outs = out.chunks_mut(PASS_ROWS * GROUP_ROWS);
    acts.chunks(PASS_ROWS).zip(outs).enumerate().map(move |(i, (x, out))| (x, out, stream && i == 0))
}

/// Four activation values from `at`, as one 32-bit lane.
#[inline(always)]
pub(crate) unsafe fn four(qs: &[i8], at: usize) -> i32 {
    // SAFETY (callers): `at + 4 <= qs.len()`.
    unsafe { (qs.as_ptr().add(at) as *const i32).read_unaligned() }
}

/// Rows `8h..8h + 8` of a group against `N` activation rows: `out[n * 16 + 8h + r]`; the
/// first half asks for the blocks ahead where `STREAM`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` indexes several arrays in step
unsafe fn half<D: Dot, const T: u8, const N: usize, const STREAM: bool>(
    g: *const u8,
    nb: usize,
    h: usize,
    x: &[Q8Row; N],
    out: &mut [f32],
) {
    let p: Parts = parts(TYPES[T as usize]);
    let has_min = p.m.is_some();
    // One chain of sums per activation row when there are several; two for one, so that a
    // row's products do not all wait on each other. Integer sums: the split changes nothing.
    // (16-bit pairs, as the K-quants add them on AVX2, would need two sums per row here and
    // so two passes over the weights for four rows: the default model's prefill lost 25%.)
    let chains = if N == 1 { 2 } else { 1 };
    // SAFETY: registers of zeros.
    let mut acc = [unsafe { _mm256_setzero_ps() }; N];
    for b in 0..nb {
        // SAFETY: `tile` checked the group for `nb` group blocks and every activation row for
        // `nb` blocks; every offset below lies inside block `b` of each.
        unsafe {
            if STREAM && h == 0 {
                prefetch_block(g, b, p.bytes);
            }
            let gb = g.add(b * p.bytes);
            let bx = |n: usize, j: usize| _mm256_set1_epi32(four(x[n].qs, b * QK8_0 + j));
            let mut s = [[_mm256_setzero_si256(); 2]; N];
            if T == Q8_0 {
                for c in 0..8 {
                    let w = _mm256_loadu_si256(gb.add(p.qs + 64 * c + 32 * h) as *const __m256i);
                    for n in 0..N {
                        s[n][c % chains] = D::acc_i8(s[n][c % chains], w, bx(n, 4 * c));
                    }
                }
            } else {
                let low4 = _mm256_set1_epi8(0x0F);
                for c in 0..4 {
                    let raw = _mm256_loadu_si256(gb.add(p.qs + 64 * c + 32 * h) as *const __m256i);
                    let mut lo = _mm256_and_si256(raw, low4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4);
                    if let Some(qh) = p.qh {
                        lo = _mm256_or_si256(lo, fifth_bits(gb.add(qh + 8 * c + 4 * h)));
                        hi = _mm256_or_si256(hi, fifth_bits(gb.add(qh + 8 * (c + 4) + 4 * h)));
                    }
                    for n in 0..N {
                        s[n][0] = D::acc_u8(s[n][0], lo, bx(n, 4 * c));
                        s[n][chains - 1] = D::acc_u8(s[n][chains - 1], hi, bx(n, 16 + 4 * c));
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(16 * h) as *const __m128i));
            let m = match p.m {
                Some(at) => _mm256_cvtph_ps(_mm_loadu_si128(gb.add(at + 16 * h) as *const __m128i)),
                None => _mm256_setzero_ps(),
            };
            for n in 0..N {
                let mut isum = if chains == 2 { _mm256_add_epi32(s[n][0], s[n][1]) } else { s[n][0] };
                let sx = x[n].sums[b];
                let off = offset(T, D::I8_BIAS);
                if off != 0 {
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * sx));
                }
                let dx = _mm256_set1_ps(x[n].d[b]);
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[n]);
                if has_min {
                    acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(sx as f32), _mm256_mul_ps(m, dx), acc[n]);
                }
            }
        }
    }
    for n in 0..N {
        // SAFETY: `out` holds `N * 16` f32.
        unsafe { _mm256_storeu_ps(out[n * GROUP_ROWS + 8 * h..].as_mut_ptr(), acc[n]) };
    }
}

/// A whole group on 512-bit vectors: `out[n * 16 + r]`; asks for the blocks ahead where
/// `STREAM`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` indexes several arrays in step
unsafe fn whole<const T: u8, const N: usize, const STREAM: bool>(
    g: *const u8,
    nb: usize,
    x: &[Q8Row; N],
    out: &mut [f32],
) {
    let p: Parts = parts(TYPES[T as usize]);
    // SAFETY: registers of zeros.
    let mut acc = [unsafe { _mm512_setzero_ps() }; N];
    for b in 0..nb {
        // SAFETY: as in `half`.
        unsafe {
            if STREAM {
                prefetch_block(g, b, p.bytes);
            }
            let gb = g.add(b * p.bytes);
            let bx = |n: usize, j: usize| _mm512_set1_epi32(four(x[n].qs, b * QK8_0 + j));
            let mut s = [[_mm512_setzero_si512(); 2]; N];
            if T == Q8_0 {
                let bias = _mm512_set1_epi8(i8::MIN);
                for c in 0..8 {
                    let w = _mm512_xor_si512(_mm512_loadu_si512(gb.add(p.qs + 64 * c) as *const _), bias);
                    for n in 0..N {
                        s[n][c % 2] = _mm512_dpbusd_epi32(s[n][c % 2], w, bx(n, 4 * c));
                    }
                }
            } else {
                let low4 = _mm512_set1_epi8(0x0F);
                for c in 0..4 {
                    let raw = _mm512_loadu_si512(gb.add(p.qs + 64 * c) as *const _);
                    let mut lo = _mm512_and_si512(raw, low4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low4);
                    if let Some(qh) = p.qh {
                        let bits = |c: usize| (gb.add(qh + 8 * c) as *const u64).read_unaligned();
                        lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(bits(c), _mm512_set1_epi8(0x10)));
                        hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(bits(c + 4), _mm512_set1_epi8(0x10)));
                    }
                    for n in 0..N {
                        s[n][0] = _mm512_dpbusd_epi32(s[n][0], lo, bx(n, 4 * c));
                        s[n][1] = _mm512_dpbusd_epi32(s[n][1], hi, bx(n, 16 + 4 * c));
                    }
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            let m = match p.m {
                Some(at) => _mm512_cvtph_ps(_mm256_loadu_si256(gb.add(at) as *const __m256i)),
                None => _mm512_setzero_ps(),
            };
            for n in 0..N {
                let mut isum = _mm512_add_epi32(s[n][0], s[n][1]);
                let sx = x[n].sums[b];
                let off = offset(T, 128);
                if off != 0 {
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(off * sx));
                }
                let dx = _mm512_set1_ps(x[n].d[b]);
                acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[n]);
                if p.m.is_some() {
                    acc[n] = _mm512_fmadd_ps(_mm512_set1_ps(sx as f32), _mm512_mul_ps(m, dx), acc[n]);
                }
            }
        }
    }
    for n in 0..N {
        // SAFETY: `out` holds `N * 16` f32.
        unsafe { _mm512_storeu_ps(out[n * GROUP_ROWS..].as_mut_ptr(), acc[n]) };
    }
}

/// Runs `$call` with const `$t` = `$tag` and const `$n` = `$acts.len()` (1 to 4), `$x` the
/// activation rows (of type `$row`) as an array.
macro_rules! by_n {
    ($row:ty, $tag:expr, $acts:expr, |$t:ident, $n:ident, $x:ident| $call:expr) => {{
        const $t: u8 = $tag;
        match $acts.len() {
            1 => {
                const $n: usize = 1;
                let $x: &[$row; $n] = $acts.try_into().expect("length matched");
                $call
            }
            2 => {
                const $n: usize = 2;
                let $x: &[$row; $n] = $acts.try_into().expect("length matched");
                $call
            }
            3 => {
                const $n: usize = 3;
                let $x: &[$row; $n] = $acts.try_into().expect("length matched");
                $call
            }
            4 => {
                const $n: usize = 4;
                let $x: &[$row; $n] = $acts.try_into().expect("length matched");
                $call
            }
            n => unreachable!("{n} activation rows for one group"),
        }
    }};
}
pub(crate) use by_n;

/// Runs `$call` with const `$s` = `$stream`: a kernel's prefetch is a const generic (as a
/// runtime flag inside the K-quant loop it cost Q6_K's prefill 1.8x, in code generation).
macro_rules! by_stream {
    ($stream:expr, |$s:ident| $call:expr) => {
        if $stream {
            const $s: bool = true;
            $call
        } else {
            const $s: bool = false;
            $call
        }
    };
}
pub(crate) use by_stream;

/// Runs `$call` with const `$t` the tag of `$ty` and const `$n` = `$acts.len()`.
macro_rules! by_type_and_n {
    ($ty:expr, $acts:expr, |$t:ident, $n:ident, $x:ident| $call:expr) => {
        match $ty {
            QuantType::Q4_0 => by_n!(Q8Row, Q4_0, $acts, |$t, $n, $x| $call),
            QuantType::Q4_1 => by_n!(Q8Row, Q4_1, $acts, |$t, $n, $x| $call),
            QuantType::Q5_0 => by_n!(Q8Row, Q5_0, $acts, |$t, $n, $x| $call),
            QuantType::Q5_1 => by_n!(Q8Row, Q5_1, $acts, |$t, $n, $x| $call),
            QuantType::Q8_0 => by_n!(Q8Row, Q8_0, $acts, |$t, $n, $x| $call),
            ty => unreachable!("{ty:?} has no interleaved layout"),
        }
    };
}

/// One group on 256-bit vectors with `D`'s products, both halves.
#[inline(always)]
unsafe fn halves<D: Dot>(ty: QuantType, g: *const u8, nb: usize, acts: &[Q8Row], out: &mut [f32], stream: bool) {
    for (acts, out, stream) in passes(acts, out, stream) {
        // SAFETY: the caller's.
        unsafe {
            by_stream!(stream, |S| by_type_and_n!(ty, acts, |T, N, x| {
                half::<D, T, N, S>(g, nb, 0, x, out);
                half::<D, T, N, S>(g, nb, 1, x, out)
            }))
        }
    }
}

/// A group of this file's types on 512-bit vectors (see [`entry_points`]).
#[inline(always)]
unsafe fn whole_group(ty: QuantType, g: *const u8, nb: usize, acts: &[Q8Row], out: &mut [f32], stream: bool) {
    for (acts, out, stream) in passes(acts, out, stream) {
        // SAFETY: the caller's.
        unsafe { by_stream!(stream, |S| by_type_and_n!(ty, acts, |T, N, x| whole::<T, N, S>(g, nb, x, out))) }
    }
}

/// The four entry points of one family of group kernels, `$row` its activation rows: the file
/// that invokes it defines `halves::<D>` (256-bit, both 8-row halves) and `whole_group`
/// (512-bit) with the same arguments.
macro_rules! entry_points {
    ($row:ty) => {
        /// A group on AVX2.
        ///
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C; `g` holds `nb` group blocks of `ty`, each of
        /// `acts` `nb` blocks, `out` `16 * acts.len()` f32, and `acts.len()` is 1 to
        /// [`MAX_ACTS`](crate::quant::interleaved::MAX_ACTS). `stream`:
        /// ask for the group's bytes ahead of their use (it is read from memory).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn group_avx2(
            ty: QuantType,
            g: *const u8,
            nb: usize,
            acts: &[$row],
            out: &mut [f32],
            stream: bool,
        ) {
            unsafe { halves::<$crate::quant::interleaved_x86::Avx2>(ty, g, nb, acts, out, stream) }
        }

        /// [`group_avx2`] with AVX-VNNI's products.
        ///
        /// # Safety
        /// As [`group_avx2`], and the CPU must support AVX-VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub(crate) unsafe fn group_avxvnni(
            ty: QuantType,
            g: *const u8,
            nb: usize,
            acts: &[$row],
            out: &mut [f32],
            stream: bool,
        ) {
            unsafe { halves::<$crate::quant::interleaved_x86::AvxVnni>(ty, g, nb, acts, out, stream) }
        }

        /// [`group_avx2`] with AVX-512 VNNI's 256-bit products.
        ///
        /// # Safety
        /// As [`group_avx2`], and the CPU must support AVX-512 VNNI and VL.
        #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
        pub(crate) unsafe fn group_avx512vnni_256(
            ty: QuantType,
            g: *const u8,
            nb: usize,
            acts: &[$row],
            out: &mut [f32],
            stream: bool,
        ) {
            unsafe { halves::<$crate::quant::interleaved_x86::Avx512Vnni>(ty, g, nb, acts, out, stream) }
        }

        /// A group on 512-bit vectors.
        ///
        /// # Safety
        /// As [`group_avx2`], and the CPU must support AVX-512 F, BW and VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
        pub(crate) unsafe fn group_avx512(
            ty: QuantType,
            g: *const u8,
            nb: usize,
            acts: &[$row],
            out: &mut [f32],
            stream: bool,
        ) {
            unsafe { whole_group(ty, g, nb, acts, out, stream) }
        }
    };
}
pub(crate) use entry_points;

entry_points!(Q8Row);
