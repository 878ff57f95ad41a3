//! Matmuls on radix-kernels' CPU kernels, wrapped for candle tensors, on the model's rayon pool:
//! quantized ones ([`QuantMatrix`]: every GGML type we have a dot product for, read in place
//! from the mapped file) and float ones ([`DenseMatrix`]: f32/f16/bf16), each row reduced in one
//! order whatever the batch. candle computes no matmul on the CPU but for quantized types we
//! have no kernel for (Q2_K, Q3_K, IQ*), which load with a note; it keeps the GPU path.
//!
//! An earlier attempt ran our K-quant kernels for decode only, beside candle's for prefill and
//! the head, and the model decoded 7% slower: two thread pools taking turns on two cores
//! (benches/README.md, "K-quant kernels"). Now one pool runs every product.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

use half::{bf16, f16};
use radix_kernels::dense::{DenseMatrix, DenseWeights};
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

/// `x @ W^T` on our dense kernel, shaped as `x` with its last dim `n_out`.
pub(crate) fn dense_forward(m: &DenseMatrix, x: &Tensor) -> Result<Tensor> {
    let (rows, dims) = host_rows(x, m.k(), m.n_out())?;
    dense_rows(m, &rows, dims)
}

/// `rows @ W^T` for f32 rows already on the host, shaped `dims`.
pub(crate) fn dense_rows(m: &DenseMatrix, rows: &[f32], dims: Vec<usize>) -> Result<Tensor> {
    let mut out = vec![0.0f32; rows.len() / m.k() * m.n_out()];
    m.matmul(rows, &mut out)?;
    Ok(Tensor::from_vec(out, dims, &Device::Cpu)?)
}

/// Our dense matrix for a float tensor of shape `[n_out, k]` on the CPU, kept in its type
/// (f16 and bf16 as stored, anything else as f32): candle's matmul gives a row other bits in a
/// batch of one or two rows than in a larger one (radix_kernels::dense).
pub(crate) fn dense_matrix(t: &Tensor) -> Result<Arc<DenseMatrix>> {
    let &[n_out, k] = t.dims() else {
        return Err(ModelError::Config(format!("a matrix of shape {:?}", t.dims())));
    };
    let t = t.to_device(&Device::Cpu)?.flatten_all()?;
    let weights = match t.dtype() {
        DType::F16 => DenseWeights::F16(t.to_vec1::<f16>()?),
        DType::BF16 => DenseWeights::BF16(t.to_vec1::<bf16>()?),
        _ => DenseWeights::F32(t.to_dtype(DType::F32)?.to_vec1::<f32>()?),
    };
    Ok(Arc::new(DenseMatrix::new(n_out, k, weights)?))
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
    let layout = match QuantMatrix::interleaving_wins() {
        true => "matmul weights repacked at load into 16-row groups from the mapped file",
        false => "weights read in place from the mapped file",
    };
    format!("quantized matmuls run on radix-kernels' {} kernels, {layout}", kernel.name())
}
