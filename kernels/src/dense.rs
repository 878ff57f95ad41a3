//! Float weight matrices on the CPU (`f32`, `f16`, `bf16`): `out = x @ W^T` computed so that a
//! row's result never depends on the batch.
//!
//! A general matmul (candle's, through the `gemm` crate) chooses its blocking and its inner
//! kernel by the shape: one or two activation rows take another path than many, so a decode
//! step, a short prefill chunk and a long one give the same token's K/V and logits a few ulps
//! apart, and greedy replies change with what else is in the batch. Here every output element is
//! one dot product of an activation row and a weight row, always reduced in the same order
//! ([`dot`]), on every path and for every tile, batch size and thread split; tiles and tasks
//! only choose which outputs are computed together.
//!
//! The order (kept by the AVX2 kernel and the portable one, so both give bitwise equal results):
//! lane `l` of eight accumulates `x[i] * w[i]` for `i ≡ l (mod 8)` over the whole chunks of
//! eight with fused multiply-adds, the lanes are summed as `((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))`,
//! and the rest of the row is added in order with fused multiply-adds. Weights are converted to
//! `f32` exactly before they are multiplied.
//!
//! ```
//! use radix_kernels::dense::{DenseMatrix, DenseWeights};
//!
//! let w = DenseMatrix::new(2, 3, DenseWeights::F32(vec![1.0, 2.0, 3.0, -1.0, 0.0, 1.0]))?;
//! let mut out = [0.0f32; 2];
//! w.matmul(&[1.0, 1.0, 2.0], &mut out)?;
//! assert_eq!(out, [9.0, 1.0]);
//! # Ok::<(), radix_kernels::KernelError>(())
//! ```

use half::{bf16, f16};
use rayon::prelude::*;

use crate::KernelError;
use crate::cpu;
use crate::quant::WeightBytes;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Accumulator lanes of one dot product (one 256-bit vector of f32).
pub(crate) const LANES: usize = 8;

/// Weight rows a task covers at least when several tasks share a matrix (below this a task's
/// wake-up costs more than its work).
const MIN_ROWS_PER_TASK: usize = 16;

/// Activation rows per task: a block of weight rows stays in cache while they stream past it.
const X_ROWS_PER_TASK: usize = 32;

/// Weight bytes per task when prefilling: a tile that stays in the core's caches.
const TILE_BYTES: usize = 64 * 1024;

/// A float weight matrix's values, row-major `[n_out, k]`, in the type they were stored in.
#[derive(Clone)]
pub enum DenseWeights {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// IEEE half precision.
    F16(Vec<f16>),
    /// bfloat16.
    BF16(Vec<bf16>),
    /// Little-endian values of a type in shared bytes, read in place (a memory-mapped
    /// safetensors file: no copy, page cache as the file is). Must be aligned to the type.
    Mapped(FloatType, WeightBytes),
}

/// The element type of [`DenseWeights::Mapped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatType {
    /// 32-bit floats.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
}

impl FloatType {
    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            FloatType::F32 => 4,
            FloatType::F16 | FloatType::BF16 => 2,
        }
    }
}

/// The values as a typed slice, whatever holds them.
#[derive(Clone, Copy)]
enum View<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl DenseWeights {
    /// How many values: an error for mapped bytes that are not whole aligned values (or on a
    /// big-endian CPU, where the file's values would read wrong).
    fn checked_len(&self) -> Result<usize, KernelError> {
        Ok(match self {
            DenseWeights::F32(w) => w.len(),
            DenseWeights::F16(w) => w.len(),
            DenseWeights::BF16(w) => w.len(),
            DenseWeights::Mapped(t, bytes) => {
                let aligned = (bytes.as_slice().as_ptr() as usize).is_multiple_of(t.size());
                if cfg!(target_endian = "big") || !aligned || !bytes.len().is_multiple_of(t.size()) {
                    return Err(KernelError::BadShape(format!(
                        "{} bytes of {t:?} values at an address that is not a multiple of {}",
                        bytes.len(),
                        t.size()
                    )));
                }
                bytes.len() / t.size()
            }
        })
    }

    fn view(&self) -> View<'_> {
        match self {
            DenseWeights::F32(w) => View::F32(w),
            DenseWeights::F16(w) => View::F16(w),
            DenseWeights::BF16(w) => View::BF16(w),
            DenseWeights::Mapped(t, bytes) => {
                let b = bytes.as_slice();
                // SAFETY: `DenseMatrix::new` checked (`checked_len`) that the bytes are whole
                // values aligned to the type on a little-endian CPU; every bit pattern is a
                // valid f32/f16/bf16; the bytes live as long as `self` (shared, never written).
                unsafe {
                    match t {
                        FloatType::F32 => View::F32(std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / 4)),
                        FloatType::F16 => View::F16(std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / 2)),
                        FloatType::BF16 => View::BF16(std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / 2)),
                    }
                }
            }
        }
    }
}

/// Which implementation of the dot product a matmul uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseKernel {
    /// The fastest one this CPU supports.
    Auto,
    /// Portable Rust, correct everywhere.
    Portable,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
}

impl DenseKernel {
    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            DenseKernel::Auto | DenseKernel::Portable => true,
            DenseKernel::Avx2 => cpu::has_avx2_fma_f16c(),
        }
    }

    fn resolve(self) -> DenseKernel {
        match self {
            DenseKernel::Auto if DenseKernel::Avx2.is_available() => DenseKernel::Avx2,
            DenseKernel::Auto => DenseKernel::Portable,
            other => other,
        }
    }
}

/// A float weight matrix `[n_out, k]`, for `x @ W^T` with results independent of the batch.
#[derive(Clone)]
pub struct DenseMatrix {
    n_out: usize,
    k: usize,
    weights: DenseWeights,
}

impl DenseMatrix {
    /// The matrix of `weights`, row-major `[n_out, k]`.
    pub fn new(n_out: usize, k: usize, weights: DenseWeights) -> Result<Self, KernelError> {
        if n_out == 0 || k == 0 {
            return Err(KernelError::BadShape(format!("a dense matrix of {n_out} x {k}")));
        }
        let expected = n_out.checked_mul(k).ok_or_else(|| KernelError::BadShape(format!("{n_out} x {k} overflows")))?;
        let len = weights.checked_len()?;
        if len != expected {
            return Err(KernelError::LengthMismatch { what: "dense weights", expected, actual: len });
        }
        Ok(DenseMatrix { n_out, k, weights })
    }

    /// Output rows.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The values as stored.
    pub fn weights(&self) -> &DenseWeights {
        &self.weights
    }

    /// Row `row` in f32 (exact for every type), into `out` (`k` values): an embedding lookup.
    pub fn row_f32(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if row >= self.n_out {
            return Err(KernelError::BadShape(format!("row {row} of a matrix of {} rows", self.n_out)));
        }
        if out.len() != self.k {
            return Err(KernelError::LengthMismatch { what: "row", expected: self.k, actual: out.len() });
        }
        let range = row * self.k..(row + 1) * self.k;
        match self.weights.view() {
            View::F32(w) => out.copy_from_slice(&w[range]),
            View::F16(w) => out.iter_mut().zip(&w[range]).for_each(|(o, v)| *o = v.to_f32()),
            View::BF16(w) => out.iter_mut().zip(&w[range]).for_each(|(o, v)| *o = v.to_f32()),
        }
        Ok(())
    }

    /// `out = x @ W^T`: `x` row-major `[m, k]`, `out` `[m, n_out]`, on the current rayon pool
    /// with the fastest kernel this CPU has.
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(x, out, DenseKernel::Auto)
    }

    /// [`matmul`](Self::matmul) with a chosen kernel (an error if this CPU lacks it).
    pub fn matmul_with(&self, x: &[f32], out: &mut [f32], kernel: DenseKernel) -> Result<(), KernelError> {
        if !kernel.is_available() {
            return Err(KernelError::Unavailable(match kernel {
                DenseKernel::Avx2 => "AVX2 + FMA + F16C",
                _ => "portable",
            }));
        }
        if !x.len().is_multiple_of(self.k) {
            return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: self.k });
        }
        let m = x.len() / self.k;
        if out.len() != m * self.n_out {
            return Err(KernelError::LengthMismatch { what: "out", expected: m * self.n_out, actual: out.len() });
        }
        if m == 0 {
            return Ok(());
        }
        let kernel = kernel.resolve();
        let x_tiles = m.div_ceil(X_ROWS_PER_TASK);
        let want = rayon::current_num_threads() * 4;
        let bytes_per_row = self.k * std::mem::size_of::<f32>();
        let mut tile = if m <= 4 { self.n_out } else { (TILE_BYTES / bytes_per_row).max(MIN_ROWS_PER_TASK) };
        if self.n_out.div_ceil(tile) * x_tiles < want {
            tile = self.n_out.div_ceil(want.div_ceil(x_tiles)).max(MIN_ROWS_PER_TASK);
        }
        let w_tiles = self.n_out.div_ceil(tile);
        let out_ptr = OutPtr(out.as_mut_ptr());
        (0..w_tiles * x_tiles).into_par_iter().for_each(|t| {
            let (xt, wt) = (t / w_tiles, t % w_tiles);
            let rows = xt * X_ROWS_PER_TASK..((xt + 1) * X_ROWS_PER_TASK).min(m);
            let cols = wt * tile..((wt + 1) * tile).min(self.n_out);
            for row in rows {
                let x_row = &x[row * self.k..(row + 1) * self.k];
                // SAFETY: `out` is `[m, n_out]` (checked above), `row < m` and `cols` lies in
                // `0..n_out`; tasks cover disjoint (row, column) pairs, so no two write the same
                // element, and `out` outlives the parallel loop.
                let out_row = unsafe {
                    std::slice::from_raw_parts_mut(out_ptr.get().add(row * self.n_out + cols.start), cols.len())
                };
                self.row_times(x_row, cols.clone(), out_row, kernel);
            }
        });
        Ok(())
    }

    /// One activation row times the weight rows `cols`.
    fn row_times(&self, x: &[f32], cols: std::ops::Range<usize>, out: &mut [f32], kernel: DenseKernel) {
        let k = self.k;
        let rows = cols.start * k..cols.end * k;
        match (self.weights.view(), kernel) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only chosen after checking for AVX2, FMA and F16C.
            (View::F32(w), DenseKernel::Avx2) => unsafe { avx2::rows_f32(x, &w[rows], out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (View::F16(w), DenseKernel::Avx2) => unsafe { avx2::rows_f16(x, &w[rows], out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (View::BF16(w), DenseKernel::Avx2) => unsafe { avx2::rows_bf16(x, &w[rows], out) },
            (View::F32(w), _) => rows_portable(x, &w[rows], out, |v| v),
            (View::F16(w), _) => rows_portable(x, &w[rows], out, f16::to_f32),
            (View::BF16(w), _) => rows_portable(x, &w[rows], out, bf16::to_f32),
        }
    }
}

impl std::fmt::Debug for DenseMatrix {
    // The values would be megabytes of output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = match self.weights.view() {
            View::F32(_) => "f32",
            View::F16(_) => "f16",
            View::BF16(_) => "bf16",
        };
        let mapped = matches!(self.weights, DenseWeights::Mapped(..));
        f.debug_struct("DenseMatrix")
            .field("n_out", &self.n_out)
            .field("k", &self.k)
            .field("dtype", &dtype)
            .field("mapped", &mapped)
            .finish()
    }
}

/// The output pointer shared by the tasks, which write disjoint elements.
struct OutPtr(*mut f32);

impl OutPtr {
    // A method, so closures capture the whole `Sync` wrapper rather than its raw field.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

// SAFETY: the tasks write disjoint elements (see `matmul_with`).
unsafe impl Sync for OutPtr {}

/// The eight lanes summed in the module's fixed order.
#[inline(always)]
pub(crate) fn sum_lanes(l: [f32; LANES]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// The dot product of `x` and `w` (converted by `to_f32`) in the module's order.
#[inline(always)]
pub(crate) fn dot<T: Copy>(x: &[f32], w: &[T], to_f32: impl Fn(T) -> f32) -> f32 {
    debug_assert_eq!(x.len(), w.len());
    let whole = x.len() / LANES * LANES;
    let mut lanes = [0.0f32; LANES];
    for (xc, wc) in x[..whole].chunks_exact(LANES).zip(w[..whole].chunks_exact(LANES)) {
        for l in 0..LANES {
            lanes[l] = xc[l].mul_add(to_f32(wc[l]), lanes[l]);
        }
    }
    let mut sum = sum_lanes(lanes);
    for (&xv, &wv) in x[whole..].iter().zip(&w[whole..]) {
        sum = xv.mul_add(to_f32(wv), sum);
    }
    sum
}

/// `out[j] = dot(x, w row j)` for the rows of `w` (row-major, `x.len()` wide), portably.
fn rows_portable<T: Copy>(x: &[f32], w: &[T], out: &mut [f32], to_f32: impl Fn(T) -> f32 + Copy) {
    for (o, w_row) in out.iter_mut().zip(w.chunks_exact(x.len())) {
        *o = dot(x, w_row, to_f32);
    }
}

#[cfg(test)]
mod tests;
