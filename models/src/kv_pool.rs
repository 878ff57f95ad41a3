//! The paged KV pool: every layer's K and V storage for `num_pages x page_size` token slots,
//! allocated once. Models write and read it through page tables; the engine decides which
//! pages belong to whom (ARCHITECTURE.md §3).
//!
//! Storage is either host vectors (the CPU path) or one candle tensor per layer's K and V on a
//! device (the tensor path: CUDA, Metal, or the CPU when testing that path). Both have the same
//! layout, [`PagedLayout`].

use candle_core::{DType, Device, Tensor};
use half::vec::HalfBitsVecExt;
use half::{bf16, f16};
use radix_kernels::PagedLayout;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Element type of the stored K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDType {
    /// 4 bytes per element.
    F32,
    /// 2 bytes per element.
    F16,
    /// 2 bytes per element.
    BF16,
}

impl KvDType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvDType::F32 => 4,
            KvDType::F16 | KvDType::BF16 => 2,
        }
    }
}

/// One layer's K or V storage.
#[derive(Debug, Clone)]
pub(crate) enum KvStorage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// `[layer_len]` elements on a device.
    Tensor(Tensor),
}

impl KvStorage {
    fn zeros(dtype: KvDType, len: usize, device: Option<&Device>) -> Result<Self> {
        Ok(match (device, dtype) {
            (None, KvDType::F32) => KvStorage::F32(vec![0.0; len]),
            // Zeroed as integers, which the allocator gets as untouched zero pages: a pool sized
            // for long contexts costs memory only as it fills (`vec![f16::ZERO; n]` writes every
            // element, so the whole budget would be resident from start-up).
            (None, KvDType::F16) => KvStorage::F16(vec![0u16; len].reinterpret_into::<f16>()),
            (None, KvDType::BF16) => KvStorage::BF16(vec![0u16; len].reinterpret_into::<bf16>()),
            (Some(device), dtype) => KvStorage::Tensor(Tensor::zeros(len, dtype.candle(), device)?),
        })
    }

    /// Appends the elements `range` as little-endian bytes (the disk tier's page layout).
    fn append_bytes(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) -> Result<()> {
        fn put<T: Copy, const N: usize>(v: &[T], out: &mut Vec<u8>, bytes: impl Fn(T) -> [u8; N]) {
            out.reserve(v.len() * N);
            v.iter().for_each(|&x| out.extend_from_slice(&bytes(x)));
        }
        match self {
            KvStorage::F32(v) => put(&v[range], out, f32::to_le_bytes),
            KvStorage::F16(v) => put(&v[range], out, f16::to_le_bytes),
            KvStorage::BF16(v) => put(&v[range], out, bf16::to_le_bytes),
            KvStorage::Tensor(t) => {
                let part = t.narrow(0, range.start, range.len())?;
                match t.dtype() {
                    DType::F32 => put(&part.to_vec1::<f32>()?, out, f32::to_le_bytes),
                    DType::F16 => put(&part.to_vec1::<f16>()?, out, f16::to_le_bytes),
                    DType::BF16 => put(&part.to_vec1::<bf16>()?, out, bf16::to_le_bytes),
                    other => return Err(ModelError::KvPool(format!("a KV tensor of {other:?}"))),
                }
            }
        }
        Ok(())
    }

    /// Overwrites the elements from `start` on with `bytes` in [`append_bytes`](Self::append_bytes)'s layout.
    fn set_bytes(&mut self, start: usize, bytes: &[u8]) -> Result<()> {
        fn get<'a, T, const N: usize>(
            bytes: &'a [u8],
            from: impl Fn([u8; N]) -> T + 'a,
        ) -> impl Iterator<Item = T> + 'a {
            bytes.chunks_exact(N).map(move |c| from(c.try_into().expect("chunks of N bytes")))
        }
        fn set<T, const N: usize>(v: &mut [T], bytes: &[u8], from: impl Fn([u8; N]) -> T) {
            v.iter_mut().zip(get(bytes, from)).for_each(|(d, x)| *d = x);
        }
        match self {
            KvStorage::F32(v) => set(&mut v[start..start + bytes.len() / 4], bytes, f32::from_le_bytes),
            KvStorage::F16(v) => set(&mut v[start..start + bytes.len() / 2], bytes, f16::from_le_bytes),
            KvStorage::BF16(v) => set(&mut v[start..start + bytes.len() / 2], bytes, bf16::from_le_bytes),
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
        }
        Ok(())
    }

    fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) -> Result<()> {
        match self {
            KvStorage::F32(v) => v.copy_within(src, dst),
            KvStorage::F16(v) => v.copy_within(src, dst),
            KvStorage::BF16(v) => v.copy_within(src, dst),
            KvStorage::Tensor(t) => {
                // candle refuses a slice_set from its own storage: copy the source out first.
                let from = t.narrow(0, src.start, src.len())?.copy()?;
                t.slice_set(&from, 0, dst)?;
            }
        }
        Ok(())
    }
}

/// K and V of one layer.
#[derive(Debug, Clone)]
pub(crate) struct LayerKv {
    pub(crate) k: KvStorage,
    pub(crate) v: KvStorage,
}

/// The K and V slices of a layer, typed (both always share one element type).
pub(crate) enum TypedKv<'a> {
    F32(&'a mut [f32], &'a mut [f32]),
    F16(&'a mut [f16], &'a mut [f16]),
    BF16(&'a mut [bf16], &'a mut [bf16]),
}

impl LayerKv {
    /// The host slices; `None` for a pool of tensors.
    pub(crate) fn typed(&mut self) -> Option<TypedKv<'_>> {
        match (&mut self.k, &mut self.v) {
            (KvStorage::F32(k), KvStorage::F32(v)) => Some(TypedKv::F32(k, v)),
            (KvStorage::F16(k), KvStorage::F16(v)) => Some(TypedKv::F16(k, v)),
            (KvStorage::BF16(k), KvStorage::BF16(v)) => Some(TypedKv::BF16(k, v)),
            _ => None,
        }
    }

    /// The K and V tensors of a pool on a device; `None` for host storage.
    pub(crate) fn tensors(&self) -> Option<(&Tensor, &Tensor)> {
        match (&self.k, &self.v) {
            (KvStorage::Tensor(k), KvStorage::Tensor(v)) => Some((k, v)),
            _ => None,
        }
    }
}

/// K/V storage for every layer of a model.
#[derive(Debug, Clone)]
pub struct KvPool {
    layout: PagedLayout,
    dtype: KvDType,
    /// `None`: host vectors; `Some`: tensors on that device.
    device: Option<Device>,
    pub(crate) layers: Vec<LayerKv>,
}

impl KvPool {
    /// Allocates `num_pages` pages of `page_size` token slots for every layer of `config`, in
    /// host memory (the CPU path).
    pub fn new(config: &ModelConfig, page_size: usize, num_pages: usize, dtype: KvDType) -> Result<Self> {
        Self::allocate(config, page_size, num_pages, dtype, None)
    }

    /// Like [`new`](Self::new), as tensors on `device` (the tensor path; a model loaded for a
    /// GPU, or with [`LoadOptions::tensor_path`](crate::LoadOptions::tensor_path), needs this).
    pub fn on_device(
        config: &ModelConfig,
        page_size: usize,
        num_pages: usize,
        dtype: KvDType,
        device: &Device,
    ) -> Result<Self> {
        Self::allocate(config, page_size, num_pages, dtype, Some(device))
    }

    fn allocate(
        config: &ModelConfig,
        page_size: usize,
        num_pages: usize,
        dtype: KvDType,
        device: Option<&Device>,
    ) -> Result<Self> {
        let layout = PagedLayout { num_kv_heads: config.num_kv_heads, head_dim: config.head_dim, page_size, num_pages };
        layout.validate().map_err(|e| ModelError::KvPool(e.to_string()))?;
        let mut layers = Vec::new();
        for _ in 0..config.num_kv_layers() {
            layers.push(LayerKv {
                k: KvStorage::zeros(dtype, layout.layer_len(), device)?,
                v: KvStorage::zeros(dtype, layout.layer_len(), device)?,
            });
        }
        Ok(KvPool { layout, dtype, device: device.cloned(), layers })
    }

    /// Allocates as many pages as fit in `budget_bytes`, in host memory.
    pub fn with_budget(config: &ModelConfig, page_size: usize, budget_bytes: usize, dtype: KvDType) -> Result<Self> {
        Self::allocate(config, page_size, Self::pages_in(config, page_size, budget_bytes, dtype)?, dtype, None)
    }

    /// Allocates as many pages as fit in `budget_bytes`, as tensors on `device`.
    pub fn with_budget_on(
        config: &ModelConfig,
        page_size: usize,
        budget_bytes: usize,
        dtype: KvDType,
        device: &Device,
    ) -> Result<Self> {
        let pages = Self::pages_in(config, page_size, budget_bytes, dtype)?;
        Self::allocate(config, page_size, pages, dtype, Some(device))
    }

    fn pages_in(config: &ModelConfig, page_size: usize, budget_bytes: usize, dtype: KvDType) -> Result<usize> {
        let page_bytes = Self::page_bytes(config, page_size, dtype);
        let num_pages = budget_bytes / page_bytes.max(1);
        if num_pages == 0 {
            return Err(ModelError::KvPool(format!(
                "a budget of {budget_bytes} bytes holds no page of {page_bytes} bytes ({page_size} tokens)"
            )));
        }
        Ok(num_pages)
    }

    /// Where the storage is: `None` for host vectors, the device for tensors.
    pub fn device(&self) -> Option<&Device> {
        self.device.as_ref()
    }

    /// Bytes one page takes across all attention layers, K and V.
    pub fn page_bytes(config: &ModelConfig, page_size: usize, dtype: KvDType) -> usize {
        2 * config.num_kv_layers() * page_size * config.num_kv_heads * config.head_dim * dtype.size()
    }

    /// Geometry of each layer's storage.
    pub fn layout(&self) -> &PagedLayout {
        &self.layout
    }

    /// Element type.
    pub fn dtype(&self) -> KvDType {
        self.dtype
    }

    /// Number of pages.
    pub fn num_pages(&self) -> usize {
        self.layout.num_pages
    }

    /// Token slots per page.
    pub fn page_size(&self) -> usize {
        self.layout.page_size
    }

    /// Copies the first `tokens` slots of page `src` to page `dst` in every layer (copy-on-write
    /// of a partly filled shared page).
    pub fn copy_page(&mut self, src: u32, dst: u32, tokens: usize) -> Result<()> {
        let l = self.layout;
        if src as usize >= l.num_pages || dst as usize >= l.num_pages || tokens > l.page_size {
            return Err(ModelError::KvPool(format!(
                "copy of {tokens} slots from page {src} to {dst} is outside {} pages of {}",
                l.num_pages, l.page_size
            )));
        }
        let len = tokens * l.slot_len();
        // `slot` gives slot ids; the storage is indexed in elements.
        let (from, to) = (l.slot(src, 0) * l.slot_len(), l.slot(dst, 0) * l.slot_len());
        for layer in &mut self.layers {
            layer.k.copy_within(from..from + len, to)?;
            layer.v.copy_within(from..from + len, to)?;
        }
        Ok(())
    }

    /// Bytes of one page in [`read_page`](Self::read_page)'s layout: every layer's K then V.
    pub fn page_len_bytes(&self) -> usize {
        2 * self.layers.len() * self.layout.page_size * self.layout.slot_len() * self.dtype.size()
    }

    /// Appends page `page`'s K/V to `out`: for every layer its K then its V slots, as
    /// little-endian elements of the pool's type ([`page_len_bytes`](Self::page_len_bytes) of
    /// them). The disk tier keeps pages in this layout.
    pub fn read_page(&self, page: u32, out: &mut Vec<u8>) -> Result<()> {
        let range = self.page_range(page)?;
        for layer in &self.layers {
            layer.k.append_bytes(range.clone(), out)?;
            layer.v.append_bytes(range.clone(), out)?;
        }
        Ok(())
    }

    /// Overwrites page `page` with `bytes` in [`read_page`](Self::read_page)'s layout.
    pub fn write_page(&mut self, page: u32, bytes: &[u8]) -> Result<()> {
        let range = self.page_range(page)?;
        if bytes.len() != self.page_len_bytes() {
            return Err(ModelError::KvPool(format!(
                "a page of {} bytes written into pages of {}",
                bytes.len(),
                self.page_len_bytes()
            )));
        }
        let part = range.len() * self.dtype.size();
        for (layer, bytes) in self.layers.iter_mut().zip(bytes.chunks_exact(2 * part)) {
            layer.k.set_bytes(range.start, &bytes[..part])?;
            layer.v.set_bytes(range.start, &bytes[part..])?;
        }
        Ok(())
    }

    /// The elements of page `page` in each layer's storage.
    fn page_range(&self, page: u32) -> Result<std::ops::Range<usize>> {
        let l = self.layout;
        if page as usize >= l.num_pages {
            return Err(ModelError::KvPool(format!("page {page} is outside {} pages", l.num_pages)));
        }
        let start = l.slot(page, 0) * l.slot_len();
        Ok(start..start + l.page_size * l.slot_len())
    }

    /// Fills every slot of every layer with random values (normal, standard deviation `std`), so
    /// that decode speed over a long context can be measured without prefilling it first.
    pub fn fill_random(&mut self, std: f32) -> Result<()> {
        let len = self.layout.layer_len();
        let dtype = self.dtype.candle();
        for layer in &mut self.layers {
            for storage in [&mut layer.k, &mut layer.v] {
                match storage {
                    KvStorage::Tensor(t) => {
                        let noise = Tensor::randn(0f32, std, len, t.device())?.to_dtype(dtype)?;
                        t.slice_set(&noise, 0, 0)?;
                    }
                    _ => {
                        let noise = Tensor::randn(0f32, std, len, &Device::Cpu)?.to_vec1::<f32>()?;
                        match storage {
                            KvStorage::F32(v) => v.copy_from_slice(&noise),
                            KvStorage::F16(v) => v.iter_mut().zip(&noise).for_each(|(d, &x)| *d = f16::from_f32(x)),
                            KvStorage::BF16(v) => v.iter_mut().zip(&noise).for_each(|(d, &x)| *d = bf16::from_f32(x)),
                            KvStorage::Tensor(_) => unreachable!("matched above"),
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads back one layer's K and V of a slot as f32, with the device's error if the copy
    /// fails (for tests).
    #[cfg(test)]
    pub(crate) fn try_read_slot(&self, layer: usize, slot: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = self.layout.slot_len();
        let range = slot * n..(slot + 1) * n;
        fn read<T: radix_kernels::KvElement>(v: &[T], r: std::ops::Range<usize>) -> Vec<f32> {
            v[r].iter().map(|x| x.to_f32()).collect()
        }
        let pick = |s: &KvStorage| -> Result<Vec<f32>> {
            Ok(match s {
                KvStorage::F32(v) => read(v, range.clone()),
                KvStorage::F16(v) => read(v, range.clone()),
                KvStorage::BF16(v) => read(v, range.clone()),
                KvStorage::Tensor(t) => t.narrow(0, range.start, n)?.to_dtype(DType::F32)?.to_vec1::<f32>()?,
            })
        };
        let layer = &self.layers[layer];
        Ok((pick(&layer.k)?, pick(&layer.v)?))
    }
}

impl KvDType {
    /// The candle element type.
    pub fn candle(self) -> DType {
        match self {
            KvDType::F32 => DType::F32,
            KvDType::F16 => DType::F16,
            KvDType::BF16 => DType::BF16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn config() -> ModelConfig {
        ModelConfig::from_hf_json(
            r#"{"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 32,
                "rms_norm_eps": 1e-6}"#,
        )
        .unwrap()
    }

    /// Host vectors and device tensors (here on the CPU) behave alike: copy-on-write of a partly
    /// filled page copies exactly its first slots in every layer, K and V.
    #[test]
    fn copy_page_copies_the_first_slots_of_every_layer_in_both_storages() {
        let c = config();
        for dtype in [KvDType::F32, KvDType::F16, KvDType::BF16] {
            let pools =
                [KvPool::new(&c, 4, 6, dtype).unwrap(), KvPool::on_device(&c, 4, 6, dtype, &Device::Cpu).unwrap()];
            for mut pool in pools {
                pool.fill_random(1.0).unwrap();
                let before: Vec<_> = (0..24).map(|s| pool.try_read_slot(1, s).unwrap()).collect();
                pool.copy_page(1, 4, 3).unwrap();
                for layer in 0..2 {
                    for (slot, old) in before.iter().enumerate() {
                        let got = pool.try_read_slot(layer, slot).unwrap();
                        let want = match slot {
                            16..=18 => pool.try_read_slot(layer, slot - 12).unwrap(),
                            _ if layer == 1 => old.clone(),
                            _ => got.clone(),
                        };
                        assert_eq!(got, want, "{dtype:?} layer {layer} slot {slot}");
                    }
                }
                assert_ne!(pool.try_read_slot(1, 19).unwrap(), pool.try_read_slot(1, 7).unwrap());
                assert!(pool.copy_page(6, 0, 1).is_err() && pool.copy_page(0, 1, 5).is_err());
            }
        }
    }

    /// A page read out and written into another page of another pool (host or tensors, same
    /// element type) holds the same K and V in every layer, bit for bit.
    #[test]
    fn pages_read_out_and_written_back_are_bit_identical_across_storages() {
        let c = config();
        for dtype in [KvDType::F32, KvDType::F16, KvDType::BF16] {
            let make = |device: bool| match device {
                false => KvPool::new(&c, 4, 6, dtype).unwrap(),
                true => KvPool::on_device(&c, 4, 6, dtype, &Device::Cpu).unwrap(),
            };
            for (from_device, to_device) in [(false, false), (false, true), (true, false), (true, true)] {
                let mut from = make(from_device);
                from.fill_random(1.0).unwrap();
                let mut bytes = Vec::new();
                from.read_page(2, &mut bytes).unwrap();
                assert_eq!(bytes.len(), from.page_len_bytes());
                assert_eq!(bytes.len(), KvPool::page_bytes(&c, 4, dtype));
                let mut to = make(to_device);
                to.write_page(5, &bytes).unwrap();
                for layer in 0..2 {
                    for offset in 0..4 {
                        let want = from.try_read_slot(layer, 8 + offset).unwrap();
                        assert_eq!(to.try_read_slot(layer, 20 + offset).unwrap(), want, "{dtype:?} layer {layer}");
                    }
                    assert_eq!(to.try_read_slot(layer, 19).unwrap().0, vec![0.0; 32], "neighbours untouched");
                }
                assert!(to.write_page(6, &bytes).is_err() && to.write_page(0, &bytes[1..]).is_err());
            }
        }
    }
}
