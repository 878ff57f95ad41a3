//! One pre-norm decoder layer: `x + mixer(norm(x))`, then `x + mlp(norm(x))`. The mixer is
//! attention over the paged KV pool or (hybrid models) a Gated DeltaNet over the recurrent
//! state; the MLP is dense or a sparse mixture of experts.

use candle_core::Tensor;

use super::attention::Attention;
use super::backend::ForwardContext;
use super::delta_net::GatedDeltaNet;
use super::mlp::Mlp;
use super::moe::SparseMoe;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_pool::LayerKv;
use crate::layers::RmsNorm;
use crate::state_pool::LayerState;
use crate::weights::{TensorName, Weights};

/// What mixes a layer's rows across positions.
enum Mixer {
    Attention(Attention),
    DeltaNet(GatedDeltaNet),
}

/// A layer's MLP.
enum Ffn {
    Dense(Mlp),
    Sparse(SparseMoe),
}

/// The cache a layer reads and writes: its KV pool layer or its recurrent state.
pub(crate) enum LayerCache<'a> {
    Kv(&'a mut LayerKv),
    State(&'a mut LayerState),
}

/// A decoder layer.
pub(crate) struct DecoderLayer {
    attn_norm: RmsNorm,
    mixer: Mixer,
    ffn_norm: RmsNorm,
    ffn: Ffn,
}

impl DecoderLayer {
    /// Loads layer `layer`.
    pub(crate) fn load(config: &ModelConfig, layer: usize, w: &mut Weights) -> Result<Self> {
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        let mixer = match &config.hybrid {
            Some(hybrid) if config.is_recurrent_layer(layer) => {
                Mixer::DeltaNet(GatedDeltaNet::load(config, hybrid, layer, w)?)
            }
            _ => Mixer::Attention(Attention::load(config, layer, w)?),
        };
        let ffn = match &config.moe {
            Some(moe) if config.is_sparse_layer(layer) => Ffn::Sparse(SparseMoe::load(config, moe, layer, w)?),
            _ => Ffn::Dense(Mlp::load(config, layer, w)?),
        };
        // llama.cpp names Qwen3.5's second norm after the attention it follows.
        let ffn_norm_gguf = if config.arch.is_qwen35() { "post_attention_norm" } else { "ffn_norm" };
        Ok(DecoderLayer {
            attn_norm: w.rms_norm(&TensorName::layer(layer, "attn_norm", "input_layernorm"), hidden, eps)?,
            mixer,
            ffn_norm: w.rms_norm(&TensorName::layer(layer, ffn_norm_gguf, "post_attention_layernorm"), hidden, eps)?,
            ffn,
        })
    }

    /// Whether the layer attends (and so has a KV pool layer) rather than recurs.
    pub(crate) fn attends(&self) -> bool {
        matches!(self.mixer, Mixer::Attention(_))
    }

    /// Its Gated DeltaNet, if it recurs.
    pub(crate) fn delta_net(&self) -> Option<&GatedDeltaNet> {
        match &self.mixer {
            Mixer::DeltaNet(delta_net) => Some(delta_net),
            Mixer::Attention(_) => None,
        }
    }

    /// Writes the K/V that attention over the rows `x` would write, computing nothing else:
    /// a layer whose output this pass does not need (the multi-token-prediction head's).
    pub(crate) fn write_kv(&self, x: &Tensor, ctx: &ForwardContext, kv: &mut LayerKv) -> Result<()> {
        match &self.mixer {
            Mixer::Attention(attention) => attention.write_kv(&self.attn_norm.forward(x)?, ctx, kv),
            Mixer::DeltaNet(_) => Err(ModelError::KvPool("a recurrent layer has no K/V to write".into())),
        }
    }

    /// The residual stream `[rows, hidden]` after this layer; the rows' K/V or recurrent state
    /// go into `cache`.
    pub(crate) fn forward(&self, x: &Tensor, ctx: &ForwardContext, cache: LayerCache) -> Result<Tensor> {
        let normed = self.attn_norm.forward(x)?;
        let mixed = match (&self.mixer, cache) {
            (Mixer::Attention(attention), LayerCache::Kv(kv)) => attention.forward(&normed, ctx, kv)?,
            (Mixer::DeltaNet(delta_net), LayerCache::State(state)) => delta_net.forward(&normed, ctx, state)?,
            _ => return Err(ModelError::KvPool("a layer was given the other kind of cache".into())),
        };
        let x = (x + mixed)?;
        let normed = self.ffn_norm.forward(&x)?;
        let mlp = match &self.ffn {
            Ffn::Dense(mlp) => mlp.forward(&normed)?,
            Ffn::Sparse(moe) => moe.forward(&normed)?,
        };
        Ok((x + mlp)?)
    }
}
