//! GGUF files as llama.cpp's converter lays them out. The header is read through candle's
//! reader; the file is memory-mapped, and on the CPU every quantized matrix of a type
//! radix-kernels multiplies is its blocks in the map: matmul weights repacked once into the
//! interleaved layout of the same size where that runs faster (`QuantMatrix::interleaving_wins`:
//! x86), the file's pages released as each is copied, so the weights are resident once; else,
//! and for untied embedding rows, read in place (page cache, as llama.cpp's weights are). Float tensors, quantized types without a kernel of ours and every tensor
//! bound for a GPU are read through candle. A corrupt file is an error naming the file rather
//! than a panic inside the reader.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::gguf_file::TensorInfo;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use radix_kernels::quant::{QuantMatrix, WeightBytes};

use super::{Embedded, Target, TensorName, WeightSource};
use crate::cpu_matmul::{dense_matrix, kernel_note, quant_type};
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, Linear, Weight};

/// An open GGUF file: its header, its mapping, and the file to read other tensors from.
pub(crate) struct GgufSource {
    path: PathBuf,
    content: gguf_file::Content,
    file: Mutex<File>,
    /// The whole file, mapped read-only: quantized matrices on the CPU borrow their blocks.
    map: WeightBytes,
    /// The same mapping, to release the pages of matrices that were repacked.
    mmap: Arc<Mmap>,
    /// Dequantize every matrix to f32 at load ([`crate::LoadOptions::dequantize_weights`]).
    dequantize: bool,
}

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
        // SAFETY: the file is mapped read-only; a model file changed underneath a running server
        // is outside what we can guard against, as for every mmap-based loader (llama.cpp's too).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(format!("cannot map: {e}")))?;
        let mmap = Arc::new(map);
        let map = WeightBytes::new(Arc::clone(&mmap) as Arc<dyn AsRef<[u8]> + Send + Sync>);
        Ok(GgufSource { path: path.to_owned(), content, file: Mutex::new(file), map, mmap, dequantize })
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

    /// A tensor's header entry, with a shape that holds elements.
    fn info(&self, name: &TensorName) -> Result<&TensorInfo> {
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
        Ok(info)
    }

    /// A tensor's blocks in the map, if it is a quantized `[rows, k]` (or `[experts, rows, k]`)
    /// matrix of a type our kernels multiply; `None` for other tensors.
    fn mapped(&self, name: &TensorName) -> Result<Option<(radix_kernels::quant::QuantType, Vec<usize>, WeightBytes)>> {
        let info = self.info(name)?;
        let Some(ty) = quant_type(info.ggml_dtype) else { return Ok(None) };
        let dims = info.shape.dims().to_vec();
        let k = *dims.last().expect("a shape with elements has dims");
        if !(2..=3).contains(&dims.len()) || !k.is_multiple_of(ty.block_values()) {
            return Ok(None);
        }
        let elements: usize = dims.iter().product();
        let bad = |m: String| ModelError::BadFile { path: self.path.clone(), message: m };
        let len = elements / ty.block_values() * ty.block_bytes();
        let start = usize::try_from(self.content.tensor_data_offset.saturating_add(info.offset)).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(len)
            .and_then(|end| self.map.slice(start..end).ok())
            .ok_or_else(|| bad(format!("tensor `{}` runs past the end of the file", name.gguf())))?;
        Ok(Some((ty, dims, bytes)))
    }

    /// A quantized matrix read in place, if [`mapped`](Self::mapped) finds one.
    fn quant_matrix(&self, name: &TensorName, to: &mut Target) -> Result<Option<QuantMatrix>> {
        let Some((ty, dims, bytes)) = self.mapped(name)? else { return Ok(None) };
        let &[n_out, k] = dims.as_slice() else { return Ok(None) };
        let m = QuantMatrix::new(ty, n_out, k, bytes).map_err(|e| ModelError::BadFile {
            path: self.path.clone(),
            message: format!("tensor `{}`: {e}", name.gguf()),
        })?;
        to.note(kernel_note());
        Ok(Some(m))
    }

    /// `m` (blocks in the map) as its matmuls run fastest: an interleaved copy where that wins,
    /// the map's pages it was read from then released; else `m` itself.
    fn for_matmul(&self, m: QuantMatrix) -> QuantMatrix {
        if !QuantMatrix::interleaving_wins() {
            return m;
        }
        // Released from the tensor's start each time, so that no page straddling two pieces
        // is left behind.
        let all = m.bytes();
        let release = |piece: &[u8]| {
            let end = piece.as_ptr() as usize + piece.len() - all.as_ptr() as usize;
            self.release(&all[..end]);
        };
        m.interleaved_releasing(&release)
    }

    /// Drops the pages of the map that lie wholly inside `bytes` (a range of it) from this
    /// process: a later read faults them in again from the file. Only a hint to save memory, so
    /// a failure is ignored.
    fn release(&self, bytes: &[u8]) {
        #[cfg(unix)]
        {
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
            let Some(start) = (bytes.as_ptr() as usize).checked_sub(self.mmap.as_ptr() as usize) else { return };
            let (first, end) = (start.next_multiple_of(page), (start + bytes.len()) / page * page);
            if end > first && end <= self.mmap.len() {
                // SAFETY: the map is read-only and file-backed, so dropping its pages loses
                // nothing: the next access reads them from the file again (the file changing
                // underneath is outside what any mmap loader guards against, see `open`).
                let _ =
                    unsafe { self.mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first) };
            }
        }
        #[cfg(not(unix))]
        let _ = bytes;
    }

    /// A tensor as stored, read into `device`'s memory.
    fn qtensor(&self, name: &TensorName, device: &Device) -> Result<QTensor> {
        let gguf_name = name.gguf();
        self.info(name)?;
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

    /// On the CPU, quantized matrices of our types are read in place; on a GPU, quantized
    /// matrices stay as stored (candle's GPU kernels) and float ones keep their type.
    fn matrix(&self, name: &TensorName, shape: [usize; 2], to: &mut Target) -> Result<Weight> {
        if self.dequantize {
            return float_weight(self.tensor(name, &shape, &to.device)?);
        }
        if to.device.is_cpu()
            && let Some(m) = self.quant_matrix(name, to)?
        {
            return Ok(Weight::Quant(Arc::new(self.for_matmul(m))));
        }
        let q = self.qtensor(name, &to.device)?;
        self.weight_of(q, to)
    }

    /// Splits llama.cpp's `[experts, out, in]` tensor into one matrix per expert: each expert's
    /// blocks are contiguous, so on the CPU each is its range of the map, and elsewhere a tensor
    /// of its own bytes, typed as stored.
    fn expert_matrices(
        &self,
        stacked: &TensorName,
        _each: &dyn Fn(usize) -> TensorName,
        experts: usize,
        shape: [usize; 2],
        to: &mut Target,
    ) -> Result<Vec<Weight>> {
        let bad = |m: String| ModelError::BadFile { path: self.path.clone(), message: m };
        let check = |dims: &[usize]| {
            if dims != [experts, shape[0], shape[1]] {
                return Err(bad(format!(
                    "expert tensor `{}` has shape {dims:?}, expected [{experts}, {}, {}]",
                    stacked.gguf(),
                    shape[0],
                    shape[1]
                )));
            }
            Ok(())
        };
        if to.device.is_cpu()
            && !self.dequantize
            && let Some((ty, dims, bytes)) = self.mapped(stacked)?
        {
            check(&dims)?;
            to.note(kernel_note());
            let per_expert = bytes.len() / experts;
            return (0..experts)
                .map(|e| {
                    let m = QuantMatrix::new(ty, dims[1], dims[2], bytes.slice(e * per_expert..(e + 1) * per_expert)?)
                        .map_err(|e| bad(format!("tensor `{}`: {e}", stacked.gguf())))?;
                    Ok(Weight::Quant(Arc::new(self.for_matmul(m))))
                })
                .collect();
        }
        let all = self.qtensor(stacked, &Device::Cpu)?;
        check(all.shape().dims())?;
        let dims = all.shape().dims().to_vec();
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

    /// Quantized rows stay quantized (lookups dequantize the rows they need) and a tied head
    /// multiplies by that same matrix: on the CPU the file's blocks in place, or, tied, the
    /// copy repacked as other matmul weights are; float ones keep their 16-bit type on a GPU.
    fn embedding(&self, name: &TensorName, _shape: [usize; 2], tied: bool, to: &mut Target) -> Result<Embedded> {
        if to.device.is_cpu()
            && !self.dequantize
            && let Some(m) = self.quant_matrix(name, to)?
        {
            // A tied head may be repacked; lookups then read that copy too, so the file's pages
            // are not kept beside it (a lookup through the map faults in its neighbours too:
            // 54 MiB of the Qwen3-0.6B shape's table resident after a 2048-token prompt).
            let m = Arc::new(if tied { self.for_matmul(m) } else { m });
            let tied_head = tied.then(|| Linear::new(Weight::Quant(Arc::clone(&m))));
            return Ok(Embedded { embedding: Embedding::Quant(m), tied_head });
        }
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
        if self.dequantize && tied {
            let dense = q.dequantize(device)?;
            return Ok(Embedded {
                embedding: Embedding::Quantized(Arc::new(q)),
                tied_head: Some(Linear::new(float_weight(dense)?)),
            });
        }
        to.note(candle_note(q.dtype()));
        Embedded::quantized(q, tied)
    }
}

impl GgufSource {
    /// A stored matrix in the form that runs fastest on the target device: on a GPU candle's
    /// quantized kernels or cuBLAS; on the CPU (types we have no kernel for) candle's.
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
        to.note(candle_note(q.dtype()));
        Ok(Weight::Candle(QMatMul::from_qtensor(q)?))
    }
}

/// The load note of a quantized type left to candle's CPU kernels.
fn candle_note(dtype: GgmlDType) -> String {
    format!("{dtype:?} weights run on candle's CPU kernels: radix-kernels has no kernel for the type")
}

/// A float matrix: on the CPU our dense kernel, in the type it comes in; elsewhere candle's.
fn float_weight(t: Tensor) -> Result<Weight> {
    if !t.device().is_cpu() {
        return Ok(Weight::Candle(QMatMul::Tensor(t)));
    }
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
