//! Activation rows quantized for the dot products: Q8_0 (blocks of 32, for the 32-value weight
//! types) and Q8_K (blocks of 256, for the K-quants), each rounded as llama.cpp rounds them, and
//! [`LayerInput`], which quantizes a layer's input at most once per format for every matmul that
//! reads it. Rows are quantized one by one, so a row's values never depend on the other rows.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::blocks::{ActFormat, QK_K, QK8_0};
use crate::KernelError;

/// One task's share of a quantization: inputs, values, scales, sums (as rayon's `zip` nests
/// them).
type Chunk<'a, S> = (((&'a [f32], &'a mut [i8]), &'a mut [f32]), &'a mut [S]);

/// Rows per rayon task when quantizing many rows.
const ROWS_PER_TASK: usize = 16;

/// Rows quantized to Q8_0: per block of 32, int8 values in `-127..=127`, an f32 scale and the
/// values' sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Q8_0Acts {
    pub(crate) k: usize,
    /// `[rows, k]`.
    pub(crate) qs: Vec<i8>,
    /// `[rows, k / 32]`.
    pub(crate) d: Vec<f32>,
    /// `[rows, k / 32]`: the sum of each block's values.
    pub(crate) sums: Vec<i32>,
}

/// Rows quantized to Q8_K: per block of 256, int8 values in `-127..=127` and an f32 scale; the
/// sum of each 16 values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Q8KActs {
    pub(crate) k: usize,
    /// `[rows, k]`.
    pub(crate) qs: Vec<i8>,
    /// `[rows, k / 256]`.
    pub(crate) d: Vec<f32>,
    /// `[rows, k / 16]`.
    pub(crate) bsums: Vec<i16>,
}

/// One row of [`Q8_0Acts`].
#[derive(Clone, Copy)]
pub(crate) struct Q8Row<'a> {
    pub(crate) qs: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) sums: &'a [i32],
}

/// One row of [`Q8KActs`].
#[derive(Clone, Copy)]
pub(crate) struct Q8KRow<'a> {
    pub(crate) qs: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) bsums: &'a [i16],
}

/// Checks that `x` is whole rows of `k`, `k` a non-zero multiple of `block`.
fn check(x: &[f32], k: usize, block: usize) -> Result<(), KernelError> {
    if k == 0 || !k.is_multiple_of(block) {
        return Err(KernelError::BadQuantized(format!("k = {k} must be a non-zero multiple of {block}")));
    }
    if !x.len().is_multiple_of(k) {
        return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: k });
    }
    Ok(())
}

/// Runs `blocks` over `x` (`[rows, k]`) and the matching parts of its outputs (one scale per
/// `block` values, one sum per `sum_every`), whole rows at a time: many rows are split over the
/// current rayon pool, a few done here. A row's values never depend on how rows are split.
fn split_rows<S: Send>(
    x: &[f32],
    k: usize,
    block: usize,
    sum_every: usize,
    (qs, d, sums): (&mut [i8], &mut [f32], &mut [S]),
    blocks: impl Fn(Chunk<'_, S>) + Sync + Send,
) {
    let per_task = ROWS_PER_TASK * k;
    if x.len() > per_task {
        x.par_chunks(per_task)
            .zip(qs.par_chunks_mut(per_task))
            .zip(d.par_chunks_mut(per_task / block))
            .zip(sums.par_chunks_mut(per_task / sum_every))
            .for_each(blocks);
    } else {
        blocks((((x, qs), d), sums));
    }
}

impl Q8_0Acts {
    /// Quantizes `x`, row-major `[rows, k]`, `k` a non-zero multiple of 32; many rows are
    /// split over the current rayon pool.
    pub fn quantize(x: &[f32], k: usize) -> Result<Self, KernelError> {
        check(x, k, QK8_0)?;
        let nb = x.len() / QK8_0;
        let mut a = Q8_0Acts { k, qs: vec![0; x.len()], d: vec![0.0; nb], sums: vec![0; nb] };
        let fast = crate::cpu::has_avx2_fma();
        split_rows(x, k, QK8_0, QK8_0, (&mut a.qs, &mut a.d, &mut a.sums), |(((x, q), d), s)| {
            quantize_q8_0_blocks(x, q, d, s, fast)
        });
        Ok(a)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.qs.len().checked_div(self.k).unwrap_or(0)
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The f32 values the quantized rows stand for (`q * d`), `[rows, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs.chunks_exact(QK8_0).zip(&self.d).flat_map(|(q, &d)| q.iter().map(move |&v| v as f32 * d)).collect()
    }

    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> Q8Row<'_> {
        let nb = self.k / QK8_0;
        Q8Row {
            qs: &self.qs[r * self.k..(r + 1) * self.k],
            d: &self.d[r * nb..(r + 1) * nb],
            sums: &self.sums[r * nb..(r + 1) * nb],
        }
    }
}

impl Q8KActs {
    /// Quantizes `x`, row-major `[rows, k]`, `k` a non-zero multiple of 256; many rows are
    /// split over the current rayon pool.
    pub fn quantize(x: &[f32], k: usize) -> Result<Self, KernelError> {
        check(x, k, QK_K)?;
        let nb = x.len() / QK_K;
        let mut a = Q8KActs { k, qs: vec![0; x.len()], d: vec![0.0; nb], bsums: vec![0; x.len() / 16] };
        let fast = crate::cpu::has_avx2_fma();
        split_rows(x, k, QK_K, 16, (&mut a.qs, &mut a.d, &mut a.bsums), |(((x, q), d), s)| {
            quantize_q8k_blocks(x, q, d, s, fast)
        });
        Ok(a)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.qs.len().checked_div(self.k).unwrap_or(0)
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The f32 values the quantized rows stand for (`q * d`), `[rows, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs.chunks_exact(QK_K).zip(&self.d).flat_map(|(q, &d)| q.iter().map(move |&v| v as f32 * d)).collect()
    }

    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> Q8KRow<'_> {
        let nb = self.k / QK_K;
        Q8KRow {
            qs: &self.qs[r * self.k..(r + 1) * self.k],
            d: &self.d[r * nb..(r + 1) * nb],
            bsums: &self.bsums[r * self.k / 16..(r + 1) * self.k / 16],
        }
    }
}

/// A layer's input, `[rows, k]` f32, with its quantizations made on first use and shared by
/// every matmul that reads it (q/k/v, gate/up, the experts of a MoE layer).
#[derive(Debug)]
pub struct LayerInput<'a> {
    x: &'a [f32],
    k: usize,
    q8_0: OnceLock<Q8_0Acts>,
    q8k: OnceLock<Q8KActs>,
}

impl<'a> LayerInput<'a> {
    /// Wraps `x`, row-major `[rows, k]`.
    pub fn new(x: &'a [f32], k: usize) -> Result<Self, KernelError> {
        if k == 0 || !x.len().is_multiple_of(k) {
            return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: k.max(1) });
        }
        Ok(LayerInput { x, k, q8_0: OnceLock::new(), q8k: OnceLock::new() })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.x.len() / self.k
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The f32 rows.
    pub fn values(&self) -> &'a [f32] {
        self.x
    }

    /// The rows in Q8_0 (quantized on the first call).
    pub fn q8_0(&self) -> Result<&Q8_0Acts, KernelError> {
        if let Some(a) = self.q8_0.get() {
            return Ok(a);
        }
        let a = Q8_0Acts::quantize(self.x, self.k)?;
        Ok(self.q8_0.get_or_init(|| a))
    }

    /// The rows in Q8_K (quantized on the first call).
    pub fn q8k(&self) -> Result<&Q8KActs, KernelError> {
        if let Some(a) = self.q8k.get() {
            return Ok(a);
        }
        let a = Q8KActs::quantize(self.x, self.k)?;
        Ok(self.q8k.get_or_init(|| a))
    }

    /// Quantizes now to `format` (so that parallel readers find it made).
    pub fn prepare(&self, format: ActFormat) -> Result<(), KernelError> {
        match format {
            ActFormat::Q8_0 => self.q8_0().map(|_| ()),
            ActFormat::Q8K => self.q8k().map(|_| ()),
        }
    }
}

/// Quantizes one block of 32 values as llama.cpp's AVX2 `quantize_row_q8_0`: `scale = max|x| /
/// 127`, values rounded to nearest (ties to even), in `-127..=127`. NaNs become 0; a block with
/// an infinity quantizes to zeros with an infinite scale.
pub fn quantize_block_q8_0(x: &[f32; QK8_0]) -> ([i8; QK8_0], f32) {
    let mut q = [0i8; QK8_0];
    let d = q8_0_block(x, &mut q);
    (q, d)
}

#[inline(always)]
fn q8_0_block(x: &[f32], q: &mut [i8]) -> f32 {
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

/// Quantizes one block of 256 values as llama.cpp's `quantize_row_q8_K_ref`: `iscale = -127 /
/// max` with `max` the (first) value of largest magnitude, values rounded to nearest (ties to
/// even), at most 127, `d = 1 / iscale`. NaNs are left out of the maximum and become 0.
#[inline(always)]
fn q8k_block(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    if amax == 0.0 {
        q.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (iscale * v).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    for (s, q) in bsums.iter_mut().zip(q.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}

fn quantize_q8_0_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32], fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` is only true where the CPU supports AVX2 and FMA.
        unsafe { q8_0_blocks_avx2(x, q, d, s) };
        return;
    }
    let _ = fast;
    q8_0_blocks(x, q, d, s);
}

#[inline(always)]
fn q8_0_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
    for (((x, q), d), s) in x.chunks_exact(QK8_0).zip(q.chunks_exact_mut(QK8_0)).zip(d).zip(s) {
        *d = q8_0_block(x, q);
        *s = q.iter().map(|&v| v as i32).sum();
    }
}

/// The same source compiled with AVX2 so that the compiler vectorizes it; the rounding and
/// arithmetic are IEEE-exact, so the values equal the portable build's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn q8_0_blocks_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
    q8_0_blocks(x, q, d, s)
}

fn quantize_q8k_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i16], fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` is only true where the CPU supports AVX2 and FMA.
        unsafe { q8k_blocks_avx2(x, q, d, s) };
        return;
    }
    let _ = fast;
    q8k_blocks(x, q, d, s);
}

#[inline(always)]
fn q8k_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i16]) {
    for (((x, q), d), s) in x.chunks_exact(QK_K).zip(q.chunks_exact_mut(QK_K)).zip(d).zip(s.chunks_exact_mut(16)) {
        *d = q8k_block(x, q, s);
    }
}

/// See [`q8_0_blocks_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn q8k_blocks_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i16]) {
    q8k_blocks(x, q, d, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_K follows llama.cpp: the value of largest magnitude maps to -127 (its sign flips with
    /// the scale's), ties round to even, and the sums of 16 match the values.
    #[test]
    fn q8k_rounds_as_llama_cpp() {
        let mut x = [0.0f32; QK_K];
        x[3] = 2.0;
        x[7] = -1.0; // -1 * -127 / 2 = 63.5: ties to even, 64
        x[9] = 0.5 * 2.0 / 127.0; // 0.5 after scaling... times -1: -0.5 rounds to -0
        let a = Q8KActs::quantize(&x, QK_K).unwrap();
        assert_eq!(a.qs[3], -127);
        assert_eq!(a.qs[7], 64);
        assert_eq!(a.qs[9], 0);
        assert_eq!(a.d[0], 1.0 / (-127.0 / 2.0));
        assert_eq!(a.bsums[0], -127 + 64);
        let back = a.dequantize();
        assert!((back[3] - 2.0).abs() < 1e-6 && (back[7] + 64.0 * 2.0 / 127.0).abs() < 1e-6);
    }

    /// A layer input quantizes each format once and gives the same rows as quantizing directly.
    #[test]
    fn layer_input_shares_one_quantization() {
        let x: Vec<f32> = (0..3 * 512).map(|i| (i as f32 * 0.37).sin()).collect();
        let input = LayerInput::new(&x, 512).unwrap();
        let first = input.q8k().unwrap() as *const Q8KActs;
        assert_eq!(first, input.q8k().unwrap() as *const Q8KActs);
        assert_eq!(*input.q8k().unwrap(), Q8KActs::quantize(&x, 512).unwrap());
        assert_eq!(*input.q8_0().unwrap(), Q8_0Acts::quantize(&x, 512).unwrap());
        assert!(LayerInput::new(&x, 500).is_err());
        assert!(Q8KActs::quantize(&x, 96).is_err());
    }
}
