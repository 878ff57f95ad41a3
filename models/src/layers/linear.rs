//! A linear layer, `x @ W^T (+ b)`, on whichever kernel suits its matrix and device: on the CPU
//! radix-kernels' kernels, quantized ones for every GGML type they cover (weights in place) and
//! the float one for dense matrices, both batch-invariant, with candle's matmul only for
//! quantized types we have no kernel for; on a GPU candle's quantized kernels, or cuBLAS in the
//! matrix's own 16-bit type. Projections that share an input (q/k/v, gate/up) share one
//! quantization of it ([`Linear::forward_shared`]).

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};
use radix_kernels::dense::DenseMatrix;
use radix_kernels::quant::{LayerInput, QuantMatrix};

use crate::cpu_matmul::{dense_forward, dense_rows, host_rows, quant_forward};
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
    /// candle's `QMatMul`: quantized matrices on a GPU, quantized types radix-kernels has no
    /// kernel for (and dense weights in tests).
    Candle(QMatMul),
    /// A float matrix on the CPU on radix-kernels' dense kernel, whose rows never depend on
    /// the batch.
    Float(Arc<DenseMatrix>),
    /// A quantized matrix on radix-kernels' CPU kernels, read in place (from the memory map of
    /// the model file), on the model's pool.
    Quant(Arc<QuantMatrix>),
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
            Weight::Quant(m) => {
                let (rows, dims) = host_rows(x, m.k(), m.n_out())?;
                quant_forward(m, &LayerInput::new(&rows, m.k())?, dims)?
            }
            Weight::Float(m) => dense_forward(m, x)?,
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

    /// Applies several layers to the same input, as [`forward`](Self::forward) each. The
    /// matrices on our kernels share one quantization of `x` per activation format (q/k/v and
    /// gate/up quantized their common input once per matrix before); candle's quantized
    /// matrices of one type share candle's fused path where it has one (GPUs).
    pub(crate) fn forward_shared(layers: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        let mut out: Vec<Option<Tensor>> = vec![None; layers.len()];
        // Matrices on our kernels read one f32 copy of `x`, and the quantized ones one
        // quantization of it.
        let host: Vec<usize> =
            (0..layers.len()).filter(|&i| matches!(layers[i].weight, Weight::Quant(_) | Weight::Float(_))).collect();
        if let Some(&first) = host.first() {
            let k = match &layers[first].weight {
                Weight::Quant(m) => m.k(),
                Weight::Float(m) => m.k(),
                _ => unreachable!("host layers are Quant or Float"),
            };
            let (rows, mut dims) = host_rows(x, k, k)?;
            let mut input = None;
            for &i in &host {
                let y = match &layers[i].weight {
                    Weight::Quant(m) => {
                        *dims.last_mut().expect("at least one dim") = m.n_out();
                        let input = match &mut input {
                            Some(input) => input,
                            None => input.insert(LayerInput::new(&rows, k)?),
                        };
                        quant_forward(m, input, dims.clone())?
                    }
                    Weight::Float(m) => {
                        *dims.last_mut().expect("at least one dim") = m.n_out();
                        dense_rows(m, &rows, dims.clone())?
                    }
                    _ => unreachable!("host layers are Quant or Float"),
                };
                out[i] = Some(layers[i].add_bias(y)?);
            }
        }
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

    /// The matrix on our quantized kernels, if it is one.
    pub(crate) fn quant_matrix(&self) -> Option<&Arc<QuantMatrix>> {
        match &self.weight {
            Weight::Quant(m) => Some(m),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use candle_core::quantized::GgmlDType;
    use radix_kernels::quant::WeightBytes;

    use super::*;
    use crate::cpu_matmul::quant_type;

    /// A `[n, k]` matrix of `dtype` quantized from a smooth pattern, on our kernels.
    fn quantized(n: usize, k: usize, dtype: GgmlDType, seed: f32) -> Linear {
        let w: Vec<f32> = (0..n * k).map(|i| ((i as f32 * 0.37 + seed).sin()) * 0.1).collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, dtype).unwrap();
        let bytes = WeightBytes::from_vec(q.data().unwrap().into_owned());
        let m = QuantMatrix::new(quant_type(dtype).unwrap(), n, k, bytes).unwrap();
        Linear::new(Weight::Quant(Arc::new(m)))
    }

    /// `forward_shared` gives each layer exactly its own `forward`, whatever mix of types
    /// (two activation formats), biases and dense matrices shares the input, for one row
    /// (decode) or many (prefill).
    #[test]
    fn shared_input_projections_equal_separate_ones() {
        let k = 512;
        let mut q = quantized(256, k, GgmlDType::Q4K, 0.0);
        q.bias =
            Some(Tensor::from_vec((0..256).map(|i| i as f32 * 0.01).collect::<Vec<_>>(), 256, &Device::Cpu).unwrap());
        let kproj = quantized(128, k, GgmlDType::Q5_0, 1.0);
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
