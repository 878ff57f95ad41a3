//! The experts of a MoE layer on a CUDA device, dispatched without a host round trip: the
//! router's logits become each row's top-k ids and weights on the device
//! (`radix_kernels::cuda::moe::route`), every routed (row, expert) pair is multiplied by its
//! expert's matrices straight from the ids (candle's `indexed_moe_forward` for quantized experts,
//! `radix_kernels::cuda::moe::dense_indexed` for f32/f16/bf16 ones), and each row's experts are
//! added up with their weights in rank order (`radix_kernels::cuda::moe::combine`).
//!
//! The experts are kept stacked, `[experts, out, in]` in one allocation per matrix kind, as
//! those kernels read them. Layers whose experts are of a type neither takes stay on the
//! per-expert path in `moe.rs`.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Tensor};
use radix_kernels::cuda::moe::{combine, dense_indexed, route};

use crate::error::Result;
use crate::layers::{Linear, Weight};

/// One matrix kind (gate, up or down) of every expert, stacked.
enum Stacked {
    /// Quantized as stored, for candle's indexed kernels.
    Quantized(Box<QTensor>),
    /// f32/f16/bf16, for ours.
    Dense(Tensor),
}

/// Quantized types candle's `indexed_moe_forward` takes.
const INDEXED_TYPES: [GgmlDType; 6] =
    [GgmlDType::Q8_0, GgmlDType::Q2K, GgmlDType::Q3K, GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K];

impl Stacked {
    /// The experts' matrices stacked, if all are on a CUDA device in one type an indexed kernel
    /// takes.
    fn of(weights: &[Weight]) -> Result<Option<Self>> {
        let quantized: Option<Vec<&QTensor>> = weights
            .iter()
            .map(|w| match w {
                Weight::Candle(QMatMul::QTensor(q)) => Some(q.as_ref()),
                _ => None,
            })
            .collect();
        if let Some(qs) = quantized {
            let Some(first) = qs.first() else { return Ok(None) };
            let (dtype, device) = (first.dtype(), first.device());
            let Ok(&[n, k]) = <&[usize; 2]>::try_from(first.shape().dims()) else { return Ok(None) };
            if !device.is_cuda()
                || !INDEXED_TYPES.contains(&dtype)
                || qs.iter().any(|q| q.dtype() != dtype || q.shape().dims() != [n, k])
            {
                return Ok(None);
            }
            // Each expert's blocks back to back, as llama.cpp stacks them in a GGUF file.
            let mut bytes = Vec::new();
            for q in &qs {
                bytes.extend_from_slice(&q.data()?);
            }
            let storage = QStorage::from_data(Cow::Owned(bytes), &device, dtype)?;
            return Ok(Some(Stacked::Quantized(Box::new(QTensor::new(storage, (qs.len(), n, k))?))));
        }
        let dense: Option<Vec<&Tensor>> = weights
            .iter()
            .map(|w| match w {
                Weight::Dense(t) | Weight::Candle(QMatMul::Tensor(t)) => Some(t),
                _ => None,
            })
            .collect();
        match dense {
            Some(ts)
                if !ts.is_empty()
                    && ts
                        .iter()
                        .all(|t| t.device().is_cuda() && t.dims() == ts[0].dims() && t.dtype() == ts[0].dtype())
                    && matches!(ts[0].dtype(), DType::F32 | DType::F16 | DType::BF16) =>
            {
                Ok(Some(Stacked::Dense(Tensor::stack(&ts, 0)?)))
            }
            _ => Ok(None),
        }
    }

    /// `[rows, topk, out]`: each routed pair's matrix times its input (`[rows, 1 or topk, in]`).
    fn indexed(&self, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Stacked::Quantized(q) => q.indexed_moe_forward(x, ids)?,
            Stacked::Dense(w) => dense_indexed(w, x, ids)?,
        })
    }
}

/// A layer's experts, stacked on the CUDA device.
pub(crate) struct DeviceExperts {
    gate: Stacked,
    up: Stacked,
    down: Stacked,
}

impl DeviceExperts {
    /// The experts stacked for the indexed kernels, or `None` (they stay per expert) unless
    /// every matrix is on a CUDA device in a type the kernels take.
    pub(super) fn stack(gates: &[Weight], ups: &[Weight], downs: &[Weight]) -> Result<Option<Self>> {
        let (Some(gate), Some(up), Some(down)) = (Stacked::of(gates)?, Stacked::of(ups)?, Stacked::of(downs)?) else {
            return Ok(None);
        };
        Ok(Some(DeviceExperts { gate, up, down }))
    }

    /// The routed experts' weighted sum for `x` (`[rows, hidden]` f32 on the device), routed
    /// by `router` to `k` experts a row (renormalised with `renormalize`): `[rows, hidden]`.
    pub(super) fn forward(&self, router: &Linear, x: &Tensor, k: usize, renormalize: bool) -> Result<Tensor> {
        let logits = router.forward(x)?.to_dtype(DType::F32)?;
        let (ids, weights) = route(&logits, k, renormalize)?;
        // candle's indexed kernels read their input from the start of its storage.
        let x = whole(&x.unsqueeze(1)?)?;
        let gate = self.gate.indexed(&x, &ids)?;
        let up = self.up.indexed(&x, &ids)?;
        let h = whole(&(gate.silu()? * up)?)?;
        let y = self.down.indexed(&h, &ids)?;
        Ok(combine(&y, &weights)?)
    }
}

/// `t` contiguous from the start of its own storage.
fn whole(t: &Tensor) -> Result<Tensor> {
    Ok(if t.is_contiguous() && t.layout().start_offset() == 0 { t.clone() } else { t.affine(1.0, 0.0)? })
}
