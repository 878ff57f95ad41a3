//! Random weights of a model's shape, for speed measurements of shapes no file here has (a
//! Qwen3-8B-shaped model on a GPU, say): made in memory on the target device instead of
//! written to and read back from a multi-gigabyte file. The outputs are meaningless; the work per
//! token is the real model's. Each tensor is made in the shape the layer asking for it expects.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor, ggml_file};
use candle_core::{DType, Device, Tensor};
use half::f16;
use radix_kernels::quant::{QuantMatrix, QuantType, WeightBytes};
use rayon::prelude::*;

use super::{Embedded, Target, TensorName, WeightSource};
use crate::config::ModelConfig;
use crate::cpu_matmul::dense_matrix;
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, Linear, Weight};
use crate::rng::SplitMix64;

/// The type of the random matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomFormat {
    /// Dense bf16 (the unquantized checkpoint's type).
    BF16,
    /// llama.cpp's Q4_K (4.5 bits per weight): radix-kernels' kernels on the CPU, candle's on a
    /// GPU.
    Q4K,
}

/// Bytes of one Q4_K block of 256 weights: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins,
/// 128 bytes of 4-bit values.
const Q4K_BLOCK_BYTES: usize = 144;

/// A model's worth of random weights, made tensor by tensor as the loader asks.
#[derive(Debug, Clone)]
pub struct RandomWeights {
    config: ModelConfig,
    format: RandomFormat,
    seed: u64,
}

impl RandomWeights {
    /// Weights of `config`'s shape in `format`; the same seed gives the same weights.
    pub fn new(config: ModelConfig, format: RandomFormat, seed: u64) -> Result<Self> {
        if format == RandomFormat::Q4K {
            let inner = [config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim];
            if let Some(k) = inner.iter().find(|k| !k.is_multiple_of(256)) {
                return Err(ModelError::Config(format!("Q4_K needs inner sizes that are multiples of 256, not {k}")));
            }
        }
        Ok(RandomWeights { config, format, seed })
    }

    pub(crate) fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Random bf16 values, normal with standard deviation 0.02.
    fn bf16(&self, shape: &[usize], device: &Device) -> Result<Tensor> {
        Ok(Tensor::randn(0f32, 0.02, shape, device)?.to_dtype(DType::BF16)?)
    }

    /// Random Q4_K blocks: uniform 6-bit scales and mins and 4-bit values, with `dmin = 7.5 d`
    /// so that weights centre on zero.
    fn q4k_bytes(&self, name: &TensorName, shape: &[usize]) -> Vec<u8> {
        let blocks = shape.iter().product::<usize>() / 256;
        let mut bytes = vec![0u8; blocks * Q4K_BLOCK_BYTES];
        let seed = self.seed
            ^ name.gguf().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        let (d, dmin) = (f16::from_f32(1e-4).to_le_bytes(), f16::from_f32(7.5e-4).to_le_bytes());
        bytes.par_chunks_mut(Q4K_BLOCK_BYTES * 1024).enumerate().for_each(|(chunk, out)| {
            let mut rng = SplitMix64::new(seed ^ (chunk as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            for block in out.chunks_exact_mut(Q4K_BLOCK_BYTES) {
                for word in block[4..].chunks_mut(8) {
                    let r = rng.next_u64().to_le_bytes();
                    word.copy_from_slice(&r[..word.len()]);
                }
                block[..2].copy_from_slice(&d);
                block[2..4].copy_from_slice(&dmin);
            }
        });
        bytes
    }

    /// Random Q4_K blocks as candle's tensor.
    fn q4k(&self, name: &TensorName, shape: &[usize], device: &Device) -> Result<QTensor> {
        Ok(ggml_file::qtensor_from_ggml(GgmlDType::Q4K, &self.q4k_bytes(name, shape), shape.to_vec(), device)?)
    }

    /// Random Q4_K blocks as a matrix on our CPU kernels.
    fn q4k_matrix(&self, name: &TensorName, shape: [usize; 2]) -> Result<Arc<QuantMatrix>> {
        let bytes = WeightBytes::from_vec(self.q4k_bytes(name, &shape));
        Ok(Arc::new(QuantMatrix::new(QuantType::Q4_K, shape[0], shape[1], bytes)?))
    }
}

impl WeightSource for RandomWeights {
    /// Made-up weights have exactly what a model of the config has.
    fn contains(&self, _name: &TensorName, expected: bool) -> bool {
        expected
    }

    /// Norm weights are ones (so activations keep their scale through the layers); biases small.
    fn tensor(&self, name: &TensorName, shape: &[usize], device: &Device) -> Result<Tensor> {
        if name.gguf().ends_with(".bias") {
            return Ok(Tensor::randn(0f32, 0.02, shape, device)?);
        }
        Ok(Tensor::ones(shape, DType::F32, device)?)
    }

    fn matrix(&self, name: &TensorName, shape: [usize; 2], to: &mut Target) -> Result<Weight> {
        Ok(match self.format {
            RandomFormat::BF16 if to.device.is_cpu() => Weight::Float(dense_matrix(&self.bf16(&shape, &to.device)?)?),
            RandomFormat::BF16 => Weight::Dense(self.bf16(&shape, &to.device)?),
            RandomFormat::Q4K if to.device.is_cpu() => Weight::Quant(self.q4k_matrix(name, shape)?),
            RandomFormat::Q4K => Weight::Candle(QMatMul::from_qtensor(self.q4k(name, &shape, &to.device)?)?),
        })
    }

    fn embedding(&self, name: &TensorName, shape: [usize; 2], tied: bool, to: &mut Target) -> Result<Embedded> {
        match self.format {
            RandomFormat::BF16 if to.device.is_cpu() => {
                Ok(Embedded::float(dense_matrix(&self.bf16(&shape, &to.device)?)?, tied))
            }
            RandomFormat::BF16 => Ok(Embedded::dense(self.bf16(&shape, &to.device)?, tied, Weight::Dense)),
            RandomFormat::Q4K if to.device.is_cpu() => {
                let m = self.q4k_matrix(name, shape)?;
                let tied_head = tied.then(|| Linear::new(Weight::Quant(Arc::clone(&m))));
                Ok(Embedded { embedding: Embedding::Quant(m), tied_head })
            }
            RandomFormat::Q4K => Embedded::quantized(self.q4k(name, &shape, &to.device)?, tied),
        }
    }
}
