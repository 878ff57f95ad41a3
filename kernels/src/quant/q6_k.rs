//! Q6_K weights (ggml's `block_q6_K`): per 256 values an f16 scale `d`, sixteen sub-blocks of
//! 16 with int8 scales, and 6-bit values `q` in `0..64` standing for `d * sc_s * (q - 32)`.
//!
//! The values are unpacked to one byte each at load (1.2x the bytes of the packed form) and
//! rows interleaved in groups of eight, so that a vector lane is an output row. Against Q8_K
//! activations one block contributes `d * dx * Σ_s sc_s * (Σ q * x - 32 * Σ x)`, an exact
//! integer (the offset term from the activations' sums of 16) folded into the f32
//! accumulator with one fused multiply-add by every kernel.

use half::f16;

use super::Q8Kernel;
use super::kquant::{self, DotOut, KMatrix, MAX_ROWS, Q8KRows, QK_K};
use crate::KernelError;

/// Bytes per GGML Q6_K block: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales,
/// then the f16 scale.
pub const Q6_K_BLOCK_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

/// Rows interleaved in one group.
const ROWS: usize = 8;

/// One block of a group of eight rows, values unpacked to `0..64`.
#[derive(Clone, PartialEq)]
struct GroupBlock {
    d: [f32; ROWS],
    /// Per sub-block `s`: lanes `2r` and `2r + 1` hold row `r`'s scale (one `madd` operand).
    scales: [[i16; 2 * ROWS]; 16],
    /// Per pair of sub-blocks `t`: lane `2r` holds row `r`'s scale of sub-block `2t`, lane
    /// `2r + 1` that of `2t + 1` (to meet the activations' sums of 16 in one `madd`).
    pairs: [[i16; 2 * ROWS]; 8],
    /// Per chunk `c` of four values, 32 bytes at `32c`: byte `4r + i` is row `r`'s value `4c + i`.
    q: [u8; ROWS * QK_K],
}

/// A weight matrix `[n_out, k]` in Q6_K, for `x @ W^T` (`k` a multiple of 256).
#[derive(Clone, PartialEq)]
pub struct Q6KMatrix {
    n_out: usize,
    k: usize,
    /// `[group][block]`; the last group is padded with zero rows.
    blocks: Vec<GroupBlock>,
}

impl GroupBlock {
    fn zero() -> Self {
        GroupBlock { d: [0.0; ROWS], scales: [[0; 2 * ROWS]; 16], pairs: [[0; 2 * ROWS]; 8], q: [0; ROWS * QK_K] }
    }

    /// Puts one GGML block in as row `r` (see ggml's `dequantize_row_q6_K` for the layout).
    fn set_row(&mut self, r: usize, b: &[u8]) {
        let (ql, rest) = b.split_at(QK_K / 2);
        let (qh, rest) = rest.split_at(QK_K / 4);
        let (sc, d) = rest.split_at(QK_K / 16);
        let mut q = [0u8; QK_K];
        for half in 0..2 {
            let (ql, qh, q) = (&ql[64 * half..], &qh[32 * half..], &mut q[128 * half..]);
            for l in 0..32 {
                q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        self.d[r] = f16::from_le_bytes([d[0], d[1]]).to_f32();
        for (s, &v) in sc.iter().enumerate() {
            let v = v as i8 as i16;
            self.scales[s][2 * r] = v;
            self.scales[s][2 * r + 1] = v;
            self.pairs[s / 2][2 * r + s % 2] = v;
        }
        for (j, &v) in q.iter().enumerate() {
            self.q[(j / 4) * 32 + 4 * r + j % 4] = v;
        }
    }

    /// Row `r`'s value `j`, in `0..64`.
    fn value(&self, r: usize, j: usize) -> u8 {
        self.q[(j / 4) * 32 + 4 * r + j % 4]
    }

    fn scale(&self, r: usize, s: usize) -> i32 {
        self.scales[s][2 * r] as i32
    }
}

impl Q6KMatrix {
    /// Reads GGML Q6_K blocks (`n_out * k / 256` blocks of 210 bytes, row after row), as in a
    /// GGUF file or candle's `QTensor::data()`.
    pub fn from_ggml_bytes(n_out: usize, k: usize, bytes: &[u8]) -> Result<Self, KernelError> {
        let nb = kquant::check_ggml("Q6_K bytes", n_out, k, Q6_K_BLOCK_BYTES, bytes)?;
        let mut blocks = vec![GroupBlock::zero(); n_out.div_ceil(ROWS) * nb];
        for (row, row_bytes) in bytes.chunks_exact(nb * Q6_K_BLOCK_BYTES).enumerate() {
            for (b, block) in row_bytes.chunks_exact(Q6_K_BLOCK_BYTES).enumerate() {
                blocks[(row / ROWS) * nb + b].set_row(row % ROWS, block);
            }
        }
        Ok(Q6KMatrix { n_out, k, blocks })
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

    /// Row `row` of the matrix in f32, into `out` (`k` values): a lookup in a quantized
    /// embedding table.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        super::check_row(self.n_out, self.k, row, out)?;
        let (nb, g, r) = (self.k / QK_K, row / ROWS, row % ROWS);
        for (gb, out) in self.blocks[g * nb..(g + 1) * nb].iter().zip(out.chunks_exact_mut(QK_K)) {
            for (j, out) in out.iter_mut().enumerate() {
                *out = gb.d[r] * gb.scale(r, j / 16) as f32 * (gb.value(r, j) as i32 - 32) as f32;
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

impl KMatrix for Q6KMatrix {
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

/// One block's exact sum for row `r` is `Σ_s sc_s * (Σ q * x) - 32 * Σ_s sc_s * (Σ x)`: at most
/// 16 * 128 * 16 * 63 * 127 plus 32 * 16 * 128 * 16 * 127 in size, well inside i32. It is
/// folded into the accumulator with one fused multiply-add, the same in every kernel.
fn dot_scalar(blocks: &[GroupBlock], x: &Q8KRows, xrow: usize) -> [f32; MAX_ROWS] {
    let mut acc = [0.0f32; MAX_ROWS];
    for (b, gb) in blocks.iter().enumerate() {
        let (xq, dx, bsums) = x.block(xrow, b);
        for (r, acc) in acc.iter_mut().enumerate() {
            let (mut isum, mut ioff) = (0i32, 0i32);
            for s in 0..16 {
                let d: i32 = (0..16).map(|l| gb.value(r, 16 * s + l) as i32 * xq[16 * s + l] as i32).sum();
                isum += gb.scale(r, s) * d;
                ioff += gb.scale(r, s) * bsums[s] as i32;
            }
            *acc = (gb.d[r] * dx).mul_add((isum - 32 * ioff) as f32, *acc);
        }
    }
    acc
}

/// The AVX2 kernel for one group of eight rows and `N` activation rows: lanes are rows;
/// `maddubs` of the unsigned values with broadcast activations, two summed as i16, then
/// `madd` with the rows' scales into exact 32-bit sums.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<const N: usize>(blocks: &[GroupBlock], x: &Q8KRows, xrow: usize) -> [[f32; MAX_ROWS]; N] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, gb) in blocks.iter().enumerate() {
        let xb: [(&[i8], f32, &[i16]); N] = std::array::from_fn(|n| x.block(xrow + n, b));
        let mut isum = [_mm256_setzero_si256(); N];
        for s in 0..16 {
            // SAFETY: `scales[s]` holds 16 i16.
            let sc = unsafe { _mm256_loadu_si256(gb.scales[s].as_ptr().cast()) };
            for half in 0..2 {
                let c = 4 * s + 2 * half;
                // SAFETY: `32c + 64 <= 2048 = q.len()`.
                let (w0, w1) = unsafe {
                    let p = gb.q.as_ptr().add(32 * c);
                    (_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(p.add(32).cast()))
                };
                for n in 0..N {
                    // SAFETY: `4c + 8 <= 256`, the length of a block of activations.
                    let (x0, x1) = unsafe {
                        let p = xb[n].0.as_ptr().add(4 * c).cast::<i32>();
                        (p.read_unaligned(), p.add(1).read_unaligned())
                    };
                    // Each `maddubs` lane is at most 2 * 63 * 127, so two sum inside i16.
                    let p0 = _mm256_maddubs_epi16(w0, _mm256_set1_epi32(x0));
                    let p1 = _mm256_maddubs_epi16(w1, _mm256_set1_epi32(x1));
                    isum[n] = _mm256_add_epi32(isum[n], _mm256_madd_epi16(_mm256_add_epi16(p0, p1), sc));
                }
            }
        }
        // SAFETY: `d` holds 8 f32.
        let d = unsafe { _mm256_loadu_ps(gb.d.as_ptr()) };
        for n in 0..N {
            let bsums = xb[n].2;
            let mut ioff = _mm256_setzero_si256();
            for t in 0..8 {
                let pair = (bsums[2 * t] as u16 as i32) | ((bsums[2 * t + 1] as i32) << 16);
                // SAFETY: `pairs[t]` holds 16 i16.
                let m = unsafe { _mm256_loadu_si256(gb.pairs[t].as_ptr().cast()) };
                ioff = _mm256_add_epi32(ioff, _mm256_madd_epi16(m, _mm256_set1_epi32(pair)));
            }
            let total = _mm256_sub_epi32(isum[n], _mm256_slli_epi32(ioff, 5));
            let dx = _mm256_set1_ps(xb[n].1);
            acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(total), acc[n]);
        }
    }
    let mut out = [[0.0f32; MAX_ROWS]; N];
    for n in 0..N {
        // SAFETY: `out[n]` holds 8 f32.
        unsafe { _mm256_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
    out
}

impl std::fmt::Debug for Q6KMatrix {
    // The values would be megabytes of output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q6KMatrix").field("n_out", &self.n_out).field("k", &self.k).finish_non_exhaustive()
    }
}
