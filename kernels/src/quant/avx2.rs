//! The AVX2 + FMA micro-kernel (x86_64), after llama.cpp's Q8_0 dot product: `maddubs` of
//! the weights' magnitudes with the activations carrying the weights' signs, then `madd`
//! into 32-bit sums, which are exact.

use std::arch::x86_64::*;

use super::QK8_0;
use super::matrix::{GROUP_BLOCK, ROWS};

/// See [`super::scalar::tile`]; same arguments, same result bit for bit.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // `b` and `n` index several arrays in step
pub(crate) unsafe fn tile<const N: usize>(wq: &[i8], ws: &[f32], xq: [&[i8]; N], xs: [&[f32]; N]) -> [[f32; ROWS]; N] {
    let nb = ws.len() / ROWS;
    // The loads below read these ranges only.
    assert!(wq.len() >= nb * GROUP_BLOCK);
    for n in 0..N {
        assert!(xq[n].len() >= nb * QK8_0 && xs[n].len() >= nb);
    }
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let mut sums = [_mm256_setzero_si256(); N];
        for c in 0..QK8_0 / 4 {
            // SAFETY: `b * GROUP_BLOCK + c * 32 + 32 <= nb * GROUP_BLOCK <= wq.len()`.
            let w = unsafe { _mm256_loadu_si256(wq.as_ptr().add(b * GROUP_BLOCK + c * QK8_0).cast()) };
            let w_abs = _mm256_abs_epi8(w);
            for n in 0..N {
                // SAFETY: `b * 32 + c * 4 + 4 <= nb * 32 <= xq[n].len()`.
                let four = unsafe { xq[n].as_ptr().add(b * QK8_0 + c * 4).cast::<i32>().read_unaligned() };
                // Activations are in -127..=127, so negating them never overflows, and each
                // pair of products is at most 2 * 128 * 127 < i16::MAX: `maddubs` never
                // saturates and the sums are exact.
                let x_signed = _mm256_sign_epi8(_mm256_set1_epi32(four), w);
                let pairs = _mm256_maddubs_epi16(w_abs, x_signed);
                sums[n] = _mm256_add_epi32(sums[n], _mm256_madd_epi16(pairs, ones));
            }
        }
        // SAFETY: `b * ROWS + ROWS <= ws.len()`.
        let dw = unsafe { _mm256_loadu_ps(ws.as_ptr().add(b * ROWS)) };
        for n in 0..N {
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(xs[n][b]));
            acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[n]), d, acc[n]);
        }
    }
    let mut out = [[0.0f32; ROWS]; N];
    for n in 0..N {
        // SAFETY: `out[n]` holds 8 f32.
        unsafe { _mm256_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
    out
}
