//! RMSNorm, the only normalisation the decoders we run use (before attention, before the MLP,
//! at the end, and on each head of q and k in Qwen3).

use candle_core::Tensor;

use crate::error::Result;

/// `x / rms(x) * weight` over the last dimension.
#[derive(Debug, Clone)]
pub(crate) struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// A norm of `weight` (`[dim]` f32 on the model's device) with the config's epsilon.
    pub(crate) fn new(weight: Tensor, eps: f64) -> Self {
        RmsNorm { weight, eps: eps as f32 }
    }

    /// Normalises each row of `[..., dim]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }
}
