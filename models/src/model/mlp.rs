//! The SwiGLU MLP: `down(silu(gate(x)) * up(x))`, with gate and up sharing one quantization of
//! their input.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::Linear;
use crate::weights::{TensorName, Weights};

/// One decoder layer's MLP (or a MoE layer's shared expert).
pub(crate) struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// Loads layer `layer`'s MLP.
    pub(crate) fn load(config: &ModelConfig, layer: usize, w: &mut Weights) -> Result<Self> {
        let names = ["ffn_gate", "ffn_up", "ffn_down"];
        Self::load_named(layer, names, "mlp", config.hidden_size, config.intermediate_size, w)
    }

    /// Loads an MLP of width `inner` whose GGUF matrices are `blk.{layer}.{gguf[i]}` (gate, up,
    /// down) and whose checkpoint module is `model.layers.{layer}.{hf}`.
    pub(crate) fn load_named(
        layer: usize,
        gguf: [&str; 3],
        hf: &str,
        hidden: usize,
        inner: usize,
        w: &mut Weights,
    ) -> Result<Self> {
        let name = |g: &str, proj: &str| TensorName::layer(layer, g, &format!("{hf}.{proj}"));
        Ok(Mlp {
            gate: w.linear(&name(gguf[0], "gate_proj"), [inner, hidden], false)?,
            up: w.linear(&name(gguf[1], "up_proj"), [inner, hidden], false)?,
            down: w.linear(&name(gguf[2], "down_proj"), [hidden, inner], false)?,
        })
    }

    /// `[rows, hidden]` to `[rows, hidden]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [gate, up]: [Tensor; 2] =
            Linear::forward_shared(&[&self.gate, &self.up], x)?.try_into().expect("two projections");
        self.down.forward(&(gate.silu()? * up)?)
    }
}
