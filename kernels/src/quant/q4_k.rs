//! Q4_K weights (ggml's `block_q4_K`): per 256 values an f16 scale `d` and minimum scale
//! `dmin`, eight sub-blocks of 32 with 6-bit scales and minimums, and 4-bit values, standing
//! for `d * sc_s * q - dmin * m_s`.
//!
//! Against Q8_K activations one block contributes
//! `d * dx * Σ_s sc_s * (Σ q * x) - dmin * dx * Σ_s m_s * (Σ x)`: both sums are exact integers
//! (the second from the activations' sums of 16), folded into the f32 accumulator with two
//! fused multiply-adds in the same order by every kernel.
//!
//! Rows are interleaved in groups of eight (as the Q8_0 matrix does), so that a vector lane
//! is an output row: the AVX2 kernel never sums across lanes, and one broadcast of four
//! activation bytes meets eight rows.

use half::f16;

use super::Q8Kernel;
use super::kquant::{self, DotOut, KMatrix, MAX_ROWS, Q8KRows, QK_K};
use crate::KernelError;

/// Bytes per GGML Q4_K block: `d`, `dmin` (f16), 12 bytes of packed scales, 128 of values.
pub const Q4_K_BLOCK_BYTES: usize = 4 + 12 + QK_K / 2;

/// Rows interleaved in one group.
const ROWS: usize = 8;

/// One block of a group of eight rows, scales unpacked, values still four bits.
#[derive(Clone, PartialEq)]
struct GroupBlock {
    d: [f32; ROWS],
    dmin: [f32; ROWS],
    /// Per sub-block `s`: lanes `2r` and `2r + 1` hold row `r`'s scale (one `madd` operand).
    scales: [[i16; 2 * ROWS]; 8],
    /// Per pair of sub-blocks `t`: lane `2r` holds row `r`'s minimum of sub-block `2t`,
    /// lane `2r + 1` that of `2t + 1`.
    mins: [[i16; 2 * ROWS]; 4],
    /// Per sub-block `s` and chunk `h` of 8 values, 32 bytes at `(4s + h) * 32`: byte
    /// `4r + i` holds row `r`'s value `32s + 8h + i` (low nibble) and `32s + 8h + 4 + i` (high).
    qs: [u8; ROWS * QK_K / 2],
}

/// A weight matrix `[n_out, k]` in Q4_K, for `x @ W^T` (`k` a multiple of 256).
#[derive(Clone, PartialEq)]
pub struct Q4KMatrix {
    n_out: usize,
    k: usize,
    /// `[group][block]`; the last group is padded with zero rows.
    blocks: Vec<GroupBlock>,
}

/// Sub-block `j`'s 6-bit scale and minimum from ggml's 12 packed bytes (`get_scale_min_k4`).
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Value `j` (`0..256`) of a GGML block's 128 value bytes.
fn ggml_value(qs: &[u8], j: usize) -> u8 {
    (qs[32 * (j / 64) + j % 32] >> (4 * ((j / 32) % 2))) & 0xF
}

impl GroupBlock {
    fn zero() -> Self {
        GroupBlock {
            d: [0.0; ROWS],
            dmin: [0.0; ROWS],
            scales: [[0; 2 * ROWS]; 8],
            mins: [[0; 2 * ROWS]; 4],
            qs: [0; ROWS * QK_K / 2],
        }
    }

    /// Puts one GGML block in as row `r`.
    fn set_row(&mut self, r: usize, b: &[u8]) {
        self.d[r] = f16::from_le_bytes([b[0], b[1]]).to_f32();
        self.dmin[r] = f16::from_le_bytes([b[2], b[3]]).to_f32();
        for s in 0..8 {
            let (sc, m) = scale_min(s, &b[4..16]);
            self.scales[s][2 * r] = sc as i16;
            self.scales[s][2 * r + 1] = sc as i16;
            self.mins[s / 2][2 * r + s % 2] = m as i16;
        }
        let qs = &b[16..];
        for s in 0..8 {
            for h in 0..4 {
                for i in 0..4 {
                    let j = 32 * s + 8 * h + i;
                    self.qs[(4 * s + h) * 32 + 4 * r + i] = ggml_value(qs, j) | (ggml_value(qs, j + 4) << 4);
                }
            }
        }
    }

    /// Row `r`'s value `j`.
    fn value(&self, r: usize, j: usize) -> u8 {
        let (s, h, i) = (j / 32, (j % 32) / 8, j % 8);
        (self.qs[(4 * s + h) * 32 + 4 * r + i % 4] >> (4 * (i / 4))) & 0xF
    }

    fn scale(&self, r: usize, s: usize) -> i32 {
        self.scales[s][2 * r] as i32
    }

    fn min(&self, r: usize, s: usize) -> i32 {
        self.mins[s / 2][2 * r + s % 2] as i32
    }
}

impl Q4KMatrix {
    /// Reads GGML Q4_K blocks (`n_out * k / 256` blocks of 144 bytes, row after row), as in a
    /// GGUF file or candle's `QTensor::data()`.
    pub fn from_ggml_bytes(n_out: usize, k: usize, bytes: &[u8]) -> Result<Self, KernelError> {
        let nb = kquant::check_ggml("Q4_K bytes", n_out, k, Q4_K_BLOCK_BYTES, bytes)?;
        let mut blocks = vec![GroupBlock::zero(); n_out.div_ceil(ROWS) * nb];
        for (row, row_bytes) in bytes.chunks_exact(nb * Q4_K_BLOCK_BYTES).enumerate() {
            for (b, block) in row_bytes.chunks_exact(Q4_K_BLOCK_BYTES).enumerate() {
                blocks[(row / ROWS) * nb + b].set_row(row % ROWS, block);
            }
        }
        Ok(Q4KMatrix { n_out, k, blocks })
    }

    /// Output rows.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The f32 matrix the blocks stand for, row-major `[n_out, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        super::dequantize_rows(self.n_out, self.k, |row, out| self.dequantize_row(row, out))
    }

    /// Row `row` of the matrix in f32, into `out` (`k` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        super::check_row(self.n_out, self.k, row, out)?;
        let (nb, g, r) = (self.k / QK_K, row / ROWS, row % ROWS);
        for (gb, out) in self.blocks[g * nb..(g + 1) * nb].iter().zip(out.chunks_exact_mut(QK_K)) {
            for (j, out) in out.iter_mut().enumerate() {
                let s = j / 32;
                *out = gb.d[r] * gb.scale(r, s) as f32 * gb.value(r, j) as f32 - gb.dmin[r] * gb.min(r, s) as f32;
            }
        }
        Ok(())
    }

    /// `out = x @ W^T`: `x` row-major `[m, k]`, `out` `[m, n_out]`, on the current rayon pool
    /// with the fastest kernel this CPU has.
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        kquant::matmul(self, x, out, Q8Kernel::Auto)
    }

    /// [`matmul`](Self::matmul) with a chosen kernel (an error if this CPU lacks it; `Vnni`
    /// runs the AVX2 path).
    pub fn matmul_with(&self, x: &[f32], out: &mut [f32], kernel: Q8Kernel) -> Result<(), KernelError> {
        kquant::matmul(self, x, out, kernel)
    }

    /// `out = x @ W^T` for activations already quantized (so several matrices sharing an
    /// input quantize it once).
    pub fn matmul_quantized(&self, x: &Q8KRows, out: &mut [f32], kernel: Q8Kernel) -> Result<(), KernelError> {
        kquant::matmul_quantized(self, x, out, kernel)
    }
}

impl KMatrix for Q4KMatrix {
    const ROWS: usize = ROWS;

    fn n_out(&self) -> usize {
        self.n_out
    }

    fn k(&self) -> usize {
        self.k
    }

    fn row_bytes(&self) -> usize {
        self.k / QK_K * std::mem::size_of::<GroupBlock>() / ROWS
    }

    fn dot(&self, group: usize, x: &Q8KRows, xrow: usize, n: usize, avx2: bool) -> DotOut {
        let nb = self.k / QK_K;
        let blocks = &self.blocks[group * nb..(group + 1) * nb];
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY (all four): `avx2` is only true where the CPU supports AVX2 and FMA.
            return kquant::dispatch(
                n,
                || unsafe { dot_avx2::<1>(blocks, x, xrow) },
                || unsafe { dot_avx2::<2>(blocks, x, xrow) },
                || unsafe { dot_avx2::<3>(blocks, x, xrow) },
                || unsafe { dot_avx2::<4>(blocks, x, xrow) },
            );
        }
        let _ = avx2;
        std::array::from_fn(|i| if i < n { dot_scalar(blocks, x, xrow + i) } else { [0.0; MAX_ROWS] })
    }
}

/// Sums of each pair of 16 activations: the sum of each 32-value sub-block.
#[inline(always)]
fn sub_block_sums(bsums: &[i16]) -> [i16; 8] {
    // At most 32 * 127 in size, so i16 holds it.
    std::array::from_fn(|s| bsums[2 * s] + bsums[2 * s + 1])
}

fn dot_scalar(blocks: &[GroupBlock], x: &Q8KRows, xrow: usize) -> [f32; MAX_ROWS] {
    let mut acc = [0.0f32; MAX_ROWS];
    for (b, gb) in blocks.iter().enumerate() {
        let (xq, dx, bsums) = x.block(xrow, b);
        let sums = sub_block_sums(bsums);
        for (r, acc) in acc.iter_mut().enumerate() {
            let (mut isum, mut imin) = (0i32, 0i32);
            for s in 0..8 {
                let d: i32 = (0..32).map(|l| gb.value(r, 32 * s + l) as i32 * xq[32 * s + l] as i32).sum();
                isum += gb.scale(r, s) * d;
                imin += gb.min(r, s) * sums[s] as i32;
            }
            let a = (gb.d[r] * dx).mul_add(isum as f32, *acc);
            *acc = (-(gb.dmin[r] * dx)).mul_add(imin as f32, a);
        }
    }
    acc
}

/// The AVX2 kernel for one group of eight rows and `N` activation rows: lanes are rows;
/// `maddubs` of the 4-bit values with broadcast activations, summed as i16 over a sub-block,
/// then `madd` with the rows' scales into exact 32-bit sums.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<const N: usize>(blocks: &[GroupBlock], x: &Q8KRows, xrow: usize) -> [[f32; MAX_ROWS]; N] {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, gb) in blocks.iter().enumerate() {
        let xb: [(&[i8], f32, &[i16]); N] = std::array::from_fn(|n| x.block(xrow + n, b));
        let mut isum = [_mm256_setzero_si256(); N];
        for s in 0..8 {
            let mut p16 = [_mm256_setzero_si256(); N];
            for h in 0..4 {
                // SAFETY: `(4s + h) * 32 + 32 <= 1024 = qs.len()`.
                let w = unsafe { _mm256_loadu_si256(gb.qs.as_ptr().add((4 * s + h) * 32).cast()) };
                let lo = _mm256_and_si256(w, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
                for n in 0..N {
                    // SAFETY: `32s + 8h + 8 <= 256`, the length of a block of activations.
                    let (xl, xh) = unsafe {
                        let p = xb[n].0.as_ptr().add(32 * s + 8 * h).cast::<i32>();
                        (p.read_unaligned(), p.add(1).read_unaligned())
                    };
                    // Each `maddubs` lane is at most 2 * 15 * 127, and eight are summed per
                    // sub-block: at most 30480, inside i16.
                    let pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl));
                    let ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh));
                    p16[n] = _mm256_add_epi16(p16[n], _mm256_add_epi16(pl, ph));
                }
            }
            // SAFETY: `scales[s]` holds 16 i16.
            let sc = unsafe { _mm256_loadu_si256(gb.scales[s].as_ptr().cast()) };
            for n in 0..N {
                isum[n] = _mm256_add_epi32(isum[n], _mm256_madd_epi16(p16[n], sc));
            }
        }
        // SAFETY: `d` and `dmin` hold 8 f32.
        let (d, dmin) = unsafe { (_mm256_loadu_ps(gb.d.as_ptr()), _mm256_loadu_ps(gb.dmin.as_ptr())) };
        for n in 0..N {
            let sums = sub_block_sums(xb[n].2);
            let mut imin = _mm256_setzero_si256();
            for t in 0..4 {
                let pair = (sums[2 * t] as u16 as i32) | ((sums[2 * t + 1] as i32) << 16);
                // SAFETY: `mins[t]` holds 16 i16.
                let m = unsafe { _mm256_loadu_si256(gb.mins[t].as_ptr().cast()) };
                imin = _mm256_add_epi32(imin, _mm256_madd_epi16(m, _mm256_set1_epi32(pair)));
            }
            let dx = _mm256_set1_ps(xb[n].1);
            // The same two roundings per lane as the scalar kernel's `mul_add`s.
            let a = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[n]), acc[n]);
            acc[n] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(imin), a);
        }
    }
    let mut out = [[0.0f32; MAX_ROWS]; N];
    for n in 0..N {
        // SAFETY: `out[n]` holds 8 f32.
        unsafe { _mm256_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
    out
}

impl std::fmt::Debug for Q4KMatrix {
    // The values would be megabytes of output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q4KMatrix").field("n_out", &self.n_out).field("k", &self.k).finish_non_exhaustive()
    }
}
