//! What the K-quant matmuls ([`Q4KMatrix`](super::Q4KMatrix), [`Q6KMatrix`](super::Q6KMatrix))
//! share: activations quantized to Q8_K (one f32 scale per 256 values plus the int sums of
//! every 16, like ggml's `block_q8_K`) and the parallel driver.
//!
//! Each output element comes from one call of the format's kernel (a group of weight rows
//! times up to four activation rows), whatever the tiling or thread count, and every kernel
//! computes the same exact integer sums per 256-value block and folds them into the f32
//! accumulator with the same fused multiply-adds, so results are bitwise equal across kernels
//! and thread counts.

use rayon::prelude::*;

use super::Q8Kernel;
use crate::KernelError;

/// Values per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// One task's share of `fill`: inputs, values, scales, sums (as rayon's `zip` nests them).
type Chunk<'a> = ((&'a [f32], &'a mut [i8]), (&'a mut [f32], &'a mut [i16]));

/// Activation rows one weight-row pass serves (the unpacked weights are reused across them).
pub(crate) const NX: usize = 4;

/// Weight rows one [`KMatrix::dot`] call may return (formats interleave up to this many).
pub(crate) const MAX_ROWS: usize = 8;

/// What [`KMatrix::dot`] returns: `[activation row][weight row]`.
pub(crate) type DotOut = [[f32; MAX_ROWS]; NX];

/// Runs `f::<N>` for `N = n` (`1..=NX`) and pads the result to `NX` rows (the x86 kernels'
/// helper; the portable kernel has no use for it).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn dispatch<const A: usize, const B: usize, const C: usize, const D: usize>(
    n: usize,
    f1: impl FnOnce() -> [[f32; MAX_ROWS]; A],
    f2: impl FnOnce() -> [[f32; MAX_ROWS]; B],
    f3: impl FnOnce() -> [[f32; MAX_ROWS]; C],
    f4: impl FnOnce() -> [[f32; MAX_ROWS]; D],
) -> DotOut {
    let mut out = [[0.0f32; MAX_ROWS]; NX];
    match n {
        4 => out[..D].copy_from_slice(&f4()),
        3 => out[..C].copy_from_slice(&f3()),
        2 => out[..B].copy_from_slice(&f2()),
        _ => out[..A].copy_from_slice(&f1()),
    }
    out
}

/// Activation rows per parallel task when prefilling (a tile of weight rows is reused across them).
const X_ROWS_PER_TASK: usize = 64;

/// Weight bytes per parallel task when prefilling: a tile that stays in the core's caches.
const TILE_BYTES: usize = 64 * 1024;

/// Rows of activations quantized to Q8_K: per 256 values one f32 scale and 256 int8 values in
/// `-127..=127`, plus the sum of every 16 values (which the formats with per-sub-block minimums
/// or offsets need).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Q8KRows {
    pub(crate) k: usize,
    /// `[rows, k]` int8 values.
    pub(crate) quants: Vec<i8>,
    /// `[rows, k / 256]` scales.
    pub(crate) scales: Vec<f32>,
    /// `[rows, k / 16]` sums of 16 consecutive values.
    pub(crate) bsums: Vec<i16>,
}

impl Q8KRows {
    /// Quantizes `x`, row-major `[rows, k]`; `k` must be a non-zero multiple of 256.
    pub fn new(x: &[f32], k: usize) -> Result<Self, KernelError> {
        check_k(k)?;
        if !x.len().is_multiple_of(k) {
            return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: k });
        }
        let mut rows = Q8KRows::default();
        rows.fill(x, k);
        Ok(rows)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.quants.len().checked_div(self.k).unwrap_or(0)
    }

    /// The f32 values the quantized rows stand for (`q * scale`), `[rows, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.quants
            .chunks_exact(QK_K)
            .zip(&self.scales)
            .flat_map(|(q, &d)| q.iter().map(move |&v| v as f32 * d))
            .collect()
    }

    /// Quantizes `x` (already validated) into this value's buffers.
    pub(crate) fn fill(&mut self, x: &[f32], k: usize) {
        self.k = k;
        self.quants.resize(x.len(), 0);
        self.scales.resize(x.len() / QK_K, 0.0);
        self.bsums.resize(x.len() / 16, 0);
        let work = |((x, q), (s, b)): Chunk| {
            for (((x, q), s), b) in
                x.chunks_exact(QK_K).zip(q.chunks_exact_mut(QK_K)).zip(s.iter_mut()).zip(b.chunks_exact_mut(16))
            {
                *s = quantize_block(x, q, b);
            }
        };
        // Whole rows per task: enough work to outweigh a task's cost.
        let per_task = 16 * k;
        if x.len() > per_task {
            x.par_chunks(per_task)
                .zip(self.quants.par_chunks_mut(per_task))
                .zip(self.scales.par_chunks_mut(per_task / QK_K).zip(self.bsums.par_chunks_mut(per_task / 16)))
                .for_each(work);
        } else {
            work(((x, &mut self.quants[..]), (&mut self.scales[..], &mut self.bsums[..])));
        }
    }

    /// Block `b` of row `row`: values, scale, sums of 16.
    #[inline(always)]
    pub(crate) fn block(&self, row: usize, b: usize) -> (&[i8], f32, &[i16]) {
        let nb = self.k / QK_K;
        let i = row * nb + b;
        (&self.quants[i * QK_K..(i + 1) * QK_K], self.scales[i], &self.bsums[i * 16..(i + 1) * 16])
    }
}

/// `scale = max|x| / 127`, values rounded to nearest (ties to even); NaNs become 0.
fn quantize_block(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    // `max` skips NaNs, so one NaN does not wipe out its block.
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        // The clamp guards against `v * id` rounding a hair above 127; `as` maps NaN to 0.
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    for (s, q) in bsums.iter_mut().zip(q.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
    d
}

/// Checks the inner dimension of a K-quant matmul.
pub(crate) fn check_k(k: usize) -> Result<(), KernelError> {
    if k == 0 || !k.is_multiple_of(QK_K) {
        return Err(KernelError::BadQuantized(format!("k = {k} must be a non-zero multiple of {QK_K}")));
    }
    Ok(())
}

/// Checks `n_out` and the byte length of a GGML K-quant tensor; returns blocks per row.
pub(crate) fn check_ggml(
    what: &'static str,
    n_out: usize,
    k: usize,
    block_bytes: usize,
    bytes: &[u8],
) -> Result<usize, KernelError> {
    check_k(k)?;
    if n_out == 0 {
        return Err(KernelError::BadQuantized("n_out must be at least 1".into()));
    }
    let nb = k / QK_K;
    let expected = n_out
        .checked_mul(nb)
        .and_then(|n| n.checked_mul(block_bytes))
        .ok_or_else(|| KernelError::BadQuantized(format!("{n_out} x {k} overflows")))?;
    if bytes.len() != expected {
        return Err(KernelError::LengthMismatch { what, expected, actual: bytes.len() });
    }
    Ok(nb)
}

/// A K-quant weight matrix `[n_out, k]` as the driver sees it.
pub(crate) trait KMatrix: Sync {
    fn n_out(&self) -> usize;
    fn k(&self) -> usize;
    /// Weight rows per unit of work (rows the format interleaves; at most `MAX_ROWS`).
    const ROWS: usize;
    /// Bytes of one weight row, for tiling.
    fn row_bytes(&self) -> usize;
    /// Weight rows `unit * ROWS..` dotted with activation rows `xrow..xrow + n` of `x` (`n` in
    /// `1..=NX`), as `out[activation row][weight row]`.
    fn dot(&self, unit: usize, x: &Q8KRows, xrow: usize, n: usize, avx2: bool) -> DotOut;
}

/// Whether `kernel` means the AVX2 path (after checking the CPU has it). VNNI has no separate
/// K-quant path yet, so it runs the AVX2 one.
pub(crate) fn use_avx2(kernel: Q8Kernel) -> Result<bool, KernelError> {
    if !kernel.is_available() {
        return Err(KernelError::Unavailable(kernel.name()));
    }
    Ok(kernel.resolve() != Q8Kernel::Scalar)
}

/// `out = x @ W^T` for f32 activations `[m, k]`.
pub(crate) fn matmul<M: KMatrix>(w: &M, x: &[f32], out: &mut [f32], kernel: Q8Kernel) -> Result<(), KernelError> {
    let avx2 = use_avx2(kernel)?;
    let k = w.k();
    if !x.len().is_multiple_of(k) {
        return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: k });
    }
    check_out(w, x.len() / k, out)?;
    let mut xq = Q8KRows::default();
    xq.fill(x, k);
    run(w, &xq, out, avx2);
    Ok(())
}

/// `out = x @ W^T` for activations already quantized.
pub(crate) fn matmul_quantized<M: KMatrix>(
    w: &M,
    x: &Q8KRows,
    out: &mut [f32],
    kernel: Q8Kernel,
) -> Result<(), KernelError> {
    let avx2 = use_avx2(kernel)?;
    if x.k != w.k() {
        return Err(KernelError::BadQuantized(format!("activations have k = {}, the matrix {}", x.k, w.k())));
    }
    check_out(w, x.rows(), out)?;
    run(w, x, out, avx2);
    Ok(())
}

fn check_out<M: KMatrix>(w: &M, m: usize, out: &[f32]) -> Result<(), KernelError> {
    let expected = m * w.n_out();
    if out.len() != expected {
        return Err(KernelError::LengthMismatch { what: "out", expected, actual: out.len() });
    }
    Ok(())
}

/// Splits the product into tasks of (a tile of weight rows, a block of activation rows).
fn run<M: KMatrix>(w: &M, x: &Q8KRows, out: &mut [f32], avx2: bool) {
    let (m, n) = (x.rows(), w.n_out());
    if m == 0 {
        return;
    }
    let x_tiles = m.div_ceil(X_ROWS_PER_TASK);
    let units = n.div_ceil(M::ROWS);
    // Enough tasks that every thread gets several, but no more than that where no weight
    // tile is reused (a few activation rows): each task costs a wake-up.
    let want = rayon::current_num_threads() * 4;
    let mut tile = if m <= NX { units } else { (TILE_BYTES / (M::ROWS * w.row_bytes())).max(1) };
    if units.div_ceil(tile) * x_tiles < want {
        tile = units.div_ceil(want.div_ceil(x_tiles)).max(1);
    }
    let w_tiles = units.div_ceil(tile);
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Borrow the wrapper whole (a closure would capture only its raw, non-`Sync` field).
    let out_ptr = &out_ptr;
    (0..w_tiles * x_tiles).into_par_iter().for_each(|t| {
        let (xt, wt) = (t / w_tiles, t % w_tiles);
        let rows = xt * X_ROWS_PER_TASK..((xt + 1) * X_ROWS_PER_TASK).min(m);
        for u in wt * tile..((wt + 1) * tile).min(units) {
            let cols = u * M::ROWS..((u + 1) * M::ROWS).min(n);
            let mut i = rows.start;
            while i < rows.end {
                let len = (rows.end - i).min(NX);
                let v = w.dot(u, x, i, len, avx2);
                for (r, v) in v[..len].iter().enumerate() {
                    for (c, j) in cols.clone().enumerate() {
                        // SAFETY: the callers validated `out` as `[m, n]`, `i + r < m` and
                        // `j < n`; tasks cover disjoint (row, column) pairs, so no two write
                        // the same element, and `out` outlives the parallel loop.
                        unsafe { *out_ptr.0.add((i + r) * n + j) = v[c] };
                    }
                }
                i += len;
            }
        }
    });
}

/// The output pointer shared by the tasks, which write disjoint elements.
struct OutPtr(*mut f32);

// SAFETY: see `run`: tasks write disjoint elements of a buffer that outlives them.
unsafe impl Sync for OutPtr {}
