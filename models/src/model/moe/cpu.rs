//! The experts on radix-kernels' quantized kernels (the CPU, every type they cover): a layer's
//! input is quantized once and shared by every expert its rows chose, and the experts run side
//! by side on the model's rayon pool, one task each.
//!
//! candle's path (the one [`super::SparseMoe`] takes on a GPU) quantized the input again in each
//! expert's gate/up call and its hidden state in the down call, and split every one of those
//! ~384 small matmuls per layer (about 32 rows each at a 512-token prefill) over its pool,
//! waiting at a barrier after each.
//!
//! Every row's result is its own: the kernels reduce each output the same way whatever the other
//! rows, an expert's hidden state is quantized row by row, and a row's experts are added in
//! expert order.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use radix_kernels::quant::{LayerInput, QuantMatrix, swiglu};
use rayon::prelude::*;

use super::Expert;
use crate::error::Result;

/// One expert's three matrices, read in place.
pub(super) struct CpuExpert {
    gate: Arc<QuantMatrix>,
    up: Arc<QuantMatrix>,
    down: Arc<QuantMatrix>,
}

/// The experts on our kernels, or `None` where some matrix is not on them (a GPU, a type we
/// have no kernel for, float weights).
pub(super) fn cpu_experts(experts: &[Expert]) -> Option<Vec<CpuExpert>> {
    experts
        .iter()
        .map(|e| {
            Some(CpuExpert {
                gate: Arc::clone(e.gate.quant_matrix()?),
                up: Arc::clone(e.up.quant_matrix()?),
                down: Arc::clone(e.down.quant_matrix()?),
            })
        })
        .collect()
}

/// The weighted sum of each row's experts, `[rows, hidden]`; `routed[e]` lists the rows
/// expert `e` takes and their weights. Runs on the current rayon pool.
pub(super) fn forward(experts: &[CpuExpert], x: &Tensor, routed: &[(Vec<u32>, Vec<f32>)]) -> Result<Tensor> {
    let (rows, hidden) = x.dims2()?;
    let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let input = LayerInput::new(&xs, hidden)?;
    let active: Vec<usize> = (0..experts.len()).filter(|&e| !routed[e].0.is_empty()).collect();
    // Quantized here, once, rather than by whichever expert task comes first.
    if let Some(&e) = active.first() {
        input.prepare(experts[e].gate.ty().act_format())?;
        input.prepare(experts[e].up.ty().act_format())?;
    }
    let outputs: Vec<Result<Vec<f32>>> =
        active.par_iter().with_max_len(1).map(|&e| expert_forward(&experts[e], &input, &routed[e].0)).collect();
    // Added up in expert order, whatever the threads did: the same sums every run.
    let mut out = vec![0.0f32; rows * hidden];
    for (&e, y) in active.iter().zip(outputs) {
        let y = y?;
        let (ids, weights) = &routed[e];
        for ((&row, &w), y) in ids.iter().zip(weights).zip(y.chunks_exact(hidden)) {
            let acc = &mut out[row as usize * hidden..(row as usize + 1) * hidden];
            for (a, &v) in acc.iter_mut().zip(y) {
                *a += w * v;
            }
        }
    }
    Ok(Tensor::from_vec(out, (rows, hidden), x.device())?)
}

/// One expert's SwiGLU MLP over the rows `ids` of `input`, `[ids.len(), hidden]`.
fn expert_forward(expert: &CpuExpert, input: &LayerInput, ids: &[u32]) -> Result<Vec<f32>> {
    let (n, inner) = (ids.len(), expert.gate.n_out());
    let mut gate = vec![0.0f32; n * inner];
    let mut up = vec![0.0f32; n * inner];
    expert.gate.matmul_rows(input, ids, &mut gate)?;
    expert.up.matmul_rows(input, ids, &mut up)?;
    swiglu(&mut gate, &up);
    let mut y = vec![0.0f32; n * expert.down.n_out()];
    expert.down.matmul(&LayerInput::new(&gate, inner)?, &mut y)?;
    Ok(y)
}
