//! A Hugging Face model directory's `*.safetensors` files, memory-mapped, under transformers'
//! tensor names. Matrices are dense: on the CPU in their stored type on our batch-invariant
//! kernel, read in place from the map (`mapped`; copied only where a tensor's bytes are not
//! aligned to its type), and on a GPU kept in 16 bits (bf16) unless stored as f32.

mod mapped;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use radix_kernels::dense::{DenseMatrix, DenseWeights};

use super::{Embedded, Naming, Target, TensorName, WeightSource};
use crate::config::Architecture;
use crate::cpu_matmul::dense_matrix;
use crate::error::{ModelError, Result};
use crate::layers::Weight;
use mapped::MappedTensors;

/// The mapped files of one model directory.
pub(crate) struct SafetensorsSource {
    dir: PathBuf,
    tensors: MmapedSafetensors,
    /// The same files mapped again, for float matrices read in place on the CPU.
    mapped: MappedTensors,
    /// For the message of a missing tensor.
    arch: Architecture,
    /// Checkpoints of Qwen3.5 with its vision tower keep the language model under
    /// `model.language_model.` rather than `model.`.
    language_model_prefix: bool,
}

impl SafetensorsSource {
    /// Maps every `*.safetensors` file in `dir`.
    pub(crate) fn open(dir: &Path, arch: Architecture) -> Result<Self> {
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
        let mapped = MappedTensors::open(&files)?;
        let language_model_prefix = tensors.get("model.language_model.embed_tokens.weight").is_ok();
        Ok(SafetensorsSource { dir: dir.to_owned(), tensors, mapped, arch, language_model_prefix })
    }

    /// The name `name` is stored under.
    fn stored_name(&self, name: &TensorName) -> String {
        match name.hf().strip_prefix("model.") {
            Some(rest) if self.language_model_prefix => format!("model.language_model.{rest}"),
            _ => name.hf().to_owned(),
        }
    }

    /// The tensor as stored, on `device`.
    fn load(&self, name: &TensorName, device: &Device) -> Result<Tensor> {
        let stored = self.stored_name(name);
        self.tensors.load(&stored, device).map_err(|_| ModelError::MissingTensor {
            path: self.dir.clone(),
            name: stored.clone(),
            arch: self.arch.gguf_name().to_owned(),
        })
    }

    /// A matrix as stored, in host memory, checked to be `shape`.
    fn load_matrix(&self, name: &TensorName, shape: [usize; 2]) -> Result<Tensor> {
        let t = self.load(name, &Device::Cpu)?;
        if t.dims() != shape {
            return Err(ModelError::BadFile {
                path: self.dir.clone(),
                message: format!("tensor `{}` has shape {:?}, expected {shape:?}", self.stored_name(name), t.dims()),
            });
        }
        Ok(t)
    }

    /// A float matrix on the CPU, read in place from the map where its bytes allow (a 2-D f32,
    /// f16 or bf16 tensor aligned to its type), else copied out; `shape` checked when given.
    fn host_matrix(&self, name: &TensorName, shape: Option<[usize; 2]>) -> Result<Arc<DenseMatrix>> {
        if let Some(t) = self.mapped.get(&self.stored_name(name))
            && let (Some(dtype), &[n_out, k]) = (t.dtype, t.shape.as_slice())
            && shape.is_none_or(|s| s == [n_out, k])
            && let Ok(m) = DenseMatrix::new(n_out, k, DenseWeights::Mapped(dtype, t.bytes.clone()))
        {
            return Ok(Arc::new(m));
        }
        let t = match shape {
            Some(shape) => self.load_matrix(name, shape)?,
            None => self.load(name, &Device::Cpu)?,
        };
        dense_matrix(&t)
    }

    /// A matrix as a GPU keeps it: f32 if stored so, else bf16 (cuBLAS's fast type).
    fn device_matrix(&self, name: &TensorName, device: &Device) -> Result<Tensor> {
        let t = self.load(name, device)?;
        Ok(if t.dtype() == DType::F32 { t } else { t.to_dtype(DType::BF16)? })
    }
}

impl WeightSource for SafetensorsSource {
    fn naming(&self) -> Naming {
        Naming::Hf
    }

    fn contains(&self, name: &TensorName, _expected: bool) -> bool {
        self.tensors.get(&self.stored_name(name)).is_ok()
    }

    fn tensor(&self, name: &TensorName, _shape: &[usize], device: &Device) -> Result<Tensor> {
        Ok(self.load(name, &Device::Cpu)?.to_dtype(DType::F32)?.to_device(device)?)
    }

    fn matrix(&self, name: &TensorName, shape: [usize; 2], to: &mut Target) -> Result<Weight> {
        Ok(if to.device.is_cpu() {
            Weight::Float(self.host_matrix(name, Some(shape))?)
        } else {
            Weight::Dense(self.device_matrix(name, &to.device)?)
        })
    }

    /// The shape is checked by the caller against the config (`Embedding::check_shape`), whose
    /// message names the vocabulary.
    fn embedding(&self, name: &TensorName, _shape: [usize; 2], tied: bool, to: &mut Target) -> Result<Embedded> {
        Ok(if to.device.is_cpu() {
            Embedded::float(self.host_matrix(name, None)?, tied)
        } else {
            Embedded::dense(self.device_matrix(name, &to.device)?, tied, Weight::Dense)
        })
    }
}
