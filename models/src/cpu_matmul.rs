//! Quantized matmuls on radix-kernels' CPU kernels, wrapped for candle tensors (Q8_0).
//!
//! Q4_K and Q6_K stay on candle's kernels for now. Ours beat them one matrix at a time at one
//! activation row (`matmul-bench --m 1 --formats q4_k,q6_k`: 1.0-1.2x for Q4_K, 1.8-1.9x for
//! Q6_K, but 0.47x for the 151,936-row output head), yet used for decode only, next to candle's
//! for prefill and the head, the model decoded 7% slower (37.1-37.5 against 39.9-40.2 tok/s,
//! Qwen3-0.6B-shaped Q4_K_M at depth 512, A/B in one session): two thread pools taking turns on
//! two cores cost more than the kernels gain (benches/README.md, "K-quant kernels").

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use radix_kernels::KernelError;
use radix_kernels::quant::Q8_0Matrix;

use crate::error::{ModelError, Result};

/// `x @ W^T` for `x` of shape `[..., k]` through a host kernel `matmul(x, out)` for a
/// `[n_out, k]` matrix, on the current rayon pool.
pub(crate) fn host_forward(
    x: &Tensor,
    k: usize,
    n_out: usize,
    matmul: impl FnOnce(&[f32], &mut [f32]) -> std::result::Result<(), KernelError>,
) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    match dims.last_mut() {
        Some(last) if *last == k => *last = n_out,
        _ => return Err(ModelError::Config(format!("input of shape {dims:?} for a [{n_out}, {k}] matrix"))),
    }
    let x = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut out = vec![0.0f32; x.len() / k * n_out];
    matmul(&x, &mut out)?;
    Ok(Tensor::from_vec(out, dims, &Device::Cpu)?)
}

/// Our Q8_0 matrix for a Q8_0 tensor of shape `[n_out, k]`; `None` for other types.
pub(crate) fn q8_0_matrix(q: &QTensor, notes: &mut Vec<String>) -> Result<Option<Arc<Q8_0Matrix>>> {
    let &[n_out, k] = q.shape().dims() else { return Ok(None) };
    if q.dtype() != GgmlDType::Q8_0 {
        return Ok(None);
    }
    let note = "Q8_0 matmuls run on radix-kernels' int8 kernel";
    if !notes.iter().any(|n| n == note) {
        notes.push(note.to_owned());
    }
    Ok(Some(Arc::new(Q8_0Matrix::from_ggml_bytes(n_out, k, &q.data()?)?)))
}
