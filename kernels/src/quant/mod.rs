//! Quantized matrix multiplication on the CPU: Q8_0 weights times f32 activations, and the
//! K-quant (Q4_K, Q6_K) experts of mixture-of-experts layers ([`KQuantMatrix`]).
//!
//! Other K-quant matrices run on candle's kernels: our earlier AVX2 ones were faster alone at
//! one row but slower in the model, and were removed (benches/README.md, "K-quant kernels";
//! the last commit that has them is 4fb5aed). The experts' kernel is AVX-512 VNNI, one call
//! per expert on the calling thread, with activations quantized once per layer.
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

use crate::cpu;

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod kquant;
mod matrix;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub use activations::{QuantizedRows, quantize_block_q8_0};
pub use kquant::{
    KQuant, KQuantMatrix, Q4_K_BLOCK_BYTES, Q6_K_BLOCK_BYTES, Q8KRows, QK_K, kquant_kernel_is_fast, swiglu,
};
pub use matrix::Q8_0Matrix;

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
            Q8Kernel::Avx2 => cpu::has_avx2_fma(),
            Q8Kernel::Vnni => cpu::has_vnni_256(),
        }
    }

    /// `Auto` resolved to a concrete kernel.
    fn resolve(self) -> Q8Kernel {
        match self {
            Q8Kernel::Auto if cpu::has_vnni_256() => Q8Kernel::Vnni,
            Q8Kernel::Auto if cpu::has_avx2_fma() => Q8Kernel::Avx2,
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
