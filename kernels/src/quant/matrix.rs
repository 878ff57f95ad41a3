//! [`QuantMatrix`]: a weight matrix in a GGML block format, borrowed in place (from a memory
//! map of the model file, or any owner of bytes), and the parallel driver of its matmul.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use super::acts::{LayerInput, Q8KRow, Q8Row};
use super::blocks::{ActFormat, QuantType, dequantize_row};
use super::interleaved::{self, GROUP_ROWS};
use super::kernel::{Acts, QuantKernel, tile};
use crate::KernelError;

/// Bytes of weights shared with their owner (a memory map, a `Vec`): a range of it.
#[derive(Clone)]
pub struct WeightBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl WeightBytes {
    /// All of `owner`'s bytes.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
        WeightBytes { owner, start: 0, len }
    }

    /// Bytes made in memory (tests, random weights).
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        WeightBytes::new(Arc::new(bytes))
    }

    /// The bytes at `range` of these ones (an error if it runs past them).
    pub fn slice(&self, range: Range<usize>) -> Result<Self, KernelError> {
        if range.start > range.end || range.end > self.len {
            return Err(KernelError::BadQuantized(format!("bytes {range:?} of {}", self.len)));
        }
        Ok(WeightBytes { owner: Arc::clone(&self.owner), start: self.start + range.start, len: range.len() })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBytes({} bytes at {})", self.len, self.start)
    }
}

/// How a matmul is cut into parallel tasks. Results never depend on it (each output is one
/// kernel's fixed sequence of operations); tests vary it to show that.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Split {
    /// Weight rows per task (rounded up to the kernel's tile); `None` picks by size.
    pub rows_per_task: Option<usize>,
    /// Activation rows per task; `None` picks by size.
    pub acts_per_task: Option<usize>,
}

/// Activation rows per task when prefilling (a tile of weights is reused across them).
const ACTS_PER_TASK: usize = 64;

/// Weight bytes per task when prefilling: a tile that stays in the core's L2 cache while the
/// task's activation rows stream past it.
const TILE_BYTES: usize = 96 * 1024;

/// Products below this many multiply-adds run on the calling thread (a task costs more).
const SERIAL_WORK: usize = 1 << 16;

/// The environment variable that keeps every matrix in the file's layout (`in-place`) rather
/// than interleaving matmul weights at load (`interleaved`, the default): for A/B runs.
pub const WEIGHT_LAYOUT_ENV: &str = "RADIX_WEIGHT_LAYOUT";

/// How a [`QuantMatrix`]'s blocks lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// As in a GGUF file: each row's blocks in order, read in place.
    InPlace,
    /// Repacked in groups of 16 rows (`kernels/src/quant/interleaved.rs`, `interleaved_k.rs`):
    /// the same bytes per row, multiplied without horizontal reductions.
    Interleaved,
}

/// A weight matrix `[n_out, k]` in a GGML block format, multiplied as `out = x @ W^T`: rows of
/// blocks as in a GGUF file, read in place, or a repacked copy in the [`Layout::Interleaved`]
/// layout.
#[derive(Clone)]
pub struct QuantMatrix {
    ty: QuantType,
    n_out: usize,
    k: usize,
    layout: Layout,
    data: WeightBytes,
}

impl std::fmt::Debug for QuantMatrix {
    // The values would be megabytes of output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("ty", &self.ty)
            .field("n_out", &self.n_out)
            .field("k", &self.k)
            .field("layout", &self.layout)
            .finish()
    }
}

impl QuantMatrix {
    /// The matrix whose rows are `data` (`n_out` rows of `k / block` blocks of `ty`).
    pub fn new(ty: QuantType, n_out: usize, k: usize, data: WeightBytes) -> Result<Self, KernelError> {
        let block = ty.block_values();
        if k == 0 || !k.is_multiple_of(block) {
            return Err(KernelError::BadQuantized(format!(
                "{} needs k a non-zero multiple of {block}, not {k}",
                ty.name()
            )));
        }
        if n_out == 0 {
            return Err(KernelError::BadQuantized("n_out must be at least 1".into()));
        }
        let expected = n_out
            .checked_mul(ty.row_bytes(k))
            .ok_or_else(|| KernelError::BadQuantized(format!("{n_out} x {k} overflows")))?;
        if data.len() != expected {
            return Err(KernelError::LengthMismatch { what: "quantized matrix bytes", expected, actual: data.len() });
        }
        Ok(QuantMatrix { ty, n_out, k, layout: Layout::InPlace, data })
    }

    /// This matrix in the [`Layout::Interleaved`] layout: a copy in memory of the same size
    /// (plus at most 15 rows of padding), multiplied bitwise as the file's layout is.
    pub fn interleaved(&self) -> QuantMatrix {
        self.interleaved_releasing(&|_| {})
    }

    /// [`interleaved`](Self::interleaved), calling `release(bytes)` as it goes with the part of
    /// [`bytes`](Self::bytes) it has finished reading (every byte once, in order), so that a
    /// caller can drop those pages of a mapped file before the rest is copied.
    pub fn interleaved_releasing(&self, release: &dyn Fn(&[u8])) -> QuantMatrix {
        if self.layout == Layout::Interleaved {
            return self.clone();
        }
        let source = self.bytes();
        let released = std::cell::Cell::new(0);
        let done = |n: usize| {
            release(&source[released.get()..n]);
            released.set(n);
        };
        let len = interleaved::interleaved_len(self.ty, self.n_out, self.k);
        // Pages of their own rather than the malloc heap: weights live as long as the model,
        // and the one arena the forward's short-lived buffers churn in need not hold them.
        let data = match memmap2::MmapMut::map_anon(len) {
            Ok(mut map) => {
                interleaved::interleave(self.ty, self.n_out, self.k, source, &mut map, &done);
                WeightBytes::new(Arc::new(map))
            }
            Err(_) => {
                let mut bytes = vec![0u8; len];
                interleaved::interleave(self.ty, self.n_out, self.k, source, &mut bytes, &done);
                WeightBytes::from_vec(bytes)
            }
        };
        QuantMatrix { layout: Layout::Interleaved, data, ..self.clone() }
    }

    /// Whether the matmuls of this process run faster on [`interleaved`](Self::interleaved)
    /// copies than on the file's blocks in place: wherever an x86 kernel runs, unless
    /// `RADIX_WEIGHT_LAYOUT=in-place`.
    pub fn interleaving_wins() -> bool {
        QuantKernel::Auto.resolve() != QuantKernel::Portable && !in_place_forced()
    }

    /// The layout of the blocks.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The weight type.
    pub fn ty(&self) -> QuantType {
        self.ty
    }

    /// Output rows.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The blocks, as borrowed, in the matrix's [`layout`](Self::layout).
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Row `row` of the matrix in f32, into `out` (`k` values): a lookup in an embedding table.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if row >= self.n_out {
            return Err(KernelError::BadQuantized(format!("row {row} of a matrix with {} rows", self.n_out)));
        }
        if out.len() != self.k {
            return Err(KernelError::LengthMismatch { what: "row out", expected: self.k, actual: out.len() });
        }
        let rb = self.ty.row_bytes(self.k);
        match self.layout {
            Layout::InPlace => dequantize_row(self.ty, &self.bytes()[row * rb..(row + 1) * rb], out),
            Layout::Interleaved => {
                let group = &self.bytes()[row / GROUP_ROWS * GROUP_ROWS * rb..][..GROUP_ROWS * rb];
                interleaved::dequantize_row(self.ty, group, self.k / self.ty.block_values(), row % GROUP_ROWS, out);
            }
        }
        Ok(())
    }

    /// The whole matrix in f32, row-major `[n_out, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0.0f32; self.n_out * self.k];
        for (row, out) in w.chunks_exact_mut(self.k).enumerate() {
            self.dequantize_row(row, out).expect("row and length are in range");
        }
        w
    }

    /// `out = x @ W^T`, `out` row-major `[x.rows(), n_out]`, on the current rayon pool.
    pub fn matmul(&self, x: &LayerInput, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(x, None, out, QuantKernel::Auto, Split::default())
    }

    /// `out[i] = x.row(rows[i]) @ W^T`, `out` row-major `[rows.len(), n_out]`: the rows a
    /// mixture-of-experts layer routes to one expert.
    pub fn matmul_rows(&self, x: &LayerInput, rows: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(x, Some(rows), out, QuantKernel::Auto, Split::default())
    }

    /// [`matmul`](Self::matmul) or [`matmul_rows`](Self::matmul_rows) with a chosen kernel (an
    /// error if this CPU lacks it) and split.
    pub fn matmul_with(
        &self,
        x: &LayerInput,
        rows: Option<&[u32]>,
        out: &mut [f32],
        kernel: QuantKernel,
        split: Split,
    ) -> Result<(), KernelError> {
        if !kernel.is_available() {
            return Err(KernelError::Unavailable(kernel.name()));
        }
        if x.k() != self.k {
            return Err(KernelError::BadQuantized(format!("activations of {} values for k = {}", x.k(), self.k)));
        }
        let m = rows.map_or(x.rows(), <[u32]>::len);
        if let Some(&bad) = rows.and_then(|r| r.iter().find(|&&r| r as usize >= x.rows())) {
            return Err(KernelError::BadQuantized(format!("activation row {bad} of {}", x.rows())));
        }
        let expected = m * self.n_out;
        if out.len() != expected {
            return Err(KernelError::LengthMismatch { what: "matmul output", expected, actual: out.len() });
        }
        if m == 0 {
            return Ok(());
        }
        let job = Job { w: self, kernel: kernel.resolve(), rows, out: OutPtr(out.as_mut_ptr()) };
        match self.ty.act_format() {
            ActFormat::Q8_0 => {
                let a = x.q8_0()?;
                job.run(m, split, |i| Row::Q8(a.row(i)))
            }
            ActFormat::Q8K => {
                let a = x.q8k()?;
                job.run(m, split, |i| Row::Q8K(a.row(i)))
            }
        }
        Ok(())
    }
}

/// One activation row in either format.
#[derive(Clone, Copy)]
enum Row<'a> {
    Q8(Q8Row<'a>),
    Q8K(Q8KRow<'a>),
}

/// Whether `RADIX_WEIGHT_LAYOUT` asks for the file's layout (read once per process; any other
/// value than `in-place` or `interleaved` is reported once and ignored).
fn in_place_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| match std::env::var(WEIGHT_LAYOUT_ENV) {
        Ok(v) if v.trim().eq_ignore_ascii_case("in-place") => true,
        Ok(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("interleaved") => false,
        Ok(v) => {
            eprintln!("{WEIGHT_LAYOUT_ENV}={v:?} is not `in-place` or `interleaved`: ignored");
            false
        }
        Err(_) => false,
    })
}

/// One matmul's fixed parts.
struct Job<'a> {
    w: &'a QuantMatrix,
    kernel: QuantKernel,
    rows: Option<&'a [u32]>,
    out: OutPtr,
}

impl Job<'_> {
    /// Weight rows per tile.
    fn lanes(&self) -> usize {
        match self.w.layout {
            Layout::InPlace => self.kernel.lanes(self.w.ty),
            Layout::Interleaved => GROUP_ROWS,
        }
    }

    /// The most activation rows one tile takes.
    fn max_acts(&self) -> usize {
        match self.w.layout {
            Layout::InPlace => self.kernel.max_acts(self.w.ty),
            Layout::Interleaved => interleaved::MAX_ACTS,
        }
    }

    /// Cuts `m` activation rows times the weight rows into tasks and runs them.
    fn run<'x>(&self, m: usize, split: Split, act: impl Fn(usize) -> Row<'x> + Sync) {
        let (ty, n_out) = (self.w.ty, self.w.n_out);
        let lanes = self.lanes();
        let groups = n_out.div_ceil(lanes);
        let row_bytes = ty.row_bytes(self.w.k);
        let threads = rayon::current_num_threads();
        let x_per = split.acts_per_task.unwrap_or(ACTS_PER_TASK).max(1);
        let x_tiles = m.div_ceil(x_per);
        let mut g_per = match split.rows_per_task {
            Some(r) => r.div_ceil(lanes).max(1),
            None => (TILE_BYTES / (lanes * row_bytes)).max(1),
        };
        if split.rows_per_task.is_none() && groups.div_ceil(g_per) * x_tiles < threads * 4 {
            // Enough tasks that every thread gets several.
            g_per = groups.div_ceil((threads * 4).div_ceil(x_tiles)).max(1);
        }
        let g_tiles = groups.div_ceil(g_per);
        let task = |t: usize| {
            let (xt, gt) = (t / g_tiles, t % g_tiles);
            self.task(xt * x_per..((xt + 1) * x_per).min(m), gt * g_per..((gt + 1) * g_per).min(groups), &act);
        };
        let serial = split == Split::default() && m * n_out * self.w.k < SERIAL_WORK;
        if serial || g_tiles * x_tiles == 1 {
            (0..g_tiles * x_tiles).for_each(task);
        } else {
            (0..g_tiles * x_tiles).into_par_iter().for_each(task);
        }
    }

    /// Activation rows `xs` times row groups `groups`.
    fn task<'x>(&self, xs: Range<usize>, groups: Range<usize>, act: &impl Fn(usize) -> Row<'x>) {
        let nmax = self.max_acts();
        let mut i = xs.start;
        while i < xs.end {
            let n = (xs.end - i).min(nmax);
            // Up to `MAX_ACTS` rows; the tile reads the first `n`.
            let row = |j: usize| act(self.rows.map_or(i + j.min(n - 1), |r| r[i + j.min(n - 1)] as usize));
            match row(0) {
                Row::Q8(_) => {
                    let x: [Q8Row; interleaved::MAX_ACTS] = std::array::from_fn(|j| match row(j) {
                        Row::Q8(r) => r,
                        Row::Q8K(_) => unreachable!("one format per matmul"),
                    });
                    self.groups(i, Acts::Q8(&x[..n]), groups.clone(), i == xs.start);
                }
                Row::Q8K(_) => {
                    let x: [Q8KRow; interleaved::MAX_ACTS] = std::array::from_fn(|j| match row(j) {
                        Row::Q8K(r) => r,
                        Row::Q8(_) => unreachable!("one format per matmul"),
                    });
                    self.groups(i, Acts::Q8K(&x[..n]), groups.clone(), i == xs.start);
                }
            }
            i += n;
        }
    }

    /// Activation rows `i..i + acts.len()` times row groups `groups`; `first_pass` where these
    /// are the task's first activation rows, so its weights come from memory rather than cache.
    fn groups(&self, i: usize, acts: Acts, groups: Range<usize>, first_pass: bool) {
        let (ty, n_out) = (self.w.ty, self.w.n_out);
        let lanes = self.lanes();
        let rb = ty.row_bytes(self.w.k);
        let bytes = self.w.bytes();
        let n = acts.len();
        let mut results = [0.0f32; GROUP_ROWS * interleaved::MAX_ACTS];
        for g in groups {
            let out = &mut results[..n * lanes];
            match self.w.layout {
                Layout::Interleaved => {
                    let group = &bytes[g * GROUP_ROWS * rb..(g + 1) * GROUP_ROWS * rb];
                    let nb = self.w.k / ty.block_values();
                    interleaved::tile(self.kernel, ty, group, nb, acts, out, first_pass);
                }
                Layout::InPlace => {
                    // A last group past `n_out` repeats the last row; its lanes are dropped.
                    let w: [&[u8]; 16] = std::array::from_fn(|r| {
                        let row = (g * lanes + r).min(n_out - 1);
                        &bytes[row * rb..(row + 1) * rb]
                    });
                    tile(self.kernel, ty, &w[..lanes], acts, out);
                }
            }
            let valid = lanes.min(n_out - g * lanes);
            for j in 0..n {
                let start = (i + j) * n_out + g * lanes;
                // SAFETY: `matmul_with` checked `out` as `[m, n_out]`; `i + j < m` and the lanes
                // kept lie inside `0..n_out`. Tasks cover disjoint (activation row, row group)
                // pairs, so no two write the same element, and `out` outlives the parallel loop.
                unsafe { std::ptr::copy_nonoverlapping(out[j * lanes..].as_ptr(), self.out.0.add(start), valid) };
            }
        }
    }
}

/// The output pointer shared by the tasks, which write disjoint elements.
struct OutPtr(*mut f32);

// SAFETY: see `Job::task`: tasks write disjoint elements of a buffer that outlives them.
unsafe impl Sync for OutPtr {}
