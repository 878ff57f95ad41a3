//! The AVX2 + FMA (+ F16C) dot products of `dense.rs`: one 8-lane accumulator per output, the
//! lanes summed and the tail added in the module's order, so every result is bitwise the
//! portable one. Tiles of up to 2 activation rows x 4 weight rows (or 1 x 8 for a single row)
//! only share loads; no output's arithmetic depends on its tile.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::LANES;

/// Loads eight weights as f32.
trait Load: Copy {
    /// # Safety
    /// `ptr` must point at eight readable values, and the CPU must have AVX2, FMA and F16C.
    unsafe fn load8(ptr: *const Self) -> __m256;
    fn to_f32(self) -> f32;
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load8(ptr: *const Self) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(ptr) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Load for f16 {
    #[inline(always)]
    unsafe fn load8(ptr: *const Self) -> __m256 {
        // SAFETY: the caller's contract; f16 is 16 bits, eight of them are 128.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(ptr.cast())) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Load for bf16 {
    #[inline(always)]
    unsafe fn load8(ptr: *const Self) -> __m256 {
        // SAFETY: the caller's contract. A bf16 is the high half of the f32 it stands for.
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(ptr.cast())), 16)) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// The lanes of `v` summed as `sum_lanes` does: `((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))`.
#[inline(always)]
unsafe fn sum_lanes(v: __m256) -> f32 {
    // SAFETY: register-only intrinsics of AVX (the caller's target features).
    unsafe {
        let half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
        _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)))
    }
}

/// Rows `x` (R of them, each `k` long) times weight rows `w` (C of them), into `out[r][c]`.
#[inline(always)]
unsafe fn tile<T: Load, const R: usize, const C: usize>(x: [&[f32]; R], w: [&[T]; C]) -> [[f32; C]; R] {
    let k = x[0].len();
    let whole = k / LANES * LANES;
    // SAFETY: every pointer read stays below `whole <= k`, the length of every row; the
    // caller's target features cover the intrinsics.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut i = 0;
        while i < whole {
            let wv: [__m256; C] = std::array::from_fn(|c| T::load8(w[c].as_ptr().add(i)));
            for r in 0..R {
                let xv = _mm256_loadu_ps(x[r].as_ptr().add(i));
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
                }
            }
            i += LANES;
        }
        let mut out = [[0.0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                let mut sum = sum_lanes(acc[r][c]);
                for j in whole..k {
                    sum = x[r][j].mul_add(w[c][j].to_f32(), sum);
                }
                out[r][c] = sum;
            }
        }
        out
    }
}

/// `out[j] = x · w[j]` for the rows of `w` (row-major, `x.len()` wide).
#[inline(always)]
unsafe fn rows<T: Load>(x: &[f32], w: &[T], out: &mut [f32]) {
    let k = x.len();
    let mut j = 0;
    let n = out.len();
    // SAFETY: the caller's target features; rows are sliced in bounds.
    unsafe {
        while j + 8 <= n {
            let ws: [&[T]; 8] = std::array::from_fn(|c| &w[(j + c) * k..(j + c + 1) * k]);
            out[j..j + 8].copy_from_slice(&tile::<T, 1, 8>([x], ws)[0]);
            j += 8;
        }
        while j < n {
            out[j] = tile::<T, 1, 1>([x], [&w[j * k..(j + 1) * k]])[0][0];
            j += 1;
        }
    }
}

/// [`rows`] for f32 weights.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` holds `out.len()` rows of `x.len()` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_f32(x: &[f32], w: &[f32], out: &mut [f32]) {
    // SAFETY: this function's own contract.
    unsafe { rows(x, w, out) }
}

/// [`rows`] for f16 weights.
///
/// # Safety
/// As [`rows_f32`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_f16(x: &[f32], w: &[f16], out: &mut [f32]) {
    // SAFETY: this function's own contract.
    unsafe { rows(x, w, out) }
}

/// [`rows`] for bf16 weights.
///
/// # Safety
/// As [`rows_f32`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_bf16(x: &[f32], w: &[bf16], out: &mut [f32]) {
    // SAFETY: this function's own contract.
    unsafe { rows(x, w, out) }
}
