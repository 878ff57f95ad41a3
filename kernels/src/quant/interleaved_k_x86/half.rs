//! The 256-bit kernel (AVX2, AVX-VNNI, AVX-512 VNNI on 256 bits): a group in two halves of
//! eight rows, block by block, at most four activation rows per pass.

use std::arch::x86_64::*;
use std::ops::Range;

use super::shared::{PREFETCH_BLOCKS, Q4_K, Q5_K, Q6_K, TYPES, q6_high, scale_min};
use crate::quant::acts::Q8KRow;
use crate::quant::avx2::fifth_bits;
use crate::quant::blocks::{QK_K, QuantType};
use crate::quant::interleaved::GROUP_ROWS;
use crate::quant::interleaved_k::{PartsK, parts_k};
use crate::quant::interleaved_x86::{Dot, PASS_ROWS, by_stream, four, passes, prefetch};

/// A 32-bit lane's value (a scale in `-128..=127`) in both of its 16-bit halves, for `madd`.
#[inline(always)]
unsafe fn pair16(v: __m256i) -> __m256i {
    unsafe { _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32::<16>(v)) }
}

/// Group blocks whose scales [`halves`] decodes once for all of a call's activation rows.
const SPAN_BLOCKS: usize = 4;

/// Where [`half`] finds a group block's scales, for half `h` (rows `8h..8h + 8`), one row per
/// 32-bit lane: decoded from the block as it goes ([`InBlock`], for one to four activation
/// rows), or from a [`Decoded`] copy shared by more.
trait Scales {
    /// Sub-block `j`'s scale (Q4_K, Q5_K: 8 sub-blocks of 32 values; Q6_K: 16 of 16): the
    /// 16-bit pair `(sc, sc)` where [`Dot::WIDEN_LATE`] (for `madd` with 16-bit sums), else i32.
    unsafe fn sc<D: Dot, const T: u8>(&self, h: usize, j: usize) -> __m256i;
    /// The 16-bit pair of sub-blocks `2t` and `2t + 1` that multiplies the activation's sums
    /// ([`paired`]): Q4_K, Q5_K the minimums (`t < 4`), Q6_K the scales (`t < 8`).
    unsafe fn pair<const T: u8>(&self, h: usize, t: usize) -> __m256i;
    /// `d` in f32.
    unsafe fn d(&self, h: usize) -> __m256;
    /// `dmin` in f32 (Q4_K, Q5_K).
    unsafe fn dmin(&self, h: usize) -> __m256;
}

/// The scales read from the group block at `.0` as they are used.
#[derive(Clone, Copy)]
struct InBlock(*const u8);

impl InBlock {
    /// Sixteen rows' bytes at `at` from the block.
    #[inline(always)]
    unsafe fn bytes(self, at: usize) -> __m128i {
        // SAFETY (callers): `at + 16` lies inside the block.
        unsafe { _mm_loadu_si128(self.0.add(at) as *const __m128i) }
    }

    /// Sub-block `j`'s sixteen scales and minimums (Q4_K, Q5_K).
    #[inline(always)]
    unsafe fn scale_min<const T: u8>(self, j: usize) -> (__m128i, __m128i) {
        // SAFETY (callers): as for `bytes`.
        unsafe { scale_min(self.0.add(parts_k(TYPES[T as usize]).scales), j) }
    }
}

/// Half `h`'s eight bytes of sixteen rows' `v`, in the low half.
#[inline(always)]
unsafe fn rows_of_half(v: __m128i, h: usize) -> __m128i {
    unsafe { if h == 0 { v } else { _mm_srli_si128::<8>(v) } }
}

impl Scales for InBlock {
    #[inline(always)]
    unsafe fn sc<D: Dot, const T: u8>(&self, h: usize, j: usize) -> __m256i {
        // SAFETY (callers): `self.0` is a whole group block of the type.
        unsafe {
            let v = if T == Q6_K {
                let at = parts_k(QuantType::Q6_K).scales + 16 * j;
                _mm256_cvtepi8_epi32(rows_of_half(self.bytes(at), h))
            } else {
                _mm256_cvtepu8_epi32(rows_of_half(self.scale_min::<T>(j).0, h))
            };
            if D::WIDEN_LATE { pair16(v) } else { v }
        }
    }

    #[inline(always)]
    unsafe fn pair<const T: u8>(&self, h: usize, t: usize) -> __m256i {
        // SAFETY: as for `sc`.
        unsafe {
            let (a, b) = if T == Q6_K {
                let at = parts_k(QuantType::Q6_K).scales + 32 * t;
                (self.bytes(at), self.bytes(at + 16))
            } else {
                (self.scale_min::<T>(2 * t).1, self.scale_min::<T>(2 * t + 1).1)
            };
            let (lo, hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
            let v = if h == 0 { lo } else { hi };
            if T == Q6_K { _mm256_cvtepi8_epi16(v) } else { _mm256_cvtepu8_epi16(v) }
        }
    }

    #[inline(always)]
    unsafe fn d(&self, h: usize) -> __m256 {
        unsafe { _mm256_cvtph_ps(self.bytes(16 * h)) }
    }

    #[inline(always)]
    unsafe fn dmin(&self, h: usize) -> __m256 {
        unsafe { _mm256_cvtph_ps(self.bytes(32 + 16 * h)) }
    }
}

/// One group block's scales, decoded for both halves as [`Scales`] gives them.
#[derive(Clone, Copy)]
struct Decoded {
    sc: [[__m256i; 16]; 2],
    pairs: [[__m256i; 8]; 2],
    d: [__m256; 2],
    dmin: [__m256; 2],
}

impl Decoded {
    /// Decodes group block `gb` of type tag `T` into `self`.
    #[inline(always)]
    unsafe fn decode<D: Dot, const T: u8>(&mut self, gb: *const u8) {
        let from = InBlock(gb);
        let (subs, pairs) = if T == Q6_K { (16, 8) } else { (8, 4) };
        // SAFETY (callers): `gb` is a whole group block of the type.
        unsafe {
            for h in 0..2 {
                for j in 0..subs {
                    self.sc[h][j] = from.sc::<D, T>(h, j);
                }
                for t in 0..pairs {
                    self.pairs[h][t] = from.pair::<T>(h, t);
                }
                self.d[h] = from.d(h);
                if T != Q6_K {
                    self.dmin[h] = from.dmin(h);
                }
            }
        }
    }
}

impl Scales for &Decoded {
    #[inline(always)]
    unsafe fn sc<D: Dot, const T: u8>(&self, h: usize, j: usize) -> __m256i {
        self.sc[h][j]
    }

    #[inline(always)]
    unsafe fn pair<const T: u8>(&self, h: usize, t: usize) -> __m256i {
        self.pairs[h][t]
    }

    #[inline(always)]
    unsafe fn d(&self, h: usize) -> __m256 {
        self.d[h]
    }

    #[inline(always)]
    unsafe fn dmin(&self, h: usize) -> __m256 {
        self.dmin[h]
    }
}

/// `Σ_t madd(pair t, sums t)` over half `h`'s pairs ([`Scales::pair`]) and the activation's
/// sums in super-block `b`, two per 32-bit lane as i16: Q6_K those of 16-value sub-blocks `2t`,
/// `2t + 1` (`t < 8`, the stored offset's part), Q4_K and Q5_K those of 32-value sub-blocks
/// `2t`, `2t + 1` (`t < 4`, the minimums' part, each within 32 * 128). Exact in 32 bits.
#[inline(always)]
unsafe fn paired<S: Scales, const T: u8>(sc: &S, h: usize, x: &Q8KRow, b: usize) -> __m256i {
    // SAFETY: `tile` checked `x` for 16 sums per super-block, and `b` is one of its blocks.
    unsafe {
        let sums = x.bsums.as_ptr().add(16 * b);
        let mut total = _mm256_setzero_si256();
        if T == Q6_K {
            for t in 0..8 {
                let pair = _mm256_set1_epi32((sums.add(2 * t) as *const i32).read_unaligned());
                total = _mm256_add_epi32(total, _mm256_madd_epi16(sc.pair::<T>(h, t), pair));
            }
        } else {
            // The 32-value sums B0..B7 as i16, [B0..B3 twice | B4..B7 twice]: pair t is lane
            // 0, 1, 4 or 5 (the sums fit, so `packs` saturates nothing).
            let b32 = _mm256_madd_epi16(_mm256_loadu_si256(sums as *const __m256i), _mm256_set1_epi16(1));
            let b16 = _mm256_packs_epi32(b32, b32);
            for (t, lane) in [0, 1, 4, 5].into_iter().enumerate() {
                let pair = _mm256_permutevar8x32_epi32(b16, _mm256_set1_epi32(lane));
                total = _mm256_add_epi32(total, _mm256_madd_epi16(sc.pair::<T>(h, t), pair));
            }
        }
        total
    }
}

/// Rows `8h..8h + 8` of a group against `N` (at most 4) Q8_K rows over group block `b` (at
/// `gb`, its scales from `sc`): `out[n * 16 + 8h + r]` goes on from the sums of blocks before `b`; the
/// first half asks for the blocks ahead where `STREAM`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `n` indexes several arrays in step
unsafe fn half<D: Dot, S: Scales, const T: u8, const N: usize, const STREAM: bool>(
    gb: *const u8,
    b: usize,
    h: usize,
    sc: S,
    x: &[Q8KRow; N],
    out: &mut [f32],
) {
    let p: PartsK = parts_k(TYPES[T as usize]);
    // Stored and reloaded f32 are exact, so the result is one pass's over all blocks.
    // SAFETY: registers of zeros, or `N * 16` f32 of `out`.
    let mut acc: [__m256; N] = std::array::from_fn(|n| unsafe {
        if b == 0 { _mm256_setzero_ps() } else { _mm256_loadu_ps(out[n * GROUP_ROWS + 8 * h..].as_ptr()) }
    });
    // The first half's `j`-th chunk step asks for bytes `128 j..128 (j + 1)` of the block
    // `PREFETCH_BLOCKS` on; 32 steps cover every type's block.
    let prefetch_ahead = |j: usize| {
        if STREAM && h == 0 && 128 * j < p.bytes {
            prefetch(gb.wrapping_add(PREFETCH_BLOCKS * p.bytes + 128 * j), 128);
        }
    };
    // SAFETY: `tile` checked the group for `nb` group blocks and every activation row for `nb`
    // super-blocks, and `b < nb`; every offset below lies inside block `b` of each.
    unsafe {
        let bx = |n: usize, j: usize| _mm256_set1_epi32(four(x[n].qs, b * QK_K + j));
        let chunk = |at: usize, i: usize| _mm256_loadu_si256(gb.add(at + 64 * i + 32 * h) as *const __m256i);
        let low4 = _mm256_set1_epi8(0x0F);
        let mut isum = [_mm256_setzero_si256(); N];
        if T == Q6_K {
            let bits45 = _mm256_set1_epi8(0x30);
            for hv in 0..2 {
                for kk in 0..4 {
                    let subs = [8 * hv + kk, 8 * hv + kk + 4];
                    let mut t = [[_mm256_setzero_si256(); 2]; N];
                    for k in 4 * kk..4 * kk + 4 {
                        let l0 = 4 * k;
                        prefetch_ahead(16 * hv + k);
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
                                    let scaled = _mm256_madd_epi16(t[n][side], sc.sc::<D, T>(h, subs[side]));
                                    isum[n] = _mm256_add_epi32(isum[n], scaled);
                                    t[n][side] = _mm256_setzero_si256();
                                }
                            }
                        }
                    }
                    if !D::WIDEN_LATE {
                        for n in 0..N {
                            for side in 0..2 {
                                isum[n] = _mm256_add_epi32(
                                    isum[n],
                                    _mm256_mullo_epi32(t[n][side], sc.sc::<D, T>(h, subs[side])),
                                );
                            }
                        }
                    }
                }
            }
            for n in 0..N {
                // The values are stored plus 32: take 32 Σ sc x back off.
                isum[n] = _mm256_sub_epi32(isum[n], _mm256_slli_epi32::<5>(paired::<S, T>(&sc, h, &x[n], b)));
                let dx = _mm256_set1_ps(x[n].d[b]);
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[n]), _mm256_mul_ps(sc.d(h), dx), acc[n]);
            }
        } else {
            // 16-bit sums hold eight chunks of 4-bit values, four of 5-bit ones.
            let flush_every = if T == Q5_K { 4 } else { 8 };
            for c in 0..4 {
                let mut t = [[_mm256_setzero_si256(); 2]; N];
                for i in 8 * c..8 * c + 8 {
                    prefetch_ahead(i);
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
                                isum[n] = _mm256_add_epi32(
                                    isum[n],
                                    _mm256_madd_epi16(t[n][side], sc.sc::<D, T>(h, 2 * c + side)),
                                );
                                t[n][side] = _mm256_setzero_si256();
                            }
                        }
                    }
                }
                if !D::WIDEN_LATE {
                    for n in 0..N {
                        let lo = _mm256_mullo_epi32(t[n][0], sc.sc::<D, T>(h, 2 * c));
                        let both = _mm256_add_epi32(lo, _mm256_mullo_epi32(t[n][1], sc.sc::<D, T>(h, 2 * c + 1)));
                        isum[n] = _mm256_add_epi32(isum[n], both);
                    }
                }
            }
            for n in 0..N {
                let msum = paired::<S, T>(&sc, h, &x[n], b);
                let dx = _mm256_set1_ps(x[n].d[b]);
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[n]), _mm256_mul_ps(sc.d(h), dx), acc[n]);
                let neg = _mm256_xor_ps(_mm256_mul_ps(sc.dmin(h), dx), _mm256_set1_ps(-0.0));
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), neg, acc[n]);
            }
        }
    }
    for n in 0..N {
        // SAFETY: `out` holds `N * 16` f32.
        unsafe { _mm256_storeu_ps(out[n * GROUP_ROWS + 8 * h..].as_mut_ptr(), acc[n]) };
    }
}

/// One group on 256-bit vectors with `D`'s products: block by block, both halves, at most
/// four activation rows at a time (more would not fit the sixteen registers). Up to four rows
/// (decode) read the scales from the block as they go; more share a span of blocks' scales
/// decoded once, which would cost the single row's memory-bound pass a quarter of its speed.
#[inline(always)]
pub(super) unsafe fn halves<D: Dot>(
    ty: QuantType,
    g: *const u8,
    nb: usize,
    acts: &[Q8KRow],
    out: &mut [f32],
    stream: bool,
) {
    match ty {
        // SAFETY: the caller's.
        QuantType::Q4_K => unsafe { halves_of::<D, Q4_K>(g, nb, acts, out, stream) },
        QuantType::Q5_K => unsafe { halves_of::<D, Q5_K>(g, nb, acts, out, stream) },
        QuantType::Q6_K => unsafe { halves_of::<D, Q6_K>(g, nb, acts, out, stream) },
        ty => unreachable!("{ty:?} is not a K-quant"),
    }
}

/// Runs `$call` with const `$n` = `$x.len()` (1 to 4) and const `$s` = `$stream`.
macro_rules! by_rows_and_stream {
    ($x:expr, $stream:expr, |$n:ident, $s:ident| $call:expr) => {
        by_stream!($stream, |$s| match $x.len() {
            1 => {
                const $n: usize = 1;
                $call
            }
            2 => {
                const $n: usize = 2;
                $call
            }
            3 => {
                const $n: usize = 3;
                $call
            }
            _ => {
                const $n: usize = 4;
                $call
            }
        })
    };
}

/// [`halves`] for type tag `T`.
#[inline(always)]
unsafe fn halves_of<D: Dot, const T: u8>(g: *const u8, nb: usize, acts: &[Q8KRow], out: &mut [f32], stream: bool) {
    let bytes = parts_k(TYPES[T as usize]).bytes;
    if acts.len() <= PASS_ROWS {
        // SAFETY: the caller's: block `b < nb` of the group.
        let in_block = |b: usize| InBlock(unsafe { g.add(b * bytes) });
        // SAFETY: the caller's.
        unsafe { by_rows_and_stream!(acts, stream, |N, S| blocks::<D, _, T, N, S>(g, 0..nb, in_block, acts, out)) };
        return;
    }
    // SAFETY: all-zero bits are valid vectors.
    let mut decoded: [Decoded; SPAN_BLOCKS] = unsafe { std::mem::zeroed() };
    for start in (0..nb).step_by(SPAN_BLOCKS) {
        let span = start..(start + SPAN_BLOCKS).min(nb);
        for (d, b) in decoded.iter_mut().zip(span.clone()) {
            // SAFETY: the caller's: block `b < nb` of the group.
            unsafe { d.decode::<D, T>(g.add(b * bytes)) };
        }
        let of = |b: usize| &decoded[b - start];
        // Only the first rows' pass reads the span from memory.
        for (x, out, stream) in passes(acts, out, stream) {
            // SAFETY: the caller's.
            unsafe { by_rows_and_stream!(x, stream, |N, S| blocks::<D, _, T, N, S>(g, span.clone(), of, x, out)) }
        }
    }
}

/// `N` activation rows over group blocks `bs`, block `b`'s scales from `scales(b)`.
#[inline(always)]
unsafe fn blocks<D: Dot, S: Scales, const T: u8, const N: usize, const STREAM: bool>(
    g: *const u8,
    bs: Range<usize>,
    scales: impl Fn(usize) -> S,
    x: &[Q8KRow],
    out: &mut [f32],
) {
    let x: &[Q8KRow; N] = x.try_into().expect("N activation rows");
    let bytes = parts_k(TYPES[T as usize]).bytes;
    for b in bs {
        // Both halves of each block before the next: the half that reads a 64-byte line
        // second finds it in L1, and the memory stream never waits on a pass that reads
        // nothing new (the vocabulary head at one row ran at 17 GB/s in two whole passes).
        // SAFETY: the caller's: block `b` lies in the group.
        unsafe {
            let gb = g.add(b * bytes);
            half::<D, S, T, N, STREAM>(gb, b, 0, scales(b), x, out);
            half::<D, S, T, N, STREAM>(gb, b, 1, scales(b), x, out);
        }
    }
}
