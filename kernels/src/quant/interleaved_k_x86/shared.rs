//! What the 256-bit and 512-bit K-quant group kernels share: the type tags, the prefetch
//! distance, and the unpacking of scales and Q6_K's high bits.

use std::arch::x86_64::*;

use crate::quant::blocks::QuantType;

/// How many group blocks ahead the first half asks for the bytes it will read. Asked for one
/// 128-byte run per chunk step, spread over the block, rather than a whole block at its start:
/// on an AVX2 EPYC the spread kept the single-thread Q6_K head (1024 → 151,936, one row) at
/// 8.4 ms against 12 ms without prefetch, where whole-block requests gained nothing.
pub(super) const PREFETCH_BLOCKS: usize = 2;

/// Type tags for const generics.
pub(super) const Q4_K: u8 = 0;
pub(super) const Q5_K: u8 = 1;
pub(super) const Q6_K: u8 = 2;

/// The types in tag order.
pub(super) const TYPES: [QuantType; 3] = [QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K];

/// Sub-block `j`'s 6-bit scales and minimums of sixteen rows (Q4_K, Q5_K), from the transposed
/// packed bytes at `s` (llama.cpp's `get_scale_min_k4`, sixteen rows at a time).
#[inline(always)]
pub(super) unsafe fn scale_min(s: *const u8, j: usize) -> (__m128i, __m128i) {
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

/// Q6_K's two high bits of `qh` placed at bits 4 and 5 of each byte, for a chunk whose values
/// lie in the first (`low`) or second 32 of their half, low nibbles and high nibbles.
macro_rules! q6_high {
    ($slli:ident, $srli:ident, $qh:expr, $second:expr) => {{
        let qh = $qh;
        if $second { ($slli::<2>(qh), $srli::<2>(qh)) } else { ($slli::<4>(qh), qh) }
    }};
}

pub(super) use q6_high;
