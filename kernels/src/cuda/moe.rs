//! Mixture-of-experts routing and dense expert dispatch on NVIDIA GPUs (`cuda/moe.cu`), so a
//! MoE layer reads nothing back to the host: [`route`] turns the router's logits into each row's
//! top-k expert ids and weights on the device ([`crate::moe::route_device_order`] is what it
//! computes), [`dense_indexed`] multiplies each routed (row, expert) pair by that expert's
//! matrix for experts kept as f32/f16/bf16 (quantized experts use candle's
//! `QTensor::indexed_moe_forward` with the same ids), and [`combine`] adds each row's experts
//! up with their weights, in rank order.

use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use candle_core::{CudaStorage, DType, Storage, Tensor};

use super::device_err;
use crate::KernelError;
use crate::moe::validate_routing;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/moe.ptx"));
const MODULE: &str = "radix_moe";
/// Warps per block of the routing and matrix kernels.
const WARPS: u32 = 4;

fn func(device: &CudaDevice, name: &str) -> Result<CudaFunction, KernelError> {
    Ok(device.get_or_load_custom_func(name, MODULE, PTX).map_err(device_err)?.into_cuda_function())
}

fn cuda_of(t: &Tensor, what: &str) -> Result<CudaDevice, KernelError> {
    t.device().as_cuda_device().cloned().map_err(|_| device_err(format!("{what} is not on the CUDA device")))
}

fn wrap<T: candle_core::cuda_backend::CudaDType>(device: &CudaDevice, out: CudaSlice<T>, shape: &[usize]) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, device.clone()));
    Tensor::from_storage(storage, shape, candle_core::op::BackpropOp::none(), false)
}

fn launch_err(e: impl std::fmt::Debug) -> KernelError {
    device_err(format!("kernel launch failed: {e:?}"))
}

/// Each row's top `k` experts of the router's `logits` (`[rows, experts]` f32 on the GPU): the
/// softmax, the `k` largest probabilities (equal ones: the lower expert first), renormalised to
/// sum to 1 when `renormalize`. Returns the ids (`[rows, k]` u32) and weights (`[rows, k]` f32).
pub fn route(logits: &Tensor, k: usize, renormalize: bool) -> Result<(Tensor, Tensor), KernelError> {
    let (rows, experts) = logits.dims2().map_err(device_err)?;
    validate_routing(experts, k)?;
    if logits.dtype() != DType::F32 {
        return Err(device_err(format!("router logits must be f32, got {:?}", logits.dtype())));
    }
    let device = cuda_of(logits, "router logits")?;
    let logits = logits.contiguous().map_err(device_err)?;
    let ids = device.alloc_zeros::<u32>((rows * k).max(1)).map_err(device_err)?;
    let weights = device.alloc_zeros::<f32>((rows * k).max(1)).map_err(device_err)?;
    if rows > 0 {
        let (storage, layout) = logits.storage_and_layout();
        let Storage::Cuda(s) = &*storage else { return Err(device_err("router logits are not on the CUDA device")) };
        let x = s.as_cuda_slice::<f32>().map_err(device_err)?.slice(layout.start_offset()..);
        let f = func(&device, "radix_moe_topk")?;
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(WARPS), 1, 1),
            block_dim: (32 * WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let words = [rows as u32, experts as u32, k as u32, u32::from(renormalize)];
        let stream = device.cuda_stream();
        let mut args = stream.launch_builder(&f);
        args.arg(&x);
        for w in &words {
            args.arg(w);
        }
        args.arg(&ids).arg(&weights);
        // SAFETY: argument types and order match the kernel; the logits hold rows x experts
        // (contiguous), ids and weights rows x k, and 1 <= k <= experts <= MAX_EXPERTS.
        unsafe { args.launch(cfg) }.map_err(launch_err)?;
    }
    Ok((wrap(&device, ids, &[rows, k]), wrap(&device, weights, &[rows, k])))
}

/// `out[row, j] = W[ids[row, j]] x[row, j or 0]` for experts stored densely as `w`
/// (`[experts, n, in]`, f32/f16/bf16): `x` is `[rows, 1, in]` (every expert of a row reads the
/// same input: gate and up) or `[rows, topk, in]` (each its own: down), f32. Returns
/// `[rows, topk, n]` f32.
pub fn dense_indexed(w: &Tensor, x: &Tensor, ids: &Tensor) -> Result<Tensor, KernelError> {
    let (experts, n, inner) = w.dims3().map_err(device_err)?;
    let (rows, x_per_row, x_in) = x.dims3().map_err(device_err)?;
    let (id_rows, topk) = ids.dims2().map_err(device_err)?;
    if x_in != inner || id_rows != rows || !(x_per_row == 1 || x_per_row == topk) || ids.dtype() != DType::U32 {
        return Err(device_err(format!(
            "experts {:?}, input {:?} and ids {:?} ({:?}) do not fit together",
            w.dims(),
            x.dims(),
            ids.dims(),
            ids.dtype()
        )));
    }
    if x.dtype() != DType::F32 {
        return Err(device_err(format!("expert input must be f32, got {:?}", x.dtype())));
    }
    let device = cuda_of(w, "expert weights")?;
    let (w, x, ids) = (
        w.contiguous().map_err(device_err)?,
        x.contiguous().map_err(device_err)?,
        ids.contiguous().map_err(device_err)?,
    );
    let out = device.alloc_zeros::<f32>((rows * topk * n).max(1)).map_err(device_err)?;
    if rows > 0 && n > 0 {
        let (ws, wl) = w.storage_and_layout();
        let (xs, xl) = x.storage_and_layout();
        let (is, il) = ids.storage_and_layout();
        let (Storage::Cuda(ws), Storage::Cuda(xs), Storage::Cuda(is)) = (&*ws, &*xs, &*is) else {
            return Err(device_err("expert weights, input and ids must all be on the CUDA device"));
        };
        let xv = xs.as_cuda_slice::<f32>().map_err(device_err)?.slice(xl.start_offset()..);
        let iv = is.as_cuda_slice::<u32>().map_err(device_err)?.slice(il.start_offset()..);
        let suffix = match w.dtype() {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            other => return Err(device_err(format!("dense experts of {other:?} have no kernel"))),
        };
        let f = func(&device, &format!("radix_moe_dense_{suffix}"))?;
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(WARPS), rows as u32, topk as u32),
            block_dim: (32 * WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let words = [experts as u32, n as u32, inner as u32, topk as u32, x_per_row as u32];
        let stream = device.cuda_stream();
        let mut args = stream.launch_builder(&f);
        let (w16, wb16, w32);
        match w.dtype() {
            DType::F16 => {
                w16 = ws.as_cuda_slice::<half::f16>().map_err(device_err)?.slice(wl.start_offset()..);
                args.arg(&w16);
            }
            DType::BF16 => {
                wb16 = ws.as_cuda_slice::<half::bf16>().map_err(device_err)?.slice(wl.start_offset()..);
                args.arg(&wb16);
            }
            _ => {
                w32 = ws.as_cuda_slice::<f32>().map_err(device_err)?.slice(wl.start_offset()..);
                args.arg(&w32);
            }
        }
        args.arg(&xv).arg(&iv).arg(&out);
        for v in &words {
            args.arg(v);
        }
        // SAFETY: argument types and order match the kernel; the weights hold experts x n x in
        // values, the input rows x (1 or topk) x in, the ids rows x topk (an id past the experts
        // gives 0 in the kernel), and out rows x topk x n; all contiguous.
        unsafe { args.launch(cfg) }.map_err(launch_err)?;
    }
    Ok(wrap(&device, out, &[rows, topk, n]))
}

/// Each row's experts added up with their weights: `y` (`[rows, topk, hidden]` f32) and
/// `weights` (`[rows, topk]` f32) to `[rows, hidden]`, the experts in rank order.
pub fn combine(y: &Tensor, weights: &Tensor) -> Result<Tensor, KernelError> {
    let (rows, topk, hidden) = y.dims3().map_err(device_err)?;
    if weights.dims() != [rows, topk] || y.dtype() != DType::F32 || weights.dtype() != DType::F32 {
        return Err(device_err(format!(
            "expert outputs {:?} and weights {:?} do not fit together",
            y.dims(),
            weights.dims()
        )));
    }
    let device = cuda_of(y, "expert outputs")?;
    let (y, weights) = (y.contiguous().map_err(device_err)?, weights.contiguous().map_err(device_err)?);
    let out = device.alloc_zeros::<f32>((rows * hidden).max(1)).map_err(device_err)?;
    if rows > 0 && hidden > 0 {
        let (ys, yl) = y.storage_and_layout();
        let (ws, wl) = weights.storage_and_layout();
        let (Storage::Cuda(ys), Storage::Cuda(ws)) = (&*ys, &*ws) else {
            return Err(device_err("expert outputs and weights must be on the CUDA device"));
        };
        let yv = ys.as_cuda_slice::<f32>().map_err(device_err)?.slice(yl.start_offset()..);
        let wv = ws.as_cuda_slice::<f32>().map_err(device_err)?.slice(wl.start_offset()..);
        let f = func(&device, "radix_moe_combine")?;
        let threads = 256u32;
        let cfg = LaunchConfig {
            grid_dim: ((hidden as u32).div_ceil(threads), rows as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let words = [rows as u32, topk as u32, hidden as u32];
        let stream = device.cuda_stream();
        let mut args = stream.launch_builder(&f);
        args.arg(&yv).arg(&wv).arg(&out);
        for v in &words {
            args.arg(v);
        }
        // SAFETY: argument types and order match the kernel; y holds rows x topk x hidden,
        // weights rows x topk and out rows x hidden values, all contiguous.
        unsafe { args.launch(cfg) }.map_err(launch_err)?;
    }
    Ok(wrap(&device, out, &[rows, hidden]))
}
