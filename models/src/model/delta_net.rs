//! Qwen3.5's Gated DeltaNet layer (linear attention): projections to q/k/v, the output gate z,
//! beta and the decay input a; a depthwise causal convolution with SiLU over q/k/v; L2-normed
//! q and k; the gated delta rule on each sequence's recurrent state; an RMSNorm of each value
//! head gated by SiLU(z); the output projection. The recurrence runs over the engine's
//! [`crate::StatePool`]: on CUDA (a pool in GPU memory) on radix-kernels' CUDA kernels, with no
//! copy to the host; elsewhere on its CPU kernels (on the CPU tensor path and Metal the rows
//! travel through host memory for it, and for a pool of tensors each sequence's state too).

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{Device, Tensor};
use candle_nn::ops::sigmoid;
use radix_kernels::delta_net::{
    DeltaNetShape, causal_conv1d_silu, gated_delta_rule, gated_delta_rule_verify, l2_normalize, softplus,
};

use super::backend::ForwardContext;
use crate::config::{HybridConfig, ModelConfig, ValueHeadOrder};
use crate::error::{ModelError, Result};
use crate::layers::{Linear, RmsNorm};
use crate::state_pool::{LayerState, StateStorage, VerifiedSpan};
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
    /// The convolution weight, decay rates and dt biases on a CUDA device, for its kernels.
    #[cfg(feature = "cuda")]
    device_params: Option<[Tensor; 3]>,
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
        #[cfg(feature = "cuda")]
        let device_params = match w.device() {
            d if d.is_cuda() => Some([
                Tensor::from_slice(&conv, conv.len(), d)?,
                Tensor::from_slice(&neg_decay_rate, nv, d)?,
                Tensor::from_slice(&dt_bias, nv, d)?,
            ]),
            _ => None,
        };
        Ok(GatedDeltaNet {
            #[cfg(feature = "cuda")]
            device_params,
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
    /// recurrent state in `state`, which ends as the state after each sequence's last row (a
    /// span being verified leaves its state as it was and keeps its inputs instead).
    pub(crate) fn forward(&self, x: &Tensor, ctx: &ForwardContext, state: &mut LayerState) -> Result<Tensor> {
        let n = x.dim(0)?;
        let [qkv, z, b, a]: [Tensor; 4] =
            Linear::forward_shared(&[&self.qkv, &self.z, &self.b, &self.a], x)?.try_into().expect("four projections");
        let DeltaNetShape { num_value_heads: nv, value_dim: dv, .. } = self.shape;
        let LayerState { conv, ssm, verified } = state;
        let core = match (conv.host_mut(), ssm.host_mut()) {
            (Some(conv), Some(ssm)) => {
                let core = self.core_on_host(&qkv, &a, &b, ctx, &mut HostState::Slices { conv, ssm }, verified)?;
                Tensor::from_vec(core, (n, nv, dv), &Device::Cpu)?.to_device(x.device())?
            }
            _ => self.core_on_pool_tensors(&qkv, &a, &b, ctx, state)?.reshape((n, nv, dv))?,
        };
        let gated = (self.norm.forward(&core)? * z.reshape((n, nv, dv))?.silu()?)?;
        self.out.forward(&gated.reshape((n, nv * dv))?)
    }

    /// The convolution and the delta rule over a pool of tensors: on CUDA our kernels, in place
    /// in GPU memory; elsewhere (the CPU tests' pool of tensors) each sequence's state through
    /// host memory. `[rows, value heads * value_dim]` on the rows' device.
    fn core_on_pool_tensors(
        &self,
        qkv: &Tensor,
        a: &Tensor,
        b: &Tensor,
        ctx: &ForwardContext,
        state: &mut LayerState,
    ) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let (Some(batch), Some([conv_w, rate, bias])) = (ctx.recurrent_batch(), &self.device_params) {
            if ctx.chunks().iter().any(|c| c.verify) {
                return Err(ModelError::Batch(
                    "drafted tokens of a hybrid model are verified on the CPU path only (the CUDA kernels advance \
                     the state in place)"
                        .into(),
                ));
            }
            let (Some(conv_state), Some(ssm_state)) = (state.conv.tensor(), state.ssm.tensor()) else {
                return Err(ModelError::KvPool("the state pool is in host memory but the pass runs on CUDA".into()));
            };
            let mixed = batch.conv(qkv, conv_w, self.conv_kernel, conv_state)?;
            return Ok(batch.rule(&self.shape, &mixed, a, b, rate, bias, ssm_state)?);
        }
        let mut verified = std::mem::take(&mut state.verified);
        let core = self.core_on_host(qkv, a, b, ctx, &mut HostState::Pool(state), &mut verified);
        state.verified = verified;
        let n = qkv.dim(0)?;
        Ok(Tensor::from_vec(core?, (n, self.shape.num_value_heads * self.shape.value_dim), &Device::Cpu)?
            .to_device(qkv.device())?)
    }

    /// The convolution and the delta rule on radix-kernels' CPU kernels, each sequence on its
    /// slot of `state`: `[rows, value heads, value_dim]` in host memory. A span being verified
    /// reads its slot without advancing it, and its inputs go into `verified`.
    fn core_on_host(
        &self,
        qkv: &Tensor,
        a: &Tensor,
        b: &Tensor,
        ctx: &ForwardContext,
        state: &mut HostState,
        verified: &mut HashMap<u32, VerifiedSpan>,
    ) -> Result<Vec<f32>> {
        let n = qkv.dim(0)?;
        let DeltaNetShape { num_value_heads: nv, value_dim: dv, .. } = self.shape;
        let channels = self.channels();
        let qkv = qkv.flatten_all()?.to_vec1::<f32>()?;
        let beta = sigmoid(b)?.flatten_all()?.to_vec1::<f32>()?;
        let decay_in = a.flatten_all()?.to_vec1::<f32>()?;
        let mut core = vec![0.0f32; n * nv * dv];
        for chunk in ctx.chunks() {
            let slot = chunk
                .state_slot
                .ok_or_else(|| ModelError::Batch("a sequence of a hybrid model's batch has no state slot".into()))?;
            let rows = chunk.start..chunk.start + chunk.len;
            let mut span = VerifiedSpan {
                qkv: qkv[rows.start * channels..rows.end * channels].to_vec(),
                decay_in: decay_in[rows.start * nv..rows.end * nv].to_vec(),
                beta: beta[rows.start * nv..rows.end * nv].to_vec(),
                fresh: chunk.context_len == chunk.len,
                applied: 0,
            };
            let out = &mut core[rows.start * nv * dv..rows.end * nv * dv];
            let mut slot_state = state.slot(slot as usize, self.conv_state_len(), self.shape.state_len())?;
            let (conv_state, ssm_state) = slot_state.parts();
            if span.fresh {
                conv_state.fill(0.0);
                ssm_state.fill(0.0);
            }
            if chunk.verify {
                // The first row is the sequence's own last token, kept whatever becomes of the
                // drafts: it advances the slot as a decode step would, so a round that rejects
                // every draft replays nothing. The drafts only read the state it leaves: the
                // rows after the first rejected one must not leave a trace in it.
                self.mix(&span, 0..chunk.len, conv_state, Ssm::Verify { state: ssm_state, kept: 1 }, out)?;
                span.applied = 1;
                verified.insert(slot, span);
            } else {
                self.mix(&span, 0..chunk.len, conv_state, Ssm::Advance(ssm_state), out)?;
                verified.remove(&slot);
            }
            let copy = slot_state.into_copy();
            state.write_back(copy)?;
        }
        Ok(core)
    }

    /// Advances `slot`'s state over rows `rows` of the span last verified there: bitwise the
    /// state a pass computing just those rows would leave. Calls continue one another from
    /// row 0; the first row the verify pass applied itself, so rows already applied are
    /// skipped. The span is forgotten once its last row is applied.
    pub(crate) fn apply_verified(&self, state: &mut LayerState, slot: u32, rows: Range<usize>) -> Result<()> {
        let span = state
            .verified
            .get(&slot)
            .ok_or_else(|| ModelError::Batch(format!("no verified span on state slot {slot} to apply")))?;
        let len = span.decay_in.len() / self.shape.num_value_heads;
        // From where the last call ended, or from row 0 when only the verify pass's own row is
        // applied (callers count the span from its start).
        let continues = rows.start == span.applied || (rows.start == 0 && span.applied == 1);
        if !continues || rows.end > len || rows.start > rows.end {
            return Err(ModelError::Batch(format!(
                "rows {rows:?} of a verified span of {len} rows, {} of them applied",
                span.applied
            )));
        }
        let rows = span.applied.max(rows.start)..rows.end.max(span.applied);
        let mut span = state.verified.remove(&slot).expect("found above");
        if !rows.is_empty() {
            let mut host = HostState::of(state);
            let mut slot_state = host.slot(slot as usize, self.conv_state_len(), self.shape.state_len())?;
            let (conv_state, ssm_state) = slot_state.parts();
            let mut out = vec![0.0f32; rows.len() * self.shape.num_value_heads * self.shape.value_dim];
            self.mix(&span, rows.clone(), conv_state, Ssm::Advance(ssm_state), &mut out)?;
            let copy = slot_state.into_copy();
            host.write_back(copy)?;
        }
        span.applied = rows.end;
        if span.applied < len {
            state.verified.insert(slot, span);
        }
        Ok(())
    }

    /// The convolution, the L2 norms, the decay and the delta rule over rows `rows` of one
    /// sequence's `span`, from `conv_state` (updated) and `ssm`; the rule's outputs into `out`.
    /// The one path every pass and every applied verification takes, so that they agree bit
    /// for bit.
    fn mix(
        &self,
        span: &VerifiedSpan,
        rows: Range<usize>,
        conv_state: &mut [f32],
        ssm: Ssm,
        out: &mut [f32],
    ) -> Result<()> {
        let DeltaNetShape { num_key_heads: nk, num_value_heads: nv, key_dim: dk, .. } = self.shape;
        let channels = self.channels();
        let input = &span.qkv[rows.start * channels..rows.end * channels];
        let mut mixed = vec![0.0f32; input.len()];
        // The convolution's window advances as the state does: over the kept rows only.
        let kept = match ssm {
            Ssm::Advance(_) => rows.len(),
            Ssm::Verify { kept, .. } => kept.min(rows.len()),
        };
        let (kept_in, drafts_in) = input.split_at(kept * channels);
        let (kept_out, drafts_out) = mixed.split_at_mut(kept * channels);
        causal_conv1d_silu(kept_in, &self.conv, self.conv_kernel, conv_state, kept_out)?;
        if !drafts_in.is_empty() {
            let mut window = conv_state.to_vec();
            causal_conv1d_silu(drafts_in, &self.conv, self.conv_kernel, &mut window, drafts_out)?;
        }
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
        let mut g = Vec::with_capacity(rows.len() * nv);
        for row in span.decay_in[rows.start * nv..rows.end * nv].chunks_exact(nv) {
            for (h, &x) in row.iter().enumerate() {
                g.push(self.neg_decay_rate[h] * softplus(x + self.dt_bias[h]));
            }
        }
        let beta = &span.beta[rows.start * nv..rows.end * nv];
        match ssm {
            Ssm::Advance(state) => gated_delta_rule(&self.shape, &q, &k, &v, &g, beta, state, out)?,
            Ssm::Verify { state, .. } => gated_delta_rule_verify(&self.shape, kept, &q, &k, &v, &g, beta, state, out)?,
        }
        Ok(())
    }

    /// Channels of the convolution: q, k and v.
    fn channels(&self) -> usize {
        let DeltaNetShape { num_key_heads: nk, num_value_heads: nv, key_dim: dk, value_dim: dv, .. } = self.shape;
        2 * nk * dk + nv * dv
    }

    /// f32 values of one slot's convolution state.
    fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.channels()
    }
}

/// The delta rule's state for [`GatedDeltaNet::mix`]: advanced in place over every row, or
/// (a span being verified) over its first `kept` rows only and read for the rest.
enum Ssm<'a> {
    Advance(&'a mut [f32]),
    Verify { state: &'a mut [f32], kept: usize },
}

/// Where [`GatedDeltaNet::core_on_host`] finds each sequence's state: the host pool's slices
/// (worked on in place), or a pool of tensors (each slot copied out and back).
enum HostState<'a> {
    Slices { conv: &'a mut [f32], ssm: &'a mut [f32] },
    Pool(&'a mut LayerState),
}

impl HostState<'_> {
    /// Slot `slot`'s conv and SSM state (of these lengths) to work on.
    fn slot(&mut self, slot: usize, conv_len: usize, ssm_len: usize) -> Result<SlotState<'_>> {
        Ok(match self {
            HostState::Slices { conv, ssm } => SlotState::InPlace {
                conv: &mut conv[slot * conv_len..(slot + 1) * conv_len],
                ssm: &mut ssm[slot * ssm_len..(slot + 1) * ssm_len],
            },
            HostState::Pool(pool) => SlotState::Copied {
                conv: pool.conv.read(slot * conv_len, conv_len)?,
                ssm: pool.ssm.read(slot * ssm_len, ssm_len)?,
                slot,
            },
        })
    }
}

/// One slot's state as [`HostState::slot`] hands it out.
enum SlotState<'a> {
    InPlace { conv: &'a mut [f32], ssm: &'a mut [f32] },
    Copied { conv: Vec<f32>, ssm: Vec<f32>, slot: usize },
}

impl SlotState<'_> {
    fn parts(&mut self) -> (&mut [f32], &mut [f32]) {
        match self {
            SlotState::InPlace { conv, ssm } => (conv, ssm),
            SlotState::Copied { conv, ssm, .. } => (conv, ssm),
        }
    }

    /// A copied slot's values, to write back with [`HostState::write_back`]; `None` for a
    /// slot worked on in place.
    fn into_copy(self) -> Option<(usize, Vec<f32>, Vec<f32>)> {
        match self {
            SlotState::InPlace { .. } => None,
            SlotState::Copied { conv, ssm, slot } => Some((slot, conv, ssm)),
        }
    }
}

impl HostState<'_> {
    /// Writes a slot copied out by [`HostState::slot`] back into its pool of tensors.
    fn write_back(&mut self, copy: Option<(usize, Vec<f32>, Vec<f32>)>) -> Result<()> {
        if let (Some((slot, conv, ssm)), HostState::Pool(pool)) = (copy, self) {
            pool.conv.write(slot * conv.len(), &conv)?;
            pool.ssm.write(slot * ssm.len(), &ssm)?;
        }
        Ok(())
    }

    /// `state` as the CPU kernels work on it: its host slices, or a pool of tensors.
    fn of(state: &mut LayerState) -> HostState<'_> {
        if let LayerState { conv: StateStorage::Host(_), ssm: StateStorage::Host(_), .. } = state {
            let LayerState { conv: StateStorage::Host(conv), ssm: StateStorage::Host(ssm), .. } = state else {
                unreachable!("matched just above")
            };
            return HostState::Slices { conv, ssm };
        }
        HostState::Pool(state)
    }
}
