//! Reading weights from GGUF (quantized, through candle's reader and `QMatMul`) or from
//! safetensors with a `config.json`, under llama.cpp's tensor names.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Module, Tensor};

use radix_kernels::quant::Q8_0Matrix;

use crate::config::{Architecture, ModelConfig};
use crate::cpu_matmul::{exact_q8_0, host_forward, q8_0_matrix};
use crate::error::{ModelError, Result};
use crate::random_weights::RandomWeights;

/// A linear layer: `x @ W^T (+ b)`, W dense or quantized.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

/// The matrix of a [`Linear`], and whose kernel multiplies by it.
#[derive(Debug, Clone)]
pub(crate) enum Weight {
    /// candle's `QMatMul`: dense weights, and quantized types other than Q8_0.
    Candle(QMatMul),
    /// Q8_0 on radix-kernels' int8 kernel, which is faster than candle's on the CPU for any
    /// inner size (candle's fast path needs multiples of 256) and runs on the model's pool.
    Q8_0(Arc<Q8_0Matrix>),
    /// A dense matrix kept in its own type (bf16/f16 on a GPU): f32 inputs are cast to it for
    /// the matmul (cuBLAS) and the result back to f32.
    Dense(Tensor),
}

impl Linear {
    pub(crate) fn new(weight: Weight) -> Self {
        Linear { weight, bias: None }
    }

    /// Applies the layer to `[rows, in]`, giving `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            Weight::Candle(m) => m.forward(x)?,
            Weight::Q8_0(m) => host_forward(x, m.k(), m.n_out(), |x, out| m.matmul(x, out))?,
            Weight::Dense(w) => x.to_dtype(w.dtype())?.matmul(&w.t()?)?.to_dtype(DType::F32)?,
        };
        self.add_bias(y)
    }

    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Applies several layers to the same input, as [`forward`](Self::forward) each. Quantized
    /// matrices of one type on the CPU share one quantization of `x` to 8 bits and one
    /// parallel region (candle's fused path, where its CPU kernels have one): q/k/v and
    /// gate/up each quantized their common input again and synchronised the pool once per
    /// matrix.
    pub fn forward_shared(layers: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        let mut out: Vec<Option<Tensor>> = vec![None; layers.len()];
        for (i, layer) in layers.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            let Some(dtype) = layer.candle_qtensor().map(|t| t.dtype()) else {
                out[i] = Some(layer.forward(x)?);
                continue;
            };
            // Every not yet computed layer whose matrix has this quantized type.
            let group: Vec<usize> = (i..layers.len())
                .filter(|&j| out[j].is_none() && layers[j].candle_qtensor().is_some_and(|t| t.dtype() == dtype))
                .collect();
            let fused = if group.len() > 1 {
                let tensors: Vec<&QTensor> = group.iter().filter_map(|&j| layers[j].candle_qtensor()).collect();
                QTensor::gemv_fused_shared_lhs(&tensors, x)?
            } else {
                None
            };
            match fused {
                Some(ys) => {
                    for (&j, y) in group.iter().zip(ys) {
                        out[j] = Some(layers[j].add_bias(y)?);
                    }
                }
                None => {
                    for &j in &group {
                        out[j] = Some(layers[j].forward(x)?);
                    }
                }
            }
        }
        Ok(out.into_iter().map(|y| y.expect("every layer computed")).collect())
    }

    /// The quantized tensor of a matrix on candle's quantized kernels.
    fn candle_qtensor(&self) -> Option<&QTensor> {
        match &self.weight {
            Weight::Candle(QMatMul::QTensor(t)) => Some(t),
            _ => None,
        }
    }
}

/// The token embedding: quantized rows are dequantized only for the tokens looked up.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// A dense `[vocab, hidden]` matrix.
    Dense(Tensor),
    /// A quantized `[vocab, hidden]` matrix.
    Quantized(Arc<QTensor>),
    /// A Q8_0 `[vocab, hidden]` matrix shared with the tied output head.
    Q8_0(Arc<Q8_0Matrix>),
}

impl Embedding {
    /// Looks up token ids, giving `[ids, hidden]` f32.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Embedding::Dense(w) => w.index_select(ids, 0)?.to_dtype(DType::F32)?,
            Embedding::Quantized(q) => q.embedding(ids)?.to_dtype(DType::F32)?,
            Embedding::Q8_0(m) => {
                let ids = ids.to_dtype(DType::U32)?.flatten_all()?.to_vec1::<u32>()?;
                let mut rows = vec![0.0f32; ids.len() * m.k()];
                for (&id, row) in ids.iter().zip(rows.chunks_exact_mut(m.k())) {
                    m.dequantize_row(id as usize, row)?;
                }
                Tensor::from_vec(rows, (ids.len(), m.k()), &Device::Cpu)?
            }
        })
    }
}

/// Where the weights are.
pub(crate) enum WeightStore {
    Gguf {
        path: PathBuf,
        content: gguf_file::Content,
        file: Mutex<File>,
        dequantize: bool,
    },
    Safetensors {
        dir: PathBuf,
        tensors: MmapedSafetensors,
        arch: Architecture,
    },
    /// Made up on the spot, for speed measurements of a shape ([`crate::RandomWeights`]).
    Random(RandomWeights),
}

/// Quantization types whose CPU kernels in candle are scalar or untiled and which Q8_0 cannot
/// hold exactly (a per-block minimum); requantized to Q8_0 at load. Q5_K is here because
/// candle's kernel takes one activation row at a time: a Q5_K_M Qwen3-0.6B-shaped model
/// prefilled 140 tok/s (llama.cpp: 616) and decoded 48; as Q8_0, 412 and 53. Requantizing adds
/// 6-13% of the file's own quantization error (L2, `requantizing_to_q8_0_adds_little_error`),
/// under 1% more error in all, and costs memory (8.5 bits per weight instead of 4.5-6).
const SLOW_CPU_TYPES: [GgmlDType; 3] = [GgmlDType::Q4_1, GgmlDType::Q5_1, GgmlDType::Q5K];

impl WeightStore {
    pub(crate) fn open_gguf(path: &Path, dequantize: bool) -> Result<Self> {
        let bad = |m: String| ModelError::BadFile { path: path.to_owned(), message: m };
        let mut file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        // candle's reader panics on some corrupt headers (`general.alignment` = 0 divides by
        // zero): report those as a bad file too.
        let content = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gguf_file::Content::read(&mut file)))
            .map_err(|p| {
                let why =
                    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
                bad(format!("not a readable GGUF file: the reader failed ({})", why.unwrap_or_default()))
            })?
            .map_err(|e| bad(format!("not a readable GGUF file: {e}")))?;
        Ok(WeightStore::Gguf { path: path.to_owned(), content, file: Mutex::new(file), dequantize })
    }

    /// The GGUF header, for GGUF stores.
    pub(crate) fn gguf_content(&self) -> Option<&gguf_file::Content> {
        match self {
            WeightStore::Gguf { content, .. } => Some(content),
            WeightStore::Safetensors { .. } | WeightStore::Random(_) => None,
        }
    }

    pub(crate) fn open_safetensors(dir: &Path, arch: Architecture) -> Result<Self> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| ModelError::BadFile { path: dir.to_owned(), message: format!("cannot list: {e}") })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::BadFile { path: dir.to_owned(), message: "no .safetensors files".into() });
        }
        // SAFETY: the files are mapped read-only; a model file changed underneath a running
        // server is outside what we can guard against, as for every mmap-based loader.
        let tensors = unsafe { MmapedSafetensors::multi(&files) }
            .map_err(|e| ModelError::BadFile { path: dir.to_owned(), message: format!("bad safetensors: {e}") })?;
        Ok(WeightStore::Safetensors { dir: dir.to_owned(), tensors, arch })
    }

    fn path(&self) -> &Path {
        match self {
            WeightStore::Gguf { path, .. } => path,
            WeightStore::Safetensors { dir, .. } => dir,
            WeightStore::Random(_) => Path::new("<random weights>"),
        }
    }

    /// The store's own name for a tensor given by its GGUF name.
    fn name_of(&self, gguf_name: &str) -> String {
        match self {
            WeightStore::Gguf { .. } | WeightStore::Random(_) => gguf_name.to_owned(),
            WeightStore::Safetensors { .. } => hf_name(gguf_name),
        }
    }

    pub(crate) fn contains(&self, gguf_name: &str) -> bool {
        match self {
            WeightStore::Gguf { content, .. } => content.tensor_infos.contains_key(gguf_name),
            WeightStore::Safetensors { tensors, .. } => tensors.get(&hf_name(gguf_name)).is_ok(),
            WeightStore::Random(r) => r.contains(gguf_name),
        }
    }

    fn missing(&self, gguf_name: &str) -> ModelError {
        let arch = match self {
            WeightStore::Gguf { content, .. } => content
                .metadata
                .get("general.architecture")
                .and_then(|v| v.to_string().ok().cloned())
                .unwrap_or_default(),
            WeightStore::Safetensors { arch, .. } => arch.gguf_name().to_owned(),
            WeightStore::Random(r) => r.config().arch.gguf_name().to_owned(),
        };
        ModelError::MissingTensor { path: self.path().to_owned(), name: self.name_of(gguf_name), arch }
    }

    /// A GGUF tensor as stored, read into `device`'s memory.
    fn qtensor(&self, gguf_name: &str, device: &Device) -> Result<QTensor> {
        let WeightStore::Gguf { content, file, path, .. } = self else {
            unreachable!("only GGUF stores hold QTensors")
        };
        let Some(info) = content.tensor_infos.get(gguf_name) else { return Err(self.missing(gguf_name)) };
        let dims = info.shape.dims();
        // candle's reader overflows on the first and reads an empty tensor through a misaligned
        // pointer on the second.
        let problem = match dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
            None => Some("whose element count overflows"),
            Some(0) => Some("which holds no elements"),
            Some(_) => None,
        };
        if let Some(problem) = problem {
            return Err(ModelError::BadFile {
                path: path.clone(),
                message: format!("tensor `{gguf_name}` has shape {dims:?}, {problem}"),
            });
        }
        let mut file = file.lock().expect("weight file lock is never poisoned: reads do not panic");
        let q = content.tensor(&mut *file, gguf_name, device).map_err(|e| ModelError::BadFile {
            path: path.clone(),
            message: format!("cannot read tensor `{gguf_name}`: {e}"),
        })?;
        if matches!(q.dtype(), GgmlDType::Q8_1 | GgmlDType::Q8K) {
            return Err(ModelError::UnsupportedQuantization {
                name: gguf_name.into(),
                dtype: format!("{:?}", q.dtype()),
            });
        }
        Ok(q)
    }

    /// A dense f32 tensor on `device` (norm weights, biases, small tables).
    pub(crate) fn dense(&self, gguf_name: &str, device: &Device) -> Result<Tensor> {
        match self {
            WeightStore::Gguf { .. } => Ok(self.qtensor(gguf_name, &Device::Cpu)?.dequantize(device)?),
            WeightStore::Safetensors { tensors, .. } => {
                let t = tensors.load(&hf_name(gguf_name), &Device::Cpu).map_err(|_| self.missing(gguf_name))?;
                Ok(t.to_dtype(DType::F32)?.to_device(device)?)
            }
            WeightStore::Random(r) => r.dense(gguf_name, device),
        }
    }

    /// A matrix for `x @ W^T` on `device`, with its bias if the file has one. `notes` collects
    /// load-time conversions worth logging. On the CPU, slow quantized types become Q8_0 on our
    /// kernel; on a GPU, quantized matrices stay as stored (candle's GPU kernels) and dense ones
    /// keep their type.
    pub(crate) fn linear(&self, gguf_prefix: &str, device: &Device, notes: &mut Vec<String>) -> Result<Linear> {
        let weight_name = format!("{gguf_prefix}.weight");
        let weight = match self {
            WeightStore::Gguf { dequantize: true, .. } => {
                Weight::Candle(QMatMul::Tensor(self.dense(&weight_name, device)?))
            }
            WeightStore::Gguf { .. } if !device.is_cpu() => {
                let q = self.qtensor(&weight_name, device)?;
                match q.dtype() {
                    GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                        Weight::Dense(q.dequantize(device)?.to_dtype(stored_float_type(q.dtype()))?)
                    }
                    _ => Weight::Candle(QMatMul::from_qtensor(q)?),
                }
            }
            WeightStore::Gguf { .. } => {
                let q = fast_cpu_type(self.qtensor(&weight_name, device)?, notes)?;
                match q8_0_matrix(&q, notes)? {
                    Some(m) => Weight::Q8_0(m),
                    None => Weight::Candle(QMatMul::from_qtensor(q)?),
                }
            }
            WeightStore::Safetensors { tensors, .. } if !device.is_cpu() => {
                let t = tensors.load(&hf_name(&weight_name), device).map_err(|_| self.missing(&weight_name))?;
                Weight::Dense(if t.dtype() == DType::F32 { t } else { t.to_dtype(DType::BF16)? })
            }
            WeightStore::Safetensors { .. } => Weight::Candle(QMatMul::Tensor(self.dense(&weight_name, device)?)),
            WeightStore::Random(r) => r.weight(&weight_name, device)?,
        };
        let bias_name = format!("{gguf_prefix}.bias");
        let bias = if self.contains(&bias_name) { Some(self.dense(&bias_name, device)?) } else { None };
        Ok(Linear { weight, bias })
    }

    pub(crate) fn embedding(&self, device: &Device, notes: &mut Vec<String>) -> Result<(Embedding, Option<Linear>)> {
        let candle_head = |dense: Tensor| Linear::new(Weight::Candle(QMatMul::Tensor(dense)));
        if let WeightStore::Random(r) = self {
            return r.embedding(device);
        }
        if !device.is_cpu() {
            return self.device_embedding(device);
        }
        match self {
            WeightStore::Gguf { dequantize, .. } => {
                let q = self.qtensor("token_embd.weight", device)?;
                let tied = !self.contains("output.weight");
                Ok(match q.dtype() {
                    GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                        let dense = q.dequantize(device)?;
                        let head = tied.then(|| candle_head(dense.clone()));
                        (Embedding::Dense(dense), head)
                    }
                    _ if tied && *dequantize => {
                        let dense = q.dequantize(device)?;
                        (Embedding::Quantized(Arc::new(q)), Some(candle_head(dense)))
                    }
                    _ if tied => {
                        // A tied output head multiplies by the embedding every step, so it gets a
                        // fast type; lookups share that one copy rather than keeping a second.
                        let fast = fast_cpu_type(q, notes)?;
                        match q8_0_matrix(&fast, notes)? {
                            Some(m) => (Embedding::Q8_0(Arc::clone(&m)), Some(Linear::new(Weight::Q8_0(m)))),
                            None => {
                                let fast = Arc::new(fast);
                                let head = Linear::new(Weight::Candle(QMatMul::from_arc(Arc::clone(&fast))?));
                                (Embedding::Quantized(fast), Some(head))
                            }
                        }
                    }
                    _ => (Embedding::Quantized(Arc::new(q)), None),
                })
            }
            WeightStore::Safetensors { .. } => {
                let w = self.dense("token_embd.weight", device)?;
                let tied_head = if self.contains("output.weight") { None } else { Some(candle_head(w.clone())) };
                Ok((Embedding::Dense(w), tied_head))
            }
            WeightStore::Random(_) => unreachable!("handled above"),
        }
    }

    /// The embedding on a GPU: quantized rows stay quantized (lookups dequantize the rows they
    /// need) and a tied head multiplies by that same copy; dense ones keep a 16-bit type.
    fn device_embedding(&self, device: &Device) -> Result<(Embedding, Option<Linear>)> {
        let tied = !self.contains("output.weight");
        let dense_pair = |w: Tensor| {
            let head = tied.then(|| Linear::new(Weight::Dense(w.clone())));
            (Embedding::Dense(w), head)
        };
        match self {
            WeightStore::Gguf { .. } => {
                let q = self.qtensor("token_embd.weight", device)?;
                Ok(match q.dtype() {
                    GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                        dense_pair(q.dequantize(device)?.to_dtype(stored_float_type(q.dtype()))?)
                    }
                    _ => {
                        let q = Arc::new(q);
                        let head = if tied {
                            Some(Linear::new(Weight::Candle(QMatMul::from_arc(Arc::clone(&q))?)))
                        } else {
                            None
                        };
                        (Embedding::Quantized(q), head)
                    }
                })
            }
            WeightStore::Safetensors { tensors, .. } => {
                let name = hf_name("token_embd.weight");
                let t = tensors.load(&name, device).map_err(|_| self.missing("token_embd.weight"))?;
                Ok(dense_pair(if t.dtype() == DType::F32 { t } else { t.to_dtype(DType::BF16)? }))
            }
            WeightStore::Random(r) => r.embedding(device),
        }
    }
}

/// The candle type of a float GGUF tensor (kept as stored on a GPU).
fn stored_float_type(dtype: GgmlDType) -> DType {
    match dtype {
        GgmlDType::BF16 => DType::BF16,
        GgmlDType::F16 => DType::F16,
        _ => DType::F32,
    }
}

/// Converts a quantized tensor whose candle CPU kernel is slow into Q8_0, which has a fast one
/// (ours): exactly for Q4_0 and Q5_0, by requantizing for Q4_1 and Q5_1.
fn fast_cpu_type(q: QTensor, notes: &mut Vec<String>) -> Result<QTensor> {
    if let Some(exact) = exact_q8_0(&q)? {
        let note = format!("stored {:?} weights as Q8_0 at load, same values (faster CPU matmul)", q.dtype());
        if !notes.contains(&note) {
            notes.push(note);
        }
        return Ok(exact);
    }
    let inner = q.shape().dims().last().copied().unwrap_or(0);
    if SLOW_CPU_TYPES.contains(&q.dtype()) && inner.is_multiple_of(32) {
        let note = format!("converted {:?} weights to Q8_0 at load (faster CPU matmul)", q.dtype());
        if !notes.contains(&note) {
            notes.push(note);
        }
        let dense = q.dequantize(&Device::Cpu)?;
        return Ok(QTensor::quantize(&dense, GgmlDType::Q8_0)?);
    }
    Ok(q)
}

/// The Hugging Face name of a tensor given by its llama.cpp (GGUF) name.
pub(crate) fn hf_name(gguf_name: &str) -> String {
    let (stem, suffix) = gguf_name.rsplit_once('.').unwrap_or((gguf_name, ""));
    let mapped = match stem {
        "token_embd" => "model.embed_tokens".to_owned(),
        "output_norm" => "model.norm".to_owned(),
        "output" => "lm_head".to_owned(),
        _ => match stem.strip_prefix("blk.").and_then(|rest| rest.split_once('.')) {
            Some((layer, part)) => {
                let hf_part = match part {
                    "attn_norm" => "input_layernorm",
                    "ffn_norm" => "post_attention_layernorm",
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_output" => "self_attn.o_proj",
                    "attn_q_norm" => "self_attn.q_norm",
                    "attn_k_norm" => "self_attn.k_norm",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_down" => "mlp.down_proj",
                    other => other,
                };
                format!("model.layers.{layer}.{hf_part}")
            }
            None => stem.to_owned(),
        },
    };
    if suffix.is_empty() { mapped } else { format!("{mapped}.{suffix}") }
}

/// Checks the shapes of the loaded config against the embedding, so that a wrong config fails
/// at load with a message rather than deep inside a matmul.
pub(crate) fn check_embedding_shape(config: &ModelConfig, embedding: &Embedding) -> Result<()> {
    let dims = match embedding {
        Embedding::Dense(t) => t.dims().to_vec(),
        Embedding::Quantized(q) => q.shape().dims().to_vec(),
        Embedding::Q8_0(m) => vec![m.n_out(), m.k()],
    };
    if dims != [config.vocab_size, config.hidden_size] {
        return Err(ModelError::Config(format!(
            "embedding is {dims:?} but the config says vocab {} x hidden {}",
            config.vocab_size, config.hidden_size
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// For each type requantized at load, the Q8_0 copy's distance from the file's values is a
    /// small fraction of the file's own distance from the weights it was made from.
    #[test]
    fn requantizing_to_q8_0_adds_little_error() {
        let (n, k) = (16, 512);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.61).sin() * (0.5 + (i % 29) as f32 / 29.0)).collect();
        let dense = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu).unwrap();
        let values = |q: &QTensor| q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let dist = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
        for dtype in SLOW_CPU_TYPES {
            let file = QTensor::quantize(&dense, dtype).unwrap();
            let converted = fast_cpu_type(QTensor::quantize(&dense, dtype).unwrap(), &mut Vec::new()).unwrap();
            assert_eq!(converted.dtype(), GgmlDType::Q8_0);
            let (file_values, q8_values) = (values(&file), values(&converted));
            let own = dist(&file_values, &w);
            let added = dist(&q8_values, &file_values);
            assert!(added <= 0.25 * own, "{dtype:?}: requantizing adds {added:e}, the file's own error is {own:e}");
        }
    }

    /// A `[n, k]` matrix of `dtype` quantized from a smooth pattern.
    fn quantized(n: usize, k: usize, dtype: GgmlDType, seed: f32) -> Linear {
        let w: Vec<f32> = (0..n * k).map(|i| ((i as f32 * 0.37 + seed).sin()) * 0.1).collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, dtype).unwrap();
        Linear::new(Weight::Candle(QMatMul::from_qtensor(q).unwrap()))
    }

    /// `forward_shared` gives each layer exactly its own `forward`, whichever matrices share
    /// candle's fused path (same quantized type, shapes its x86 kernels take), with biases,
    /// mixed types and one row (decode) or many (prefill).
    #[test]
    fn shared_input_projections_equal_separate_ones() {
        let k = 512;
        let mut q = quantized(256, k, GgmlDType::Q4K, 0.0);
        q.bias =
            Some(Tensor::from_vec((0..256).map(|i| i as f32 * 0.01).collect::<Vec<_>>(), 256, &Device::Cpu).unwrap());
        let kproj = quantized(128, k, GgmlDType::Q4K, 1.0);
        let v = quantized(128, k, GgmlDType::Q6K, 2.0);
        let dense = Linear::new(Weight::Candle(QMatMul::Tensor(
            Tensor::from_vec((0..64 * k).map(|i| (i as f32 * 0.11).cos()).collect::<Vec<_>>(), (64, k), &Device::Cpu)
                .unwrap(),
        )));
        let layers = [&q, &kproj, &v, &dense];
        for rows in [1, 7, 40] {
            let x: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 0.73).sin()).collect();
            let x = Tensor::from_vec(x, (rows, k), &Device::Cpu).unwrap();
            let shared = Linear::forward_shared(&layers, &x).unwrap();
            assert_eq!(shared.len(), layers.len());
            for (i, (layer, got)) in layers.iter().zip(&shared).enumerate() {
                let want = layer.forward(&x).unwrap();
                assert_eq!(got.dims(), want.dims(), "layer {i}, {rows} rows");
                let (got, want) = (got.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
                assert_eq!(got, want, "layer {i}, {rows} rows");
            }
        }
    }
}
