//! Where weights come from: a GGUF file, a safetensors directory, or random numbers of a
//! model's shape, each a [`WeightSource`]. Layers ask for their tensors by a [`TensorName`]
//! they build themselves (in every naming scheme a source may use), so a new layer kind brings
//! its own names and touches neither the sources nor the other layers; each source decides, in
//! one place, how it stores a matrix for the device the model runs on.

mod gguf;
mod random;
mod safetensors;

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Tensor};
use radix_kernels::dense::DenseMatrix;

use crate::error::Result;
use crate::layers::{Embedding, Linear, RmsNorm, Weight};

pub(crate) use gguf::GgufSource;
pub use random::{RandomFormat, RandomWeights};
pub(crate) use safetensors::SafetensorsSource;

/// A tensor as the layer that owns it names it: llama.cpp's (GGUF) name and transformers' (the
/// Hugging Face safetensors) name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorName {
    gguf: String,
    hf: String,
}

impl TensorName {
    /// A tensor of the whole model (`token_embd` / `model.embed_tokens`).
    pub(crate) fn model(gguf: &str, hf: &str) -> Self {
        TensorName { gguf: gguf.to_owned(), hf: hf.to_owned() }
    }

    /// A tensor of decoder layer `layer`: `blk.{layer}.{gguf}` / `model.layers.{layer}.{hf}`.
    pub(crate) fn layer(layer: usize, gguf: &str, hf: &str) -> Self {
        TensorName { gguf: format!("blk.{layer}.{gguf}"), hf: format!("model.layers.{layer}.{hf}") }
    }

    /// The `.weight` of a module of that name.
    pub(crate) fn weight(&self) -> Self {
        self.suffixed("weight")
    }

    /// The `.bias` of a module of that name.
    pub(crate) fn bias(&self) -> Self {
        self.suffixed("bias")
    }

    fn suffixed(&self, suffix: &str) -> Self {
        TensorName { gguf: format!("{}.{suffix}", self.gguf), hf: format!("{}.{suffix}", self.hf) }
    }

    /// llama.cpp's name (GGUF files, and the seed of random weights).
    pub(crate) fn gguf(&self) -> &str {
        &self.gguf
    }

    /// transformers' name (safetensors files).
    pub(crate) fn hf(&self) -> &str {
        &self.hf
    }
}

/// Whose names and conventions a source's tensors follow: llama.cpp's converter bakes some
/// transformations into GGUF files (Qwen3.5's `ssm_a = -exp(A_log)`, norms with `+1` folded
/// in) that a layer must undo or apply itself for a transformers checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Naming {
    /// GGUF as llama.cpp's converter writes it (and random weights, which use its names).
    Gguf,
    /// A transformers checkpoint.
    Hf,
}

/// Weights as some source holds them. `shape` arguments are what the asking layer expects:
/// random weights are made in it; files hold shapes of their own, which the embedding check and
/// the first matmul hold to the config.
pub(crate) trait WeightSource {
    /// Whether the source holds `name`, a tensor some models of an architecture have and some
    /// lack (biases, an untied head). `expected`: whether a model of this config has it, which
    /// is all made-up weights can go by; files answer from what they hold.
    fn contains(&self, name: &TensorName, expected: bool) -> bool;

    /// A dense f32 tensor on `device`: norm weights, biases, small tables.
    fn tensor(&self, name: &TensorName, shape: &[usize], device: &Device) -> Result<Tensor>;

    /// The `[out, in]` matrix of `x @ W^T`, in the form that runs fastest on the target device.
    fn matrix(&self, name: &TensorName, shape: [usize; 2], to: &mut Target) -> Result<Weight>;

    /// The `[vocab, hidden]` token embedding and, with `tied`, the output head on that matrix.
    fn embedding(&self, name: &TensorName, shape: [usize; 2], tied: bool, to: &mut Target) -> Result<Embedded>;

    /// Whose names and conventions the tensors follow.
    fn naming(&self) -> Naming {
        Naming::Gguf
    }

    /// The `[out, in]` matrices of `experts` experts: GGUF stacks them in one 3-D tensor
    /// (`stacked`), checkpoints keep one matrix per expert (`each(expert)`).
    fn expert_matrices(
        &self,
        _stacked: &TensorName,
        each: &dyn Fn(usize) -> TensorName,
        experts: usize,
        shape: [usize; 2],
        to: &mut Target,
    ) -> Result<Vec<Weight>> {
        (0..experts).map(|e| self.matrix(&each(e).weight(), shape, to)).collect()
    }
}

/// Where loaded weights go: the model's device, and the notes of load-time conversions worth
/// logging ([`crate::Model::load_notes`]).
pub(crate) struct Target {
    pub(crate) device: Device,
    pub(crate) notes: Vec<String>,
}

impl Target {
    /// Adds `note` unless it is there already (one note per kind of conversion, not per tensor).
    pub(crate) fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }
}

/// A token embedding and, when the head is tied, the head multiplying by that same matrix (kept
/// once, in a form fit for both).
pub(crate) struct Embedded {
    pub(crate) embedding: Embedding,
    pub(crate) tied_head: Option<Linear>,
}

impl Embedded {
    /// A dense matrix; `head` gives the form a tied head multiplies by it in.
    pub(crate) fn dense(w: Tensor, tied: bool, head: fn(Tensor) -> Weight) -> Self {
        let tied_head = tied.then(|| Linear::new(head(w.clone())));
        Embedded { embedding: Embedding::Dense(w), tied_head }
    }

    /// A float matrix on the CPU (our dense kernel), for lookups and a tied head alike.
    pub(crate) fn float(m: Arc<DenseMatrix>, tied: bool) -> Self {
        let tied_head = tied.then(|| Linear::new(Weight::Float(Arc::clone(&m))));
        Embedded { embedding: Embedding::Float(m), tied_head }
    }

    /// A quantized matrix on candle's kernels, for lookups and a tied head alike.
    pub(crate) fn quantized(q: QTensor, tied: bool) -> Result<Self> {
        let q = Arc::new(q);
        let tied_head = if tied { Some(Linear::new(Weight::Candle(QMatMul::from_arc(Arc::clone(&q))?))) } else { None };
        Ok(Embedded { embedding: Embedding::Quantized(q), tied_head })
    }
}

/// What a layer loads through: a source and the target its weights go to.
pub(crate) struct Weights<'a> {
    source: &'a dyn WeightSource,
    to: Target,
    /// Added to every RMSNorm weight (1 for a Qwen3.5 checkpoint's zero-centred norms).
    norm_offset: f32,
    /// MoE layers below this keep their routed experts in host memory (`--n-cpu-moe`).
    host_expert_layers: usize,
}

impl<'a> Weights<'a> {
    /// Loads from `source` onto `device`.
    pub(crate) fn new(source: &'a dyn WeightSource, device: &Device) -> Self {
        Weights {
            source,
            to: Target { device: device.clone(), notes: Vec::new() },
            norm_offset: 0.0,
            host_expert_layers: 0,
        }
    }

    /// Adds `offset` to the weight of every RMSNorm loaded from now on.
    pub(crate) fn with_norm_offset(self, offset: f32) -> Self {
        Weights { norm_offset: offset, ..self }
    }

    /// The device the model's weights go to.
    #[cfg(feature = "cuda")]
    pub(crate) fn device(&self) -> &Device {
        &self.to.device
    }

    /// Keeps the routed experts of layers `0..layers` in host memory when the model loads onto
    /// another device (llama-server's `--n-cpu-moe`; `usize::MAX` is `--cpu-moe`).
    pub(crate) fn with_host_experts(self, layers: usize) -> Self {
        Weights { host_expert_layers: layers, ..self }
    }

    /// Whether layer `layer`'s routed experts stay in host memory: the model runs elsewhere and
    /// the layer is one `--cpu-moe`/`--n-cpu-moe` names.
    pub(crate) fn experts_on_host(&self, layer: usize) -> bool {
        !self.to.device.is_cpu() && layer < self.host_expert_layers
    }

    /// The matrices of a MoE layer's experts as the source stores them for the model's device,
    /// or (`on_host`) for the CPU; see [`WeightSource::expert_matrices`].
    pub(crate) fn expert_weights(
        &mut self,
        stacked: &TensorName,
        each: &dyn Fn(usize) -> TensorName,
        experts: usize,
        shape: [usize; 2],
        on_host: bool,
    ) -> Result<Vec<Weight>> {
        let device = on_host.then(|| std::mem::replace(&mut self.to.device, Device::Cpu));
        let weights = self.source.expert_matrices(&stacked.weight(), each, experts, shape, &mut self.to);
        if let Some(device) = device {
            self.to.device = device;
        }
        weights
    }

    /// Whose names and conventions the source follows.
    pub(crate) fn naming(&self) -> Naming {
        self.source.naming()
    }

    /// See [`WeightSource::contains`].
    pub(crate) fn contains(&self, name: &TensorName, expected: bool) -> bool {
        self.source.contains(name, expected)
    }

    /// A dense f32 tensor on the model's device.
    pub(crate) fn tensor(&self, name: &TensorName, shape: &[usize]) -> Result<Tensor> {
        self.source.tensor(name, shape, &self.to.device)
    }

    /// A dense f32 tensor in host memory (tables read once at load).
    pub(crate) fn host_tensor(&self, name: &TensorName, shape: &[usize]) -> Result<Tensor> {
        self.source.tensor(name, shape, &Device::Cpu)
    }

    /// The RMSNorm whose `[dim]` weight is `name.weight`.
    pub(crate) fn rms_norm(&self, name: &TensorName, dim: usize, eps: f64) -> Result<RmsNorm> {
        let weight = self.tensor(&name.weight(), &[dim])?;
        let weight = if self.norm_offset != 0.0 { (weight + f64::from(self.norm_offset))? } else { weight };
        Ok(RmsNorm::new(weight, eps))
    }

    /// The linear layer `name` (`name.weight`, `[out, in]`), with `name.bias` wherever the source
    /// has one. `biased`: whether the architecture has that bias (see
    /// [`WeightSource::contains`]); a file's own biases are loaded either way, as transformers
    /// would.
    pub(crate) fn linear(&mut self, name: &TensorName, shape: [usize; 2], biased: bool) -> Result<Linear> {
        let weight = self.source.matrix(&name.weight(), shape, &mut self.to)?;
        let bias_name = name.bias();
        let bias = if self.contains(&bias_name, biased) { Some(self.tensor(&bias_name, &shape[..1])?) } else { None };
        Ok(Linear::new(weight).with_bias(bias))
    }

    /// The embedding `name.weight`; see [`WeightSource::embedding`].
    pub(crate) fn embedding(&mut self, name: &TensorName, shape: [usize; 2], tied: bool) -> Result<Embedded> {
        self.source.embedding(&name.weight(), shape, tied, &mut self.to)
    }

    /// The notes collected, for [`crate::Model::load_notes`].
    pub(crate) fn into_notes(self) -> Vec<String> {
        self.to.notes
    }
}
