//! The experts on radix-kernels' K-quant kernel ([`KQuantMatrix`], AVX-512 VNNI CPUs): a
//! layer's input is quantized to 8 bits once and shared by every expert its rows chose, and
//! the experts run side by side on the model's rayon pool, one task each, every matmul on its
//! task's thread.
//!
//! candle's path (the one [`super::SparseMoe`] takes elsewhere) quantized the input again in
//! each expert's gate/up call and its hidden state in the down call, and split every one of
//! those ~384 small matmuls per layer (about 32 rows each at a 512-token prefill) over its
//! pool, waiting at a barrier after each.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Tensor};
use radix_kernels::quant::{KQuant, KQuantMatrix, Q8KRows, kquant_kernel_is_fast, swiglu};
use rayon::prelude::*;

use super::Expert;
use crate::error::Result;
use crate::layers::Linear;

/// One expert's three matrices, repacked.
pub(super) struct PackedExpert {
    gate: KQuantMatrix,
    up: KQuantMatrix,
    down: KQuantMatrix,
}

/// The experts repacked for the K-quant kernel, or `None` where it does not apply: a CPU
/// without AVX-512 VNNI, weights on another device, or any matrix not Q4_K/Q6_K with 16-row
/// and 256-column multiples.
pub(super) fn pack_experts(experts: &[Expert]) -> Result<Option<Vec<PackedExpert>>> {
    if !kquant_kernel_is_fast() {
        return Ok(None);
    }
    let mut packed = Vec::with_capacity(experts.len());
    for e in experts {
        let (Some(gate), Some(up), Some(down)) = (pack(&e.gate)?, pack(&e.up)?, pack(&e.down)?) else {
            return Ok(None);
        };
        packed.push(PackedExpert { gate, up, down });
    }
    Ok(Some(packed))
}

/// One matrix repacked, if the kernel takes it.
fn pack(linear: &Linear) -> Result<Option<KQuantMatrix>> {
    let Some(q) = linear.candle_qtensor() else { return Ok(None) };
    let format = match q.dtype() {
        GgmlDType::Q4K => KQuant::Q4K,
        GgmlDType::Q6K => KQuant::Q6K,
        _ => return Ok(None),
    };
    let &[n_out, k] = q.shape().dims() else { return Ok(None) };
    if !q.device().is_cpu() || !n_out.is_multiple_of(16) || !k.is_multiple_of(256) {
        return Ok(None);
    }
    Ok(Some(KQuantMatrix::from_ggml_bytes(format, n_out, k, &q.data()?)?))
}

/// The weighted sum of each row's experts, `[rows, hidden]`; `routed[e]` lists the rows
/// expert `e` takes and their weights. Runs on the current rayon pool.
pub(super) fn forward(experts: &[PackedExpert], x: &Tensor, routed: &[(Vec<u32>, Vec<f32>)]) -> Result<Tensor> {
    let (rows, hidden) = x.dims2()?;
    let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut xq = Q8KRows::default();
    xq.quantize(&xs, hidden)?;
    let active: Vec<usize> = (0..experts.len()).filter(|&e| !routed[e].0.is_empty()).collect();
    let outputs: Vec<Result<Vec<f32>>> =
        active.par_iter().with_max_len(1).map(|&e| expert_forward(&experts[e], &xq, &routed[e].0)).collect();
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

/// One expert's SwiGLU MLP over the rows `ids` of `xq`, `[ids.len(), hidden]`.
fn expert_forward(expert: &PackedExpert, xq: &Q8KRows, ids: &[u32]) -> Result<Vec<f32>> {
    let (n, inner) = (ids.len(), expert.gate.n_out());
    let mut gate = vec![0.0f32; n * inner];
    let mut up = vec![0.0f32; n * inner];
    expert.gate.matmul_rows(xq, ids, &mut gate)?;
    expert.up.matmul_rows(xq, ids, &mut up)?;
    swiglu(&mut gate, &up);
    let mut hq = Q8KRows::default();
    hq.quantize(&gate, inner)?;
    let all: Vec<u32> = (0..n as u32).collect();
    let mut y = vec![0.0f32; n * expert.down.n_out()];
    expert.down.matmul_rows(&hq, &all, &mut y)?;
    Ok(y)
}
