//! Quantized matmuls on radix-kernels' CPU kernels, wrapped for candle tensors (Q8_0).
//!
//! Q4_K and Q6_K stay on candle's kernels for now. Ours beat them one matrix at a time at one
//! activation row (`matmul-bench --m 1 --formats q4_k,q6_k`: 1.0-1.2x for Q4_K, 1.8-1.9x for
//! Q6_K, but 0.47x for the 151,936-row output head), yet used for decode only, next to candle's
//! for prefill and the head, the model decoded 7% slower (37.1-37.5 against 39.9-40.2 tok/s,
//! Qwen3-0.6B-shaped Q4_K_M at depth 512, A/B in one session): two thread pools taking turns on
//! two cores cost more than the kernels gain (benches/README.md, "K-quant kernels").

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use radix_kernels::KernelError;
use radix_kernels::dense::{DenseMatrix, DenseWeights};
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

/// Bytes of one Q8_0 block: an f16 scale and 32 signed 8-bit values.
const Q8_0_BLOCK: usize = 34;

/// Writes one block's 32 values as signed integers.
type UnpackBlock = fn(&[u8], &mut [i8; 32]);

/// The same matrix as Q8_0, exactly, for types whose values are a per-block f16 scale times a
/// small signed integer: Q4_0 (`d * (q - 8)`, `q` in 0..16) and Q5_0 (`d * (q - 16)`, `q` in
/// 0..32). The integers fit in 8 bits, so the Q8_0 copy holds bitwise the same values and our
/// int8 kernel runs it (candle's CPU kernels for these types are scalar or untiled: a Q4_0
/// Qwen3-0.6B-shaped model prefilled 48 tok/s against llama.cpp's 495). `None` for other types.
pub(crate) fn exact_q8_0(q: &QTensor) -> Result<Option<QTensor>> {
    let (block, unpack): (usize, UnpackBlock) = match q.dtype() {
        GgmlDType::Q4_0 => (18, unpack_q4_0),
        GgmlDType::Q5_0 => (22, unpack_q5_0),
        _ => return Ok(None),
    };
    let data = q.data()?;
    if data.len() % block != 0 {
        return Err(ModelError::Config(format!("{:?} data of {} bytes is not whole blocks", q.dtype(), data.len())));
    }
    let mut out = Vec::with_capacity(data.len() / block * Q8_0_BLOCK);
    let mut values = [0i8; 32];
    for src in data.chunks_exact(block) {
        unpack(src, &mut values);
        out.extend_from_slice(&src[..2]); // the f16 scale, unchanged
        out.extend(values.iter().map(|&v| v as u8));
    }
    let storage = QStorage::from_data(Cow::Owned(out), &Device::Cpu, GgmlDType::Q8_0)?;
    Ok(Some(QTensor::new(storage, q.shape().clone())?))
}

/// A Q4_0 block (`d`, 16 bytes of nibbles: element `j` is the low nibble of byte `j`, element
/// `j + 16` the high one) as its signed values `q - 8`.
fn unpack_q4_0(block: &[u8], out: &mut [i8; 32]) {
    let qs = &block[2..18];
    for (j, &b) in qs.iter().enumerate() {
        out[j] = (b & 0x0F) as i8 - 8;
        out[j + 16] = (b >> 4) as i8 - 8;
    }
}

/// A Q5_0 block (`d`, 4 bytes of high bits as a little-endian u32, 16 bytes of low nibbles
/// laid out as Q4_0's) as its signed values `q - 16`.
fn unpack_q5_0(block: &[u8], out: &mut [i8; 32]) {
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let qs = &block[6..22];
    for (j, &b) in qs.iter().enumerate() {
        let lo = (b & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        let hi = (b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        out[j] = lo as i8 - 16;
        out[j + 16] = hi as i8 - 16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q4_0 and Q5_0 matrices become Q8_0 ones holding exactly the same values.
    #[test]
    fn q4_0_and_q5_0_become_the_same_q8_0_values() {
        let (n, k) = (7, 96);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.61).sin() * (1.0 + (i % 13) as f32)).collect();
        let w = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q5_0] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let exact = exact_q8_0(&q).unwrap().expect("converted");
            assert_eq!(exact.dtype(), GgmlDType::Q8_0);
            assert_eq!(exact.shape().dims(), &[n, k]);
            let want = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let got = exact.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(got, want, "{dtype:?}");
        }
        let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        assert!(exact_q8_0(&q8).unwrap().is_none());
    }
}
