//! Qwen3.5's Gated DeltaNet layer (linear attention): projections to q/k/v, the output gate z,
//! beta and the decay input a; a depthwise causal convolution with SiLU over q/k/v; L2-normed
//! q and k; the gated delta rule on each sequence's recurrent state; an RMSNorm of each value
//! head gated by SiLU(z); the output projection. The recurrence runs on radix-kernels' CPU
//! kernels over the engine's [`crate::StatePool`]; on the tensor path the rows travel through
//! host memory for it (the state pool lives there).

use candle_core::{Device, Tensor};
use candle_nn::ops::sigmoid;
use radix_kernels::delta_net::{DeltaNetShape, causal_conv1d_silu, gated_delta_rule};

use super::backend::ForwardContext;
use crate::config::{HybridConfig, ModelConfig, ValueHeadOrder};
use crate::error::{ModelError, Result};
use crate::layers::{Linear, RmsNorm};
use crate::state_pool::LayerState;
use crate::weights::{Naming, TensorName, Weights};

/// One Gated DeltaNet layer.
pub(crate) struct GatedDeltaNet {
    qkv: Linear,
    z: Linear,
    b: Linear,
    a: Linear,
    /// `[channels, kernel]`.
    conv: Vec<f32>,
    conv_kernel: usize,
    /// `-exp(A_log)` per value head: the decay rate's scale.
    neg_decay_rate: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The RMSNorm of each value head's output (its weight is used as stored, not offset).
    norm: RmsNorm,
    out: Linear,
    shape: DeltaNetShape,
}

impl GatedDeltaNet {
    /// Loads layer `layer`'s Gated DeltaNet.
    pub(crate) fn load(config: &ModelConfig, hybrid: &HybridConfig, layer: usize, w: &mut Weights) -> Result<Self> {
        let name = |gguf: &str, hf: &str| TensorName::layer(layer, gguf, hf);
        let hidden = config.hidden_size;
        let (nv, dv) = (hybrid.num_value_heads, hybrid.value_head_dim);
        let channels = hybrid.conv_channels();
        let conv =
            w.host_tensor(&name("ssm_conv1d", "linear_attn.conv1d").weight(), &[channels, hybrid.conv_kernel])?;
        let conv = conv.flatten_all()?.to_vec1::<f32>()?;
        if conv.len() != channels * hybrid.conv_kernel {
            return Err(ModelError::Config(format!(
                "layer {layer}: conv weight has {} values, expected {channels} channels x {}",
                conv.len(),
                hybrid.conv_kernel
            )));
        }
        let per_head = |t: Tensor, what: &str| -> Result<Vec<f32>> {
            let v = t.flatten_all()?.to_vec1::<f32>()?;
            if v.len() != nv {
                return Err(ModelError::Config(format!("layer {layer}: {what} has {} values for {nv} heads", v.len())));
            }
            Ok(v)
        };
        // llama.cpp's converter stores -exp(A_log) as `ssm_a`.
        let neg_decay_rate = match w.naming() {
            Naming::Gguf => per_head(w.host_tensor(&name("ssm_a", "linear_attn.A_log"), &[nv])?, "ssm_a")?,
            Naming::Hf => per_head(w.host_tensor(&name("ssm_a", "linear_attn.A_log"), &[nv])?, "A_log")?
                .into_iter()
                .map(|a| -a.exp())
                .collect(),
        };
        let dt_bias = per_head(w.host_tensor(&name("ssm_dt.bias", "linear_attn.dt_bias"), &[nv])?, "dt_bias")?;
        let norm_weight = w.tensor(&name("ssm_norm", "linear_attn.norm").weight(), &[dv])?;
        Ok(GatedDeltaNet {
            qkv: w.linear(&name("attn_qkv", "linear_attn.in_proj_qkv"), [channels, hidden], false)?,
            z: w.linear(&name("attn_gate", "linear_attn.in_proj_z"), [nv * dv, hidden], false)?,
            b: w.linear(&name("ssm_beta", "linear_attn.in_proj_b"), [nv, hidden], false)?,
            a: w.linear(&name("ssm_alpha", "linear_attn.in_proj_a"), [nv, hidden], false)?,
            conv,
            conv_kernel: hybrid.conv_kernel,
            neg_decay_rate,
            dt_bias,
            norm: RmsNorm::new(norm_weight, config.rms_norm_eps),
            out: w.linear(&name("ssm_out", "linear_attn.out_proj"), [hidden, nv * dv], false)?,
            shape: DeltaNetShape {
                num_key_heads: hybrid.num_key_heads,
                num_value_heads: nv,
                key_dim: hybrid.key_head_dim,
                value_dim: dv,
                tiled_value_heads: hybrid.value_head_order == ValueHeadOrder::Tiled,
            },
        })
    }

    /// Mixes the normed rows `x` (`[rows, hidden]`) of each sequence of the pass through its
    /// recurrent state in `state`, which ends as the state after each sequence's last row.
    pub(crate) fn forward(&self, x: &Tensor, ctx: &ForwardContext, state: &mut LayerState) -> Result<Tensor> {
        let n = x.dim(0)?;
        let [qkv, z, b, a]: [Tensor; 4] =
            Linear::forward_shared(&[&self.qkv, &self.z, &self.b, &self.a], x)?.try_into().expect("four projections");
        let DeltaNetShape { num_key_heads: nk, num_value_heads: nv, key_dim: dk, value_dim: dv, .. } = self.shape;
        let channels = 2 * nk * dk + nv * dv;
        let qkv = qkv.flatten_all()?.to_vec1::<f32>()?;
        let beta = sigmoid(&b)?.flatten_all()?.to_vec1::<f32>()?;
        let decay_in = a.flatten_all()?.to_vec1::<f32>()?;
        let (conv_len, ssm_len) = ((self.conv_kernel - 1) * channels, self.shape.state_len());
        let mut core = vec![0.0f32; n * nv * dv];
        for chunk in ctx.chunks() {
            let slot = chunk
                .state_slot
                .ok_or_else(|| ModelError::Batch("a sequence of a hybrid model's batch has no state slot".into()))?
                as usize;
            let conv_state = &mut state.conv[slot * conv_len..(slot + 1) * conv_len];
            let ssm_state = &mut state.ssm[slot * ssm_len..(slot + 1) * ssm_len];
            if chunk.context_len == chunk.len {
                conv_state.fill(0.0);
                ssm_state.fill(0.0);
            }
            let rows = chunk.start..chunk.start + chunk.len;
            let mut mixed = vec![0.0f32; chunk.len * channels];
            let input = &qkv[rows.start * channels..rows.end * channels];
            causal_conv1d_silu(input, &self.conv, self.conv_kernel, conv_state, &mut mixed)?;
            let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for row in mixed.chunks_exact(channels) {
                q.extend_from_slice(&row[..nk * dk]);
                k.extend_from_slice(&row[nk * dk..2 * nk * dk]);
                v.extend_from_slice(&row[2 * nk * dk..]);
            }
            // As transformers (and the FLA kernels it follows): x / sqrt(sum x^2 + 1e-6), and q
            // scaled by 1 / sqrt(key_dim).
            l2_normalize(&mut q, dk, 1.0 / (dk as f32).sqrt());
            l2_normalize(&mut k, dk, 1.0);
            let mut g = Vec::with_capacity(chunk.len * nv);
            for row in decay_in[rows.start * nv..rows.end * nv].chunks_exact(nv) {
                for (h, &x) in row.iter().enumerate() {
                    g.push(self.neg_decay_rate[h] * softplus(x + self.dt_bias[h]));
                }
            }
            let out = &mut core[rows.start * nv * dv..rows.end * nv * dv];
            let beta = &beta[rows.start * nv..rows.end * nv];
            gated_delta_rule(&self.shape, &q, &k, &v, &g, beta, ssm_state, out)?;
        }
        let core = Tensor::from_vec(core, (n, nv, dv), &Device::Cpu)?.to_device(x.device())?;
        let gated = (self.norm.forward(&core)? * z.reshape((n, nv, dv))?.silu()?)?;
        self.out.forward(&gated.reshape((n, nv * dv))?)
    }
}

/// Scales each `dim`-wide head of `x` to unit L2 norm (with transformers' epsilon), times
/// `scale`.
fn l2_normalize(x: &mut [f32], dim: usize, scale: f32) {
    for head in x.chunks_exact_mut(dim) {
        let sum: f32 = head.iter().map(|v| v * v).sum();
        let factor = scale / (sum + 1e-6).sqrt();
        for v in head {
            *v *= factor;
        }
    }
}

/// `ln(1 + e^x)`, linear above 20 as torch's softplus.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}
