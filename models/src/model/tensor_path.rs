//! The tensor path: a forward pass as candle ops on the model's device, with the KV pool held as
//! one tensor per layer's K and V. GPUs run it (CUDA, Metal); the CPU runs it when asked
//! ([`LoadOptions::tensor_path`](crate::LoadOptions::tensor_path)), which is how the CPU tests
//! cover it. Norms, RoPE, matmuls and the MLP are shared by every device; attention is our CUDA
//! kernels on `cuda`, and elsewhere a gather of each sequence's context through its page table
//! followed by candle's matmul and softmax.

use candle_core::{DType, Tensor};
use radix_kernels::{PagedLayout, SequenceAttention};

use super::{DecoderLayer, Model};
use crate::batch::ForwardBatch;
use crate::error::Result;
use crate::kv_pool::KvPool;
use crate::rope::RopeLayout;

/// How one forward pass attends, planned once and used by every layer.
enum Attention {
    /// Our kernels over the pool in GPU memory.
    #[cfg(feature = "cuda")]
    Cuda(Box<radix_kernels::cuda::CudaAttentionBatch>),
    /// Scatter the new rows into the pool, gather each context, attend with candle ops.
    Gather(GatherPlan),
}

struct GatherPlan {
    /// `[rows, slot_len]` u32: each new row's slot repeated along the row, as `scatter_set`
    /// takes its index.
    write_index: Tensor,
    seqs: Vec<GatherSequence>,
}

struct GatherSequence {
    start: usize,
    len: usize,
    /// `[context_len]` u32: the slot of every position.
    context_slots: Tensor,
    /// `[len, context_len]` f32: 0 where a new token sees a position, -inf past it (causal);
    /// none for a single token, which sees its whole context.
    mask: Option<Tensor>,
}

/// Per-pass inputs shared by the layers.
struct Pass<'a> {
    cos: Tensor,
    sin: Tensor,
    attention: Attention,
    layout: &'a PagedLayout,
}

impl Model {
    /// [`Model::forward`] on the tensor path (the caller checked the batch and the pool).
    pub(super) fn forward_tensors(&self, batch: &ForwardBatch, kv: &mut KvPool) -> Result<Tensor> {
        let device = &self.device;
        let layout = *kv.layout();
        let n = batch.tokens.len();
        let angles = self.rope.angles(batch.positions());
        let (cos, sin, half) = angles.cos_sin();
        // [tokens, 1, half]: candle's rope kernels take one row of angles per batch entry, and
        // each token is its own batch entry at its own position.
        let cos = Tensor::from_slice(cos, (n, 1, half), device)?;
        let sin = Tensor::from_slice(sin, (n, 1, half), device)?;
        let seqs = batch.attention_sequences();
        let slots = batch.slots(layout.page_size);
        let pass = Pass { cos, sin, attention: self.plan_attention(&layout, n, &seqs, &slots)?, layout: &layout };

        let ids = Tensor::from_slice(&batch.tokens, n, device)?;
        let mut x = self.embedding.forward(&ids)?;
        for (layer, layer_kv) in self.layers.iter().zip(kv.layers.iter()) {
            let (k_cache, v_cache) = layer_kv.tensors().expect("forward checked that the pool holds tensors");
            x = self.layer_tensors(layer, &x, &pass, k_cache, v_cache)?;
        }
        let rows = batch.logit_rows();
        if rows.is_empty() {
            return Ok(Tensor::zeros((0, self.config.vocab_size), DType::F32, device)?);
        }
        let rows = Tensor::from_slice(&rows, rows.len(), device)?;
        let last = x.index_select(&rows, 0)?;
        let normed = candle_nn::ops::rms_norm(&last, &self.norm, self.config.rms_norm_eps as f32)?;
        self.lm_head.forward(&normed)
    }

    fn plan_attention(
        &self,
        layout: &PagedLayout,
        n: usize,
        seqs: &[SequenceAttention],
        slots: &[u32],
    ) -> Result<Attention> {
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() {
            let batch = radix_kernels::cuda::CudaAttentionBatch::new(
                &self.device,
                layout,
                self.config.num_heads,
                n,
                seqs,
                slots,
            )?;
            return Ok(Attention::Cuda(Box::new(batch)));
        }
        let device = &self.device;
        let write_index =
            Tensor::from_slice(slots, (n, 1), device)?.broadcast_as((n, layout.slot_len()))?.contiguous()?;
        let ps = layout.page_size;
        let mut planned = Vec::with_capacity(seqs.len());
        for s in seqs {
            let ctx = s.context_len;
            let context_slots: Vec<u32> =
                (0..ctx).map(|p| s.page_table[p / ps] * ps as u32 + (p % ps) as u32).collect();
            let mask = (s.query_len > 1)
                .then(|| {
                    let first = ctx - s.query_len;
                    let mask: Vec<f32> = (0..s.query_len)
                        .flat_map(|t| (0..ctx).map(move |p| if p <= first + t { 0.0 } else { f32::NEG_INFINITY }))
                        .collect();
                    Tensor::from_vec(mask, (s.query_len, ctx), device)
                })
                .transpose()?;
            planned.push(GatherSequence {
                start: s.query_start,
                len: s.query_len,
                context_slots: Tensor::from_vec(context_slots, ctx, device)?,
                mask,
            });
        }
        Ok(Attention::Gather(GatherPlan { write_index, seqs: planned }))
    }

    fn layer_tensors(
        &self,
        layer: &DecoderLayer,
        x: &Tensor,
        pass: &Pass,
        k_cache: &Tensor,
        v_cache: &Tensor,
    ) -> Result<Tensor> {
        let c = &self.config;
        let eps = c.rms_norm_eps as f32;
        let n = x.dim(0)?;
        let h = candle_nn::ops::rms_norm(x, &layer.attn_norm, eps)?;
        let mut q = layer.q.forward(&h)?.reshape((n, c.num_heads, c.head_dim))?;
        let mut k = layer.k.forward(&h)?.reshape((n, c.num_kv_heads, c.head_dim))?;
        let v = layer.v.forward(&h)?.contiguous()?;
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            q = candle_nn::ops::rms_norm(&q, qn, eps)?;
            k = candle_nn::ops::rms_norm(&k, kn, eps)?;
        }
        let q = self.rope_tensor(&q, pass)?;
        let k = self.rope_tensor(&k, pass)?.reshape((n, c.num_kv_heads * c.head_dim))?;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let attn = match &pass.attention {
            #[cfg(feature = "cuda")]
            Attention::Cuda(batch) => {
                batch.write_kv(&k, &v, k_cache, v_cache)?;
                batch.attention(&q.reshape((n, c.num_heads * c.head_dim))?, k_cache, v_cache, scale)?
            }
            Attention::Gather(plan) => self.gather_attention(plan, pass.layout, &q, &k, &v, k_cache, v_cache, scale)?,
        };
        let x = (x + layer.o.forward(&attn)?)?;
        let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
        let mlp = layer.down.forward(&(layer.gate.forward(&h)?.silu()? * layer.up.forward(&h)?)?)?;
        Ok((x + mlp)?)
    }

    /// Rotates `[tokens, heads, head_dim]` by each token's angles.
    fn rope_tensor(&self, x: &Tensor, pass: &Pass) -> Result<Tensor> {
        let (n, heads, d) = x.dims3()?;
        let x = x.contiguous()?.reshape((n, heads, 1, d))?;
        let rotated = match self.rope.layout() {
            RopeLayout::Neox => candle_nn::rotary_emb::rope(&x, &pass.cos, &pass.sin)?,
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x, &pass.cos, &pass.sin)?,
        };
        Ok(rotated.reshape((n, heads, d))?)
    }

    /// Writes the new K/V rows into the pool, then attends per sequence over its gathered
    /// context: `[rows, heads * head_dim]` f32.
    #[allow(clippy::too_many_arguments)]
    fn gather_attention(
        &self,
        plan: &GatherPlan,
        layout: &PagedLayout,
        q: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (kv_heads, d) = (c.num_kv_heads, c.head_dim);
        let group = c.num_heads / kv_heads;
        let shape = (layout.num_slots(), layout.slot_len());
        // Reshapes of a contiguous tensor share its storage: the scatter writes the pool.
        let (k_pool, v_pool) = (k_cache.reshape(shape)?, v_cache.reshape(shape)?);
        k_pool.scatter_set(&plan.write_index, &k_new.to_dtype(k_cache.dtype())?, 0)?;
        v_pool.scatter_set(&plan.write_index, &v_new.to_dtype(v_cache.dtype())?, 0)?;
        let mut outs = Vec::with_capacity(plan.seqs.len());
        for s in &plan.seqs {
            let ctx = s.context_slots.dim(0)?;
            let gather = |pool: &Tensor| -> Result<Tensor> {
                let rows = pool.index_select(&s.context_slots, 0)?.to_dtype(DType::F32)?;
                Ok(rows.reshape((ctx, kv_heads, d))?.transpose(0, 1)?.contiguous()?)
            };
            let (keys, values) = (gather(&k_pool)?, gather(&v_pool)?); // [kv_heads, ctx, d]
            // Rows of one KV head's group side by side: [kv_heads, group * len, d].
            let qs = q.narrow(0, s.start, s.len)?.reshape((s.len, kv_heads, group, d))?.permute((1, 2, 0, 3))?;
            let qs = qs.contiguous()?.reshape((kv_heads, group * s.len, d))?;
            let mut scores = (qs.matmul(&keys.t()?)? * scale as f64)?;
            if let Some(mask) = &s.mask {
                scores = scores.reshape((kv_heads, group, s.len, ctx))?.broadcast_add(mask)?;
                scores = scores.reshape((kv_heads, group * s.len, ctx))?;
            }
            let weights = candle_nn::ops::softmax_last_dim(&scores)?;
            let out = weights.matmul(&values)?.reshape((kv_heads, group, s.len, d))?;
            outs.push(out.permute((2, 0, 1, 3))?.contiguous()?.reshape((s.len, c.num_heads * d))?);
        }
        Ok(Tensor::cat(&outs, 0)?)
    }
}
