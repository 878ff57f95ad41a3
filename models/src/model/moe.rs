//! The sparse mixture-of-experts MLP of Qwen3-MoE and Qwen3.5-MoE: a router's softmax over the
//! experts, each token's top-k (renormalised where the model says so), the chosen experts'
//! SwiGLU MLPs weighted by their probabilities, and (Qwen3.5-MoE) a shared expert every token
//! goes through, scaled by a sigmoid gate. Only experts some token chose run, each once over
//! all the rows routed to it, so a prefill chunk reads each chosen expert's weights once. On the
//! CPU the experts run on radix-kernels' quantized kernels ([`cpu`]): one 8-bit quantization of
//! the input per layer, the experts side by side on the model's pool. On CUDA the routing and
//! the experts run on the device without a host round trip ([`device`]); with
//! `--cpu-moe`/`--n-cpu-moe` a layer's experts stay in host memory on those same CPU kernels
//! while the rest of the layer runs on the GPU.

mod cpu;
#[cfg(feature = "cuda")]
mod device;
#[cfg(test)]
mod tests;

use candle_core::{DType, Tensor};
use candle_nn::ops::sigmoid;

use super::mlp::Mlp;
use crate::config::{ModelConfig, MoeConfig};
use crate::error::Result;
use crate::layers::Linear;
use crate::weights::{TensorName, Weights};

/// Where a layer's routed experts run, when not where the rest of the model does.
pub(crate) enum ExpertPlacement {
    /// On the model's device, per expert (`experts`, or `on_cpu` on the CPU).
    WithModel,
    /// In host memory on the CPU kernels while the model runs on a GPU (`--cpu-moe`): the
    /// layer's input goes to the host for them and their sum comes back.
    Host,
    /// Stacked on the CUDA device for the indexed kernels (`experts` is then empty).
    #[cfg(feature = "cuda")]
    Device(Box<device::DeviceExperts>),
}

/// One expert's SwiGLU MLP.
struct Expert {
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A layer's sparse MLP.
pub(crate) struct SparseMoe {
    router: Linear,
    experts: Vec<Expert>,
    num_experts: usize,
    experts_per_token: usize,
    norm_topk_prob: bool,
    /// The shared expert and its `[1, hidden]` gate.
    shared: Option<(Mlp, Linear)>,
    /// The experts on radix-kernels' kernels (the same matrices, read in place); `experts` is
    /// then empty.
    on_cpu: Option<Vec<cpu::CpuExpert>>,
    /// Where the routed experts run.
    placement: ExpertPlacement,
}

impl SparseMoe {
    /// Loads layer `layer`'s sparse MLP.
    pub(crate) fn load(config: &ModelConfig, moe: &MoeConfig, layer: usize, w: &mut Weights) -> Result<Self> {
        let (hidden, inner, n) = (config.hidden_size, moe.expert_intermediate_size, moe.num_experts);
        let name = |gguf: &str, hf: &str| TensorName::layer(layer, gguf, hf);
        // Checkpoints name each expert's matrix; GGUF stacks them (random weights seed each
        // expert by the stacked name and its index).
        let each = |gguf: &'static str, proj: &'static str| {
            move |e: usize| TensorName::layer(layer, &format!("{gguf}.{e}"), &format!("mlp.experts.{e}.{proj}"))
        };
        let on_host = w.experts_on_host(layer);
        let mut experts_of = |gguf: &'static str, proj: &'static str, shape: [usize; 2]| {
            w.expert_weights(&name(gguf, &format!("mlp.experts.{proj}")), &each(gguf, proj), n, shape, on_host)
        };
        let gates = experts_of("ffn_gate_exps", "gate_proj", [inner, hidden])?;
        let ups = experts_of("ffn_up_exps", "up_proj", [inner, hidden])?;
        let downs = experts_of("ffn_down_exps", "down_proj", [hidden, inner])?;
        let placement = match on_host {
            true => ExpertPlacement::Host,
            #[cfg(feature = "cuda")]
            false => match device::DeviceExperts::stack(&gates, &ups, &downs)? {
                Some(stacked) => ExpertPlacement::Device(Box::new(stacked)),
                None => ExpertPlacement::WithModel,
            },
            #[cfg(not(feature = "cuda"))]
            false => ExpertPlacement::WithModel,
        };
        let mut experts: Vec<Expert> = match placement {
            #[cfg(feature = "cuda")]
            ExpertPlacement::Device(_) => Vec::new(),
            _ => gates
                .into_iter()
                .zip(ups)
                .zip(downs)
                .map(|((gate, up), down)| Expert {
                    gate: Linear::new(gate),
                    up: Linear::new(up),
                    down: Linear::new(down),
                })
                .collect(),
        };
        // Experts loaded for the CPU (the model's device, or the host under `--cpu-moe`) are
        // read in place by our kernels when they are of a type those cover.
        let on_cpu = cpu::cpu_experts(&experts);
        if on_cpu.is_some() {
            experts = Vec::new();
        }
        let shared = match moe.shared_expert_intermediate_size {
            Some(width) => {
                let mlp = Mlp::load_named(
                    layer,
                    ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"],
                    "mlp.shared_expert",
                    hidden,
                    width,
                    w,
                )?;
                let gate = w.linear(&name("ffn_gate_inp_shexp", "mlp.shared_expert_gate"), [1, hidden], false)?;
                Some((mlp, gate))
            }
            None => None,
        };
        Ok(SparseMoe {
            router: w.linear(&name("ffn_gate_inp", "mlp.gate"), [n, hidden], false)?,
            experts,
            num_experts: n,
            experts_per_token: moe.experts_per_token,
            norm_topk_prob: moe.norm_topk_prob,
            shared,
            on_cpu,
            placement,
        })
    }

    /// `[rows, hidden]` to `[rows, hidden]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = self.routed_forward(x)?;
        if let Some((mlp, gate)) = &self.shared {
            let scale = sigmoid(&gate.forward(x)?)?;
            out = (out + mlp.forward(x)?.broadcast_mul(&scale)?)?;
        }
        Ok(out)
    }

    /// The routed experts' weighted sum, `[rows, hidden]` on the rows' device.
    fn routed_forward(&self, x: &Tensor) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let ExpertPlacement::Device(experts) = &self.placement {
            return experts.forward(&self.router, x, self.experts_per_token, self.norm_topk_prob);
        }
        let probs = candle_nn::ops::softmax_last_dim(&self.router.forward(x)?)?.to_dtype(DType::F32)?;
        let probs = probs.to_vec2::<f32>()?;
        // For each expert, the rows routed to it and their weights.
        let mut routed: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); self.num_experts];
        for (row, p) in probs.iter().enumerate() {
            let chosen = radix_kernels::moe::top_k(p, self.experts_per_token);
            let total: f32 = chosen.iter().map(|&e| p[e]).sum();
            for &e in &chosen {
                let weight = if self.norm_topk_prob { p[e] / total } else { p[e] };
                routed[e].0.push(row as u32);
                routed[e].1.push(weight);
            }
        }
        // Experts kept in host memory while the model runs on a GPU: their rows go there.
        let host_x = match self.placement {
            ExpertPlacement::Host if !x.device().is_cpu() => Some(x.to_device(&candle_core::Device::Cpu)?),
            _ => None,
        };
        let xs = host_x.as_ref().unwrap_or(x);
        let out = match &self.on_cpu {
            Some(experts) => cpu::forward(experts, xs, &routed)?,
            None => self.experts_forward(xs, &routed)?,
        };
        Ok(if host_x.is_some() { out.to_device(x.device())? } else { out })
    }

    /// The weighted sum of each row's experts on candle's matmuls, `[rows, hidden]`.
    fn experts_forward(&self, x: &Tensor, routed: &[(Vec<u32>, Vec<f32>)]) -> Result<Tensor> {
        let rows = x.dim(0)?;
        // Each row's weighted sum of its experts' outputs, added up in host memory on the CPU
        // (an `index_add` per expert would copy the whole output each time).
        let hidden = x.dim(1)?;
        let on_host = x.device().is_cpu();
        let mut host = if on_host { vec![0.0f32; rows * hidden] } else { Vec::new() };
        let mut out = if on_host { None } else { Some(Tensor::zeros(x.dims(), DType::F32, x.device())?) };
        for (expert, (ids, weights)) in self.experts.iter().zip(routed) {
            if ids.is_empty() {
                continue;
            }
            let id_tensor = Tensor::from_slice(ids, ids.len(), x.device())?;
            let xs = x.index_select(&id_tensor, 0)?;
            let [gate, up]: [Tensor; 2] =
                Linear::forward_shared(&[&expert.gate, &expert.up], &xs)?.try_into().expect("two projections");
            let y = expert.down.forward(&(gate.silu()? * up)?)?;
            match &mut out {
                None => {
                    let y = y.flatten_all()?.to_vec1::<f32>()?;
                    for ((&row, &w), y) in ids.iter().zip(weights).zip(y.chunks_exact(hidden)) {
                        let acc = &mut host[row as usize * hidden..(row as usize + 1) * hidden];
                        for (a, &v) in acc.iter_mut().zip(y) {
                            *a += w * v;
                        }
                    }
                }
                Some(out) => {
                    let weights = Tensor::from_slice(weights, (weights.len(), 1), x.device())?;
                    *out = out.index_add(&id_tensor, &y.broadcast_mul(&weights)?, 0)?;
                }
            }
        }
        Ok(match out {
            Some(out) => out,
            None => Tensor::from_vec(host, (rows, hidden), x.device())?,
        })
    }
}
