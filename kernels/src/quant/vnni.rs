//! The VNNI micro-kernels (x86_64): one `vpdpbusd` multiplies four unsigned by four signed
//! bytes and adds them into a 32-bit lane, exactly, replacing the AVX2 kernel's sign /
//! `maddubs` / `madd` / add. It needs an unsigned operand, so the weights are offset by 128
//! (`w ^ 0x80` is `w + 128` as a byte) and `128 * sum(x)` of each activation block is
//! subtracted afterwards: the integer sums equal the other kernels' exactly, and so do the
//! results.
//!
//! Intrinsics rather than `asm!`: with `asm!` the compiler picks float-domain moves around it
//! and the kernel ran slower than the AVX2 one.

use std::arch::x86_64::*;

use crate::cpu;

use super::QK8_0;
use super::matrix::{GROUP_BLOCK, ROWS};

/// See [`super::scalar::tile`], plus each activation block's `128 * sum` (`xo`);
/// same result bit for bit.
///
/// # Safety
/// The CPU must support AVX2, FMA and a 256-bit VNNI encoding ([`cpu::has_vnni_256`]).
pub(crate) unsafe fn tile<const N: usize>(
    wq: &[i8],
    ws: &[f32],
    xq: [&[i8]; N],
    xs: [&[f32]; N],
    xo: [&[i32]; N],
) -> [[f32; ROWS]; N] {
    // SAFETY: each runs only where its encoding exists; AVX2 and FMA are the caller's.
    unsafe { if cpu::has_avxvnni() { tile_avxvnni(wq, ws, xq, xs, xo) } else { tile_avx512vnni(wq, ws, xq, xs, xo) } }
}

/// One kernel per encoding of `vpdpbusd`: the bodies are the same.
macro_rules! vnni_tile {
    ($name:ident, $features:literal, $dpbusd:ident) => {
        /// [`tile`] for one encoding.
        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop)] // `b` and `n` index several arrays in step
        unsafe fn $name<const N: usize>(
            wq: &[i8],
            ws: &[f32],
            xq: [&[i8]; N],
            xs: [&[f32]; N],
            xo: [&[i32]; N],
        ) -> [[f32; ROWS]; N] {
            let nb = ws.len() / ROWS;
            // The loads below read these ranges only.
            assert!(wq.len() >= nb * GROUP_BLOCK);
            for n in 0..N {
                assert!(xq[n].len() >= nb * QK8_0 && xs[n].len() >= nb && xo[n].len() >= nb);
            }
            let offset = _mm256_set1_epi8(i8::MIN);
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..nb {
                // Two chains of sums (even and odd chunks), so that a row's `vpdpbusd`s do
                // not all wait for each other; integer sums, so the split changes nothing.
                let mut sums = [[_mm256_setzero_si256(); N]; 2];
                for c in 0..QK8_0 / 4 {
                    // SAFETY: `b * GROUP_BLOCK + c * 32 + 32 <= nb * GROUP_BLOCK <= wq.len()`.
                    let w = unsafe { _mm256_loadu_si256(wq.as_ptr().add(b * GROUP_BLOCK + c * QK8_0).cast()) };
                    let w_unsigned = _mm256_xor_si256(w, offset);
                    for n in 0..N {
                        // SAFETY: `b * 32 + c * 4 + 4 <= nb * 32 <= xq[n].len()`.
                        let four = unsafe { xq[n].as_ptr().add(b * QK8_0 + c * 4).cast::<i32>().read_unaligned() };
                        sums[c % 2][n] = $dpbusd(sums[c % 2][n], w_unsigned, _mm256_set1_epi32(four));
                    }
                }
                // SAFETY: `b * ROWS + ROWS <= ws.len()`.
                let dw = unsafe { _mm256_loadu_ps(ws.as_ptr().add(b * ROWS)) };
                for n in 0..N {
                    let sum = _mm256_add_epi32(sums[0][n], sums[1][n]);
                    let exact = _mm256_sub_epi32(sum, _mm256_set1_epi32(xo[n][b]));
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(xs[n][b]));
                    acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), d, acc[n]);
                }
            }
            let mut out = [[0.0f32; ROWS]; N];
            for n in 0..N {
                // SAFETY: `out[n]` holds 8 f32.
                unsafe { _mm256_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
            }
            out
        }
    };
}

vnni_tile!(tile_avxvnni, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32);
vnni_tile!(tile_avx512vnni, "avx2,fma,avx512vnni,avx512vl", _mm256_dpbusd_epi32);
