//! The device seam: where one forward pass keeps its rows and which attention runs, decided
//! once when the pass starts ([`ForwardContext::new`]) and used by every layer, so each layer
//! kind is written once for every device.
//!
//! - **Host** (the CPU path): K/V pages in host memory; RoPE is applied to the rows in place and
//!   radix-kernels' `write_kv` and `paged_attention` run on the model's thread pool.
//! - **Device** (the tensor path: CUDA, Metal, or the CPU when testing that path): K/V pages are
//!   one tensor per layer on the model's device and RoPE runs as candle ops; attention is our
//!   CUDA kernels on `cuda`, and elsewhere a gather of each sequence's context
//!   ([`super::gather`]).
//!
//! Everything else a layer does (norms, projections, the MLP) is the same candle code on every
//! device; only attention and the K/V write branch here.

use candle_core::{Device, Tensor};
use radix_kernels::{KvElement, PagedLayout, SequenceAttention, paged_attention, write_kv};

use super::gather::GatherPlan;
use crate::batch::{ForwardBatch, SequenceChunk};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_pool::{DeviceKv, KvSlice, LayerKv};
use crate::rope::{Rope, RopeAngles, RopeTensors};

/// The head geometry of the model's attention layers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    /// Query heads.
    pub(crate) num_heads: usize,
    /// Key/value heads.
    pub(crate) num_kv_heads: usize,
    /// Width of one head.
    pub(crate) head_dim: usize,
}

/// What the attention of one forward pass shares across layers.
pub(crate) struct ForwardContext<'a> {
    heads: Heads,
    /// The batch's sequences, for the recurrent layers' per-sequence state.
    chunks: &'a [SequenceChunk],
    /// `1 / sqrt(head_dim)`.
    scale: f32,
    backend: Backend<'a>,
    /// Hybrid models on CUDA: the pass's sequences for the Gated DeltaNet kernels, uploaded once.
    #[cfg(feature = "cuda")]
    recurrent: Option<radix_kernels::cuda::delta_net::CudaRecurrentBatch>,
}

/// Where the pass keeps its rows and K/V.
enum Backend<'a> {
    /// Host memory and radix-kernels' CPU kernels.
    Host(HostPlan<'a>),
    /// Tensors on the model's device.
    Device { rope: RopeTensors, kernel: DeviceKernel },
}

/// The CPU path's per-pass inputs.
struct HostPlan<'a> {
    rope: &'a Rope,
    angles: RopeAngles,
    /// The pool slot of every new token.
    slots: Vec<u32>,
    seqs: Vec<SequenceAttention<'a>>,
    layout: PagedLayout,
}

/// Which attention runs over a pool of tensors.
enum DeviceKernel {
    /// Our kernels over the pool in GPU memory.
    #[cfg(feature = "cuda")]
    Cuda(Box<radix_kernels::cuda::CudaAttentionBatch>),
    /// Scatter the new rows into the pool, gather each context, attend with candle ops.
    Gather(GatherPlan),
}

impl<'a> ForwardContext<'a> {
    /// Plans a pass of `batch` over a pool of `layout`: on the host, or (`tensor_path`) with
    /// tensors on `device`.
    pub(crate) fn new(
        config: &ModelConfig,
        rope: &'a Rope,
        batch: &'a ForwardBatch,
        layout: PagedLayout,
        device: &Device,
        tensor_path: bool,
    ) -> Result<Self> {
        let heads = Heads { num_heads: config.num_heads, num_kv_heads: config.num_kv_heads, head_dim: config.head_dim };
        let angles = rope.angles(batch.positions());
        let backend = if tensor_path {
            let kernel = DeviceKernel::plan(heads, &layout, batch, device)?;
            Backend::Device { rope: RopeTensors::new(&angles, rope.layout(), device)?, kernel }
        } else {
            let (slots, seqs) = (batch.slots(layout.page_size), batch.attention_sequences());
            Backend::Host(HostPlan { rope, angles, slots, seqs, layout })
        };
        #[cfg(feature = "cuda")]
        let recurrent = match config.hybrid.is_some() && tensor_path && device.is_cuda() {
            true => Some(radix_kernels::cuda::delta_net::CudaRecurrentBatch::new(
                device,
                batch.tokens.len(),
                &recurrent_sequences(&batch.sequences)?,
            )?),
            false => None,
        };
        Ok(ForwardContext {
            heads,
            chunks: &batch.sequences,
            scale: 1.0 / (config.head_dim as f32).sqrt(),
            backend,
            #[cfg(feature = "cuda")]
            recurrent,
        })
    }

    /// Hybrid models on CUDA: the pass's sequences as the Gated DeltaNet kernels take them.
    #[cfg(feature = "cuda")]
    pub(crate) fn recurrent_batch(&self) -> Option<&radix_kernels::cuda::delta_net::CudaRecurrentBatch> {
        self.recurrent.as_ref()
    }

    /// The batch's sequences, in row order.
    pub(crate) fn chunks(&self) -> &'a [SequenceChunk] {
        self.chunks
    }

    /// The head geometry every attention layer of the pass has.
    pub(crate) fn heads(&self) -> Heads {
        self.heads
    }

    /// Rotates the new rows' `q` (`[rows, heads * head_dim]` or `[rows, heads, head_dim]`) and
    /// `k`, writes `k` and `v` into the layer's pool, and attends over each sequence's context:
    /// `[rows, heads * head_dim]` f32.
    pub(crate) fn attend(&self, q: Tensor, k: Tensor, v: Tensor, kv: &mut LayerKv) -> Result<Tensor> {
        let Heads { num_heads, num_kv_heads, head_dim } = self.heads;
        let n = q.dim(0)?;
        match &self.backend {
            Backend::Host(plan) => {
                let mut q = q.flatten_all()?.to_vec1::<f32>()?;
                let mut k = k.flatten_all()?.to_vec1::<f32>()?;
                let v = v.flatten_all()?.to_vec1::<f32>()?;
                plan.rope.apply(&plan.angles, &mut q, num_heads);
                plan.rope.apply(&plan.angles, &mut k, num_kv_heads);
                let mut out = vec![0.0f32; n * num_heads * head_dim];
                let scale = self.scale;
                on_typed_kv(kv, HostAttend { plan, num_heads, scale, q: &q, k: &k, v: &v, out: &mut out })?;
                Ok(Tensor::from_vec(out, (n, num_heads * head_dim), &Device::Cpu)?)
            }
            Backend::Device { rope, kernel } => {
                let (k_cache, v_cache) = kv.device_storage().ok_or_else(|| pool_mismatch("host memory", "tensor"))?;
                let q = rope.apply(&q.reshape((n, num_heads, head_dim))?)?;
                let k = rope.apply(&k.reshape((n, num_kv_heads, head_dim))?)?.reshape((n, num_kv_heads * head_dim))?;
                let v = v.contiguous()?;
                match kernel {
                    #[cfg(feature = "cuda")]
                    DeviceKernel::Cuda(batch) => {
                        let (k_cache, v_cache) = (cuda_cache(k_cache)?, cuda_cache(v_cache)?);
                        batch.write_kv(&k, &v, k_cache, v_cache)?;
                        let q = q.reshape((n, num_heads * head_dim))?;
                        Ok(batch.attention(&q, k_cache, v_cache, self.scale)?)
                    }
                    DeviceKernel::Gather(plan) => match (k_cache, v_cache) {
                        (DeviceKv::Values(k_cache), DeviceKv::Values(v_cache)) => {
                            plan.attend(self.scale, &q, &k, &v, k_cache, v_cache)
                        }
                        // `KvPool::on_device` refuses these off CUDA.
                        _ => Err(ModelError::KvPool("block K/V types on a device other than CUDA".into())),
                    },
                }
            }
        }
    }
}

impl ForwardContext<'_> {
    /// Rotates the new rows' `k` and writes it and `v` into the layer's pool, attending to
    /// nothing: a layer whose rows only later passes read (the multi-token-prediction head's,
    /// in the decoder's own pass). The CPU path only.
    pub(crate) fn write_kv(&self, k: Tensor, v: Tensor, kv: &mut LayerKv) -> Result<()> {
        let Backend::Host(plan) = &self.backend else {
            return Err(ModelError::KvPool("the multi-token-prediction head runs on the CPU path only".into()));
        };
        let mut k = k.flatten_all()?.to_vec1::<f32>()?;
        let v = v.flatten_all()?.to_vec1::<f32>()?;
        plan.rope.apply(&plan.angles, &mut k, self.heads.num_kv_heads);
        on_typed_kv(kv, HostWrite { plan, k: &k, v: &v })
    }
}

/// What runs on a layer's host pages whatever pair of K and V types they hold.
trait OnTypedKv {
    fn run<K: KvElement, V: KvElement>(self, k_cache: &mut [K], v_cache: &mut [V]) -> Result<()>;
}

/// Runs `op` on `kv`'s host pages as the pair of types they hold: the pairs `KvTypes::check`
/// lets a pool have.
fn on_typed_kv(kv: &mut LayerKv, op: impl OnTypedKv) -> Result<()> {
    use KvSlice::*;
    match kv.typed() {
        Some((F32(kc), F32(vc))) => op.run(kc, vc),
        Some((BF16(kc), BF16(vc))) => op.run(kc, vc),
        Some((F16(kc), F16(vc))) => op.run(kc, vc),
        Some((F16(kc), Q8_0(vc))) => op.run(kc, vc),
        Some((F16(kc), Q4_0(vc))) => op.run(kc, vc),
        Some((Q8_0(kc), F16(vc))) => op.run(kc, vc),
        Some((Q8_0(kc), Q8_0(vc))) => op.run(kc, vc),
        Some((Q8_0(kc), Q4_0(vc))) => op.run(kc, vc),
        Some((Q4_0(kc), F16(vc))) => op.run(kc, vc),
        Some((Q4_0(kc), Q8_0(vc))) => op.run(kc, vc),
        Some((Q4_0(kc), Q4_0(vc))) => op.run(kc, vc),
        Some(_) => Err(ModelError::KvPool("a K/V type pair the kernels do not read".into())),
        None => Err(pool_mismatch("tensors on a device", "host")),
    }
}

/// Writes the new rows' K/V, then attends over each sequence's context.
struct HostAttend<'p, 'a> {
    plan: &'p HostPlan<'a>,
    num_heads: usize,
    scale: f32,
    q: &'p [f32],
    k: &'p [f32],
    v: &'p [f32],
    out: &'p mut [f32],
}

impl OnTypedKv for HostAttend<'_, '_> {
    fn run<K: KvElement, V: KvElement>(self, k_cache: &mut [K], v_cache: &mut [V]) -> Result<()> {
        self.plan.attend(self.num_heads, self.scale, self.q, self.k, self.v, k_cache, v_cache, self.out)
    }
}

/// Writes the new rows' K/V only.
struct HostWrite<'p, 'a> {
    plan: &'p HostPlan<'a>,
    k: &'p [f32],
    v: &'p [f32],
}

impl OnTypedKv for HostWrite<'_, '_> {
    fn run<K: KvElement, V: KvElement>(self, k_cache: &mut [K], v_cache: &mut [V]) -> Result<()> {
        let plan = self.plan;
        Ok(write_kv(&plan.layout, self.k, self.v, &plan.slots, k_cache, v_cache)?)
    }
}

impl HostPlan<'_> {
    /// Writes the new tokens' K/V into their slots, then attends over each sequence's context.
    #[allow(clippy::too_many_arguments)]
    fn attend<K: KvElement, V: KvElement>(
        &self,
        num_heads: usize,
        scale: f32,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        k_cache: &mut [K],
        v_cache: &mut [V],
        out: &mut [f32],
    ) -> Result<()> {
        write_kv(&self.layout, k, v, &self.slots, k_cache, v_cache)?;
        paged_attention(&self.layout, num_heads, scale, q, k_cache, v_cache, &self.seqs, out)?;
        Ok(())
    }
}

impl DeviceKernel {
    /// Our CUDA kernels on a CUDA device, the gather everywhere else.
    fn plan(heads: Heads, layout: &PagedLayout, batch: &ForwardBatch, device: &Device) -> Result<Self> {
        let (n, slots, seqs) = (batch.tokens.len(), batch.slots(layout.page_size), batch.attention_sequences());
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            let batch =
                radix_kernels::cuda::CudaAttentionBatch::new(device, layout, heads.num_heads, n, &seqs, &slots)?;
            return Ok(DeviceKernel::Cuda(Box::new(batch)));
        }
        Ok(DeviceKernel::Gather(GatherPlan::new(heads, layout, n, &seqs, &slots, device)?))
    }
}

/// The batch's sequences as the Gated DeltaNet kernels read them: rows, state slot, and a zero
/// start for a chunk at position 0.
#[cfg(any(feature = "cuda", test))]
fn recurrent_sequences(
    chunks: &[SequenceChunk],
) -> Result<Vec<radix_kernels::delta_net::device_order::RecurrentSequence>> {
    chunks
        .iter()
        .map(|c| {
            let slot = c
                .state_slot
                .ok_or_else(|| ModelError::Batch("a sequence of a hybrid model's batch has no state slot".into()))?;
            Ok(radix_kernels::delta_net::device_order::RecurrentSequence {
                first_row: c.start,
                rows: c.len,
                slot: slot as usize,
                fresh: c.context_len == c.len,
            })
        })
        .collect()
}

/// A layer's K or V as our CUDA kernels take it.
#[cfg(feature = "cuda")]
fn cuda_cache(kv: DeviceKv<'_>) -> Result<radix_kernels::cuda::CudaKvCache<'_>> {
    use crate::KvDType;
    use radix_kernels::cuda::CudaKvCache;
    Ok(match kv {
        DeviceKv::Values(t) => CudaKvCache::Values(t),
        DeviceKv::Blocks(KvDType::Q8_0, t) => CudaKvCache::Q8_0(t),
        DeviceKv::Blocks(KvDType::Q4_0, t) => CudaKvCache::Q4_0(t),
        DeviceKv::Blocks(other @ (KvDType::F32 | KvDType::F16 | KvDType::BF16), _) => {
            return Err(ModelError::KvPool(format!("{other} values stored as blocks")));
        }
    })
}

/// A pool that is not where the pass runs ([`crate::Model::forward`] checks this first).
fn pool_mismatch(pool: &str, path: &str) -> ModelError {
    ModelError::KvPool(format!("the pool is in {pool} but the model runs the {path} path"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk at position 0 starts from zero; a continuing chunk and a decode step from their
    /// slots; a sequence without a slot is an error, not a launch.
    #[test]
    fn chunks_become_the_kernels_sequences() {
        let chunk = |start, len, context_len, state_slot| SequenceChunk {
            start,
            len,
            context_len,
            page_table: Vec::new(),
            logits: true,
            state_slot,
            verify: false,
        };
        let seqs = recurrent_sequences(&[chunk(0, 5, 5, Some(3)), chunk(5, 4, 20, Some(0)), chunk(9, 1, 31, Some(7))])
            .unwrap();
        let words: Vec<[u32; 4]> = seqs.iter().map(|s| s.words()).collect();
        assert_eq!(words, [[0, 5, 3, 1], [5, 4, 0, 0], [9, 1, 7, 0]]);
        assert!(recurrent_sequences(&[chunk(0, 1, 1, None)]).is_err());
    }
}
