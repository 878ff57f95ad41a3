//! The Gated DeltaNet on NVIDIA GPUs (`cuda/delta_net.cu`): the causal convolution and the
//! gated delta rule of a packed pass, reading and writing each sequence's state in place in a
//! state pool held in GPU memory, on candle's stream. What the kernels compute, in what order,
//! is [`crate::delta_net::device_order`]; the checks here are its.
//!
//! A forward pass builds one [`CudaRecurrentBatch`] (its sequence table uploaded once) and uses
//! it in every Gated DeltaNet layer.

use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use candle_core::{CpuStorage, CudaStorage, DType, Device, InplaceOp1, Layout, Storage, Tensor};

use super::device_err;
use crate::KernelError;
use crate::delta_net::DeltaNetShape;
use crate::delta_net::device_order::{
    COLUMNS_PER_BLOCK, CONV_KERNELS, RecurrentSequence, SPLIT, key_capacity, validate_sequences,
};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/delta_net.ptx"));
const MODULE: &str = "radix_delta_net";

/// One forward pass's recurrent sequences, uploaded to the GPU.
pub struct CudaRecurrentBatch {
    device: CudaDevice,
    n_rows: usize,
    num_seqs: usize,
    /// The highest slot named, to check the pools against.
    max_slot: usize,
    seqs: CudaSlice<u32>,
}

impl std::fmt::Debug for CudaRecurrentBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRecurrentBatch").field("rows", &self.n_rows).field("seqs", &self.num_seqs).finish()
    }
}

/// The f32 tensor's CUDA slice and start offset, for a kernel argument.
fn cuda_f32<'a>(storage: &'a Storage, layout: &Layout, what: &str) -> candle_core::Result<(&'a CudaSlice<f32>, usize)> {
    let Storage::Cuda(s) = storage else { candle_core::bail!("{what} is not on the CUDA device") };
    if !layout.is_contiguous() {
        candle_core::bail!("{what} must be contiguous");
    }
    Ok((s.as_cuda_slice::<f32>()?, layout.start_offset()))
}

fn check_tensor(what: &'static str, t: &Tensor, len: usize) -> Result<(), KernelError> {
    if !t.device().is_cuda() || t.dtype() != DType::F32 {
        return Err(device_err(format!(
            "{what} must be f32 on the CUDA device, got {:?} on {:?}",
            t.dtype(),
            t.device()
        )));
    }
    if t.elem_count() != len {
        return Err(KernelError::LengthMismatch { what, expected: len, actual: t.elem_count() });
    }
    Ok(())
}

/// A state pool layer must be whole, so the slots index it from its start.
fn check_pool(what: &'static str, t: &Tensor, slot_len: usize, max_slot: usize) -> Result<(), KernelError> {
    if !t.device().is_cuda() || t.dtype() != DType::F32 || !t.is_contiguous() || t.layout().start_offset() != 0 {
        return Err(device_err(format!("{what} must be a whole contiguous f32 tensor on the CUDA device")));
    }
    if slot_len == 0 || !t.elem_count().is_multiple_of(slot_len) || t.elem_count() / slot_len <= max_slot {
        return Err(device_err(format!(
            "{what} of {} values does not hold slot {max_slot} of {slot_len} values",
            t.elem_count()
        )));
    }
    Ok(())
}

impl CudaRecurrentBatch {
    /// Validates the pass (`n_rows` new rows; `seqs` in row order, each slot once) and uploads
    /// its sequence table.
    pub fn new(device: &Device, n_rows: usize, seqs: &[RecurrentSequence]) -> Result<Self, KernelError> {
        let max_slot = seqs.iter().map(|s| s.slot).max().unwrap_or(0);
        validate_sequences(seqs, n_rows, max_slot + 1)?;
        let cuda = device.as_cuda_device().map_err(device_err)?;
        let mut words: Vec<u32> = seqs.iter().flat_map(|s| s.words()).collect();
        if words.is_empty() {
            words.push(0); // empty uploads are not allowed; no kernel is launched then
        }
        Ok(CudaRecurrentBatch {
            device: cuda.clone(),
            n_rows,
            num_seqs: seqs.len(),
            max_slot,
            seqs: cuda.clone_htod(&words).map_err(device_err)?,
        })
    }

    /// The causal convolution and SiLU of `x` (`[rows, channels]` f32), with `weight`
    /// (`[channels, kernel]` f32), continuing each sequence's slot of `state` (one layer's
    /// `[slots, kernel - 1, channels]`), which is updated in place. Returns `[rows, channels]`.
    pub fn conv(&self, x: &Tensor, weight: &Tensor, kernel: usize, state: &Tensor) -> Result<Tensor, KernelError> {
        if !CONV_KERNELS.contains(&kernel) {
            return Err(device_err(format!("convolution width {kernel} has no CUDA kernel ({CONV_KERNELS:?})")));
        }
        let channels = weight.elem_count() / kernel;
        check_tensor("conv weight", weight, channels * kernel)?;
        check_tensor("conv input", x, self.n_rows * channels)?;
        check_pool("conv state", state, (kernel - 1) * channels, self.max_slot)?;
        let out = self.device.alloc_zeros::<f32>((self.n_rows * channels).max(1)).map_err(device_err)?;
        if self.num_seqs > 0 && self.n_rows > 0 {
            let (x, weight) = (x.contiguous().map_err(device_err)?, weight.contiguous().map_err(device_err)?);
            let op = ConvOp { batch: self, x: &x, weight: &weight, out: &out, channels, kernel };
            state.inplace_op1(&op).map_err(device_err)?;
        }
        self.wrap(out, (self.n_rows, channels))
    }

    /// The gated delta rule of the pass: `qkv` (`[rows, channels]`, the convolution's output),
    /// the raw gate projections `a` and `b` (`[rows, value heads]`), `neg_decay_rate`
    /// (`-exp(A_log)`) and `dt_bias` (`[value heads]`), continuing each sequence's slot of
    /// `state` (one layer's `[slots, value heads, key_dim, value_dim]`), updated in place.
    /// Returns `[rows, value heads * value_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn rule(
        &self,
        shape: &DeltaNetShape,
        qkv: &Tensor,
        a: &Tensor,
        b: &Tensor,
        neg_decay_rate: &Tensor,
        dt_bias: &Tensor,
        state: &Tensor,
    ) -> Result<Tensor, KernelError> {
        shape.validate()?;
        let DeltaNetShape { num_key_heads: nk, num_value_heads: nv, key_dim: dk, value_dim: dv, .. } = *shape;
        let kmax = key_capacity(dk)
            .ok_or_else(|| device_err(format!("key head width {dk} has no CUDA kernel (at most 256)")))?;
        let n = self.n_rows;
        check_tensor("qkv", qkv, n * (2 * nk * dk + nv * dv))?;
        check_tensor("a", a, n * nv)?;
        check_tensor("b", b, n * nv)?;
        check_tensor("decay rate", neg_decay_rate, nv)?;
        check_tensor("dt bias", dt_bias, nv)?;
        check_pool("SSM state", state, shape.state_len(), self.max_slot)?;
        let out = self.device.alloc_zeros::<f32>((n * nv * dv).max(1)).map_err(device_err)?;
        if self.num_seqs > 0 && n > 0 {
            let c = |t: &Tensor| t.contiguous().map_err(device_err);
            let (qkv, a, b, rate, bias) = (c(qkv)?, c(a)?, c(b)?, c(neg_decay_rate)?, c(dt_bias)?);
            let op = RuleOp { batch: self, shape: *shape, kmax, inputs: [&qkv, &a, &b, &rate, &bias], out: &out };
            state.inplace_op1(&op).map_err(device_err)?;
        }
        self.wrap(out, (n, nv * dv))
    }

    fn wrap(&self, out: CudaSlice<f32>, shape: (usize, usize)) -> Result<Tensor, KernelError> {
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, self.device.clone()));
        // An empty pass allocated one value, which the shape leaves out.
        Ok(Tensor::from_storage(storage, shape, candle_core::op::BackpropOp::none(), false))
    }

    fn func(&self, name: &str) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaFunction> {
        Ok(self.device.get_or_load_custom_func(name, MODULE, PTX)?.into_cuda_function())
    }
}

/// The convolution, in place on one layer's conv state.
struct ConvOp<'a> {
    batch: &'a CudaRecurrentBatch,
    x: &'a Tensor,
    weight: &'a Tensor,
    out: &'a CudaSlice<f32>,
    channels: usize,
    kernel: usize,
}

impl InplaceOp1 for ConvOp<'_> {
    fn name(&self) -> &'static str {
        "radix-gdn-conv"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("radix-gdn-conv runs on CUDA only; the CPU path is radix_kernels::delta_net")
    }

    fn cuda_fwd(&self, state: &mut CudaStorage, _: &Layout) -> candle_core::Result<()> {
        let b = self.batch;
        let (x_storage, x_l) = self.x.storage_and_layout();
        let (x, x_off) = cuda_f32(&x_storage, x_l, "conv input")?;
        let (w_storage, w_l) = self.weight.storage_and_layout();
        let (w, w_off) = cuda_f32(&w_storage, w_l, "conv weight")?;
        let (x, w) = (x.slice(x_off..), w.slice(w_off..));
        let state = state.as_cuda_slice_mut::<f32>()?;
        let func = b.func(&format!("radix_gdn_conv_k{}", self.kernel))?;
        let threads = 128u32;
        let cfg = LaunchConfig {
            grid_dim: ((self.channels as u32).div_ceil(threads), b.num_seqs as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let channels = self.channels as u32;
        let stream = b.device.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&x).arg(&w).arg(state).arg(self.out).arg(&b.seqs).arg(&channels);
        // SAFETY: argument types and order match the kernel; the input, weight and output were
        // checked against rows x channels, the state pool against the highest slot, and every
        // sequence's rows against the pass (validate_sequences).
        unsafe { args.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
        Ok(())
    }
}

/// The delta rule, in place on one layer's SSM state.
struct RuleOp<'a> {
    batch: &'a CudaRecurrentBatch,
    shape: DeltaNetShape,
    kmax: usize,
    /// qkv, a, b, neg_decay_rate, dt_bias.
    inputs: [&'a Tensor; 5],
    out: &'a CudaSlice<f32>,
}

impl InplaceOp1 for RuleOp<'_> {
    fn name(&self) -> &'static str {
        "radix-gdn-rule"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("radix-gdn-rule runs on CUDA only; the CPU path is radix_kernels::delta_net")
    }

    fn cuda_fwd(&self, state: &mut CudaStorage, _: &Layout) -> candle_core::Result<()> {
        let b = self.batch;
        let guards: Vec<_> = self.inputs.iter().map(|t| t.storage_and_layout()).collect();
        let names = ["qkv", "a", "b", "decay rate", "dt bias"];
        let mut views = Vec::with_capacity(5);
        for ((storage, layout), name) in guards.iter().zip(names) {
            let (slice, off) = cuda_f32(storage, layout, name)?;
            views.push(slice.slice(off..));
        }
        let state = state.as_cuda_slice_mut::<f32>()?;
        let DeltaNetShape { num_key_heads, num_value_heads, key_dim, value_dim, tiled_value_heads } = self.shape;
        let func = b.func(&format!("radix_gdn_rule_k{}", self.kmax))?;
        let cfg = LaunchConfig {
            grid_dim: (num_value_heads as u32, value_dim.div_ceil(COLUMNS_PER_BLOCK) as u32, b.num_seqs as u32),
            block_dim: ((COLUMNS_PER_BLOCK * SPLIT) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let words = [
            num_key_heads as u32,
            num_value_heads as u32,
            key_dim as u32,
            value_dim as u32,
            u32::from(tiled_value_heads),
        ];
        let stream = b.device.cuda_stream();
        let mut args = stream.launch_builder(&func);
        for v in &views {
            args.arg(v);
        }
        args.arg(state).arg(self.out).arg(&b.seqs);
        for w in &words {
            args.arg(w);
        }
        // SAFETY: argument types and order match the kernel (five inputs, state, output, the
        // sequence table, five u32); the inputs and output were checked against the pass's rows
        // and the shape, the state pool against the highest slot, the key width against the
        // kernel's capacity, and the sequences against the pass, each slot once.
        unsafe { args.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
        Ok(())
    }
}
