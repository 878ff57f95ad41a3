//! Quantized matrix multiplication on the CPU, llama.cpp ggml-cpu style: one dot product per
//! weight type and instruction set, activations quantized once per layer input.
//!
//! - Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (against Q8_0 activations) and Q4_K, Q5_K, Q6_K
//!   (against Q8_K activations) ([`QuantType`]).
//! - Two layouts ([`Layout`]): the file's blocks read in place (a `&[u8]` borrowed from a
//!   memory map of the GGUF), or a copy repacked once at load in groups of sixteen rows
//!   (`interleaved.rs`, `interleaved_k.rs`), the same size, in which one `vpdpbusd` adds four
//!   products into each row's own lane: no horizontal reductions, about three times the
//!   in-place kernels' prefill speed (benches/README.md). The model loader repacks matmul
//!   weights wherever an x86 kernel runs ([`QuantMatrix::interleaving_wins`]) and releases the
//!   file's pages as it goes, so weights are resident once; embedding rows stay in place.
//! - Kernels ([`QuantKernel`]): portable Rust (any target), AVX2 + FMA + F16C, AVX2 with
//!   256-bit VNNI products, and AVX-512 BW + VNNI (16-row tiles). `RADIX_CPU_ISA` lowers the
//!   choice (`kernels/src/cpu.rs`); `RADIX_WEIGHT_LAYOUT=in-place` keeps the file's layout.
//! - [`LayerInput`] quantizes a layer's input at most once per activation format, for every
//!   matmul that reads it (q/k/v, gate/up, a MoE layer's experts).
//! - [`QuantMatrix`] multiplies on the *current* rayon pool (the model's), in tasks of (a tile
//!   of weight rows, a block of activation rows); [`QuantMatrix::matmul_rows`] takes the rows a
//!   MoE layer routes to one expert.
//!
//! **Batch invariance by construction.** Each output (weight row, activation row) is one f32
//! accumulator updated block by block, in order, by fused multiply-adds of exact integer sums
//! and the same scale products (`kernels/src/quant/portable.rs` spells it out). A kernel computes
//! eight or sixteen such outputs side by side, one per vector lane, and sums the integers however
//! it likes (they are exact), so every kernel, layout, tile shape, batch size and thread split
//! gives bitwise the same value: a decode step's row equals the same row in a 512-row prefill.
//!
//! ```
//! use radix_kernels::quant::{LayerInput, QuantMatrix, QuantType, WeightBytes};
//!
//! // Two Q8_0 rows over k = 32: all ones (scale 1/127 per unit), then all minus halves.
//! let mut bytes = Vec::new();
//! for (scale, q) in [(1.0f32 / 127.0, 127i8), (0.5 / 127.0, -127)] {
//!     bytes.extend_from_slice(&radix_kernels::half::f16::from_f32(scale).to_le_bytes());
//!     bytes.extend(std::iter::repeat_n(q as u8, 32));
//! }
//! let w = QuantMatrix::new(QuantType::Q8_0, 2, 32, WeightBytes::from_vec(bytes))?;
//! let x = vec![0.25f32; 32];
//! let mut out = [0.0f32; 2];
//! w.matmul(&LayerInput::new(&x, 32)?, &mut out)?;
//! // Scales are f16 and activations 8-bit, so the products are close, not exact.
//! assert!((out[0] - 8.0).abs() < 1e-2 && (out[1] + 4.0).abs() < 1e-2, "{out:?}");
//! # Ok::<(), radix_kernels::KernelError>(())
//! ```

mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocks;
mod interleaved;
mod interleaved_k;
#[cfg(target_arch = "x86_64")]
mod interleaved_k_x86;
#[cfg(target_arch = "x86_64")]
mod interleaved_x86;
mod kernel;
mod matrix;
mod portable;

pub use acts::{LayerInput, Q8_0Acts, Q8KActs, quantize_block_q8_0};
pub use blocks::{ActFormat, Q8_0_BLOCK_BYTES, QK_K, QK8_0, QuantType};
pub use kernel::QuantKernel;
pub use matrix::{Layout, QuantMatrix, Split, WEIGHT_LAYOUT_ENV, WeightBytes};

/// `gate[i] = silu(gate[i]) * up[i]`: the SwiGLU of an MLP's two projections, with the
/// vectorizing `exp` of the attention kernels (a few ulp from libm's; the same bits on every
/// path, since the body is the same IEEE operations).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up projections of different sizes");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        unsafe { swiglu_avx2(gate, up) };
        return;
    }
    swiglu_portable(gate, up);
}

/// [`swiglu`] compiled for AVX2 so that the portable body vectorizes 8 wide.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    swiglu_portable(gate, up)
}

#[inline(always)]
fn swiglu_portable(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + crate::vector::exp_approx(-*g)) * u;
    }
}
