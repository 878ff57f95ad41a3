//! One config-driven decoder for Llama, Qwen2 and Qwen3, running a packed batch over the
//! external paged KV pool.
//!
//! The architectures differ only in switches the weights and config carry: Qwen2 has q/k/v
//! biases (loaded when present), Qwen3 normalises each head of q and k and may have a head_dim
//! other than hidden/heads, and Llama GGUF files store q/k permuted for interleaved RoPE.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use radix_kernels::{KvElement, PagedLayout, SequenceAttention, paged_attention, write_kv};

use crate::batch::ForwardBatch;
use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv_pool::{KvDType, KvPool, LayerKv, TypedKv};
use crate::random_weights::RandomWeights;
use crate::rope::{Rope, RopeAngles, RopeLayout};
use crate::weights::{Embedding, Linear, WeightStore, check_embedding_shape};

mod tensor_path;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Threads of the model's own pool (attention, Q8_0 matmuls on radix-kernels' int8 kernel,
    /// and dense matmuls run there). candle runs its other quantized matmuls (Q4_K, Q6_K, ...)
    /// on a pool of its own, sized once per process from `CANDLE_NUM_THREADS`; `radix-serve`
    /// sets that from `--threads`.
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
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            dequantize_weights: false,
            device: Device::Cpu,
            tensor_path: false,
        }
    }
}

struct DecoderLayer {
    attn_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    ffn_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A loaded decoder model.
pub struct Model {
    config: ModelConfig,
    embedding: Embedding,
    layers: Vec<DecoderLayer>,
    norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    threads: rayon::ThreadPool,
    notes: Vec<String>,
    device: Device,
    /// Run the tensor path (always on a GPU).
    tensor_path: bool,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", &self.config).finish_non_exhaustive()
    }
}

/// What the attention of one forward pass shares across layers.
struct StepContext<'a> {
    angles: RopeAngles,
    slots: Vec<u32>,
    seqs: Vec<SequenceAttention<'a>>,
    layout: PagedLayout,
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

    /// Loads a Hugging Face model directory (`config.json` + safetensors).
    pub fn from_safetensors_dir(dir: &Path, options: &LoadOptions) -> Result<Self> {
        Self::safetensors_dir(dir, options, &mut |_, _| {})
    }

    fn gguf(path: &Path, options: &LoadOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let store = WeightStore::open_gguf(path, options.dequantize_weights)?;
        let config = ModelConfig::from_gguf(store.gguf_content().expect("a GGUF store"))?;
        // llama.cpp's converter permutes Llama's q/k rows for interleaved rotation; Qwen keeps
        // the Hugging Face layout.
        let layout = if config.arch == Architecture::Llama { RopeLayout::Interleaved } else { RopeLayout::Neox };
        Self::from_store(&store, config, layout, options, progress)
    }

    fn safetensors_dir(dir: &Path, options: &LoadOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| ModelError::BadFile { path: config_path.clone(), message: format!("cannot read: {e}") })?;
        let config = ModelConfig::from_hf_json(&text)?;
        let store = WeightStore::open_safetensors(dir, config.arch)?;
        Self::from_store(&store, config, RopeLayout::Neox, options, progress)
    }

    /// A model of `config`'s shape with random weights (see [`RandomWeights`]), for speed
    /// measurements.
    pub fn random(weights: RandomWeights, options: &LoadOptions) -> Result<Self> {
        let config = weights.config().clone();
        Self::from_store(&WeightStore::Random(weights), config, RopeLayout::Neox, options, &mut |_, _| {})
    }

    fn from_store(
        store: &WeightStore,
        config: ModelConfig,
        layout: RopeLayout,
        options: &LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let mut notes = Vec::new();
        let device = &options.device;
        let (embedding, tied_head) = store.embedding(device, &mut notes)?;
        check_embedding_shape(&config, &embedding)?;
        let lm_head = match tied_head {
            Some(head) => head,
            None => store.linear("output", device, &mut notes)?,
        };
        // Not `with_capacity(num_layers)`: an absurd count in a corrupt file must end in a
        // missing-tensor error, not an allocation failure.
        let mut layers = Vec::new();
        for i in 0..config.num_layers {
            let name = |part: &str| format!("blk.{i}.{part}");
            let qk_norm = config.arch == Architecture::Qwen3;
            layers.push(DecoderLayer {
                attn_norm: store.dense(&name("attn_norm.weight"), device)?,
                q: store.linear(&name("attn_q"), device, &mut notes)?,
                k: store.linear(&name("attn_k"), device, &mut notes)?,
                v: store.linear(&name("attn_v"), device, &mut notes)?,
                o: store.linear(&name("attn_output"), device, &mut notes)?,
                q_norm: if qk_norm { Some(store.dense(&name("attn_q_norm.weight"), device)?) } else { None },
                k_norm: if qk_norm { Some(store.dense(&name("attn_k_norm.weight"), device)?) } else { None },
                ffn_norm: store.dense(&name("ffn_norm.weight"), device)?,
                gate: store.linear(&name("ffn_gate"), device, &mut notes)?,
                up: store.linear(&name("ffn_up"), device, &mut notes)?,
                down: store.linear(&name("ffn_down"), device, &mut notes)?,
            });
            progress(i + 1, config.num_layers);
        }
        let divisors = if store.contains("rope_freqs.weight") {
            Some(store.dense("rope_freqs.weight", &Device::Cpu)?.to_vec1::<f32>()?)
        } else {
            None
        };
        let rope = Rope::new(&config, layout, divisors.as_deref());
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads.max(1))
            .thread_name(|i| format!("radix-model-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("cannot start {} model threads: {e}", options.threads)))?;
        let norm = store.dense("output_norm.weight", device)?;
        let tensor_path = options.tensor_path || !device.is_cpu();
        Ok(Model {
            config,
            embedding,
            layers,
            norm,
            lm_head,
            rope,
            threads,
            notes,
            device: device.clone(),
            tensor_path,
        })
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A KV pool of `num_pages` pages where this model's forward pass wants it: host memory for
    /// the CPU path, tensors on the model's device for the tensor path.
    pub fn new_kv_pool(&self, page_size: usize, num_pages: usize, dtype: KvDType) -> Result<KvPool> {
        if self.tensor_path {
            KvPool::on_device(&self.config, page_size, num_pages, dtype, &self.device)
        } else {
            KvPool::new(&self.config, page_size, num_pages, dtype)
        }
    }

    /// [`new_kv_pool`](Self::new_kv_pool) with as many pages as fit in `budget_bytes`.
    pub fn kv_pool_with_budget(&self, page_size: usize, budget_bytes: usize, dtype: KvDType) -> Result<KvPool> {
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

    /// Conversions made at load that are worth logging (e.g. Q4_1 weights converted to Q8_0).
    pub fn load_notes(&self) -> &[String] {
        &self.notes
    }

    /// Runs the batch's new tokens through the model, writing their K/V into `kv` and attending
    /// over each sequence's paged context. Returns `[sequences wanting logits, vocab]` f32 logits,
    /// in batch order.
    pub fn forward(&self, batch: &ForwardBatch, kv: &mut KvPool) -> Result<Tensor> {
        let layout = *kv.layout();
        if kv.layers.len() != self.config.num_layers
            || layout.num_kv_heads != self.config.num_kv_heads
            || layout.head_dim != self.config.head_dim
        {
            return Err(ModelError::KvPool(format!(
                "pool of {} layers x {} kv heads x {} dims does not fit this model ({} x {} x {})",
                kv.layers.len(),
                layout.num_kv_heads,
                layout.head_dim,
                self.config.num_layers,
                self.config.num_kv_heads,
                self.config.head_dim
            )));
        }
        batch.validate(layout.page_size, layout.num_pages, self.config.vocab_size)?;
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
            return Ok(Tensor::zeros((0, self.config.vocab_size), DType::F32, &self.device)?);
        }
        if self.tensor_path {
            return self.threads.install(|| self.forward_tensors(batch, kv));
        }
        let step = StepContext {
            angles: self.rope.angles(batch.positions()),
            slots: batch.slots(layout.page_size),
            seqs: batch.attention_sequences(),
            layout,
        };
        self.threads.install(|| {
            let ids = Tensor::from_slice(&batch.tokens, batch.tokens.len(), &Device::Cpu)?;
            let mut x = self.embedding.forward(&ids)?;
            for (layer, layer_kv) in self.layers.iter().zip(kv.layers.iter_mut()) {
                x = self.layer_forward(layer, &x, &step, layer_kv)?;
            }
            let rows = batch.logit_rows();
            if rows.is_empty() {
                return Ok(Tensor::zeros((0, self.config.vocab_size), DType::F32, &Device::Cpu)?);
            }
            let rows = Tensor::from_slice(&rows, rows.len(), &Device::Cpu)?;
            let last = x.index_select(&rows, 0)?;
            let normed = candle_nn::ops::rms_norm(&last, &self.norm, self.config.rms_norm_eps as f32)?;
            self.lm_head.forward(&normed)
        })
    }

    fn layer_forward(&self, layer: &DecoderLayer, x: &Tensor, step: &StepContext, kv: &mut LayerKv) -> Result<Tensor> {
        let c = &self.config;
        let eps = c.rms_norm_eps as f32;
        let n = x.dim(0)?;
        let h = candle_nn::ops::rms_norm(x, &layer.attn_norm, eps)?;
        let [mut q, mut k, v]: [Tensor; 3] =
            Linear::forward_shared(&[&layer.q, &layer.k, &layer.v], &h)?.try_into().expect("three projections");
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            q = candle_nn::ops::rms_norm(&q.reshape((n, c.num_heads, c.head_dim))?, qn, eps)?;
            k = candle_nn::ops::rms_norm(&k.reshape((n, c.num_kv_heads, c.head_dim))?, kn, eps)?;
        }
        let mut q = q.flatten_all()?.to_vec1::<f32>()?;
        let mut k = k.flatten_all()?.to_vec1::<f32>()?;
        let v = v.flatten_all()?.to_vec1::<f32>()?;
        self.rope.apply(&step.angles, &mut q, c.num_heads);
        self.rope.apply(&step.angles, &mut k, c.num_kv_heads);

        let mut attn = vec![0.0f32; n * c.num_heads * c.head_dim];
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let (q, k, v, out) = (&q[..], &k[..], &v[..], &mut attn[..]);
        match kv.typed() {
            Some(TypedKv::F32(kc, vc)) => attend(step, c.num_heads, scale, q, k, v, kc, vc, out)?,
            Some(TypedKv::F16(kc, vc)) => attend(step, c.num_heads, scale, q, k, v, kc, vc, out)?,
            Some(TypedKv::BF16(kc, vc)) => attend(step, c.num_heads, scale, q, k, v, kc, vc, out)?,
            None => unreachable!("forward checked that the CPU path has a host pool"),
        }
        let attn = Tensor::from_vec(attn, (n, c.num_heads * c.head_dim), &Device::Cpu)?;
        let x = (x + layer.o.forward(&attn)?)?;

        let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
        let [gate, up]: [Tensor; 2] =
            Linear::forward_shared(&[&layer.gate, &layer.up], &h)?.try_into().expect("two projections");
        let mlp = layer.down.forward(&(gate.silu()? * up)?)?;
        Ok((x + mlp)?)
    }
}

/// Writes the new tokens' K/V into their slots, then attends over each sequence's context.
#[allow(clippy::too_many_arguments)]
fn attend<T: KvElement>(
    step: &StepContext,
    num_heads: usize,
    scale: f32,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    k_cache: &mut [T],
    v_cache: &mut [T],
    out: &mut [f32],
) -> Result<()> {
    write_kv(&step.layout, k, v, &step.slots, k_cache, v_cache)?;
    paged_attention(&step.layout, num_heads, scale, q, k_cache, v_cache, &step.seqs, out)?;
    Ok(())
}
