//! Hot kernels over the paged KV pool.
//!
//! The KV cache of one layer is an external paged pool described by a
//! [`PagedLayout`]: `num_pages * page_size` token slots, each holding
//! `[num_kv_heads, head_dim]` K (or V) values stored as a [`KvElement`] type
//! (`f32`, `f16`, `bf16`, or the block-quantized [`KvQ8_0`] and [`KvQ4_0`]; K and V may
//! differ). Sequences address their context through page
//! tables, so pages can be shared between sequences through the radix cache.
//!
//! - [`write_kv`] stores the new tokens' K/V rows into their slots.
//! - [`paged_attention`] runs causal attention of a batch that mixes decode
//!   tokens and prefill chunks over each sequence's paged context, on the CPU,
//!   in parallel on the current rayon pool.
//!
//! [`delta_net`] has the CPU kernels of Qwen3.5's Gated DeltaNet layers (causal convolution
//! and the gated delta rule over a per-sequence recurrent state); [`moe`] the routing rule of
//! mixture-of-experts layers. Each also has a plain-Rust model of its CUDA kernel
//! ([`delta_net::device_order`], [`moe::route_device_order`]), tested against the CPU path.
//!
//! With feature `cuda`, [`cuda::CudaAttentionBatch`] runs the same two operations on an NVIDIA
//! GPU over a pool held in GPU memory (our kernels in `cuda/*.cu`, compiled to PTX at build
//! time); [`cuda::delta_net`] the Gated DeltaNet over a state pool in GPU memory and
//! [`cuda::moe`] the routing and dense expert dispatch. Metal has no kernel of its own yet: radix-models runs attention there with candle
//! ops over a gathered context.
//!
//! ```
//! use radix_kernels::{paged_attention, write_kv, PagedLayout, SequenceAttention};
//!
//! let layout = PagedLayout { num_kv_heads: 1, head_dim: 2, page_size: 2, num_pages: 4 };
//! let mut k = vec![0.0f32; layout.layer_len()];
//! let mut v = vec![0.0f32; layout.layer_len()];
//! // Two tokens in page 3 (slots 6 and 7).
//! write_kv(&layout, &[1.0, 0.0, 0.0, 1.0], &[1.0, 2.0, 3.0, 4.0], &[6, 7], &mut k, &mut v)?;
//! let q = [0.0f32, 0.0];
//! let mut out = [0.0f32; 2];
//! let seq = SequenceAttention { query_start: 0, query_len: 1, context_len: 2, page_table: &[3] };
//! paged_attention(&layout, 1, 1.0, &q, &k, &v, &[seq], &mut out)?;
//! assert_eq!(out, [2.0, 3.0]); // equal weights: the mean of the two V rows
//! # Ok::<(), radix_kernels::KernelError>(())
//! ```

#![warn(missing_docs)]

mod attention;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod delta_net;
pub mod dense;
mod element;
mod error;
mod gpu_plan;
mod hadamard;
mod kv_quant;
mod layout;
pub mod moe;
pub mod quant;
mod vector;
mod write;

pub use attention::{SequenceAttention, paged_attention};
pub use cpu::{CPU_ISA_ENV, CpuIsa};
pub use element::{KvElement, kv_from_f32, kv_to_f32};
pub use error::KernelError;
pub use hadamard::{hadamard_rotate, k_rotation_block, v_rotation_block};
pub use kv_quant::{KV_BLOCK, KvQ4_0, KvQ8_0};
pub use layout::PagedLayout;
pub use write::write_kv;

/// Re-export of the `half` crate, whose `f16` and `bf16` implement [`KvElement`].
pub use half;
