//! Grouped-query self-attention: q/k/v projections (Qwen2 adds biases, Qwen3 normalises each
//! head of q and k, Qwen3.5's q projection also yields a gate on the output), RoPE, attention
//! over the paged context, and the output projection. How the
//! rows are rotated, stored and attended is the pass's [`ForwardContext`]'s business, so this
//! layer is the same on every device.

use candle_core::Tensor;

use super::backend::ForwardContext;
use crate::config::{Architecture, ModelConfig};
use crate::error::Result;
use crate::kv_pool::LayerKv;
use crate::layers::{Linear, RmsNorm};
use crate::weights::{TensorName, Weights};

/// One decoder layer's attention.
pub(crate) struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// Qwen3's RMSNorm on each head of q and of k, before RoPE.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// Qwen3.5: each head's rows of the q projection are its query, then its output gate.
    output_gate: bool,
}

impl Attention {
    /// Loads layer `layer`'s attention.
    pub(crate) fn load(config: &ModelConfig, layer: usize, w: &mut Weights) -> Result<Self> {
        let name = |gguf: &str, hf: &str| TensorName::layer(layer, gguf, hf);
        let c = config;
        let (hidden, q_dim, kv_dim) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        // Qwen2 has q/k/v biases; a file's own biases load on any projection.
        let biased = c.arch == Architecture::Qwen2;
        let q_rows = if c.attention_output_gate { 2 * q_dim } else { q_dim };
        let q = w.linear(&name("attn_q", "self_attn.q_proj"), [q_rows, hidden], biased)?;
        let k = w.linear(&name("attn_k", "self_attn.k_proj"), [kv_dim, hidden], biased)?;
        let v = w.linear(&name("attn_v", "self_attn.v_proj"), [kv_dim, hidden], biased)?;
        let o = w.linear(&name("attn_output", "self_attn.o_proj"), [hidden, q_dim], false)?;
        let qk_norm = if c.arch.has_qk_norm() {
            let q_norm = w.rms_norm(&name("attn_q_norm", "self_attn.q_norm"), c.head_dim, c.rms_norm_eps)?;
            let k_norm = w.rms_norm(&name("attn_k_norm", "self_attn.k_norm"), c.head_dim, c.rms_norm_eps)?;
            Some((q_norm, k_norm))
        } else {
            None
        };
        Ok(Attention { q, k, v, o, qk_norm, output_gate: c.attention_output_gate })
    }

    /// Attends the normed rows `x` (`[rows, hidden]`) over their sequences' contexts in `kv`,
    /// writing their own K/V there first: `[rows, hidden]`.
    pub(crate) fn forward(&self, x: &Tensor, ctx: &ForwardContext, kv: &mut LayerKv) -> Result<Tensor> {
        let [q, k, v]: [Tensor; 3] =
            Linear::forward_shared(&[&self.q, &self.k, &self.v], x)?.try_into().expect("three projections");
        let (n, heads) = (x.dim(0)?, ctx.heads());
        let (q, gate) = if self.output_gate {
            let q = q.reshape((n, heads.num_heads, 2 * heads.head_dim))?;
            let gate = q.narrow(2, heads.head_dim, heads.head_dim)?.reshape((n, heads.num_heads * heads.head_dim))?;
            (q.narrow(2, 0, heads.head_dim)?.contiguous()?, Some(gate))
        } else {
            (q, None)
        };
        let (q, k) = match &self.qk_norm {
            Some((q_norm, k_norm)) => {
                let q = q_norm.forward(&q.reshape((n, heads.num_heads, heads.head_dim))?)?;
                (q, k_norm.forward(&k.reshape((n, heads.num_kv_heads, heads.head_dim))?)?)
            }
            None => (q, k),
        };
        let out = ctx.attend(q, k, v, kv)?;
        let out = match gate {
            Some(gate) => (out * candle_nn::ops::sigmoid(&gate)?)?,
            None => out,
        };
        self.o.forward(&out)
    }

    /// Writes the normed rows' K/V into `kv` and attends to nothing
    /// ([`ForwardContext::write_kv`]).
    pub(crate) fn write_kv(&self, x: &Tensor, ctx: &ForwardContext, kv: &mut LayerKv) -> Result<()> {
        let [k, v]: [Tensor; 2] = Linear::forward_shared(&[&self.k, &self.v], x)?.try_into().expect("two projections");
        let heads = ctx.heads();
        let k = match &self.qk_norm {
            Some((_, k_norm)) => k_norm.forward(&k.reshape((x.dim(0)?, heads.num_kv_heads, heads.head_dim))?)?,
            None => k,
        };
        ctx.write_kv(k, v, kv)
    }
}
