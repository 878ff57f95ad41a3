//! The paged KV pool: every layer's K and V storage for `num_pages x page_size` token slots,
//! allocated once. Models write and read it through page tables; the engine decides which
//! pages belong to whom (ARCHITECTURE.md §3).
//!
//! Storage is either host vectors (the CPU path) or one candle tensor per layer's K and V on a
//! device (the tensor path: CUDA, Metal, or the CPU when testing that path). Both have the same
//! layout, [`PagedLayout`].

use candle_core::{Device, Tensor};
use radix_kernels::PagedLayout;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

mod storage;

pub use storage::KvDType;
pub(crate) use storage::{DeviceKv, KvSlice, KvStorage};

/// The element types of a pool's K and of its V, chosen separately as llama.cpp's
/// `--cache-type-k` and `--cache-type-v` are. One type converts into both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvTypes {
    /// K's type.
    pub k: KvDType,
    /// V's type.
    pub v: KvDType,
}

impl From<KvDType> for KvTypes {
    fn from(both: KvDType) -> Self {
        KvTypes { k: both, v: both }
    }
}

impl KvTypes {
    /// Checks that the CPU kernels are built for this pair: f32 and bf16 only with themselves
    /// (they are for tests and for the tensor path), f16, q8_0 and q4_0 in any pair.
    pub fn check(self) -> Result<Self> {
        let mixable = |t: KvDType| matches!(t, KvDType::F16 | KvDType::Q8_0 | KvDType::Q4_0);
        if self.k == self.v || (mixable(self.k) && mixable(self.v)) {
            Ok(self)
        } else {
            Err(ModelError::KvPool(format!(
                "K as {} with V as {} is not a pair the kernels read: f16, q8_0 and q4_0 mix freely, f32 and bf16 only with themselves",
                self.k, self.v
            )))
        }
    }

    /// Bytes `values` values of K plus as many of V take.
    pub fn bytes(self, values: usize) -> usize {
        self.k.bytes(values) + self.v.bytes(values)
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v { write!(f, "{}", self.k) } else { write!(f, "K {} / V {}", self.k, self.v) }
    }
}

/// K and V of one layer.
#[derive(Debug, Clone)]
pub(crate) struct LayerKv {
    pub(crate) k: KvStorage,
    pub(crate) v: KvStorage,
}

impl LayerKv {
    /// The host slices, each of its own type; `None` for a pool of tensors.
    pub(crate) fn typed(&mut self) -> Option<(KvSlice<'_>, KvSlice<'_>)> {
        Some((self.k.slice()?, self.v.slice()?))
    }

    /// The K and V of a pool on a device; `None` for host storage.
    pub(crate) fn device_storage(&self) -> Option<(DeviceKv<'_>, DeviceKv<'_>)> {
        Some((self.k.device_storage()?, self.v.device_storage()?))
    }
}

/// K/V storage for every layer of a model.
#[derive(Debug, Clone)]
pub struct KvPool {
    layout: PagedLayout,
    types: KvTypes,
    /// `None`: host vectors; `Some`: tensors on that device.
    device: Option<Device>,
    pub(crate) layers: Vec<LayerKv>,
}

impl KvPool {
    /// Allocates `num_pages` pages of `page_size` token slots for every layer of `config`, in
    /// host memory (the CPU path). `types`: one [`KvDType`] for both, or [`KvTypes`].
    pub fn new(config: &ModelConfig, page_size: usize, num_pages: usize, types: impl Into<KvTypes>) -> Result<Self> {
        Self::allocate(config, page_size, num_pages, types.into(), None)
    }

    /// Like [`new`](Self::new), as tensors on `device` (the tensor path; a model loaded for a
    /// GPU, or with [`LoadOptions::tensor_path`](crate::LoadOptions::tensor_path), needs this).
    /// The block types are refused except on CUDA: only the CPU and CUDA kernels read them.
    pub fn on_device(
        config: &ModelConfig,
        page_size: usize,
        num_pages: usize,
        types: impl Into<KvTypes>,
        device: &Device,
    ) -> Result<Self> {
        let types = Self::check_device(types.into(), device)?;
        Self::allocate(config, page_size, num_pages, types, Some(device))
    }

    /// `types` if the attention on `device` reads them: block types only on CUDA (elsewhere the
    /// tensor path gathers pages with candle ops, which know no blocks).
    fn check_device(types: KvTypes, device: &Device) -> Result<KvTypes> {
        match [types.k, types.v].into_iter().find(|t| t.is_quantized()) {
            Some(t) if !device.is_cuda() => Err(ModelError::KvPool(format!(
                "{t} K/V is read by the CPU path and CUDA only; on {device:?} use f16 or bf16"
            ))),
            _ => Ok(types),
        }
    }

    fn allocate(
        config: &ModelConfig,
        page_size: usize,
        num_pages: usize,
        types: KvTypes,
        device: Option<&Device>,
    ) -> Result<Self> {
        let types = Self::check(config, types)?;
        let layout = PagedLayout { num_kv_heads: config.num_kv_heads, head_dim: config.head_dim, page_size, num_pages };
        layout.validate().map_err(|e| ModelError::KvPool(e.to_string()))?;
        let mut layers = Vec::new();
        for _ in 0..config.num_kv_layers() {
            layers.push(LayerKv {
                k: KvStorage::zeros(types.k, layout.layer_len(), device)?,
                v: KvStorage::zeros(types.v, layout.layer_len(), device)?,
            });
        }
        Ok(KvPool { layout, types, device: device.cloned(), layers })
    }

    /// `types` if the kernels read that pair and the model's heads are whole blocks of them.
    fn check(config: &ModelConfig, types: KvTypes) -> Result<KvTypes> {
        let types = types.check()?;
        for t in [types.k, types.v] {
            if !config.head_dim.is_multiple_of(t.values_per_unit()) {
                return Err(ModelError::KvPool(format!(
                    "{t} K/V stores blocks of {} values, and this model's heads have {}: use f16",
                    t.values_per_unit(),
                    config.head_dim
                )));
            }
        }
        Ok(types)
    }

    /// Allocates as many pages as fit in `budget_bytes`, in host memory.
    pub fn with_budget(
        config: &ModelConfig,
        page_size: usize,
        budget_bytes: usize,
        types: impl Into<KvTypes>,
    ) -> Result<Self> {
        let types = types.into();
        Self::allocate(config, page_size, Self::pages_in(config, page_size, budget_bytes, types)?, types, None)
    }

    /// Allocates as many pages as fit in `budget_bytes`, as tensors on `device`.
    pub fn with_budget_on(
        config: &ModelConfig,
        page_size: usize,
        budget_bytes: usize,
        types: impl Into<KvTypes>,
        device: &Device,
    ) -> Result<Self> {
        let types = Self::check_device(types.into(), device)?;
        let pages = Self::pages_in(config, page_size, budget_bytes, types)?;
        Self::allocate(config, page_size, pages, types, Some(device))
    }

    fn pages_in(config: &ModelConfig, page_size: usize, budget_bytes: usize, types: KvTypes) -> Result<usize> {
        let page_bytes = Self::page_bytes(config, page_size, types);
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
    pub fn page_bytes(config: &ModelConfig, page_size: usize, types: impl Into<KvTypes>) -> usize {
        config.num_kv_layers() * types.into().bytes(page_size * config.num_kv_heads * config.head_dim)
    }

    /// Geometry of each layer's storage.
    pub fn layout(&self) -> &PagedLayout {
        &self.layout
    }

    /// K's and V's element types.
    pub fn types(&self) -> KvTypes {
        self.types
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
        // `slot` gives slot ids; the storage is indexed in values.
        let (from, to) = (l.slot(src, 0) * l.slot_len(), l.slot(dst, 0) * l.slot_len());
        for layer in &mut self.layers {
            layer.k.copy_within(from..from + len, to)?;
            layer.v.copy_within(from..from + len, to)?;
        }
        Ok(())
    }

    /// Bytes of one page in [`read_page`](Self::read_page)'s layout: every layer's K then V.
    pub fn page_len_bytes(&self) -> usize {
        self.layers.len() * self.types.bytes(self.layout.page_size * self.layout.slot_len())
    }

    /// Appends page `page`'s K/V to `out`: for every layer its K then its V slots, as
    /// little-endian elements of the pool's types, or GGUF's blocks for q8_0 and q4_0
    /// ([`page_len_bytes`](Self::page_len_bytes) of them). The disk tier keeps pages in this
    /// layout.
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
        let (k_part, v_part) = (self.types.k.bytes(range.len()), self.types.v.bytes(range.len()));
        for (layer, bytes) in self.layers.iter_mut().zip(bytes.chunks_exact(k_part + v_part)) {
            layer.k.set_bytes(range.start, &bytes[..k_part])?;
            layer.v.set_bytes(range.start, &bytes[k_part..])?;
        }
        Ok(())
    }

    /// The values of page `page` in each layer's storage.
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
        for layer in &mut self.layers {
            for storage in [&mut layer.k, &mut layer.v] {
                match storage {
                    KvStorage::Tensor(t) => {
                        let noise = Tensor::randn(0f32, std, len, t.device())?.to_dtype(t.dtype())?;
                        t.slice_set(&noise, 0, 0)?;
                    }
                    KvStorage::Blocks(..) => {
                        // One tile of noise quantized on the host and repeated on the device: a
                        // pool of tens of GB would take minutes to quantize value by value.
                        let tile = len.min(1 << 20);
                        storage.set_values(0, &Tensor::randn(0f32, std, tile, &Device::Cpu)?.to_vec1::<f32>()?)?;
                        for start in (tile..len).step_by(tile) {
                            storage.copy_within(0..tile.min(len - start), start)?;
                        }
                    }
                    _ => storage.set_values(0, &Tensor::randn(0f32, std, len, &Device::Cpu)?.to_vec1::<f32>()?)?,
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
        let layer = &self.layers[layer];
        Ok((layer.k.values(slot * n..(slot + 1) * n)?, layer.v.values(slot * n..(slot + 1) * n)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn config() -> ModelConfig {
        ModelConfig::from_hf_json(
            r#"{"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "vocab_size": 32,
                "rms_norm_eps": 1e-6}"#,
        )
        .unwrap()
    }

    /// A pool of tensors on the CPU, block types included (which `on_device` keeps for CUDA):
    /// the storage code is the same on every device.
    fn tensors_on_cpu(c: &ModelConfig, types: impl Into<KvTypes>) -> KvPool {
        KvPool::allocate(c, 4, 6, types.into(), Some(&Device::Cpu)).unwrap()
    }

    /// Host vectors and device tensors (here on the CPU) behave alike: copy-on-write of a partly
    /// filled page copies exactly its first slots in every layer, K and V.
    #[test]
    fn copy_page_copies_the_first_slots_of_every_layer_in_both_storages() {
        let c = config();
        for dtype in KvDType::ALL {
            for mut pool in [KvPool::new(&c, 4, 6, dtype).unwrap(), tensors_on_cpu(&c, dtype)] {
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
        let mixed = KvTypes { k: KvDType::Q8_0, v: KvDType::Q4_0 };
        for types in KvDType::ALL.map(KvTypes::from).into_iter().chain([mixed]) {
            let make = |device: bool| match device {
                false => KvPool::new(&c, 4, 6, types).unwrap(),
                true => tensors_on_cpu(&c, types),
            };
            let dtype = types;
            for (from_device, to_device) in [(false, false), (false, true), (true, false), (true, true)] {
                let mut from = make(from_device);
                from.fill_random(1.0).unwrap();
                let mut bytes = Vec::new();
                from.read_page(2, &mut bytes).unwrap();
                assert_eq!(bytes.len(), from.page_len_bytes());
                assert_eq!(bytes.len(), KvPool::page_bytes(&c, 4, types));
                let mut to = make(to_device);
                to.write_page(5, &bytes).unwrap();
                for layer in 0..2 {
                    for offset in 0..4 {
                        let want = from.try_read_slot(layer, 8 + offset).unwrap();
                        assert_eq!(to.try_read_slot(layer, 20 + offset).unwrap(), want, "{dtype:?} layer {layer}");
                    }
                    assert_eq!(to.try_read_slot(layer, 19).unwrap().0, vec![0.0; 64], "neighbours untouched");
                }
                assert!(to.write_page(6, &bytes).is_err() && to.write_page(0, &bytes[1..]).is_err());
            }
        }
    }

    /// A pool of block types takes the bytes the formats say (34 and 18 per 32 values), is
    /// refused where a head is not whole blocks or on a device other than CUDA, and K and V pair
    /// only as the kernels are built.
    #[test]
    fn block_types_size_pages_and_refuse_what_the_kernels_do_not_read() {
        let c = config();
        let f16_page = KvPool::page_bytes(&c, 16, KvDType::F16);
        assert_eq!(f16_page, 2 * 2 * 16 * 2 * 32 * 2);
        assert_eq!(KvPool::page_bytes(&c, 16, KvDType::Q8_0) * 64, f16_page * 34);
        assert_eq!(KvPool::page_bytes(&c, 16, KvDType::Q4_0) * 64, f16_page * 18);
        let mixed = KvTypes { k: KvDType::Q8_0, v: KvDType::F16 };
        assert_eq!(KvPool::page_bytes(&c, 16, mixed) * 64, f16_page * (17 + 32));
        let small = ModelConfig { head_dim: 16, ..c.clone() };
        let err = KvPool::new(&small, 4, 6, KvDType::Q4_0).unwrap_err().to_string();
        assert!(err.contains("q4_0") && err.contains("16") && err.contains("f16"), "{err}");
        let err = KvPool::on_device(&c, 4, 6, KvDType::Q8_0, &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("q8_0") && err.contains("CUDA"), "{err}");
        let mixed_on_cpu = KvTypes { k: KvDType::F16, v: KvDType::Q4_0 };
        assert!(KvPool::with_budget_on(&c, 4, 1 << 20, mixed_on_cpu, &Device::Cpu).is_err());
        let err = KvPool::new(&c, 4, 6, KvTypes { k: KvDType::F32, v: KvDType::Q8_0 }).unwrap_err().to_string();
        assert!(err.contains("f32") && err.contains("q8_0"), "{err}");
        assert_eq!(KvDType::from_name("Q8_0"), Some(KvDType::Q8_0));
        assert_eq!(KvDType::from_name("q5_1"), None);
    }
}
