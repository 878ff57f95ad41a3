//! The shape of a decoder model, read from a Hugging Face `config.json` or from GGUF metadata.
//! The hybrid (Gated DeltaNet) and mixture-of-experts parts of a shape are in `config/layers.rs`.

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use crate::error::{ModelError, Result};

mod layers;

pub use layers::{HybridConfig, MoeConfig, ValueHeadOrder};

/// The architectures we run; they share one decoder and differ in a few switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3.x, SmolLM2.
    Llama,
    /// Qwen2 / Qwen2.5: biases on the q/k/v projections.
    Qwen2,
    /// Qwen3: RMSNorm on each head of q and k, explicit head_dim, no biases.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, a sparse mixture-of-experts MLP.
    Qwen3Moe,
    /// Qwen3.5/3.6: three Gated DeltaNet layers per gated full-attention layer, dense MLP.
    Qwen35,
    /// Qwen3.5/3.6-MoE: Qwen3.5's layers with a sparse MLP and a shared expert.
    Qwen35Moe,
}

impl Architecture {
    /// Parses a GGUF `general.architecture` or HF `model_type`.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" => Ok(Architecture::Llama),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Architecture::Qwen2),
            "qwen3" | "Qwen3ForCausalLM" => Ok(Architecture::Qwen3),
            "qwen3moe" | "qwen3_moe" | "Qwen3MoeForCausalLM" => Ok(Architecture::Qwen3Moe),
            "qwen35" | "qwen3_5" | "qwen3_5_text" | "Qwen3_5ForCausalLM" | "Qwen3_5ForConditionalGeneration" => {
                Ok(Architecture::Qwen35)
            }
            "qwen35moe"
            | "qwen3_5_moe"
            | "qwen3_5_moe_text"
            | "Qwen3_5MoeForCausalLM"
            | "Qwen3_5MoeForConditionalGeneration" => Ok(Architecture::Qwen35Moe),
            other => Err(ModelError::UnsupportedArchitecture(other.to_owned())),
        }
    }

    /// The name used in GGUF metadata keys.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Qwen35 => "qwen35",
            Architecture::Qwen35Moe => "qwen35moe",
        }
    }

    /// Whether attention normalises each head of q and k (Qwen3 and later).
    pub fn has_qk_norm(self) -> bool {
        !matches!(self, Architecture::Llama | Architecture::Qwen2)
    }

    /// Qwen3.5's layers: Gated DeltaNet mixers, a gated full attention, zero-centred norms.
    pub fn is_qwen35(self) -> bool {
        matches!(self, Architecture::Qwen35 | Architecture::Qwen35Moe)
    }
}

/// Llama 3's frequency-dependent RoPE scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    /// Overall factor.
    pub factor: f64,
    /// Wavelengths above `original / low_freq_factor` are scaled fully.
    pub low_freq_factor: f64,
    /// Wavelengths below `original / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The context length the model was trained at before scaling.
    pub original_max_position_embeddings: f64,
}

/// Everything the decoder needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Which architecture.
    pub arch: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (fewer than query heads with grouped-query attention).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Llama 3 RoPE scaling, if any.
    pub rope_llama3: Option<Llama3RopeScaling>,
    /// Linear RoPE scaling factor (positions divided by it), 1.0 if none.
    pub rope_linear_factor: f64,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// The output head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Leading dimensions of each head that RoPE rotates (Qwen3.5: a quarter); `head_dim` for
    /// the others.
    pub rotary_dim: usize,
    /// Qwen3.5's full attention: the q projection also yields a per-head gate, and the
    /// attention output is multiplied by its sigmoid.
    pub attention_output_gate: bool,
    /// The Gated DeltaNet layers of a hybrid model.
    pub hybrid: Option<HybridConfig>,
    /// The sparse MLP of a mixture-of-experts model.
    pub moe: Option<MoeConfig>,
    /// Layers of multi-token-prediction heads the file carries after the decoder's own
    /// (Qwen3.5/3.6 `nextn` layers); none run unless [`mtp_head`](Self::mtp_head) is set.
    pub mtp_layers: usize,
    /// The first multi-token-prediction head is loaded and runs (`crate::LoadOptions::mtp`):
    /// its attention is one more KV pool layer, the last, and a hybrid model's state slot also
    /// keeps the decoder's last hidden row, which the head reads beside the next token.
    pub mtp_head: bool,
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default)]
    intermediate_size: usize,
    vocab_size: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_parameters: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    #[serde(flatten)]
    layers: layers::HfLayerFields,
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json does not parse: {e}")))?;
        // A Qwen3.5 checkpoint with its vision tower keeps the language model's shape in
        // `text_config`, and its architecture name at the top.
        let text = match value.get("text_config") {
            Some(inner) => {
                let mut inner = inner.clone();
                if let (Some(map), Some(archs)) = (inner.as_object_mut(), value.get("architectures")) {
                    map.entry("architectures").or_insert(archs.clone());
                    map.remove("model_type");
                }
                inner
            }
            None => value,
        };
        let hf: HfConfig =
            serde_json::from_value(text).map_err(|e| ModelError::Config(format!("config.json does not parse: {e}")))?;
        let arch_name = hf
            .model_type
            .clone()
            .or_else(|| hf.architectures.as_ref().and_then(|a| a.first().cloned()))
            .ok_or_else(|| ModelError::Config("config.json names no model_type or architectures".into()))?;
        let arch = Architecture::from_name(&arch_name)?;
        // transformers 5 moves rope settings into `rope_parameters`; older configs use
        // `rope_theta` and `rope_scaling`.
        let rope = hf.rope_parameters.as_ref().or(hf.rope_scaling.as_ref());
        let rope_theta = hf
            .rope_theta
            .or_else(|| rope.and_then(|r| r.get("rope_theta")).and_then(|v| v.as_f64()))
            .unwrap_or(10_000.0);
        let rope_type = rope.and_then(|r| r.get("rope_type").or_else(|| r.get("type"))).and_then(|v| v.as_str());
        let number = |key: &str| rope.and_then(|r| r.get(key)).and_then(|v| v.as_f64());
        let head_dim = hf.head_dim.unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
        let partial_rotary = number("partial_rotary_factor")
            .or(hf.layers.partial_rotary_factor)
            .unwrap_or(if arch.is_qwen35() { 0.25 } else { 1.0 });
        let (rope_llama3, rope_linear_factor) = match rope_type {
            None | Some("default") => (None, 1.0),
            Some("llama3") => (
                Some(Llama3RopeScaling {
                    factor: number("factor").unwrap_or(8.0),
                    low_freq_factor: number("low_freq_factor").unwrap_or(1.0),
                    high_freq_factor: number("high_freq_factor").unwrap_or(4.0),
                    original_max_position_embeddings: number("original_max_position_embeddings").unwrap_or(8192.0),
                }),
                1.0,
            ),
            Some("linear") => (None, number("factor").unwrap_or(1.0)),
            Some(other) => return Err(ModelError::Config(format!("unsupported rope scaling type `{other}`"))),
        };
        let moe = hf.layers.moe(arch, hf.num_hidden_layers)?;
        let config = ModelConfig {
            arch,
            hidden_size: hf.hidden_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            head_dim,
            // A MoE model without dense layers may name no dense width.
            intermediate_size: match (hf.intermediate_size, &moe) {
                (0, Some(m)) => m.expert_intermediate_size,
                (n, _) => n,
            },
            vocab_size: hf.vocab_size,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta,
            rope_llama3,
            rope_linear_factor,
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            rotary_dim: (head_dim as f64 * partial_rotary) as usize,
            attention_output_gate: arch.is_qwen35(),
            hybrid: hf.layers.hybrid(arch, hf.num_hidden_layers)?,
            moe,
            mtp_layers: hf.layers.mtp_num_hidden_layers.unwrap_or(0),
            mtp_head: false,
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads GGUF metadata laid out by llama.cpp's converter. `vocab_size` and
    /// `tie_word_embeddings` come from the tensors, which the caller passes in.
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let arch_name = get_str(md, "general.architecture")?;
        let arch = Architecture::from_name(&arch_name)?;
        let key = |k: &str| format!("{}.{k}", arch.gguf_name());
        let usize_of = |k: &str| -> Result<usize> {
            let full = key(k);
            md.get(&full)
                .ok_or_else(|| ModelError::Config(format!("GGUF metadata lacks `{full}`")))?
                .to_u64()
                .map(|v| v as usize)
                .or_else(|_| md[&full].to_u32().map(|v| v as usize))
                .map_err(|e| ModelError::Config(format!("GGUF `{full}` is not an integer: {e}")))
        };
        let f64_of = |k: &str| md.get(&key(k)).and_then(|v| v.to_f32().map(f64::from).ok());
        let hidden_size = usize_of("embedding_length")?;
        let num_heads = usize_of("attention.head_count")?;
        let num_kv_heads = usize_of("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = usize_of("attention.key_length").unwrap_or(hidden_size / num_heads.max(1));
        let embedding = content
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| ModelError::Config("GGUF has no token_embd.weight".into()))?;
        let vocab_size = embedding.shape.dims().first().copied().unwrap_or(0);
        let block_count = usize_of("block_count")?;
        // Multi-token-prediction layers are counted in `block_count` and come last.
        let mtp_layers = usize_of("nextn_predict_layers").unwrap_or(0).min(block_count);
        let num_layers = block_count - mtp_layers;
        let moe = layers::gguf_moe(arch, &|k| usize_of(k).ok(), num_layers)?;
        let hybrid = layers::gguf_hybrid(arch, md, &key, &|k| usize_of(k).ok(), num_layers)?;
        let intermediate_size = match (usize_of("feed_forward_length"), &moe) {
            (Ok(n), _) => n,
            (Err(_), Some(m)) => m.expert_intermediate_size,
            (Err(e), None) => return Err(e),
        };
        let rope_linear_factor = match md.get(&key("rope.scaling.type")).and_then(|v| v.to_string().ok()) {
            Some(t) if t == "linear" => f64_of("rope.scaling.factor").unwrap_or(1.0),
            _ => 1.0,
        };
        let config = ModelConfig {
            arch,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            vocab_size,
            rms_norm_eps: f64_of("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: f64_of("rope.freq_base").unwrap_or(10_000.0),
            // llama.cpp stores Llama 3 scaling as a `rope_freqs.weight` tensor of divisors,
            // which the loader reads instead.
            rope_llama3: None,
            rope_linear_factor,
            max_position_embeddings: usize_of("context_length").unwrap_or(4096),
            tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
            rotary_dim: usize_of("rope.dimension_count").unwrap_or(head_dim),
            attention_output_gate: arch.is_qwen35(),
            hybrid,
            moe,
            mtp_layers,
            mtp_head: false,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.head_dim == 0 || self.num_layers == 0 {
            return bad(format!("heads, kv heads, head_dim and layers must be positive: {self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!("{} query heads are not a multiple of {} kv heads", self.num_heads, self.num_kv_heads));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.intermediate_size == 0 {
            return bad("vocab, hidden and intermediate sizes must be positive".into());
        }
        if self.rotary_dim == 0 || self.rotary_dim > self.head_dim || !self.rotary_dim.is_multiple_of(2) {
            return bad(format!("rotary dims {} must be even and within head_dim {}", self.rotary_dim, self.head_dim));
        }
        if let Some(h) = &self.hybrid {
            h.validate(self.num_layers)?;
        }
        if let Some(m) = &self.moe {
            m.validate(self.num_layers)?;
        }
        Ok(())
    }

    /// Whether layer `layer`'s MLP is sparse (experts) rather than dense.
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        // A layer past the decoder's is the multi-token-prediction head, whose MLP is sparse in
        // a MoE model (Qwen3.5-MoE's), as llama.cpp loads it.
        self.moe.as_ref().is_some_and(|m| m.sparse_layers.get(layer).copied().unwrap_or(true))
    }

    /// Whether layer `layer` is a Gated DeltaNet (recurrent) layer rather than attention.
    pub fn is_recurrent_layer(&self, layer: usize) -> bool {
        self.hybrid.as_ref().is_some_and(|h| h.recurrent_layers.get(layer).copied().unwrap_or(false))
    }

    /// Layers with attention, each of which has a layer in the KV pool, and the running
    /// multi-token-prediction head's.
    pub fn num_kv_layers(&self) -> usize {
        (0..self.num_layers).filter(|&l| !self.is_recurrent_layer(l)).count() + usize::from(self.mtp_head)
    }
}

fn get_str(md: &HashMap<String, gguf_file::Value>, key: &str) -> Result<String> {
    md.get(key)
        .and_then(|v| v.to_string().ok())
        .cloned()
        .ok_or_else(|| ModelError::Config(format!("GGUF metadata lacks string `{key}`")))
}
