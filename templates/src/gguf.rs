//! A minimal reader of GGUF metadata: just what a chat template needs.
//!
//! The templates crate reads `tokenizer.chat_template` and the special tokens from a `.gguf` file
//! without depending on a tensor library; the model loader reads the same file with candle.
//! Only the header and the key/value section are read, never the tensor data.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::TemplateError;

/// A metadata value of a GGUF file, reduced to what templates need.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any integer type.
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of strings (token lists).
    StringArray(Vec<String>),
    /// An array of any integer type (token types), widened to i64.
    IntArray(Vec<i64>),
    /// Any other array (floats, nested arrays), skipped: only its length is kept.
    OtherArray(u64),
}

/// The key/value metadata of a GGUF file.
pub type GgufMetadata = BTreeMap<String, GgufValue>;

const MAGIC: &[u8; 4] = b"GGUF";
// Upper bounds that keep a corrupt or hostile file from making us allocate unbounded memory.
const MAX_STRING: u64 = 64 << 20;
const MAX_KEYS: u64 = 1 << 20;
const MAX_INT_ARRAY_BYTES: u64 = 256 << 20;

/// Reads all metadata key/value pairs of the GGUF file at `path`.
pub fn read_gguf_metadata(path: &Path) -> Result<GgufMetadata, TemplateError> {
    let file = std::fs::File::open(path).map_err(|e| TemplateError::io(path, e))?;
    let mut reader = GgufReader { inner: BufReader::new(file), path };
    reader.read_metadata()
}

struct GgufReader<'p, R> {
    inner: R,
    path: &'p Path,
}

impl<R: Read> GgufReader<'_, R> {
    fn bad(&self, what: impl Into<String>) -> TemplateError {
        TemplateError::BadSource { path: self.path.to_owned(), message: what.into() }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], TemplateError> {
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf).map_err(|e| self.bad(format!("truncated GGUF file: {e}")))?;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32, TemplateError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, TemplateError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn string(&mut self) -> Result<String, TemplateError> {
        let len = self.u64()?;
        if len > MAX_STRING {
            return Err(self.bad(format!("GGUF string of {len} bytes is implausibly long")));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner.read_exact(&mut buf).map_err(|e| self.bad(format!("truncated GGUF string: {e}")))?;
        String::from_utf8(buf).map_err(|_| self.bad("GGUF string is not UTF-8"))
    }

    fn read_metadata(&mut self) -> Result<GgufMetadata, TemplateError> {
        if &self.bytes::<4>()? != MAGIC {
            return Err(self.bad("not a GGUF file (bad magic)"));
        }
        let version = self.u32()?;
        if !(2..=3).contains(&version) {
            return Err(self.bad(format!("unsupported GGUF version {version} (2 and 3 are supported)")));
        }
        let _tensor_count = self.u64()?;
        let kv_count = self.u64()?;
        if kv_count > MAX_KEYS {
            return Err(self.bad(format!("{kv_count} metadata keys is implausibly many")));
        }
        let mut metadata = GgufMetadata::new();
        for _ in 0..kv_count {
            let key = self.string()?;
            let value_type = self.u32()?;
            let value = self.value(value_type)?;
            metadata.insert(key, value);
        }
        Ok(metadata)
    }

    fn value(&mut self, value_type: u32) -> Result<GgufValue, TemplateError> {
        Ok(match value_type {
            0 => GgufValue::Int(self.bytes::<1>()?[0] as i64),
            1 => GgufValue::Int(self.bytes::<1>()?[0] as i8 as i64),
            2 => GgufValue::Int(u16::from_le_bytes(self.bytes()?) as i64),
            3 => GgufValue::Int(i16::from_le_bytes(self.bytes()?) as i64),
            4 => GgufValue::Int(self.u32()? as i64),
            5 => GgufValue::Int(i32::from_le_bytes(self.bytes()?) as i64),
            6 => GgufValue::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => GgufValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                let item_type = self.u32()?;
                let len = self.u64()?;
                if item_type == 8 {
                    if len > MAX_STRING {
                        return Err(self.bad(format!("GGUF array of {len} strings is implausibly long")));
                    }
                    let mut items = Vec::with_capacity(len.min(1 << 20) as usize);
                    for _ in 0..len {
                        items.push(self.string()?);
                    }
                    GgufValue::StringArray(items)
                } else if is_integer(item_type) {
                    let size = scalar_size(item_type).unwrap_or(8);
                    if len.checked_mul(size).is_none_or(|bytes| bytes > MAX_INT_ARRAY_BYTES) {
                        return Err(self.bad(format!("GGUF array of {len} integers is implausibly long")));
                    }
                    let mut items = Vec::with_capacity(len.min(1 << 20) as usize);
                    for _ in 0..len {
                        match self.value(item_type)? {
                            GgufValue::Int(v) => items.push(v),
                            other => return Err(self.bad(format!("GGUF integer array holds {other:?}"))),
                        }
                    }
                    GgufValue::IntArray(items)
                } else {
                    let size = scalar_size(item_type)
                        .ok_or_else(|| self.bad(format!("unsupported GGUF array item type {item_type}")))?;
                    let skip = len.checked_mul(size).ok_or_else(|| self.bad("GGUF array size overflows"))?;
                    let copied = std::io::copy(&mut (&mut self.inner).take(skip), &mut std::io::sink())
                        .map_err(|e| self.bad(format!("truncated GGUF array: {e}")))?;
                    if copied != skip {
                        return Err(self.bad("truncated GGUF array"));
                    }
                    GgufValue::OtherArray(len)
                }
            }
            10 => GgufValue::Int(self.u64()? as i64),
            11 => GgufValue::Int(i64::from_le_bytes(self.bytes()?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.bytes()?)),
            other => return Err(self.bad(format!("unknown GGUF value type {other}"))),
        })
    }
}

fn is_integer(value_type: u32) -> bool {
    matches!(value_type, 0..=5 | 10 | 11)
}

fn scalar_size(value_type: u32) -> Option<u64> {
    Some(match value_type {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}
