//! One pre-norm decoder layer: `x + attention(norm(x))`, then `x + mlp(norm(x))`.

use candle_core::Tensor;

use super::attention::Attention;
use super::backend::ForwardContext;
use super::mlp::Mlp;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kv_pool::LayerKv;
use crate::layers::RmsNorm;
use crate::weights::{TensorName, Weights};

/// A full-attention decoder layer.
pub(crate) struct DecoderLayer {
    attn_norm: RmsNorm,
    attention: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    /// Loads layer `layer`.
    pub(crate) fn load(config: &ModelConfig, layer: usize, w: &mut Weights) -> Result<Self> {
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        Ok(DecoderLayer {
            attn_norm: w.rms_norm(&TensorName::layer(layer, "attn_norm", "input_layernorm"), hidden, eps)?,
            attention: Attention::load(config, layer, w)?,
            ffn_norm: w.rms_norm(&TensorName::layer(layer, "ffn_norm", "post_attention_layernorm"), hidden, eps)?,
            mlp: Mlp::load(config, layer, w)?,
        })
    }

    /// The residual stream `[rows, hidden]` after this layer; the rows' K/V go into `kv`.
    pub(crate) fn forward(&self, x: &Tensor, ctx: &ForwardContext, kv: &mut LayerKv) -> Result<Tensor> {
        let x = (x + self.attention.forward(&self.attn_norm.forward(x)?, ctx, kv)?)?;
        let mlp = self.mlp.forward(&self.ffn_norm.forward(&x)?)?;
        Ok((x + mlp)?)
    }
}
