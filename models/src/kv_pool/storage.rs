//! One layer's K or V storage and its element types: host vectors of a float or block type,
//! or one candle tensor on a device (values, or a block type's bytes). Offsets and ranges are in
//! values throughout; a block type's storage divides them by its block (slots are always whole
//! blocks: `PagedLayout` rows are checked against the type when the pool is made).

use candle_core::{DType, Device, Tensor};
use half::vec::HalfBitsVecExt;
use half::{bf16, f16};
use radix_kernels::{KV_BLOCK, KvElement, KvQ4_0, KvQ8_0};

use crate::error::{ModelError, Result};

/// Element type of stored K or V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDType {
    /// 4 bytes per value.
    F32,
    /// 2 bytes per value.
    F16,
    /// 2 bytes per value.
    BF16,
    /// GGUF's `q8_0`: blocks of 32 values, an f16 scale and 32 int8 (8.5 bits a value).
    Q8_0,
    /// GGUF's `q4_0`: blocks of 32 values, an f16 scale and 32 nibbles (4.5 bits a value).
    Q4_0,
}

impl KvDType {
    /// Every type, in the order flags list them.
    pub const ALL: [KvDType; 5] = [KvDType::F32, KvDType::F16, KvDType::BF16, KvDType::Q8_0, KvDType::Q4_0];

    /// The name llama.cpp's `--cache-type-k/-v` use.
    pub fn name(self) -> &'static str {
        match self {
            KvDType::F32 => "f32",
            KvDType::F16 => "f16",
            KvDType::BF16 => "bf16",
            KvDType::Q8_0 => "q8_0",
            KvDType::Q4_0 => "q4_0",
        }
    }

    /// The type named `name` (as [`name`](Self::name) writes it), or `None`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Values one stored unit holds (1, or a block of 32).
    pub fn values_per_unit(self) -> usize {
        if self.is_quantized() { KV_BLOCK } else { 1 }
    }

    /// Bytes one stored unit takes.
    pub fn unit_bytes(self) -> usize {
        match self {
            KvDType::F32 => 4,
            KvDType::F16 | KvDType::BF16 => 2,
            KvDType::Q8_0 => std::mem::size_of::<KvQ8_0>(),
            KvDType::Q4_0 => std::mem::size_of::<KvQ4_0>(),
        }
    }

    /// Bytes `values` values take (`values` a whole number of units).
    pub fn bytes(self, values: usize) -> usize {
        values / self.values_per_unit() * self.unit_bytes()
    }

    /// Whether each head is stored rotated into the Hadamard basis ([`KvElement::ROTATED`]):
    /// a page of this type holds `H k`, not `k`.
    pub fn is_rotated(self) -> bool {
        match self {
            KvDType::F32 => <f32 as KvElement>::ROTATED,
            KvDType::F16 => <f16 as KvElement>::ROTATED,
            KvDType::BF16 => <bf16 as KvElement>::ROTATED,
            KvDType::Q8_0 => KvQ8_0::ROTATED,
            KvDType::Q4_0 => KvQ4_0::ROTATED,
        }
    }

    /// Whether values are stored in quantized blocks.
    pub fn is_quantized(self) -> bool {
        matches!(self, KvDType::Q8_0 | KvDType::Q4_0)
    }

    /// The candle element type of a pool of values on a device; `None` for the block types,
    /// which a device holds as bytes (`u8`).
    pub fn candle(self) -> Option<DType> {
        match self {
            KvDType::F32 => Some(DType::F32),
            KvDType::F16 => Some(DType::F16),
            KvDType::BF16 => Some(DType::BF16),
            KvDType::Q8_0 | KvDType::Q4_0 => None,
        }
    }
}

impl std::fmt::Display for KvDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One layer's K or V storage.
#[derive(Debug, Clone)]
pub(crate) enum KvStorage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Q8_0(Vec<KvQ8_0>),
    Q4_0(Vec<KvQ4_0>),
    /// `[layer_len]` elements on a device.
    Tensor(Tensor),
    /// A block type's bytes on a device, blocks as [`BlockBytes`] lays them out (GGUF's).
    Blocks(KvDType, Tensor),
}

/// A layer's K or V on a device, as the tensor path's attention takes it.
#[derive(Clone, Copy)]
pub(crate) enum DeviceKv<'a> {
    /// f32, f16 or bf16 values.
    Values(&'a Tensor),
    /// The bytes of a block type's blocks (only CUDA reads them).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Blocks(KvDType, &'a Tensor),
}

/// A layer's K or V host storage borrowed as its type, for the kernels.
pub(crate) enum KvSlice<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    Q8_0(&'a mut [KvQ8_0]),
    Q4_0(&'a mut [KvQ4_0]),
}

/// A block as GGUF stores it: the f16 scale, little-endian, then the quants.
trait BlockBytes: Sized {
    const BYTES: usize;
    fn put(&self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

impl BlockBytes for KvQ8_0 {
    const BYTES: usize = 2 + KV_BLOCK;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend(self.qs.iter().map(|&q| q as u8));
    }
    fn get(bytes: &[u8]) -> Self {
        KvQ8_0 { d: f16::from_le_bytes([bytes[0], bytes[1]]), qs: std::array::from_fn(|j| bytes[2 + j] as i8) }
    }
}

impl BlockBytes for KvQ4_0 {
    const BYTES: usize = 2 + KV_BLOCK / 2;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.qs);
    }
    fn get(bytes: &[u8]) -> Self {
        KvQ4_0 { d: f16::from_le_bytes([bytes[0], bytes[1]]), qs: std::array::from_fn(|j| bytes[2 + j]) }
    }
}

/// `range` of values as units of `T`.
fn units<T: KvElement>(range: std::ops::Range<usize>) -> std::ops::Range<usize> {
    debug_assert!(range.start.is_multiple_of(T::VALUES) && range.end.is_multiple_of(T::VALUES), "{range:?}");
    range.start / T::VALUES..range.end / T::VALUES
}

impl KvStorage {
    /// `len` values of zeros.
    pub(crate) fn zeros(dtype: KvDType, len: usize, device: Option<&Device>) -> Result<Self> {
        // Zeroed as integers or bytes, which the allocator gets as untouched zero pages: a pool
        // sized for long contexts costs memory only as it fills (`vec![f16::ZERO; n]` writes
        // every element, so the whole budget would be resident from start-up). All-zero bytes
        // are zeros in every type (a block's scale is 0).
        fn zeroed_blocks<T: KvElement>(len: usize) -> Vec<T> {
            let units = len / T::VALUES;
            let layout = std::alloc::Layout::array::<T>(units).expect("a pool that fits in memory");
            if units == 0 {
                return Vec::new();
            }
            // SAFETY: `T` is a `repr(C)` block of an f16 and integers, for which all-zero bytes
            // are a valid value; the allocation has `T`'s layout for `units` elements.
            unsafe {
                let ptr = std::alloc::alloc_zeroed(layout) as *mut T;
                if ptr.is_null() {
                    std::alloc::handle_alloc_error(layout);
                }
                Vec::from_raw_parts(ptr, units, units)
            }
        }
        Ok(match (device, dtype) {
            (None, KvDType::F32) => KvStorage::F32(vec![0.0; len]),
            (None, KvDType::F16) => KvStorage::F16(vec![0u16; len].reinterpret_into::<f16>()),
            (None, KvDType::BF16) => KvStorage::BF16(vec![0u16; len].reinterpret_into::<bf16>()),
            (None, KvDType::Q8_0) => KvStorage::Q8_0(zeroed_blocks(len)),
            (None, KvDType::Q4_0) => KvStorage::Q4_0(zeroed_blocks(len)),
            (Some(device), dtype) => match dtype.candle() {
                Some(candle) => KvStorage::Tensor(Tensor::zeros(len, candle, device)?),
                None => KvStorage::Blocks(dtype, Tensor::zeros(dtype.bytes(len), DType::U8, device)?),
            },
        })
    }

    /// The storage on a device; `None` for host storage.
    pub(crate) fn device_storage(&self) -> Option<DeviceKv<'_>> {
        match self {
            KvStorage::Tensor(t) => Some(DeviceKv::Values(t)),
            KvStorage::Blocks(dtype, t) => Some(DeviceKv::Blocks(*dtype, t)),
            _ => None,
        }
    }

    /// The host storage borrowed as its type; `None` for a tensor.
    pub(crate) fn slice(&mut self) -> Option<KvSlice<'_>> {
        Some(match self {
            KvStorage::F32(v) => KvSlice::F32(v),
            KvStorage::F16(v) => KvSlice::F16(v),
            KvStorage::BF16(v) => KvSlice::BF16(v),
            KvStorage::Q8_0(v) => KvSlice::Q8_0(v),
            KvStorage::Q4_0(v) => KvSlice::Q4_0(v),
            KvStorage::Tensor(_) | KvStorage::Blocks(..) => return None,
        })
    }

    /// Appends the values `range` as bytes (the disk tier's page layout): little-endian
    /// elements, or GGUF's blocks.
    pub(crate) fn append_bytes(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) -> Result<()> {
        fn put<T: Copy, const N: usize>(v: &[T], out: &mut Vec<u8>, bytes: impl Fn(T) -> [u8; N]) {
            out.reserve(v.len() * N);
            v.iter().for_each(|&x| out.extend_from_slice(&bytes(x)));
        }
        fn put_blocks<T: KvElement + BlockBytes>(v: &[T], range: std::ops::Range<usize>, out: &mut Vec<u8>) {
            let blocks = &v[units::<T>(range)];
            out.reserve(blocks.len() * T::BYTES);
            blocks.iter().for_each(|b| b.put(out));
        }
        match self {
            KvStorage::F32(v) => put(&v[range], out, f32::to_le_bytes),
            KvStorage::F16(v) => put(&v[range], out, f16::to_le_bytes),
            KvStorage::BF16(v) => put(&v[range], out, bf16::to_le_bytes),
            KvStorage::Q8_0(v) => put_blocks(v, range, out),
            KvStorage::Q4_0(v) => put_blocks(v, range, out),
            KvStorage::Tensor(t) => {
                let part = t.narrow(0, range.start, range.len())?;
                match t.dtype() {
                    DType::F32 => put(&part.to_vec1::<f32>()?, out, f32::to_le_bytes),
                    DType::F16 => put(&part.to_vec1::<f16>()?, out, f16::to_le_bytes),
                    DType::BF16 => put(&part.to_vec1::<bf16>()?, out, bf16::to_le_bytes),
                    other => return Err(ModelError::KvPool(format!("a KV tensor of {other:?}"))),
                }
            }
            KvStorage::Blocks(dtype, t) => {
                let bytes = dtype.bytes(range.start)..dtype.bytes(range.end);
                out.extend_from_slice(&t.narrow(0, bytes.start, bytes.len())?.to_vec1::<u8>()?);
            }
        }
        Ok(())
    }

    /// Overwrites the values from `start` on with `bytes` in [`append_bytes`](Self::append_bytes)'s layout.
    pub(crate) fn set_bytes(&mut self, start: usize, bytes: &[u8]) -> Result<()> {
        fn get<'a, T, const N: usize>(
            bytes: &'a [u8],
            from: impl Fn([u8; N]) -> T + 'a,
        ) -> impl Iterator<Item = T> + 'a {
            bytes.chunks_exact(N).map(move |c| from(c.try_into().expect("chunks of N bytes")))
        }
        fn set<T, const N: usize>(v: &mut [T], bytes: &[u8], from: impl Fn([u8; N]) -> T) {
            v.iter_mut().zip(get(bytes, from)).for_each(|(d, x)| *d = x);
        }
        fn set_blocks<T: KvElement + BlockBytes>(v: &mut [T], start: usize, bytes: &[u8]) {
            let at = units::<T>(start..start + bytes.len() / T::BYTES * T::VALUES);
            v[at].iter_mut().zip(bytes.chunks_exact(T::BYTES)).for_each(|(d, b)| *d = T::get(b));
        }
        match self {
            KvStorage::F32(v) => set(&mut v[start..start + bytes.len() / 4], bytes, f32::from_le_bytes),
            KvStorage::F16(v) => set(&mut v[start..start + bytes.len() / 2], bytes, f16::from_le_bytes),
            KvStorage::BF16(v) => set(&mut v[start..start + bytes.len() / 2], bytes, bf16::from_le_bytes),
            KvStorage::Q8_0(v) => set_blocks(v, start, bytes),
            KvStorage::Q4_0(v) => set_blocks(v, start, bytes),
            KvStorage::Tensor(t) => {
                let device = t.device().clone();
                let part = match t.dtype() {
                    DType::F32 => Tensor::new(get(bytes, f32::from_le_bytes).collect::<Vec<_>>(), &device)?,
                    DType::F16 => Tensor::new(get(bytes, f16::from_le_bytes).collect::<Vec<_>>(), &device)?,
                    DType::BF16 => Tensor::new(get(bytes, bf16::from_le_bytes).collect::<Vec<_>>(), &device)?,
                    other => return Err(ModelError::KvPool(format!("a KV tensor of {other:?}"))),
                };
                t.slice_set(&part, 0, start)?;
            }
            KvStorage::Blocks(dtype, t) => {
                t.slice_set(&Tensor::new(bytes, t.device())?, 0, dtype.bytes(start))?;
            }
        }
        Ok(())
    }

    /// Copies the values `src` to `dst` on.
    pub(crate) fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) -> Result<()> {
        fn blocks<T: KvElement>(v: &mut [T], src: std::ops::Range<usize>, dst: usize) {
            v.copy_within(units::<T>(src), dst / T::VALUES);
        }
        match self {
            KvStorage::F32(v) => v.copy_within(src, dst),
            KvStorage::F16(v) => v.copy_within(src, dst),
            KvStorage::BF16(v) => v.copy_within(src, dst),
            KvStorage::Q8_0(v) => blocks(v, src, dst),
            KvStorage::Q4_0(v) => blocks(v, src, dst),
            KvStorage::Tensor(t) => {
                // candle refuses a slice_set from its own storage: copy the source out first.
                let from = t.narrow(0, src.start, src.len())?.copy()?;
                t.slice_set(&from, 0, dst)?;
            }
            KvStorage::Blocks(dtype, t) => {
                let (start, len) = (dtype.bytes(src.start), dtype.bytes(src.len()));
                let from = t.narrow(0, start, len)?.copy()?;
                t.slice_set(&from, 0, dtype.bytes(dst))?;
            }
        }
        Ok(())
    }

    /// Stores `values` (f32) from value `start` on, rounded or quantized to the type.
    pub(crate) fn set_values(&mut self, start: usize, values: &[f32]) -> Result<()> {
        fn set<T: KvElement>(v: &mut [T], start: usize, values: &[f32]) {
            T::slice_from_f32(values, &mut v[units::<T>(start..start + values.len())]);
        }
        match self {
            KvStorage::F32(v) => set(v, start, values),
            KvStorage::F16(v) => set(v, start, values),
            KvStorage::BF16(v) => set(v, start, values),
            KvStorage::Q8_0(v) => set(v, start, values),
            KvStorage::Q4_0(v) => set(v, start, values),
            KvStorage::Tensor(t) => {
                let part = Tensor::new(values, t.device())?.to_dtype(t.dtype())?;
                t.slice_set(&part, 0, start)?;
            }
            KvStorage::Blocks(dtype, t) => {
                // Quantized on the host as the host storage does, then copied over as bytes.
                let mut host = KvStorage::zeros(*dtype, values.len(), None)?;
                host.set_values(0, values)?;
                let mut bytes = Vec::new();
                host.append_bytes(0..values.len(), &mut bytes)?;
                t.slice_set(&Tensor::new(bytes, t.device())?, 0, dtype.bytes(start))?;
            }
        }
        Ok(())
    }

    /// The values `range` as f32 (for tests).
    #[cfg(test)]
    pub(crate) fn values(&self, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        fn read<T: KvElement>(v: &[T], range: std::ops::Range<usize>) -> Vec<f32> {
            radix_kernels::kv_to_f32(&v[units::<T>(range)])
        }
        Ok(match self {
            KvStorage::F32(v) => read(v, range),
            KvStorage::F16(v) => read(v, range),
            KvStorage::BF16(v) => read(v, range),
            KvStorage::Q8_0(v) => read(v, range),
            KvStorage::Q4_0(v) => read(v, range),
            KvStorage::Tensor(t) => t.narrow(0, range.start, range.len())?.to_dtype(DType::F32)?.to_vec1::<f32>()?,
            KvStorage::Blocks(dtype, _) => {
                let mut bytes = Vec::new();
                self.append_bytes(range.clone(), &mut bytes)?;
                let mut host = KvStorage::zeros(*dtype, range.len(), None)?;
                host.set_bytes(0, &bytes)?;
                host.values(0..range.len())?
            }
        })
    }
}
