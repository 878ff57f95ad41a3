//! A linear layer, `x @ W^T (+ b)`, on whichever kernel suits its matrix and device: our int8
//! kernel for Q8_0 and our batch-invariant float kernel for dense matrices on the CPU, candle's
//! for other quantized types, cuBLAS in the matrix's own 16-bit type on a GPU. Projections that share an input (q/k/v, gate/up) can
//! share one quantization of it ([`Linear::forward_shared`]).

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};
use radix_kernels::dense::DenseMatrix;
use radix_kernels::quant::Q8_0Matrix;

use crate::cpu_matmul::host_forward;
use crate::error::Result;

/// A linear layer: `x @ W^T (+ b)`, W dense or quantized.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

/// The matrix of a [`Linear`], and whose kernel multiplies by it.
#[derive(Debug, Clone)]
pub(crate) enum Weight {
    /// candle's `QMatMul`: quantized types other than Q8_0 (and dense weights in tests).
    Candle(QMatMul),
    /// A float matrix on the CPU on radix-kernels' dense kernel, whose rows never depend on
    /// the batch.
    Float(Arc<DenseMatrix>),
    /// Q8_0 on radix-kernels' int8 kernel, which is faster than candle's on the CPU for any
    /// inner size (candle's fast path needs multiples of 256) and runs on the model's pool.
    Q8_0(Arc<Q8_0Matrix>),
    /// A dense matrix kept in its own type (bf16/f16 on a GPU): f32 inputs are cast to it for
    /// the matmul (cuBLAS) and the result back to f32.
    Dense(Tensor),
}

impl Linear {
    /// A layer without a bias.
    pub(crate) fn new(weight: Weight) -> Self {
        Linear { weight, bias: None }
    }

    /// The layer with `bias` (`[out]` f32 on the matrix's device) added to every output row.
    pub(crate) fn with_bias(self, bias: Option<Tensor>) -> Self {
        Linear { bias, ..self }
    }

    /// Applies the layer to `[rows, in]`, giving `[rows, out]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            Weight::Candle(m) => m.forward(x)?,
            Weight::Q8_0(m) => host_forward(x, m.k(), m.n_out(), |x, out| m.matmul(x, out))?,
            Weight::Float(m) => host_forward(x, m.k(), m.n_out(), |x, out| m.matmul(x, out))?,
            Weight::Dense(w) => x.to_dtype(w.dtype())?.matmul(&w.t()?)?.to_dtype(DType::F32)?,
        };
        self.add_bias(y)
    }

    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Applies several layers to the same input, as [`forward`](Self::forward) each. Quantized
    /// matrices of one type on the CPU share one quantization of `x` to 8 bits and one
    /// parallel region (candle's fused path, where its CPU kernels have one): q/k/v and
    /// gate/up each quantized their common input again and synchronised the pool once per
    /// matrix.
    pub(crate) fn forward_shared(layers: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        let mut out: Vec<Option<Tensor>> = vec![None; layers.len()];
        for (i, layer) in layers.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            let Some(dtype) = layer.candle_qtensor().map(|t| t.dtype()) else {
                out[i] = Some(layer.forward(x)?);
                continue;
            };
            // Every not yet computed layer whose matrix has this quantized type.
            let group: Vec<usize> = (i..layers.len())
                .filter(|&j| out[j].is_none() && layers[j].candle_qtensor().is_some_and(|t| t.dtype() == dtype))
                .collect();
            let fused = if group.len() > 1 {
                let tensors: Vec<&QTensor> = group.iter().filter_map(|&j| layers[j].candle_qtensor()).collect();
                QTensor::gemv_fused_shared_lhs(&tensors, x)?
            } else {
                None
            };
            match fused {
                Some(ys) => {
                    for (&j, y) in group.iter().zip(ys) {
                        out[j] = Some(layers[j].add_bias(y)?);
                    }
                }
                None => {
                    for &j in &group {
                        out[j] = Some(layers[j].forward(x)?);
                    }
                }
            }
        }
        Ok(out.into_iter().map(|y| y.expect("every layer computed")).collect())
    }

    /// The quantized tensor of a matrix on candle's quantized kernels.
    pub(crate) fn candle_qtensor(&self) -> Option<&QTensor> {
        match &self.weight {
            Weight::Candle(QMatMul::QTensor(t)) => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use candle_core::quantized::GgmlDType;

    use super::*;

    /// A `[n, k]` matrix of `dtype` quantized from a smooth pattern.
    fn quantized(n: usize, k: usize, dtype: GgmlDType, seed: f32) -> Linear {
        let w: Vec<f32> = (0..n * k).map(|i| ((i as f32 * 0.37 + seed).sin()) * 0.1).collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, dtype).unwrap();
        Linear::new(Weight::Candle(QMatMul::from_qtensor(q).unwrap()))
    }

    /// `forward_shared` gives each layer exactly its own `forward`, whichever matrices share
    /// candle's fused path (same quantized type, shapes its x86 kernels take), with biases,
    /// mixed types and one row (decode) or many (prefill).
    #[test]
    fn shared_input_projections_equal_separate_ones() {
        let k = 512;
        let mut q = quantized(256, k, GgmlDType::Q4K, 0.0);
        q.bias =
            Some(Tensor::from_vec((0..256).map(|i| i as f32 * 0.01).collect::<Vec<_>>(), 256, &Device::Cpu).unwrap());
        let kproj = quantized(128, k, GgmlDType::Q4K, 1.0);
        let v = quantized(128, k, GgmlDType::Q6K, 2.0);
        let dense = Linear::new(Weight::Candle(QMatMul::Tensor(
            Tensor::from_vec((0..64 * k).map(|i| (i as f32 * 0.11).cos()).collect::<Vec<_>>(), (64, k), &Device::Cpu)
                .unwrap(),
        )));
        let layers = [&q, &kproj, &v, &dense];
        for rows in [1, 7, 40] {
            let x: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 0.73).sin()).collect();
            let x = Tensor::from_vec(x, (rows, k), &Device::Cpu).unwrap();
            let shared = Linear::forward_shared(&layers, &x).unwrap();
            assert_eq!(shared.len(), layers.len());
            for (i, (layer, got)) in layers.iter().zip(&shared).enumerate() {
                let want = layer.forward(&x).unwrap();
                assert_eq!(got.dims(), want.dims(), "layer {i}, {rows} rows");
                let (got, want) = (got.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
                assert_eq!(got, want, "layer {i}, {rows} rows");
            }
        }
    }
}
