//! Attention by gathering each sequence's context through its page table, then candle's matmul
//! and softmax: the device backend wherever no kernel of ours runs (Metal, and the CPU when it
//! runs the tensor path for tests). Works on any device candle supports, at the cost of copying
//! every context once per layer.

use candle_core::{DType, Device, Tensor};
use radix_kernels::{PagedLayout, SequenceAttention};

use super::backend::Heads;
use crate::error::Result;

/// Per-pass index tensors, built once and shared by every layer.
pub(crate) struct GatherPlan {
    heads: Heads,
    layout: PagedLayout,
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

impl GatherPlan {
    /// Uploads the batch's slots, context slots and causal masks to `device`.
    pub(crate) fn new(
        heads: Heads,
        layout: &PagedLayout,
        n: usize,
        seqs: &[SequenceAttention],
        slots: &[u32],
        device: &Device,
    ) -> Result<Self> {
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
        Ok(GatherPlan { heads, layout: *layout, write_index, seqs: planned })
    }

    /// Writes the new K/V rows (`[rows, kv_heads * head_dim]` f32) into the layer's pool, then
    /// attends per sequence over its gathered context: `q` is `[rows, heads, head_dim]`; gives
    /// `[rows, heads * head_dim]` f32.
    pub(crate) fn attend(
        &self,
        scale: f32,
        q: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
    ) -> Result<Tensor> {
        let Heads { num_heads, num_kv_heads: kv_heads, head_dim: d } = self.heads;
        let group = num_heads / kv_heads;
        let shape = (self.layout.num_slots(), self.layout.slot_len());
        // Reshapes of a contiguous tensor share its storage: the scatter writes the pool.
        let (k_pool, v_pool) = (k_cache.reshape(shape)?, v_cache.reshape(shape)?);
        k_pool.scatter_set(&self.write_index, &k_new.to_dtype(k_cache.dtype())?, 0)?;
        v_pool.scatter_set(&self.write_index, &v_new.to_dtype(v_cache.dtype())?, 0)?;
        let mut outs = Vec::with_capacity(self.seqs.len());
        for s in &self.seqs {
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
            outs.push(out.permute((2, 0, 1, 3))?.contiguous()?.reshape((s.len, num_heads * d))?);
        }
        Ok(Tensor::cat(&outs, 0)?)
    }
}
