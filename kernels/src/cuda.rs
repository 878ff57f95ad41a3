//! Paged attention and K/V writes on NVIDIA GPUs (feature `cuda`).
//!
//! The kernels are ours (`cuda/paged_attention.cu`, compiled to PTX by `build.rs`) and run on
//! candle's CUDA device through its custom-op API, on candle's stream, so they order with the
//! model's matmuls without extra synchronisation. The pool layout, the batch description
//! ([`SequenceAttention`]) and the validation are the CPU path's; only the storage differs: each
//! layer's K and V are candle tensors on the GPU holding `layout.layer_len()` elements.
//!
//! A forward pass builds one [`CudaAttentionBatch`] (its page tables and work list uploaded
//! once) and uses it in every layer. A layer's K or V is a [`CudaKvCache`]: values (f32, f16,
//! bf16), or GGUF's q8_0 / q4_0 blocks as bytes, each head rotated into the Hadamard basis as
//! the CPU path stores them (the queries rotated in and the output back out around the
//! attention kernel, as [`paged_attention`](crate::paged_attention) does). Hybrid and MoE
//! models' other kernels live in [`delta_net`] (the Gated DeltaNet over a state pool in GPU
//! memory) and [`moe`] (routing and expert dispatch on the device).

pub mod delta_net;
pub mod moe;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Device, InplaceOp2, Layout, Shape, Tensor};

use crate::attention::validate_sequences;
use crate::gpu_plan::{BLOCK_ROWS, GpuPlan, TILE_KEYS};
use crate::hadamard::hadamard_norm;
use crate::{
    KV_BLOCK, KernelError, KvElement, KvQ4_0, KvQ8_0, PagedLayout, SequenceAttention, k_rotation_block,
    v_rotation_block,
};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));
const MODULE: &str = "radix_paged_attention";

/// Threads per attention block (`WARPS * 32`).
const BLOCK_THREADS: u32 = 128;
/// Head sizes with a compiled kernel.
const HEAD_DIMS: [usize; 5] = [16, 32, 64, 96, 128];
/// Threads per block of the block-format writes.
const ROW_THREADS: u32 = 128;
/// The shared memory a kernel may use without opting in to more (the block-format writes keep a
/// whole slot's row there).
const SHARED_BYTES: usize = 48 * 1024;
/// The pairs of K and V formats with a compiled attention kernel: the pairs
/// `radix_models`' pool allows.
const FORMAT_PAIRS: [(&str, &str); 11] = [
    ("f32", "f32"),
    ("bf16", "bf16"),
    ("f16", "f16"),
    ("f16", "q8_0"),
    ("f16", "q4_0"),
    ("q8_0", "f16"),
    ("q8_0", "q8_0"),
    ("q8_0", "q4_0"),
    ("q4_0", "f16"),
    ("q4_0", "q8_0"),
    ("q4_0", "q4_0"),
];

/// One layer's K or V cache in GPU memory, as the pool stores it.
#[derive(Clone, Copy, Debug)]
pub enum CudaKvCache<'a> {
    /// f32, f16 or bf16 values: [`PagedLayout::layer_len`] of them.
    Values(&'a Tensor),
    /// GGUF q8_0 blocks ([`KvQ8_0`]'s 34 bytes each, the f16 scale first, little-endian), each
    /// head rotated into the Hadamard basis: a u8 tensor of `layer_len / 32 * 34` bytes.
    Q8_0(&'a Tensor),
    /// GGUF q4_0 blocks ([`KvQ4_0`]'s 18 bytes each), rotated as `Q8_0`: `layer_len / 32 * 18`
    /// bytes.
    Q4_0(&'a Tensor),
}

impl<'a> CudaKvCache<'a> {
    /// The tensor holding the cache.
    pub fn tensor(&self) -> &'a Tensor {
        match *self {
            CudaKvCache::Values(t) | CudaKvCache::Q8_0(t) | CudaKvCache::Q4_0(t) => t,
        }
    }

    /// The format's name, as kernel names and `--cache-type-k` spell it.
    fn format(&self) -> &'static str {
        match self {
            CudaKvCache::Values(t) => match t.dtype() {
                DType::F32 => "f32",
                DType::F16 => "f16",
                DType::BF16 => "bf16",
                _ => "other",
            },
            CudaKvCache::Q8_0(_) => "q8_0",
            CudaKvCache::Q4_0(_) => "q4_0",
        }
    }

    /// Whether heads are stored in the Hadamard basis.
    fn rotated(&self) -> bool {
        match self {
            CudaKvCache::Values(_) => false,
            CudaKvCache::Q8_0(_) => KvQ8_0::ROTATED,
            CudaKvCache::Q4_0(_) => KvQ4_0::ROTATED,
        }
    }

    /// Bytes of one block of a block format.
    fn block_bytes(&self) -> Option<usize> {
        match self {
            CudaKvCache::Values(_) => None,
            CudaKvCache::Q8_0(_) => Some(std::mem::size_of::<KvQ8_0>()),
            CudaKvCache::Q4_0(_) => Some(std::mem::size_of::<KvQ4_0>()),
        }
    }

    /// Checks that the cache is a whole contiguous tensor on the GPU of the format's type and
    /// the layout's size.
    fn check(&self, what: &'static str, layout: &PagedLayout) -> Result<(), KernelError> {
        let t = self.tensor();
        let (ok, len) = match self.block_bytes() {
            None => (matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16), layout.layer_len()),
            Some(bytes) => {
                if !layout.head_dim.is_multiple_of(KV_BLOCK) {
                    return Err(KernelError::HeadNotWholeBlocks { head_dim: layout.head_dim, block: KV_BLOCK });
                }
                (t.dtype() == DType::U8, layout.layer_len() / KV_BLOCK * bytes)
            }
        };
        if !t.device().is_cuda() || !ok {
            return Err(device_err(format!(
                "{what} must be f32, f16 or bf16 values or u8 blocks on the CUDA device, got {} as {:?} on {:?}",
                self.format(),
                t.dtype(),
                t.device()
            )));
        }
        if !t.is_contiguous() || t.layout().start_offset() != 0 {
            return Err(device_err(format!("{what} must be a whole contiguous tensor")));
        }
        if t.elem_count() != len {
            return Err(KernelError::LengthMismatch { what, expected: len, actual: t.elem_count() });
        }
        Ok(())
    }
}

/// A Hadamard rotation as the kernels take it: the block, and `1 / sqrt(block)` rounded as the
/// CPU path rounds it.
#[derive(Clone, Copy, Debug)]
struct Rotation {
    block: u32,
    norm: f32,
}

impl Rotation {
    fn new(block: usize) -> Self {
        Rotation { block: block as u32, norm: hadamard_norm(block) }
    }
}

fn device_err(e: impl std::fmt::Display) -> KernelError {
    KernelError::Device(e.to_string())
}

/// One forward pass's batch, uploaded to the GPU: sequence descriptors, page tables, the tiles
/// of work, the new tokens' slots and how the key range is split.
pub struct CudaAttentionBatch {
    device: CudaDevice,
    layout: PagedLayout,
    num_heads: usize,
    n_rows: usize,
    seqs: CudaSlice<u32>,
    page_tables: CudaSlice<u32>,
    tiles: CudaSlice<u32>,
    num_tiles: usize,
    slots: CudaSlice<u32>,
    partition: u32,
    num_splits: u32,
}

impl std::fmt::Debug for CudaAttentionBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaAttentionBatch")
            .field("rows", &self.n_rows)
            .field("tiles", &self.num_tiles)
            .field("splits", &self.num_splits)
            .finish_non_exhaustive()
    }
}

impl CudaAttentionBatch {
    /// Validates the batch (as the CPU path does) and uploads it. `n_rows` is the number of new
    /// tokens; `slots[i]` is the pool slot of new token `i`.
    pub fn new(
        device: &Device,
        layout: &PagedLayout,
        num_heads: usize,
        n_rows: usize,
        seqs: &[SequenceAttention],
        slots: &[u32],
    ) -> Result<Self, KernelError> {
        layout.validate()?;
        if num_heads == 0 || !num_heads.is_multiple_of(layout.num_kv_heads) {
            return Err(KernelError::HeadsNotMultiple { num_heads, num_kv_heads: layout.num_kv_heads });
        }
        if !HEAD_DIMS.contains(&layout.head_dim) {
            return Err(device_err(format!(
                "head_dim {} has no CUDA kernel (supported: {HEAD_DIMS:?})",
                layout.head_dim
            )));
        }
        validate_sequences(layout, n_rows, seqs)?;
        if slots.len() != n_rows {
            return Err(KernelError::LengthMismatch { what: "slots", expected: n_rows, actual: slots.len() });
        }
        if let Some((row, &slot)) = slots.iter().enumerate().find(|&(_, &s)| s as usize >= layout.num_slots()) {
            return Err(KernelError::SlotOutOfRange { row, slot, num_slots: layout.num_slots() });
        }
        // Enough blocks to cover the GPU several times over (keys split only short of that).
        let cuda = device.as_cuda_device().map_err(device_err)?;
        let plan = GpuPlan::new(layout, num_heads, seqs, 4 * multiprocessors(cuda).max(1))?;

        let upload = |v: &[u32]| -> Result<CudaSlice<u32>, KernelError> {
            // Empty uploads are not allowed; the kernels never read past the counts they get.
            if v.is_empty() { cuda.clone_htod(&[0u32][..]) } else { cuda.clone_htod(v) }.map_err(device_err)
        };
        Ok(CudaAttentionBatch {
            device: cuda.clone(),
            layout: *layout,
            num_heads,
            n_rows,
            seqs: upload(&plan.seq_words)?,
            page_tables: upload(&plan.page_words)?,
            tiles: upload(&plan.tile_words)?,
            num_tiles: plan.num_tiles(),
            slots: upload(slots)?,
            partition: plan.partition as u32,
            num_splits: plan.num_splits as u32,
        })
    }

    /// Into how many parts each context's keys are split (1: no merge pass).
    pub fn num_splits(&self) -> usize {
        self.num_splits as usize
    }

    /// Writes the new tokens' K and V (`[n_rows, num_kv_heads * head_dim]` f32 on the GPU) into
    /// their slots of one layer's caches, rounding to the caches' type (the block formats:
    /// rotated, then quantized as [`write_kv`](crate::write_kv) does, to the same bytes).
    pub fn write_kv(
        &self,
        k_new: &Tensor,
        v_new: &Tensor,
        k_cache: CudaKvCache<'_>,
        v_cache: CudaKvCache<'_>,
    ) -> Result<(), KernelError> {
        let expected = self.n_rows * self.layout.slot_len();
        for (name, new) in [("k_new", k_new), ("v_new", v_new)] {
            check_f32_rows(name, new, expected)?;
        }
        for (name, cache) in [("k_cache", k_cache), ("v_cache", v_cache)] {
            cache.check(name, &self.layout)?;
            if cache.block_bytes().is_some() && self.layout.slot_len() * 4 > SHARED_BYTES {
                return Err(device_err(format!(
                    "a slot of {} values is too wide for the quantized K/V write (at most {}): use f16",
                    self.layout.slot_len(),
                    SHARED_BYTES / 4
                )));
            }
        }
        if self.n_rows == 0 {
            return Ok(());
        }
        let head_dim = self.layout.head_dim;
        for (new, cache, rotation) in [
            (k_new, k_cache, Rotation::new(k_rotation_block(head_dim))),
            (v_new, v_cache, Rotation::new(v_rotation_block(head_dim))),
        ] {
            let op = WriteKvOp { batch: self, format: cache.format(), rotation };
            cache.tensor().inplace_op2(&new.contiguous().map_err(device_err)?, &op).map_err(device_err)?;
        }
        Ok(())
    }

    /// Causal attention of the new tokens (`q`: `[n_rows, num_heads * head_dim]` f32 on the GPU)
    /// over their sequences' contexts in one layer's caches (the new tokens' K/V written first).
    /// Returns `[n_rows, num_heads * head_dim]` f32.
    pub fn attention(
        &self,
        q: &Tensor,
        k_cache: CudaKvCache<'_>,
        v_cache: CudaKvCache<'_>,
        scale: f32,
    ) -> Result<Tensor, KernelError> {
        if !scale.is_finite() {
            return Err(KernelError::NonFiniteScale(scale));
        }
        check_f32_rows("q", q, self.n_rows * self.num_heads * self.layout.head_dim)?;
        k_cache.check("k_cache", &self.layout)?;
        v_cache.check("v_cache", &self.layout)?;
        let formats = (k_cache.format(), v_cache.format());
        if !FORMAT_PAIRS.contains(&formats) {
            return Err(device_err(format!(
                "K as {} with V as {} has no CUDA kernel: f16, q8_0 and q4_0 pair freely, f32 and bf16 only with \
                 themselves",
                formats.0, formats.1
            )));
        }
        let head_dim = self.layout.head_dim;
        let op = AttentionOp {
            batch: self,
            scale,
            kernel: format!("radix_attention_{}_{}_d{head_dim}", formats.0, formats.1),
            q_rotation: k_cache.rotated().then(|| Rotation::new(k_rotation_block(head_dim))),
            out_rotation: v_cache.rotated().then(|| Rotation::new(v_rotation_block(head_dim))),
        };
        let q = q.contiguous().map_err(device_err)?;
        q.apply_op3_no_bwd(k_cache.tensor(), v_cache.tensor(), &op).map_err(device_err)
    }

    fn func(&self, name: &str) -> candle_core::Result<CudaFunction> {
        Ok(self.device.get_or_load_custom_func(name, MODULE, PTX)?.into_cuda_function())
    }
}

/// The number of streaming multiprocessors of the device (to size the work split).
fn multiprocessors(device: &CudaDevice) -> usize {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    device
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map(|n| n as usize)
        .unwrap_or(108)
}

fn check_f32_rows(what: &'static str, t: &Tensor, len: usize) -> Result<(), KernelError> {
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

/// The contiguous f32 data of a tensor's storage, from its start offset.
fn f32_view<'a>(s: &'a CudaStorage, l: &Layout) -> candle_core::Result<CudaView<'a, f32>> {
    if !l.is_contiguous() {
        candle_core::bail!("expected a contiguous tensor");
    }
    Ok(s.as_cuda_slice::<f32>()?.slice(l.start_offset()..))
}

/// Writes one cache (the op's destination) from the new rows (the source).
struct WriteKvOp<'a> {
    batch: &'a CudaAttentionBatch,
    /// The cache's format ([`CudaKvCache::format`]).
    format: &'static str,
    /// The rotation a block format is stored in.
    rotation: Rotation,
}

impl InplaceOp2 for WriteKvOp<'_> {
    fn name(&self) -> &'static str {
        "radix-write-kv"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("radix-write-kv runs on CUDA only; the CPU path is radix_kernels::write_kv")
    }

    fn cuda_fwd(
        &self,
        dst: &mut CudaStorage,
        _dst_l: &Layout,
        rows: &CudaStorage,
        rows_l: &Layout,
    ) -> candle_core::Result<()> {
        let b = self.batch;
        let rows = f32_view(rows, rows_l)?;
        let (n_rows, slot_len) = (b.n_rows as u32, b.layout.slot_len() as u32);
        let func = b.func(&format!("radix_write_kv_{}", self.format))?;
        let Rotation { block, norm } = self.rotation;
        let stream = b.device.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&rows).arg(&b.slots);
        let (dtype, blocks) = (dst.dtype(), matches!(dst.slice, CudaStorageSlice::U8(_)));
        match &mut dst.slice {
            CudaStorageSlice::F32(c) => args.arg(c),
            CudaStorageSlice::F16(c) => args.arg(c),
            CudaStorageSlice::BF16(c) => args.arg(c),
            CudaStorageSlice::U8(c) => args.arg(c),
            _ => candle_core::bail!("KV cache of type {dtype:?}"),
        };
        args.arg(&n_rows).arg(&slot_len);
        let cfg = if blocks {
            args.arg(&block).arg(&norm);
            // The row in shared memory (checked against SHARED_BYTES by `write_kv`).
            LaunchConfig { grid_dim: (n_rows, 1, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: slot_len * 4 }
        } else {
            LaunchConfig { grid_dim: (n_rows, 1, 1), block_dim: (slot_len.min(256), 1, 1), shared_mem_bytes: 0 }
        };
        // SAFETY: argument types and order match the kernel named by the cache's format (which
        // `CudaKvCache::check` matched to the storage type); every slot was checked against the
        // pool's size, and the row count against the new rows' length.
        unsafe { args.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
        Ok(())
    }
}

struct AttentionOp<'a> {
    batch: &'a CudaAttentionBatch,
    scale: f32,
    /// The attention kernel for the caches' formats and the head size.
    kernel: String,
    /// K stored rotated: the queries are rotated the same way first.
    q_rotation: Option<Rotation>,
    /// V stored rotated: the output is rotated back.
    out_rotation: Option<Rotation>,
}

impl CustomOp3 for AttentionOp<'_> {
    fn name(&self) -> &'static str {
        "radix-paged-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("radix-paged-attention runs on CUDA only; the CPU path is radix_kernels::paged_attention")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        k: &CudaStorage,
        _k_l: &Layout,
        v: &CudaStorage,
        _v_l: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let b = self.batch;
        let d = b.layout.head_dim;
        let q = f32_view(q, q_l)?;
        let len = b.n_rows * b.num_heads * d;
        let out = b.device.alloc_zeros::<f32>(len.max(1))?;
        let shape = Shape::from((b.n_rows, b.num_heads * d));
        if b.num_tiles == 0 {
            return Ok((CudaStorage::wrap_cuda_slice(out, b.device.clone()), shape));
        }
        let splits = b.num_splits as usize;
        // Partial results only exist when the keys are split.
        let part_len = if splits > 1 { b.n_rows * b.num_heads * splits } else { 1 };
        let part_acc = b.device.alloc_zeros::<f32>(part_len * d)?;
        let part_ml = b.device.alloc_zeros::<f32>(part_len * 2)?;
        let smem_floats = BLOCK_ROWS * d + TILE_KEYS * (d + 1) + TILE_KEYS * d;
        let cfg = LaunchConfig {
            grid_dim: (b.num_tiles as u32, b.num_splits, b.layout.num_kv_heads as u32),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: (smem_floats * 4) as u32,
        };
        let stream = b.device.cuda_stream();
        // A rotated K: score `H q` against the stored `H k`.
        let q_rotated = match self.q_rotation {
            Some(rotation) => {
                let rotated = b.device.alloc_zeros::<f32>(len)?;
                rotate_heads(b, rotation, &q, &rotated, b.n_rows * b.num_heads)?;
                Some(rotated)
            }
            None => None,
        };
        let func = b.func(&self.kernel)?;
        let scale_log2 = self.scale * std::f32::consts::LOG2_E;
        let (num_heads, num_kv_heads, page_size) =
            (b.num_heads as u32, b.layout.num_kv_heads as u32, b.layout.page_size as u32);
        let mut args = stream.launch_builder(&func);
        match &q_rotated {
            Some(rotated) => args.arg(rotated),
            None => args.arg(&q),
        };
        push_cache(&mut args, &k.slice)?;
        push_cache(&mut args, &v.slice)?;
        args.arg(&b.seqs).arg(&b.page_tables).arg(&b.tiles).arg(&out).arg(&part_acc).arg(&part_ml);
        args.arg(&num_heads).arg(&num_kv_heads).arg(&page_size).arg(&b.partition).arg(&b.num_splits);
        args.arg(&scale_log2);
        // SAFETY: argument types and order match the kernel; the batch was validated against the
        // pool layout (rows, page tables, pages), the caches against its size, and every buffer
        // the kernel writes was sized here for the rows, heads and splits it covers.
        unsafe { args.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
        if splits > 1 {
            let combine = b.func("radix_attention_combine")?;
            let cfg = LaunchConfig {
                grid_dim: ((b.n_rows * b.num_heads) as u32, 1, 1),
                block_dim: (d as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let (num_splits, head_dim) = (b.num_splits, d as u32);
            let mut args = stream.launch_builder(&combine);
            args.arg(&part_acc).arg(&part_ml).arg(&out).arg(&num_splits).arg(&head_dim);
            // SAFETY: the partial buffers hold num_splits entries for every (row, head), as the
            // attention kernel wrote them; `out` has one head_dim row per (row, head).
            unsafe { args.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
        }
        // A rotated V: the weighted sum of the stored `H v` is `H` of the one wanted.
        if let Some(rotation) = self.out_rotation {
            rotate_heads(b, rotation, &out.slice(..), &out, b.n_rows * b.num_heads)?;
        }
        Ok((CudaStorage::wrap_cuda_slice(out, b.device.clone()), shape))
    }
}

/// Pushes a K or V cache's storage as the attention kernel's cache pointer.
fn push_cache<'a>(args: &mut LaunchArgs<'a>, cache: &'a CudaStorageSlice) -> candle_core::Result<()> {
    match cache {
        CudaStorageSlice::F32(c) => args.arg(c),
        CudaStorageSlice::F16(c) => args.arg(c),
        CudaStorageSlice::BF16(c) => args.arg(c),
        CudaStorageSlice::U8(c) => args.arg(c),
        _ => candle_core::bail!("a KV cache of an unsupported type"),
    };
    Ok(())
}

/// Rotates `heads` rows of head_dim f32 from `src` into `dst` (which may be `src`) by Hadamard
/// blocks, one thread block a head.
fn rotate_heads(
    b: &CudaAttentionBatch,
    rotation: Rotation,
    src: &CudaView<'_, f32>,
    dst: &CudaSlice<f32>,
    heads: usize,
) -> candle_core::Result<()> {
    let func = b.func("radix_hadamard_heads")?;
    let head_dim = b.layout.head_dim as u32;
    let Rotation { block, norm } = rotation;
    let cfg = LaunchConfig {
        grid_dim: (heads as u32, 1, 1),
        block_dim: ((head_dim / 2).max(32), 1, 1),
        shared_mem_bytes: head_dim * 4,
    };
    let stream = b.device.cuda_stream();
    let mut args = stream.launch_builder(&func);
    args.arg(src).arg(dst).arg(&head_dim).arg(&block).arg(&norm);
    // SAFETY: argument types and order match the kernel; `src` and `dst` hold `heads` rows of
    // head_dim f32 (the queries or the output of this batch), and the kernel reads a whole head
    // into shared memory before writing any of it, so `dst` may be `src`.
    unsafe { args.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
    Ok(())
}
