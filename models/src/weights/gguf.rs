//! GGUF files as llama.cpp's converter lays them out, read through candle's reader: quantized
//! matrices stay quantized (on the CPU, slow types become Q8_0 on our int8 kernel), and a
//! corrupt file is an error naming the file rather than a panic inside the reader.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};

use super::{Embedded, Target, TensorName, WeightSource};
use crate::cpu_matmul::{dense_matrix, exact_q8_0, q8_0_matrix};
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, Linear, Weight};

/// An open GGUF file: its header, and the file to read tensors from as layers ask.
pub(crate) struct GgufSource {
    path: PathBuf,
    content: gguf_file::Content,
    file: Mutex<File>,
    /// Dequantize every matrix to f32 at load ([`crate::LoadOptions::dequantize_weights`]).
    dequantize: bool,
}

/// Quantization types whose CPU kernels in candle are scalar or untiled and which Q8_0 cannot
/// hold exactly (a per-block minimum); requantized to Q8_0 at load. Q5_K is here because
/// candle's kernel takes one activation row at a time: a Q5_K_M Qwen3-0.6B-shaped model
/// prefilled 140 tok/s (llama.cpp: 616) and decoded 48; as Q8_0, 412 and 53. Requantizing adds
/// 6-13% of the file's own quantization error (L2, `requantizing_to_q8_0_adds_little_error`),
/// under 1% more error in all, and costs memory (8.5 bits per weight instead of 4.5-6).
const SLOW_CPU_TYPES: [GgmlDType; 3] = [GgmlDType::Q4_1, GgmlDType::Q5_1, GgmlDType::Q5K];

impl GgufSource {
    /// Opens `path` and reads its header.
    pub(crate) fn open(path: &Path, dequantize: bool) -> Result<Self> {
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
        Ok(GgufSource { path: path.to_owned(), content, file: Mutex::new(file), dequantize })
    }

    /// The header, whose metadata gives the model's config.
    pub(crate) fn content(&self) -> &gguf_file::Content {
        &self.content
    }

    fn missing(&self, name: &TensorName) -> ModelError {
        let arch = self
            .content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_default();
        ModelError::MissingTensor { path: self.path.clone(), name: name.gguf().to_owned(), arch }
    }

    /// A tensor as stored, read into `device`'s memory.
    fn qtensor(&self, name: &TensorName, device: &Device) -> Result<QTensor> {
        let gguf_name = name.gguf();
        let Some(info) = self.content.tensor_infos.get(gguf_name) else { return Err(self.missing(name)) };
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
                path: self.path.clone(),
                message: format!("tensor `{gguf_name}` has shape {dims:?}, {problem}"),
            });
        }
        let mut file = self.file.lock().expect("weight file lock is never poisoned: reads do not panic");
        let q = self.content.tensor(&mut *file, gguf_name, device).map_err(|e| ModelError::BadFile {
            path: self.path.clone(),
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
}

impl WeightSource for GgufSource {
    fn contains(&self, name: &TensorName, _expected: bool) -> bool {
        self.content.tensor_infos.contains_key(name.gguf())
    }

    fn tensor(&self, name: &TensorName, _shape: &[usize], device: &Device) -> Result<Tensor> {
        Ok(self.qtensor(name, &Device::Cpu)?.dequantize(device)?)
    }

    /// On the CPU, slow quantized types become Q8_0 on our kernel; on a GPU, quantized matrices
    /// stay as stored (candle's GPU kernels) and float ones keep their type.
    fn matrix(&self, name: &TensorName, shape: [usize; 2], to: &mut Target) -> Result<Weight> {
        if self.dequantize {
            return float_weight(self.tensor(name, &shape, &to.device)?);
        }
        let q = self.qtensor(name, &to.device)?;
        self.weight_of(q, to)
    }

    /// Splits llama.cpp's `[experts, out, in]` tensor into one matrix per expert: each expert's
    /// blocks are contiguous, so each becomes a tensor of its own bytes, typed as stored.
    fn expert_matrices(
        &self,
        stacked: &TensorName,
        _each: &dyn Fn(usize) -> TensorName,
        experts: usize,
        shape: [usize; 2],
        to: &mut Target,
    ) -> Result<Vec<Weight>> {
        let all = self.qtensor(stacked, &Device::Cpu)?;
        let bad = |m: String| ModelError::BadFile { path: self.path.clone(), message: m };
        let dims = all.shape().dims().to_vec();
        if dims != [experts, shape[0], shape[1]] {
            return Err(bad(format!(
                "expert tensor `{}` has shape {dims:?}, expected [{experts}, {}, {}]",
                stacked.gguf(),
                shape[0],
                shape[1]
            )));
        }
        let bytes = all.data()?;
        let per_expert = bytes.len() / experts;
        let mut out = Vec::with_capacity(experts);
        for e in 0..experts {
            let data = std::borrow::Cow::Borrowed(&bytes[e * per_expert..(e + 1) * per_expert]);
            let storage = candle_core::quantized::QStorage::from_data(data, &to.device, all.dtype())?;
            let q = QTensor::new(storage, (dims[1], dims[2]))?;
            out.push(if self.dequantize { float_weight(q.dequantize(&to.device)?)? } else { self.weight_of(q, to)? });
        }
        Ok(out)
    }

    /// On a GPU, quantized rows stay quantized (lookups dequantize the rows they need) and a tied
    /// head multiplies by that same copy; float ones keep their 16-bit type.
    fn embedding(&self, name: &TensorName, _shape: [usize; 2], tied: bool, to: &mut Target) -> Result<Embedded> {
        let device = &to.device;
        let q = self.qtensor(name, device)?;
        let float = matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        if !device.is_cpu() {
            if float {
                let w = q.dequantize(device)?.to_dtype(stored_float_type(q.dtype()))?;
                return Ok(Embedded::dense(w, tied, Weight::Dense));
            }
            return Embedded::quantized(q, tied);
        }
        if float {
            let stored = q.dequantize(device)?.to_dtype(stored_float_type(q.dtype()))?;
            return Ok(Embedded::float(dense_matrix(&stored)?, tied));
        }
        if !tied {
            return Ok(Embedded { embedding: Embedding::Quantized(Arc::new(q)), tied_head: None });
        }
        if self.dequantize {
            let dense = q.dequantize(device)?;
            return Ok(Embedded {
                embedding: Embedding::Quantized(Arc::new(q)),
                tied_head: Some(Linear::new(float_weight(dense)?)),
            });
        }
        // A tied output head multiplies by the embedding every step, so it gets a fast type;
        // lookups share that one copy rather than keeping a second.
        let fast = fast_cpu_type(q, to)?;
        Ok(match q8_0_matrix(&fast, &mut to.notes)? {
            Some(m) => {
                Embedded { embedding: Embedding::Q8_0(Arc::clone(&m)), tied_head: Some(Linear::new(Weight::Q8_0(m))) }
            }
            None => Embedded::quantized(fast, true)?,
        })
    }
}

impl GgufSource {
    /// A stored matrix in the form that runs fastest on the target device.
    fn weight_of(&self, q: QTensor, to: &mut Target) -> Result<Weight> {
        if !to.device.is_cpu() {
            return Ok(match q.dtype() {
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                    Weight::Dense(q.dequantize(&to.device)?.to_dtype(stored_float_type(q.dtype()))?)
                }
                _ => Weight::Candle(QMatMul::from_qtensor(q)?),
            });
        }
        if matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
            return float_weight(q.dequantize(&Device::Cpu)?.to_dtype(stored_float_type(q.dtype()))?);
        }
        let q = fast_cpu_type(q, to)?;
        Ok(match q8_0_matrix(&q, &mut to.notes)? {
            Some(m) => Weight::Q8_0(m),
            None => Weight::Candle(QMatMul::from_qtensor(q)?),
        })
    }
}

/// A float matrix on the CPU: our dense kernel, in the type it comes in.
fn float_weight(t: Tensor) -> Result<Weight> {
    Ok(Weight::Float(dense_matrix(&t)?))
}

/// The candle type of a float GGUF tensor (kept as stored).
fn stored_float_type(dtype: GgmlDType) -> DType {
    match dtype {
        GgmlDType::BF16 => DType::BF16,
        GgmlDType::F16 => DType::F16,
        _ => DType::F32,
    }
}

/// Converts a quantized tensor whose candle CPU kernel is slow into Q8_0, which has a fast one
/// (ours): exactly for Q4_0 and Q5_0, by requantizing for Q4_1 and Q5_1.
fn fast_cpu_type(q: QTensor, to: &mut Target) -> Result<QTensor> {
    if let Some(exact) = exact_q8_0(&q)? {
        to.note(format!("stored {:?} weights as Q8_0 at load, same values (faster CPU matmul)", q.dtype()));
        return Ok(exact);
    }
    let inner = q.shape().dims().last().copied().unwrap_or(0);
    if SLOW_CPU_TYPES.contains(&q.dtype()) && inner.is_multiple_of(32) {
        to.note(format!("converted {:?} weights to Q8_0 at load (faster CPU matmul)", q.dtype()));
        let dense = q.dequantize(&Device::Cpu)?;
        return Ok(QTensor::quantize(&dense, GgmlDType::Q8_0)?);
    }
    Ok(q)
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
        let mut target = Target { device: Device::Cpu, notes: Vec::new() };
        for dtype in SLOW_CPU_TYPES {
            let file = QTensor::quantize(&dense, dtype).unwrap();
            let converted = fast_cpu_type(QTensor::quantize(&dense, dtype).unwrap(), &mut target).unwrap();
            assert_eq!(converted.dtype(), GgmlDType::Q8_0);
            let (file_values, q8_values) = (values(&file), values(&converted));
            let own = dist(&file_values, &w);
            let added = dist(&q8_values, &file_values);
            assert!(added <= 0.25 * own, "{dtype:?}: requantizing adds {added:e}, the file's own error is {own:e}");
        }
    }
}
