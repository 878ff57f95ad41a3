//! One config-driven decoder for Llama, Qwen2, Qwen3, Qwen3-MoE and Qwen3.5(-MoE), running a
//! packed batch over the external paged KV pool (and, for hybrid models, the external
//! recurrent [`StatePool`]): loading (which source, which RoPE layout) and the forward pass's
//! outline (embed, layers, head). The layers are types of their own, each loaded from the
//! config and a weight source (`weights`) and written once for every device; the device
//! decides only inside attention, through the pass's `ForwardContext` (`model/backend.rs`).
//!
//! The architectures differ only in switches the weights and config carry: Qwen2 has q/k/v
//! biases (loaded when present), Qwen3 normalises each head of q and k and may have a head_dim
//! other than hidden/heads, and Llama GGUF files store q/k permuted for interleaved RoPE.
//! Qwen3.5 swaps three of every four attention layers for Gated DeltaNet layers
//! (`model/delta_net.rs`); the MoE models swap the MLP for a sparse one (`model/moe.rs`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::batch::ForwardBatch;
use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv_pool::{KvPool, KvTypes};
use crate::layers::Embedding;
use crate::recommended_sampling::RecommendedSampling;
use crate::rope::{Rope, RopeLayout};
use crate::state_pool::StatePool;
use crate::weights::{GgufSource, Naming, RandomWeights, SafetensorsSource, TensorName, WeightSource, Weights};

mod attention;
mod backend;
mod decoder_layer;
mod delta_net;
mod gather;
mod head;
mod mlp;
mod moe;
mod mtp;
mod pass_logits;

use backend::ForwardContext;
use decoder_layer::{DecoderLayer, LayerCache};
use head::Head;
use mtp::MtpHead;

pub use mtp::MtpDraftRequest;
pub use pass_logits::PassLogits;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Threads of the model's own pool: attention, every quantized matmul on radix-kernels'
    /// kernels, and dense matmuls run there. candle's own pool (sized once per process from
    /// `CANDLE_NUM_THREADS`, which `radix-serve` sets from `--threads`) runs only quantized
    /// types we have no kernel for.
    pub threads: usize,
    /// Dequantize quantized weights to f32 at load: exact matmuls (no 8-bit activations),
    /// for checking a quantized file against a float reference; slower and larger.
    pub dequantize_weights: bool,
    /// Where weights, KV pool and compute live ([`crate::parse_device`]). Any device other than
    /// the CPU runs the tensor path.
    pub device: Device,
    /// Run the tensor path (the one GPUs run: candle ops, and attention by gathering the
    /// context) on the CPU too, so the CPU tests cover that code. Slower than the CPU path.
    pub tensor_path: bool,
    /// MoE models on a GPU: the routed experts of layers `0..cpu_moe_layers` stay in host
    /// memory and run on the CPU kernels, everything else on the device (llama-server's
    /// `--n-cpu-moe N`; `usize::MAX` is its `--cpu-moe`). Nothing changes on the CPU.
    pub cpu_moe_layers: usize,
    /// Load and run the file's multi-token-prediction head (Qwen3.5/3.6 `nextn` layers), which
    /// drafts for speculative decoding ([`Model::draft_mtp`]); every pass then also fills the
    /// head's KV layer. Dense Qwen3.5 GGUF files on the CPU path; elsewhere it is skipped with a
    /// load note saying why.
    pub mtp: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            dequantize_weights: false,
            device: Device::Cpu,
            tensor_path: false,
            cpu_moe_layers: 0,
            mtp: false,
        }
    }
}

/// A loaded decoder model.
pub struct Model {
    config: ModelConfig,
    embedding: Embedding,
    layers: Vec<DecoderLayer>,
    head: Head,
    /// The multi-token-prediction head, when loaded ([`LoadOptions::mtp`]).
    mtp: Option<MtpHead>,
    rope: Rope,
    threads: rayon::ThreadPool,
    notes: Vec<String>,
    device: Device,
    /// Run the tensor path (always on a GPU).
    tensor_path: bool,
    /// The sampling settings the model's files recommend.
    recommended_sampling: RecommendedSampling,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Model {
    /// Loads a `.gguf` file, or a directory with `config.json` and `*.safetensors` (or one of
    /// those safetensors files).
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        Self::load_with_progress(path, options, &mut |_, _| {})
    }

    /// [`load`](Self::load), calling `progress(layers_loaded, layers)` as layers load (for a
    /// progress bar).
    pub fn load_with_progress(
        path: &Path,
        options: &LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        if path.is_dir() {
            Self::safetensors_dir(path, options, progress)
        } else if path.extension().is_some_and(|e| e == "safetensors") {
            Self::safetensors_dir(path.parent().unwrap_or(Path::new(".")), options, progress)
        } else {
            Self::gguf(path, options, progress)
        }
    }

    /// Loads a GGUF model laid out by llama.cpp's converter.
    pub fn from_gguf(path: &Path, options: &LoadOptions) -> Result<Self> {
        Self::gguf(path, options, &mut |_, _| {})
    }

    fn gguf(path: &Path, options: &LoadOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let source = GgufSource::open(path, options.dequantize_weights)?;
        let config = ModelConfig::from_gguf(source.content())?;
        // llama.cpp's converter permutes Llama's q/k rows for interleaved rotation; Qwen keeps
        // the Hugging Face layout.
        let layout = if config.arch == Architecture::Llama { RopeLayout::Interleaved } else { RopeLayout::Neox };
        let model = Self::from_source(&source, config, layout, options, progress)?;
        let model = Model { recommended_sampling: RecommendedSampling::from_gguf(&source.content().metadata), ..model };
        drop(source);
        crate::allocator::release_freed_heap();
        Ok(model)
    }

    fn safetensors_dir(dir: &Path, options: &LoadOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| ModelError::BadFile { path: config_path.clone(), message: format!("cannot read: {e}") })?;
        let config = ModelConfig::from_hf_json(&text)?;
        let source = SafetensorsSource::open(dir, config.arch, config.num_layers)?;
        let model = Self::from_source(&source, config, RopeLayout::Neox, options, progress)?;
        Ok(Model { recommended_sampling: RecommendedSampling::from_model_dir(dir), ..model })
    }

    /// A model of `config`'s shape with random weights (see [`RandomWeights`]), for speed
    /// measurements.
    pub fn random(weights: RandomWeights, options: &LoadOptions) -> Result<Self> {
        let config = weights.config().clone();
        Self::from_source(&weights, config, RopeLayout::Neox, options, &mut |_, _| {})
    }

    fn from_source(
        source: &dyn WeightSource,
        mut config: ModelConfig,
        layout: RopeLayout,
        options: &LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let device = &options.device;
        // Qwen3.5 checkpoints' norms scale by `1 + w`; llama.cpp's converter folds the 1 into
        // GGUF files.
        let norm_offset = if source.naming() == Naming::Hf && config.arch.is_qwen35() { 1.0 } else { 0.0 };
        let mut weights =
            Weights::new(source, device).with_norm_offset(norm_offset).with_host_experts(options.cpu_moe_layers);
        let (embedding, head) = Head::load(&config, &mut weights)?;
        // Not `with_capacity(num_layers)`: an absurd count in a corrupt file must end in a
        // missing-tensor error, not an allocation failure.
        let mut layers = Vec::new();
        for i in 0..config.num_layers {
            layers.push(DecoderLayer::load(&config, i, &mut weights)?);
            progress(i + 1, config.num_layers);
        }
        // llama.cpp's converter stores Llama 3's frequency scaling as per-frequency divisors.
        let freqs = TensorName::model("rope_freqs", "rope_freqs").weight();
        let divisors = if weights.contains(&freqs, false) {
            Some(weights.host_tensor(&freqs, &[config.head_dim / 2])?.to_vec1::<f32>()?)
        } else {
            None
        };
        let rope = Rope::new(&config, layout, divisors.as_deref());
        let tensor_path = options.tensor_path || !device.is_cpu();
        let (mtp, skipped_mtp) = match mtp::skip_reason(&config, options, tensor_path, &weights) {
            None => (Some(MtpHead::load(&config, &mut weights)?), None),
            Some(why) => (None, why),
        };
        let mut notes = weights.into_notes();
        notes.extend(skipped_mtp);
        config.mtp_head = mtp.is_some();
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads.max(1))
            .thread_name(|i| format!("radix-model-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("cannot start {} model threads: {e}", options.threads)))?;
        Ok(Model {
            config,
            embedding,
            layers,
            head,
            mtp,
            rope,
            threads,
            notes,
            device: device.clone(),
            tensor_path,
            recommended_sampling: RecommendedSampling::default(),
        })
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A KV pool of `num_pages` pages where this model's forward pass wants it: host memory for
    /// the CPU path, tensors on the model's device for the tensor path.
    pub fn new_kv_pool(&self, page_size: usize, num_pages: usize, dtype: impl Into<KvTypes>) -> Result<KvPool> {
        if self.tensor_path {
            KvPool::on_device(&self.config, page_size, num_pages, dtype, &self.device)
        } else {
            KvPool::new(&self.config, page_size, num_pages, dtype)
        }
    }

    /// [`new_kv_pool`](Self::new_kv_pool) with as many pages as fit in `budget_bytes`.
    pub fn kv_pool_with_budget(
        &self,
        page_size: usize,
        budget_bytes: usize,
        dtype: impl Into<KvTypes>,
    ) -> Result<KvPool> {
        if self.tensor_path {
            KvPool::with_budget_on(&self.config, page_size, budget_bytes, dtype, &self.device)
        } else {
            KvPool::with_budget(&self.config, page_size, budget_bytes, dtype)
        }
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The sampling settings the model's files recommend (GGUF `general.sampling.*`, or
    /// `generation_config.json`), for requests that set none.
    pub fn recommended_sampling(&self) -> &RecommendedSampling {
        &self.recommended_sampling
    }

    /// Conversions made at load that are worth logging (e.g. Q4_1 weights converted to Q8_0).
    pub fn load_notes(&self) -> &[String] {
        &self.notes
    }

    /// A state pool of `num_slots` sequences for a hybrid model's recurrent layers: GPU memory
    /// on CUDA (where the Gated DeltaNet kernels work on it in place), host memory elsewhere.
    pub fn new_state_pool(&self, num_slots: usize) -> Result<StatePool> {
        if self.device.is_cuda() {
            StatePool::on_device(&self.config, num_slots, &self.device)
        } else {
            StatePool::new(&self.config, num_slots)
        }
    }

    /// Whether drafted spans can be verified ([`crate::SequenceChunk::verify`]): any model
    /// on the CPU path; a hybrid model's not yet on CUDA, whose kernels advance the state in
    /// place.
    pub fn verifies_drafts(&self) -> bool {
        self.config.hybrid.is_none() || !self.device.is_cuda()
    }

    /// After a pass verified a drafted span on state slot `slot`: advances the slot's state
    /// over the span's rows `rows` (the accepted ones, row 0 first: the sequence's own token,
    /// which the verify pass already applied), bitwise as a pass computing just them would
    /// have. Calls continue one another from row 0 (so a snapshot can be taken between them);
    /// the span's kept inputs are freed with its last row, or by
    /// [`StatePool::discard_verified`]. Models without recurrent layers have nothing to do.
    pub fn apply_verified(&self, state: &mut StatePool, slot: u32, rows: std::ops::Range<usize>) -> Result<()> {
        if self.config.hybrid.is_none() {
            return Ok(());
        }
        let recurrent = self.layers.iter().filter_map(|l| l.delta_net());
        self.threads.install(|| {
            for (delta_net, layer_state) in recurrent.zip(state.layers.iter_mut()) {
                delta_net.apply_verified(layer_state, slot, rows.clone())?;
            }
            state.apply_verified_carry(slot, rows)
        })
    }

    /// Runs the batch's new tokens through the model, writing their K/V into `kv` and attending
    /// over each sequence's paged context. Returns `[sequences wanting logits, vocab]` f32 logits,
    /// in batch order. Hybrid models need [`forward_with_state`](Self::forward_with_state).
    pub fn forward(&self, batch: &ForwardBatch, kv: &mut KvPool) -> Result<Tensor> {
        self.forward_with_state(batch, kv, None)
    }

    /// [`forward`](Self::forward) for any model: a hybrid model's recurrent layers read and
    /// write each sequence's slot of `state` ([`crate::SequenceChunk::state_slot`]).
    pub fn forward_with_state(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvPool,
        state: Option<&mut StatePool>,
    ) -> Result<Tensor> {
        let normed = self.logit_rows_normed(batch, kv, state)?;
        self.threads.install(|| self.head.logits(&normed))
    }

    /// [`forward_with_state`](Self::forward_with_state) as the engine reads it: the logits of
    /// each sequence's first logits row computed with the pass, a verified span's others when
    /// first asked for ([`PassLogits`]), the same bits either way.
    pub fn forward_pass(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvPool,
        state: Option<&mut StatePool>,
    ) -> Result<PassLogits<'_>> {
        let normed = self.logit_rows_normed(batch, kv, state)?;
        self.threads.install(|| PassLogits::new(&self.head, &self.threads, batch, &normed))
    }

    /// Runs the batch through the layers; the final norm of the rows that want logits
    /// (`[logit rows, hidden]`, in [`ForwardBatch::logit_rows`] order).
    fn logit_rows_normed(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvPool,
        mut state: Option<&mut StatePool>,
    ) -> Result<Tensor> {
        let layout = *kv.layout();
        if kv.layers.len() != self.config.num_kv_layers()
            || layout.num_kv_heads != self.config.num_kv_heads
            || layout.head_dim != self.config.head_dim
        {
            return Err(ModelError::KvPool(format!(
                "pool of {} layers x {} kv heads x {} dims does not fit this model ({} x {} x {})",
                kv.layers.len(),
                layout.num_kv_heads,
                layout.head_dim,
                self.config.num_kv_layers(),
                self.config.num_kv_heads,
                self.config.head_dim
            )));
        }
        batch.validate(layout.page_size, layout.num_pages, self.config.vocab_size)?;
        if self.config.hybrid.is_some() {
            let pool = state.as_deref().ok_or_else(|| {
                ModelError::KvPool("a hybrid model's forward pass needs a state pool (Model::new_state_pool)".into())
            })?;
            if !pool.fits(&self.config) {
                return Err(ModelError::KvPool("the state pool was made for another model".into()));
            }
            if let Some((i, s)) = batch
                .sequences
                .iter()
                .enumerate()
                .find(|(_, s)| s.state_slot.is_none_or(|p| p as usize >= pool.num_slots()))
            {
                return Err(ModelError::Batch(format!(
                    "sequence {i}: state slot {:?} is not one of the pool's {} slots",
                    s.state_slot,
                    pool.num_slots()
                )));
            }
        }
        let pool_fits = match kv.device() {
            None => !self.tensor_path,
            Some(d) => self.tensor_path && d.same_device(&self.device),
        };
        if !pool_fits {
            return Err(ModelError::KvPool(format!(
                "the pool is in {} but the model runs the {} path on {}: make the pool with Model::new_kv_pool",
                kv.device().map_or("host memory".to_owned(), crate::device_name),
                if self.tensor_path { "tensor" } else { "CPU" },
                crate::device_name(&self.device)
            )));
        }
        if batch.tokens.is_empty() {
            return Ok(Tensor::zeros((0, self.config.hidden_size), DType::F32, &self.device)?);
        }
        self.threads.install(|| {
            let ctx = ForwardContext::new(&self.config, &self.rope, batch, layout, &self.device, self.tensor_path)?;
            let ids = Tensor::from_slice(&batch.tokens, batch.tokens.len(), &self.device)?;
            let mut x = self.embedding.forward(&ids)?;
            let embedded = self.mtp.as_ref().map(|_| x.clone());
            let mut kv_layers = kv.layers.iter_mut();
            let mut state_layers = state.as_mut().map(|s| s.layers.iter_mut());
            for layer in &self.layers {
                let cache = if layer.attends() {
                    kv_layers.next().map(LayerCache::Kv)
                } else {
                    state_layers.as_mut().and_then(|s| s.next()).map(LayerCache::State)
                };
                let cache = cache.ok_or_else(|| ModelError::KvPool("fewer cache layers than model layers".into()))?;
                x = layer.forward(&x, &ctx, cache)?;
            }
            match (&self.mtp, embedded, kv_layers.next(), state) {
                (Some(mtp), Some(embedded), Some(head_kv), Some(state)) => {
                    self.finish_pass_with_mtp(mtp, batch, &ctx, &embedded, &x, head_kv, state)
                }
                (Some(_), ..) => {
                    Err(ModelError::KvPool("the multi-token-prediction head has no KV layer or state".into()))
                }
                (None, ..) => self.head.norm_rows(&x, &batch.logit_rows()),
            }
        })
    }
}
