//! The SwiGLU MLP: `down(silu(gate(x)) * up(x))`, with gate and up sharing one quantization of
//! their input.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::Linear;
use crate::weights::{TensorName, Weights};

/// One decoder layer's MLP.
pub(crate) struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// Loads layer `layer`'s MLP.
    pub(crate) fn load(config: &ModelConfig, layer: usize, w: &mut Weights) -> Result<Self> {
        let name = |gguf: &str, hf: &str| TensorName::layer(layer, gguf, hf);
        let (hidden, inner) = (config.hidden_size, config.intermediate_size);
        Ok(Mlp {
            gate: w.linear(&name("ffn_gate", "mlp.gate_proj"), [inner, hidden], false)?,
            up: w.linear(&name("ffn_up", "mlp.up_proj"), [inner, hidden], false)?,
            down: w.linear(&name("ffn_down", "mlp.down_proj"), [hidden, inner], false)?,
        })
    }

    /// `[rows, hidden]` to `[rows, hidden]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [gate, up]: [Tensor; 2] =
            Linear::forward_shared(&[&self.gate, &self.up], x)?.try_into().expect("two projections");
        self.down.forward(&(gate.silu()? * up)?)
    }
}
