//! The `*.safetensors` files of a model directory mapped for reading float matrices in place:
//! each tensor's type, shape and bytes in the map, from the file's own header (an 8-byte
//! little-endian length, then JSON naming every tensor's `dtype`, `shape` and `data_offsets`
//! from the end of the header). candle's reader copies a tensor out of its map when loaded;
//! these bytes stay page cache, as llama.cpp's weights do.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use radix_kernels::dense::FloatType;
use radix_kernels::quant::WeightBytes;
use serde::Deserialize;

use crate::error::{ModelError, Result};

/// One tensor of a mapped file.
pub(crate) struct MappedTensor {
    /// `None` for types the dense kernel does not read (integers, f64, f8).
    pub(crate) dtype: Option<FloatType>,
    pub(crate) shape: Vec<usize>,
    pub(crate) bytes: WeightBytes,
}

/// Every tensor of the directory's files, by stored name.
pub(crate) struct MappedTensors {
    tensors: HashMap<String, MappedTensor>,
}

/// A tensor's entry in a header.
#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

impl MappedTensors {
    /// Maps `files` and reads their headers.
    pub(crate) fn open(files: &[PathBuf]) -> Result<Self> {
        let mut tensors = HashMap::new();
        for path in files {
            for (name, tensor) in map_file(path)? {
                tensors.insert(name, tensor);
            }
        }
        Ok(MappedTensors { tensors })
    }

    /// The tensor stored under `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&MappedTensor> {
        self.tensors.get(name)
    }
}

fn map_file(path: &Path) -> Result<Vec<(String, MappedTensor)>> {
    let bad = |message: String| ModelError::BadFile { path: path.to_owned(), message };
    let file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    // SAFETY: mapped read-only; a model file changed underneath a running server is outside
    // what we can guard against, as for every mmap-based loader (candle maps it too).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(format!("cannot map: {e}")))?;
    let header_len = map
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad("shorter than a safetensors header".into()))?;
    let data_start = 8usize.checked_add(header_len).filter(|&end| end <= map.len());
    let data_start = data_start.ok_or_else(|| bad(format!("a header of {header_len} bytes runs past the file")))?;
    let header: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&map[8..data_start]).map_err(|e| bad(format!("bad safetensors header: {e}")))?;
    let all = WeightBytes::new(Arc::new(map));
    let mut out = Vec::with_capacity(header.len());
    for (name, value) in header {
        if name == "__metadata__" {
            continue;
        }
        let entry: HeaderEntry =
            serde_json::from_value(value).map_err(|e| bad(format!("bad header entry `{name}`: {e}")))?;
        let [start, end] = entry.data_offsets;
        let range = data_start.checked_add(start).zip(data_start.checked_add(end));
        let bytes = range
            .and_then(|(s, e)| all.slice(s..e).ok())
            .ok_or_else(|| bad(format!("tensor `{name}` runs past the end of the file")))?;
        let dtype = match entry.dtype.as_str() {
            "F32" => Some(FloatType::F32),
            "F16" => Some(FloatType::F16),
            "BF16" => Some(FloatType::BF16),
            _ => None,
        };
        out.push((name, MappedTensor { dtype, shape: entry.shape, bytes }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use candle_core::safetensors::MmapedSafetensors;
    use candle_core::{DType, Device};

    use super::*;

    /// Every tensor of a fixture's file, read in place, holds the bytes candle's reader gives,
    /// and its matrices are aligned for the dense kernel to read them there.
    #[test]
    fn tensors_in_place_are_the_bytes_candle_reads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/qwen3/model.safetensors");
        let mapped = MappedTensors::open(std::slice::from_ref(&path)).unwrap();
        // SAFETY: a fixture nobody writes while the test runs.
        let candle = unsafe { MmapedSafetensors::new(&path) }.unwrap();
        let mut seen = 0;
        for (name, _) in candle.tensors() {
            let want = candle.load(&name, &Device::Cpu).unwrap();
            let got = mapped.get(&name).unwrap_or_else(|| panic!("`{name}` is mapped"));
            assert_eq!(got.shape, want.dims(), "{name}");
            assert_eq!(got.dtype, (want.dtype() == DType::F32).then_some(FloatType::F32), "{name}");
            let values: Vec<u8> =
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(got.bytes.as_slice(), values.as_slice(), "{name}");
            // The writer pads the header so that values are aligned: matrices are read in place.
            if let &[n_out, k] = got.shape.as_slice() {
                let weights = radix_kernels::dense::DenseWeights::Mapped(FloatType::F32, got.bytes.clone());
                assert!(radix_kernels::dense::DenseMatrix::new(n_out, k, weights).is_ok(), "{name} in place");
            }
            seen += 1;
        }
        assert!(seen > 10, "the fixture has its tensors");
    }

    #[test]
    fn a_truncated_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("radix-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        std::fs::write(&path, 100u64.to_le_bytes()).unwrap();
        let err = MappedTensors::open(std::slice::from_ref(&path)).err().expect("an error").to_string();
        assert!(err.contains("model.safetensors") && err.contains("header"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
