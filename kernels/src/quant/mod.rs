//! Quantized matrix multiplication on the CPU: Q8_0 weights times f32 activations.
//!
//! [`Q4KMatrix`] and [`Q6KMatrix`] do the same for GGML's Q4_K and Q6_K weights (activations
//! quantized to Q8_K, [`Q8KRows`]; inner dimension a multiple of 256). They are not wired into
//! the model yet: candle 0.11.1 has its own repacked K-quant kernels, whose AVX-512 tier is
//! still faster at prefill (see `matmul-bench --formats q4_k,q6_k`).
//!
//! [`Q8_0Matrix`] holds a weight matrix `[n_out, k]` in GGML's Q8_0 format (blocks of 32
//! int8 values sharing one scale), repacked at load so that one pass over an activation row
//! serves eight weight rows. [`Q8_0Matrix::matmul`] computes `out = x @ W^T` the way
//! llama.cpp does: every activation row is quantized to Q8_0 once ([`quantize_block_q8_0`]),
//! then each block contributes `(sum of int8 products) * scale_w * scale_x` to an f32
//! accumulator.
//!
//! - The integer sums are exact, and every path accumulates the blocks of one output in the
//!   same order with fused multiply-adds, so the AVX2 path and the portable one give bitwise
//!   equal results, and so does any number of threads.
//! - Work is split over tiles of (weight rows x activation rows) on the *current* rayon pool
//!   (the caller owns a pool and calls `pool.install`), so a weight tile stays in cache while
//!   a block of activation rows streams past it during prefill, and decode (one row) is
//!   spread over output rows.
//!
//! ```
//! use radix_kernels::quant::Q8_0Matrix;
//!
//! // Two output rows over k = 32.
//! let w: Vec<f32> = (0..64).map(|i| if i < 32 { 1.0 } else { -0.5 }).collect();
//! let m = Q8_0Matrix::quantize(2, 32, &w)?;
//! let x = vec![0.25f32; 32];
//! let mut out = [0.0f32; 2];
//! m.matmul(&x, &mut out)?;
//! // Weight scales are stored as f16 (as in GGUF), so the products are close, not exact.
//! assert!((out[0] - 8.0).abs() < 1e-3 && (out[1] + 4.0).abs() < 1e-3, "{out:?}");
//! # Ok::<(), radix_kernels::KernelError>(())
//! ```

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod kquant;
mod matrix;
mod q4_k;
mod q6_k;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub use activations::{QuantizedRows, quantize_block_q8_0};
pub use kquant::{Q8KRows, QK_K};
pub use matrix::Q8_0Matrix;
pub use q4_k::{Q4_K_BLOCK_BYTES, Q4KMatrix};
pub use q6_k::{Q6_K_BLOCK_BYTES, Q6KMatrix};

/// Checks that `row` names one of `n_out` rows and that `out` holds `k` values: the arguments
/// of every matrix's `dequantize_row`.
fn check_row(n_out: usize, k: usize, row: usize, out: &[f32]) -> Result<(), crate::KernelError> {
    if row >= n_out {
        return Err(crate::KernelError::BadQuantized(format!("row {row} of a matrix with {n_out} rows")));
    }
    if out.len() != k {
        return Err(crate::KernelError::LengthMismatch { what: "row out", expected: k, actual: out.len() });
    }
    Ok(())
}

/// The whole `[n_out, k]` matrix in f32, row by row through a matrix's `dequantize_row`.
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

/// Values per Q8_0 block.
pub const QK8_0: usize = 32;

/// Bytes per GGML Q8_0 block: an f16 scale, then 32 int8 values.
pub const Q8_0_BLOCK_BYTES: usize = 2 + QK8_0;

/// Which implementation of the inner loop a matmul uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Kernel {
    /// The fastest one this CPU supports.
    Auto,
    /// Portable Rust, correct everywhere.
    Scalar,
    /// x86_64 AVX2 + FMA.
    Avx2,
    /// x86_64 AVX2 + FMA with 8-bit dot products (AVX-VNNI, or AVX-512 VNNI on 256-bit
    /// vectors).
    Vnni,
}

impl Q8Kernel {
    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Q8Kernel::Auto | Q8Kernel::Scalar => true,
            Q8Kernel::Avx2 => has_avx2_fma(),
            Q8Kernel::Vnni => has_vnni(),
        }
    }

    /// `Auto` resolved to a concrete kernel.
    fn resolve(self) -> Q8Kernel {
        match self {
            Q8Kernel::Auto if has_vnni() => Q8Kernel::Vnni,
            Q8Kernel::Auto if has_avx2_fma() => Q8Kernel::Avx2,
            Q8Kernel::Auto => Q8Kernel::Scalar,
            other => other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Q8Kernel::Auto => "auto",
            Q8Kernel::Scalar => "scalar",
            Q8Kernel::Avx2 => "avx2",
            Q8Kernel::Vnni => "vnni",
        }
    }
}

/// Whether the CPU supports AVX2 and FMA (cached by `std`).
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx2") && has!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU supports AVX2, FMA and a 256-bit VNNI encoding (cached by `std`).
fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma() && vnni::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
