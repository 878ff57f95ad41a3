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
    /// The decoder's layers: a layer past them is a multi-token-prediction layer.
    decoder_layers: usize,
    /// Where the multi-token-prediction head is kept (`mtp.`, or `model.mtp.`).
    mtp_prefix: &'static str,
}

/// The multi-token-prediction head's own tensors as llama.cpp's converter renames them (the
/// layer's name after `model.layers.{decoder_layers}.`) and as transformers checkpoints keep them
/// (after `mtp.`).
const MTP_OWN_TENSORS: [(&str, &str); 4] = [
    ("eh_proj.", "fc."),
    ("enorm.", "pre_fc_norm_embedding."),
    ("hnorm.", "pre_fc_norm_hidden."),
    ("shared_head.norm.", "norm."),
];

impl SafetensorsSource {
    /// Maps every `*.safetensors` file in `dir`, of a model of `decoder_layers` layers.
    pub(crate) fn open(dir: &Path, arch: Architecture, decoder_layers: usize) -> Result<Self> {
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
        let mtp_prefix = if tensors.get("model.mtp.fc.weight").is_ok() { "model.mtp." } else { "mtp." };
        Ok(SafetensorsSource {
            dir: dir.to_owned(),
            tensors,
            mapped,
            arch,
            language_model_prefix,
            decoder_layers,
            mtp_prefix,
        })
    }

    /// The name `name` is stored under.
    fn stored_name(&self, name: &TensorName) -> String {
        if let Some(mtp) = self.mtp_name(name.hf()) {
            return mtp;
        }
        match name.hf().strip_prefix("model.") {
            Some(rest) if self.language_model_prefix => format!("model.language_model.{rest}"),
            _ => name.hf().to_owned(),
        }
    }

    /// Where a layer past the decoder's is kept: the layers ask for the multi-token-prediction
    /// head as llama.cpp's converter renames it (layer `decoder_layers + i`, its own tensors
    /// in [`MTP_OWN_TENSORS`]), transformers keeps it apart (`mtp.layers.{i}.`, `mtp.fc`, ...).
    fn mtp_name(&self, hf: &str) -> Option<String> {
        let (index, tensor) = hf.strip_prefix("model.layers.")?.split_once('.')?;
        let i = index.parse::<usize>().ok()?.checked_sub(self.decoder_layers)?;
        let prefix = self.mtp_prefix;
        Some(match MTP_OWN_TENSORS.iter().find(|(renamed, _)| tensor.starts_with(renamed)) {
            Some((renamed, kept)) if i == 0 => format!("{prefix}{kept}{}", &tensor[renamed.len()..]),
            _ => format!("{prefix}layers.{i}.{tensor}"),
        })
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
