//! The repacked Q8_0 weight matrix and the tiled, parallel matmul driver.

use half::f16;
use rayon::prelude::*;

use super::activations::{QuantizedRows, check_k};
use super::{Q8_0_BLOCK_BYTES, Q8Kernel, QK8_0};
use crate::KernelError;

/// Weight rows interleaved together: one pass over an activation block serves this many.
pub(crate) const ROWS: usize = 8;

/// Bytes of one (row group, block): `ROWS` rows x 32 values.
pub(crate) const GROUP_BLOCK: usize = ROWS * QK8_0;

/// Activation rows a micro-kernel call serves from one load of the weights.
const NX: usize = 4;

/// Activation rows per parallel task (a tile of weights is reused across them).
const X_ROWS_PER_TASK: usize = 64;

/// Weight bytes per parallel task when prefilling: a tile that stays in the core's caches.
const TILE_BYTES: usize = 32 * 1024;

/// A weight matrix `[n_out, k]` in Q8_0, for `x @ W^T`.
///
/// Rows are repacked in groups of eight: for each group and block of 32 columns, eight
/// chunks of 32 bytes, chunk `c` holding columns `4c..4c+4` of the eight rows, so that one
/// broadcast of four activation bytes meets all eight rows in one vector. The last group is
/// padded with zero rows. Scales are kept as f32.
#[derive(Clone, PartialEq)]
pub struct Q8_0Matrix {
    n_out: usize,
    k: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
}

impl Q8_0Matrix {
    /// Reads GGML Q8_0 blocks (`n_out * k / 32` blocks of 34 bytes: little-endian f16 scale,
    /// then 32 int8 values, row after row), as in a GGUF file or candle's `QTensor::data()`.
    pub fn from_ggml_bytes(n_out: usize, k: usize, bytes: &[u8]) -> Result<Self, KernelError> {
        check_k(k)?;
        if n_out == 0 {
            return Err(KernelError::BadQuantized("n_out must be at least 1".into()));
        }
        let nb = k / QK8_0;
        let expected = n_out
            .checked_mul(nb)
            .and_then(|n| n.checked_mul(Q8_0_BLOCK_BYTES))
            .ok_or_else(|| KernelError::BadQuantized(format!("{n_out} x {k} overflows")))?;
        if bytes.len() != expected {
            return Err(KernelError::LengthMismatch { what: "Q8_0 bytes", expected, actual: bytes.len() });
        }
        let groups = n_out.div_ceil(ROWS);
        let mut quants = vec![0i8; groups * nb * GROUP_BLOCK];
        let mut scales = vec![0.0f32; groups * nb * ROWS];
        for (row, row_bytes) in bytes.chunks_exact(nb * Q8_0_BLOCK_BYTES).enumerate() {
            let (g, r) = (row / ROWS, row % ROWS);
            for (b, block) in row_bytes.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
                let gb = g * nb + b;
                scales[gb * ROWS + r] = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let dst = &mut quants[gb * GROUP_BLOCK..(gb + 1) * GROUP_BLOCK];
                for (c, four) in block[2..].chunks_exact(4).enumerate() {
                    for (j, &v) in four.iter().enumerate() {
                        dst[c * QK8_0 + r * 4 + j] = v as i8;
                    }
                }
            }
        }
        Ok(Q8_0Matrix { n_out, k, quants, scales })
    }

    /// Quantizes a dense row-major `[n_out, k]` matrix the way ggml does (scale
    /// `max|w| / 127` stored as f16, values rounded half away from zero).
    pub fn quantize(n_out: usize, k: usize, w: &[f32]) -> Result<Self, KernelError> {
        check_k(k)?;
        let expected =
            n_out.checked_mul(k).ok_or_else(|| KernelError::BadQuantized(format!("{n_out} x {k} overflows")))?;
        if w.len() != expected {
            return Err(KernelError::LengthMismatch { what: "weights", expected, actual: w.len() });
        }
        let mut bytes = Vec::with_capacity(w.len() / QK8_0 * Q8_0_BLOCK_BYTES);
        for block in w.chunks_exact(QK8_0) {
            let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            bytes.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            bytes.extend(block.iter().map(|&v| (v * id).round().clamp(-128.0, 127.0) as i8 as u8));
        }
        Self::from_ggml_bytes(n_out, k, &bytes)
    }

    /// Output rows.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The f32 matrix the blocks stand for (`q * scale`), row-major `[n_out, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        dequantize_rows(self.n_out, self.k, |row, out| self.dequantize_row(row, out))
    }

    /// Row `row` of the matrix in f32 (`q * scale`), into `out` (`k` values): a lookup in a
    /// quantized embedding table.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        check_row(self.n_out, self.k, row, out)?;
        let nb = self.k / QK8_0;
        let (g, r) = (row / ROWS, row % ROWS);
        for (b, out) in out.chunks_exact_mut(QK8_0).enumerate() {
            let gb = g * nb + b;
            let d = self.scales[gb * ROWS + r];
            let src = &self.quants[gb * GROUP_BLOCK..(gb + 1) * GROUP_BLOCK];
            for (j, out) in out.iter_mut().enumerate() {
                *out = src[(j / 4) * QK8_0 + r * 4 + j % 4] as f32 * d;
            }
        }
        Ok(())
    }

    /// `out = x @ W^T`: `x` row-major `[m, k]`, `out` `[m, n_out]`, on the current rayon pool
    /// with the fastest kernel this CPU has.
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(x, out, Q8Kernel::Auto)
    }

    /// [`matmul`](Self::matmul) with a chosen kernel (an error if this CPU lacks it).
    pub fn matmul_with(&self, x: &[f32], out: &mut [f32], kernel: Q8Kernel) -> Result<(), KernelError> {
        if !kernel.is_available() {
            return Err(KernelError::Unavailable(kernel.name()));
        }
        let kernel = kernel.resolve();
        if !x.len().is_multiple_of(self.k) {
            return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: self.k });
        }
        let m = x.len() / self.k;
        self.check_out(m, out)?;
        let mut xq = QuantizedRows::default();
        xq.fill(x, self.k, kernel != Q8Kernel::Scalar);
        self.run(&xq, out, kernel);
        Ok(())
    }

    /// `out = x @ W^T` for activations already quantized (so several matrices sharing an
    /// input quantize it once).
    pub fn matmul_quantized(&self, x: &QuantizedRows, out: &mut [f32], kernel: Q8Kernel) -> Result<(), KernelError> {
        if !kernel.is_available() {
            return Err(KernelError::Unavailable(kernel.name()));
        }
        if x.k != self.k {
            return Err(KernelError::BadQuantized(format!("activations have k = {}, the matrix {}", x.k, self.k)));
        }
        self.check_out(x.rows(), out)?;
        self.run(x, out, kernel.resolve());
        Ok(())
    }

    fn check_out(&self, m: usize, out: &[f32]) -> Result<(), KernelError> {
        let expected = m * self.n_out;
        if out.len() != expected {
            return Err(KernelError::LengthMismatch { what: "out", expected, actual: out.len() });
        }
        Ok(())
    }

    /// Splits the product into tasks of (a tile of row groups, a block of activation rows).
    /// Each output is computed by one micro-kernel call whatever the split, so the split
    /// (and the thread count) does not change the result.
    fn run(&self, x: &QuantizedRows, out: &mut [f32], kernel: Q8Kernel) {
        let m = x.rows();
        if m == 0 {
            return;
        }
        let groups = self.n_out.div_ceil(ROWS);
        let x_tiles = m.div_ceil(X_ROWS_PER_TASK);
        // Enough tasks that every thread gets several, but no more than that where no
        // weight tile is reused (a few activation rows): each task costs a wake-up.
        let want = rayon::current_num_threads() * 4;
        let mut tile = if m <= NX { groups } else { (TILE_BYTES / (ROWS * self.k)).max(1) };
        if groups.div_ceil(tile) * x_tiles < want {
            tile = groups.div_ceil(want.div_ceil(x_tiles)).max(1);
        }
        let g_tiles = groups.div_ceil(tile);
        let out_ptr = OutPtr(out.as_mut_ptr());
        (0..g_tiles * x_tiles).into_par_iter().for_each(|t| {
            let (xt, gt) = (t / g_tiles, t % g_tiles);
            let rows = xt * X_ROWS_PER_TASK..((xt + 1) * X_ROWS_PER_TASK).min(m);
            let group_range = gt * tile..((gt + 1) * tile).min(groups);
            self.task(x, rows, group_range, kernel, &out_ptr);
        });
    }

    fn task(
        &self,
        x: &QuantizedRows,
        rows: std::ops::Range<usize>,
        groups: std::ops::Range<usize>,
        kernel: Q8Kernel,
        out: &OutPtr,
    ) {
        let mut i = rows.start;
        while i < rows.end {
            let n = (rows.end - i).min(NX);
            for g in groups.clone() {
                match n {
                    4 => self.call::<4>(x, i, g, kernel, out),
                    3 => self.call::<3>(x, i, g, kernel, out),
                    2 => self.call::<2>(x, i, g, kernel, out),
                    _ => self.call::<1>(x, i, g, kernel, out),
                }
            }
            i += n;
        }
    }

    /// Rows `i..i + N` of `x` times row group `g`, written to `out`.
    fn call<const N: usize>(&self, x: &QuantizedRows, i: usize, g: usize, kernel: Q8Kernel, out: &OutPtr) {
        let (k, nb) = (self.k, self.k / QK8_0);
        let wq = &self.quants[g * nb * GROUP_BLOCK..(g + 1) * nb * GROUP_BLOCK];
        let ws = &self.scales[g * nb * ROWS..(g + 1) * nb * ROWS];
        let xq: [&[i8]; N] = std::array::from_fn(|n| &x.quants[(i + n) * k..(i + n + 1) * k]);
        let xs: [&[f32]; N] = std::array::from_fn(|n| &x.scales[(i + n) * nb..(i + n + 1) * nb]);
        let acc = match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only chosen after checking that the CPU supports AVX2 and FMA.
            Q8Kernel::Avx2 => unsafe { super::avx2::tile::<N>(wq, ws, xq, xs) },
            #[cfg(target_arch = "x86_64")]
            Q8Kernel::Vnni => {
                let xo: [&[i32]; N] = std::array::from_fn(|n| &x.offsets[(i + n) * nb..(i + n + 1) * nb]);
                // SAFETY: `Vnni` is only chosen after checking for AVX2, FMA and one of the two
                // VNNI encodings, and each function runs only where its own encoding exists.
                unsafe { super::vnni::tile::<N>(wq, ws, xq, xs, xo) }
            }
            _ => super::scalar::tile::<N>(wq, ws, xq, xs),
        };
        let cols = g * ROWS..((g + 1) * ROWS).min(self.n_out);
        for (n, acc) in acc.iter().enumerate() {
            let start = (i + n) * self.n_out + cols.start;
            // SAFETY: `run` validated `out` as `[m, n_out]`, `i + n < m` and `cols` lie inside
            // `0..n_out`; tasks cover disjoint (row, group) pairs, so no two write the same
            // element, and `out` outlives the parallel loop.
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), out.0.add(start), cols.len()) };
        }
    }
}

impl std::fmt::Debug for Q8_0Matrix {
    // The values would be megabytes of output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q8_0Matrix").field("n_out", &self.n_out).field("k", &self.k).finish_non_exhaustive()
    }
}

/// The output pointer shared by the tasks, which write disjoint elements.
struct OutPtr(*mut f32);

// SAFETY: see `Q8_0Matrix::call`: tasks write disjoint elements of a buffer that outlives them.
unsafe impl Sync for OutPtr {}

/// Checks that `row` names one of `n_out` rows and that `out` holds `k` values: the arguments
/// of [`Q8_0Matrix::dequantize_row`].
fn check_row(n_out: usize, k: usize, row: usize, out: &[f32]) -> Result<(), crate::KernelError> {
    if row >= n_out {
        return Err(crate::KernelError::BadQuantized(format!("row {row} of a matrix with {n_out} rows")));
    }
    if out.len() != k {
        return Err(crate::KernelError::LengthMismatch { what: "row out", expected: k, actual: out.len() });
    }
    Ok(())
}

/// The whole `[n_out, k]` matrix in f32, row by row through `dequantize_row`.
fn dequantize_rows(
    n_out: usize,
    k: usize,
    dequantize_row: impl Fn(usize, &mut [f32]) -> Result<(), crate::KernelError>,
) -> Vec<f32> {
    let mut w = vec![0.0f32; n_out * k];
    for (row, out) in w.chunks_exact_mut(k).enumerate() {
        dequantize_row(row, out).expect("row and length are in range");
    }
    w
}
