//! The parts of a model's shape that only some architectures have: the Gated DeltaNet layers of
//! a hybrid model (Qwen3.5) and the sparse MLP of a mixture-of-experts model (Qwen3-MoE,
//! Qwen3.5-MoE), read from `config.json` or from GGUF metadata as llama.cpp's converter writes
//! it.

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use super::Architecture;
use crate::error::{ModelError, Result};

/// How the value heads of a Gated DeltaNet layer are ordered in the weights, which decides
/// which key head each value head reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueHeadOrder {
    /// transformers' order: the value heads of key head 0 first (value head `h` reads key head
    /// `h / (value heads per key head)`).
    Grouped,
    /// llama.cpp's converter reorders them so ggml can broadcast: value head `h` reads key
    /// head `h % key heads`.
    Tiled,
}

/// The Gated DeltaNet (linear attention) layers of a hybrid model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridConfig {
    /// For each layer, whether it is a Gated DeltaNet layer (the others are full attention).
    pub recurrent_layers: Vec<bool>,
    /// Width of the depthwise causal convolution over q, k and v.
    pub conv_kernel: usize,
    /// Query/key heads.
    pub num_key_heads: usize,
    /// Value heads (a multiple of the key heads).
    pub num_value_heads: usize,
    /// Width of a query/key head.
    pub key_head_dim: usize,
    /// Width of a value head.
    pub value_head_dim: usize,
    /// How the file orders value heads.
    pub value_head_order: ValueHeadOrder,
}

impl HybridConfig {
    /// Channels of the convolution: q, k and v side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
    }

    /// f32 values of one sequence's convolution state in one layer: the last `conv_kernel - 1`
    /// inputs of every channel.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
    }

    /// f32 values of one sequence's recurrent state in one layer: a key x value matrix per
    /// value head.
    pub fn ssm_state_len(&self) -> usize {
        self.num_value_heads * self.key_head_dim * self.value_head_dim
    }

    /// Gated DeltaNet layers.
    pub fn num_recurrent_layers(&self) -> usize {
        self.recurrent_layers.iter().filter(|&&r| r).count()
    }

    /// The key head value head `head` reads.
    pub fn key_head_of(&self, head: usize) -> usize {
        match self.value_head_order {
            ValueHeadOrder::Grouped => head / (self.num_value_heads / self.num_key_heads),
            ValueHeadOrder::Tiled => head % self.num_key_heads,
        }
    }

    pub(super) fn validate(&self, num_layers: usize) -> Result<()> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.recurrent_layers.len() != num_layers {
            return bad(format!("{} layer types for {num_layers} layers", self.recurrent_layers.len()));
        }
        if self.conv_kernel < 1 || self.num_key_heads == 0 || self.key_head_dim == 0 || self.value_head_dim == 0 {
            return bad(format!("linear attention sizes must be positive: {self:?}"));
        }
        if self.num_value_heads == 0 || !self.num_value_heads.is_multiple_of(self.num_key_heads) {
            return bad(format!(
                "{} linear value heads are not a multiple of {} key heads",
                self.num_value_heads, self.num_key_heads
            ));
        }
        Ok(())
    }
}

/// The sparse MLP of a mixture-of-experts model.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts per sparse layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Width of one expert's MLP.
    pub expert_intermediate_size: usize,
    /// Whether the chosen experts' router probabilities are renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// Width of the shared expert every token also goes through (Qwen3.5-MoE), if any.
    pub shared_expert_intermediate_size: Option<usize>,
    /// For each layer, whether its MLP is sparse (the others are dense).
    pub sparse_layers: Vec<bool>,
}

impl MoeConfig {
    pub(super) fn validate(&self, num_layers: usize) -> Result<()> {
        if self.sparse_layers.len() != num_layers {
            return Err(ModelError::Config(format!("{} MLP kinds for {num_layers} layers", self.sparse_layers.len())));
        }
        if self.num_experts == 0
            || self.experts_per_token == 0
            || self.experts_per_token > self.num_experts
            || self.expert_intermediate_size == 0
        {
            return Err(ModelError::Config(format!(
                "{} of {} experts per token, expert width {}: need 0 < used <= experts and a positive width",
                self.experts_per_token, self.num_experts, self.expert_intermediate_size
            )));
        }
        Ok(())
    }
}

/// The `config.json` keys of the hybrid and MoE parts (flattened into the main config).
#[derive(Deserialize, Default)]
pub(super) struct HfLayerFields {
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    #[serde(alias = "num_local_experts")]
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    shared_expert_intermediate_size: Option<usize>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    pub(super) partial_rotary_factor: Option<f64>,
    pub(super) mtp_num_hidden_layers: Option<usize>,
}

impl HfLayerFields {
    /// The Gated DeltaNet layers of a Qwen3.5 config, `None` for other architectures.
    pub(super) fn hybrid(&self, arch: Architecture, num_layers: usize) -> Result<Option<HybridConfig>> {
        if !arch.is_qwen35() {
            return Ok(None);
        }
        let recurrent_layers = match &self.layer_types {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "linear_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(ModelError::Config(format!("unknown layer type `{other}` in layer_types"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => interval_layers(self.full_attention_interval.unwrap_or(4), num_layers)?,
        };
        let need = |v: Option<usize>, key: &str| {
            v.ok_or_else(|| ModelError::Config(format!("config.json of a hybrid model lacks `{key}`")))
        };
        Ok(Some(HybridConfig {
            recurrent_layers,
            conv_kernel: self.linear_conv_kernel_dim.unwrap_or(4),
            num_key_heads: need(self.linear_num_key_heads, "linear_num_key_heads")?,
            num_value_heads: need(self.linear_num_value_heads, "linear_num_value_heads")?,
            key_head_dim: need(self.linear_key_head_dim, "linear_key_head_dim")?,
            value_head_dim: need(self.linear_value_head_dim, "linear_value_head_dim")?,
            value_head_order: ValueHeadOrder::Grouped,
        }))
    }

    /// The sparse MLP of a MoE config, `None` for dense architectures.
    pub(super) fn moe(&self, arch: Architecture, num_layers: usize) -> Result<Option<MoeConfig>> {
        if !matches!(arch, Architecture::Qwen3Moe | Architecture::Qwen35Moe) {
            return Ok(None);
        }
        let num_experts = self.num_experts.unwrap_or(0);
        let step = self.decoder_sparse_step.unwrap_or(1).max(1);
        let dense = self.mlp_only_layers.clone().unwrap_or_default();
        let sparse_layers =
            (0..num_layers).map(|l| num_experts > 0 && !dense.contains(&l) && (l + 1) % step == 0).collect();
        Ok(Some(MoeConfig {
            num_experts,
            experts_per_token: self.num_experts_per_tok.unwrap_or(0),
            expert_intermediate_size: self.moe_intermediate_size.unwrap_or(0),
            // Qwen3.5-MoE's router always renormalises; Qwen3-MoE says so in its config.
            norm_topk_prob: arch == Architecture::Qwen35Moe || self.norm_topk_prob.unwrap_or(false),
            shared_expert_intermediate_size: self.shared_expert_intermediate_size.filter(|&n| n > 0),
            sparse_layers,
        }))
    }
}

/// Full attention every `interval`-th layer (the last of each group), as transformers builds
/// `layer_types` from `full_attention_interval`.
fn interval_layers(interval: usize, num_layers: usize) -> Result<Vec<bool>> {
    if interval == 0 {
        return Err(ModelError::Config("full_attention_interval must be positive".into()));
    }
    Ok((0..num_layers).map(|l| !(l + 1).is_multiple_of(interval)).collect())
}

/// The sparse MLP from GGUF metadata (`{arch}.expert_*`); llama.cpp's qwen3moe and qwen35moe
/// always renormalise the chosen experts' weights and make every layer sparse.
pub(super) fn gguf_moe(
    arch: Architecture,
    usize_of: &dyn Fn(&str) -> Option<usize>,
    num_layers: usize,
) -> Result<Option<MoeConfig>> {
    if !matches!(arch, Architecture::Qwen3Moe | Architecture::Qwen35Moe) {
        return Ok(None);
    }
    let need = |k: &str| usize_of(k).ok_or_else(|| ModelError::Config(format!("GGUF metadata lacks `{k}`")));
    Ok(Some(MoeConfig {
        num_experts: need("expert_count")?,
        experts_per_token: need("expert_used_count")?,
        expert_intermediate_size: need("expert_feed_forward_length")?,
        norm_topk_prob: true,
        shared_expert_intermediate_size: usize_of("expert_shared_feed_forward_length").filter(|&n| n > 0),
        sparse_layers: vec![true; num_layers],
    }))
}

/// The Gated DeltaNet layers from GGUF metadata (`{arch}.ssm.*`, and which layers are
/// recurrent from `attention.recurrent_layers` or `full_attention_interval`).
pub(super) fn gguf_hybrid(
    arch: Architecture,
    md: &HashMap<String, gguf_file::Value>,
    key: &dyn Fn(&str) -> String,
    usize_of: &dyn Fn(&str) -> Option<usize>,
    num_layers: usize,
) -> Result<Option<HybridConfig>> {
    if !arch.is_qwen35() {
        return Ok(None);
    }
    let need = |k: &str| usize_of(k).ok_or_else(|| ModelError::Config(format!("GGUF metadata lacks `{}`", key(k))));
    let recurrent_layers = match md.get(&key("attention.recurrent_layers")).and_then(|v| v.to_vec().ok()) {
        Some(flags) => {
            let flags: Vec<bool> = flags.iter().map(|v| v.to_bool().unwrap_or(false)).collect();
            // The converter lists the MTP layers too, after the decoder's own.
            flags.into_iter().take(num_layers).collect()
        }
        None => interval_layers(usize_of("full_attention_interval").unwrap_or(4), num_layers)?,
    };
    let num_value_heads = need("ssm.time_step_rank")?;
    let inner = need("ssm.inner_size")?;
    if num_value_heads == 0 || !inner.is_multiple_of(num_value_heads) {
        return Err(ModelError::Config(format!(
            "ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {num_value_heads}"
        )));
    }
    Ok(Some(HybridConfig {
        recurrent_layers,
        conv_kernel: need("ssm.conv_kernel")?,
        num_key_heads: need("ssm.group_count")?,
        num_value_heads,
        key_head_dim: need("ssm.state_size")?,
        value_head_dim: inner / num_value_heads,
        value_head_order: ValueHeadOrder::Tiled,
    }))
}
