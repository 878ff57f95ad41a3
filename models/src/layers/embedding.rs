//! The token embedding: a table lookup, with quantized rows dequantized only for the tokens
//! looked up (a tied output head multiplies by the same matrix, so it is kept once: on the CPU
//! the file's own blocks, read in place).

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};
use radix_kernels::dense::DenseMatrix;
use radix_kernels::quant::QuantMatrix;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// A `[vocab, hidden]` embedding matrix in the form its source and device keep it.
#[derive(Debug, Clone)]
pub(crate) enum Embedding {
    /// A dense matrix.
    Dense(Tensor),
    /// A quantized matrix on candle's kernels (a GPU, or a type we have no kernel for).
    Quantized(Arc<QTensor>),
    /// A quantized matrix read in place, shared with a tied output head on our kernels.
    Quant(Arc<QuantMatrix>),
    /// A float matrix on the CPU, shared with the tied output head on our dense kernel.
    Float(Arc<DenseMatrix>),
}

impl Embedding {
    /// Looks up token ids, giving `[ids, hidden]` f32.
    pub(crate) fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Embedding::Dense(w) => w.index_select(ids, 0)?.to_dtype(DType::F32)?,
            Embedding::Quantized(q) => q.embedding(ids)?.to_dtype(DType::F32)?,
            Embedding::Quant(m) => lookup(ids, m.k(), |id, row| m.dequantize_row(id, row))?,
            Embedding::Float(m) => lookup(ids, m.k(), |id, row| m.row_f32(id, row))?,
        })
    }

    /// Checks the matrix against the config, so that a wrong config fails at load with a
    /// message rather than deep inside a matmul.
    pub(crate) fn check_shape(&self, config: &ModelConfig) -> Result<()> {
        let dims = match self {
            Embedding::Dense(t) => t.dims().to_vec(),
            Embedding::Quantized(q) => q.shape().dims().to_vec(),
            Embedding::Quant(m) => vec![m.n_out(), m.k()],
            Embedding::Float(m) => vec![m.n_out(), m.k()],
        };
        if dims != [config.vocab_size, config.hidden_size] {
            return Err(ModelError::Config(format!(
                "embedding is {dims:?} but the config says vocab {} x hidden {}",
                config.vocab_size, config.hidden_size
            )));
        }
        Ok(())
    }
}

/// `[ids, k]` f32: each id's row written by `row_of` (which checks the id).
fn lookup(
    ids: &Tensor,
    k: usize,
    row_of: impl Fn(usize, &mut [f32]) -> std::result::Result<(), radix_kernels::KernelError>,
) -> Result<Tensor> {
    let ids = ids.to_dtype(DType::U32)?.flatten_all()?.to_vec1::<u32>()?;
    let mut rows = vec![0.0f32; ids.len() * k];
    for (&id, row) in ids.iter().zip(rows.chunks_exact_mut(k)) {
        row_of(id as usize, row)?;
    }
    Ok(Tensor::from_vec(rows, (ids.len(), k), &Device::Cpu)?)
}
