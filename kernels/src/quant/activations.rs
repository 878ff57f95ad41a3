//! Quantizing activation rows to Q8_0 (like ggml's `quantize_row_q8_0`, with an f32 scale).

use rayon::prelude::*;

use super::QK8_0;
use crate::KernelError;

/// Rows of activations quantized to Q8_0: 32 int8 values and one f32 scale per block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuantizedRows {
    pub(crate) k: usize,
    /// `[rows, k]` int8 values, each in `-127..=127`.
    pub(crate) quants: Vec<i8>,
    /// `[rows, k / 32]` scales.
    pub(crate) scales: Vec<f32>,
    /// `[rows, k / 32]`: 128 times the sum of each block's values, which the VNNI kernel
    /// subtracts (it multiplies the weights offset by 128, to make them unsigned).
    pub(crate) offsets: Vec<i32>,
}

/// One task's share of `fill`: inputs, values, scales, offsets (as rayon's `zip` nests them).
type Chunk<'a> = (((&'a [f32], &'a mut [i8]), &'a mut [f32]), &'a mut [i32]);

/// Rows per rayon task when quantizing: enough work to outweigh the task's cost.
const ROWS_PER_TASK: usize = 16;

impl QuantizedRows {
    /// Quantizes `x`, row-major `[rows, k]`; `k` must be a non-zero multiple of 32.
    pub fn new(x: &[f32], k: usize) -> Result<Self, KernelError> {
        check_k(k)?;
        if !x.len().is_multiple_of(k) {
            return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: k });
        }
        let mut rows = QuantizedRows::default();
        rows.fill(x, k, crate::cpu::has_avx2_fma());
        Ok(rows)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.quants.len().checked_div(self.k).unwrap_or(0)
    }

    /// The int8 values, `[rows, k]`.
    pub fn quants(&self) -> &[i8] {
        &self.quants
    }

    /// The scales, `[rows, k / 32]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The f32 values the quantized rows stand for (`q * scale`), `[rows, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.quants
            .chunks_exact(QK8_0)
            .zip(&self.scales)
            .flat_map(|(q, &d)| q.iter().map(move |&v| v as f32 * d))
            .collect()
    }

    /// Quantizes `x` (already validated) into this value's buffers. `avx2` only picks how the
    /// loop is compiled: the values are the same either way.
    pub(crate) fn fill(&mut self, x: &[f32], k: usize, avx2: bool) {
        self.k = k;
        self.quants.resize(x.len(), 0);
        self.scales.resize(x.len() / QK8_0, 0.0);
        self.offsets.resize(x.len() / QK8_0, 0);
        let per_task = ROWS_PER_TASK * k;
        let work = |(((x, q), s), o): Chunk| {
            quantize_blocks(x, q, s, avx2);
            for (q, o) in q.chunks_exact(QK8_0).zip(o) {
                *o = 128 * q.iter().map(|&v| v as i32).sum::<i32>();
            }
        };
        if x.len() > per_task {
            x.par_chunks(per_task)
                .zip(self.quants.par_chunks_mut(per_task))
                .zip(self.scales.par_chunks_mut(per_task / QK8_0))
                .zip(self.offsets.par_chunks_mut(per_task / QK8_0))
                .for_each(work);
        } else {
            work((((x, &mut self.quants[..]), &mut self.scales[..]), &mut self.offsets[..]));
        }
    }
}

/// Checks the inner dimension of a Q8_0 matmul.
pub(crate) fn check_k(k: usize) -> Result<(), KernelError> {
    if k == 0 || !k.is_multiple_of(QK8_0) {
        return Err(KernelError::BadQuantized(format!("k = {k} must be a non-zero multiple of {QK8_0}")));
    }
    Ok(())
}

/// Quantizes one block of 32 values: `x ≈ q * scale` with `scale = max|x| / 127` and `q`
/// rounded to nearest (ties to even), in `-127..=127`. NaNs become 0; a block with an
/// infinity quantizes to all zeros with an infinite scale.
pub fn quantize_block_q8_0(x: &[f32; QK8_0]) -> ([i8; QK8_0], f32) {
    let mut q = [0i8; QK8_0];
    let d = quantize_block(x, &mut q);
    (q, d)
}

fn quantize_blocks(x: &[f32], q: &mut [i8], s: &mut [f32], avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is only true where the CPU supports AVX2 and FMA.
        unsafe { quantize_blocks_avx2(x, q, s) };
        return;
    }
    let _ = avx2;
    quantize_blocks_portable(x, q, s);
}

fn quantize_blocks_portable(x: &[f32], q: &mut [i8], s: &mut [f32]) {
    for ((x, q), s) in x.chunks_exact(QK8_0).zip(q.chunks_exact_mut(QK8_0)).zip(s) {
        *s = quantize_block(x, q);
    }
}

/// The same source compiled with AVX2 so the compiler vectorizes it; rounding and
/// arithmetic are IEEE-exact, so the values equal the portable build's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn quantize_blocks_avx2(x: &[f32], q: &mut [i8], s: &mut [f32]) {
    for ((x, q), s) in x.chunks_exact(QK8_0).zip(q.chunks_exact_mut(QK8_0)).zip(s) {
        *s = quantize_block(x, q);
    }
}

#[inline(always)]
fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    // `max` skips NaNs, so one NaN does not wipe out its block.
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        // The clamp guards against `v * id` rounding a hair above 127; `as` maps NaN to 0.
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}
