//! Quantized matmuls on radix-kernels' CPU kernels ([`QuantMatrix`]: every GGML type we have a
//! dot product for, read in place from the mapped file), wrapped for candle tensors, on the
//! model's rayon pool. candle computes no quantized matmul on the CPU: it keeps the GPU path,
//! dense float matrices, and quantized types we have no kernel for (Q2_K, Q3_K, IQ*), which
//! load with a note.
//!
//! An earlier attempt ran our K-quant kernels for decode only, beside candle's for prefill and
//! the head, and the model decoded 7% slower: two thread pools taking turns on two cores
//! (benches/README.md, "K-quant kernels"). Now one pool runs every product.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use radix_kernels::quant::{LayerInput, QuantMatrix, QuantType};

use crate::error::{ModelError, Result};

/// The flattened f32 rows of `x` (`[..., k]`) and the dims of `x @ W^T` for `n_out` outputs.
pub(crate) fn host_rows(x: &Tensor, k: usize, n_out: usize) -> Result<(Vec<f32>, Vec<usize>)> {
    let mut dims = x.dims().to_vec();
    match dims.last_mut() {
        Some(last) if *last == k => *last = n_out,
        _ => return Err(ModelError::Config(format!("input of shape {dims:?} for a [{n_out}, {k}] matrix"))),
    }
    Ok((x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?, dims))
}

/// `x @ W^T` for one input already quantized as `input`, shaped `dims`.
pub(crate) fn quant_forward(m: &QuantMatrix, input: &LayerInput, dims: Vec<usize>) -> Result<Tensor> {
    let mut out = vec![0.0f32; input.rows() * m.n_out()];
    m.matmul(input, &mut out)?;
    Ok(Tensor::from_vec(out, dims, &Device::Cpu)?)
}

/// Our type for a GGML type, if we have a kernel for it.
pub(crate) fn quant_type(dtype: GgmlDType) -> Option<QuantType> {
    Some(match dtype {
        GgmlDType::Q4_0 => QuantType::Q4_0,
        GgmlDType::Q4_1 => QuantType::Q4_1,
        GgmlDType::Q5_0 => QuantType::Q5_0,
        GgmlDType::Q5_1 => QuantType::Q5_1,
        GgmlDType::Q8_0 => QuantType::Q8_0,
        GgmlDType::Q4K => QuantType::Q4_K,
        GgmlDType::Q5K => QuantType::Q5_K,
        GgmlDType::Q6K => QuantType::Q6_K,
        _ => return None,
    })
}

/// The load note naming the kernels the quantized matmuls run on.
pub(crate) fn kernel_note() -> String {
    let kernel = radix_kernels::quant::QuantKernel::Auto.resolve();
    format!(
        "quantized matmuls run on radix-kernels' {} kernels, weights read in place from the mapped file",
        kernel.name()
    )
}
