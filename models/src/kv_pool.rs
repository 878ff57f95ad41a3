//! The paged KV pool: every layer's K and V storage for `num_pages x page_size` token slots,
//! allocated once. Models write and read it through page tables; the engine decides which
//! pages belong to whom (DESIGN.md §2).

use half::{bf16, f16};
use radix_kernels::{KvElement, PagedLayout};

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
}

impl KvStorage {
    fn zeros(dtype: KvDType, len: usize) -> Self {
        match dtype {
            KvDType::F32 => KvStorage::F32(vec![0.0; len]),
            KvDType::F16 => KvStorage::F16(vec![f16::ZERO; len]),
            KvDType::BF16 => KvStorage::BF16(vec![bf16::ZERO; len]),
        }
    }

    fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) {
        match self {
            KvStorage::F32(v) => v.copy_within(src, dst),
            KvStorage::F16(v) => v.copy_within(src, dst),
            KvStorage::BF16(v) => v.copy_within(src, dst),
        }
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
    pub(crate) fn typed(&mut self) -> TypedKv<'_> {
        match (&mut self.k, &mut self.v) {
            (KvStorage::F32(k), KvStorage::F32(v)) => TypedKv::F32(k, v),
            (KvStorage::F16(k), KvStorage::F16(v)) => TypedKv::F16(k, v),
            (KvStorage::BF16(k), KvStorage::BF16(v)) => TypedKv::BF16(k, v),
            _ => unreachable!("K and V of a layer are allocated with the same dtype"),
        }
    }
}

/// K/V storage for every layer of a model.
#[derive(Debug, Clone)]
pub struct KvPool {
    layout: PagedLayout,
    dtype: KvDType,
    pub(crate) layers: Vec<LayerKv>,
}

impl KvPool {
    /// Allocates `num_pages` pages of `page_size` token slots for every layer of `config`.
    pub fn new(config: &ModelConfig, page_size: usize, num_pages: usize, dtype: KvDType) -> Result<Self> {
        let layout = PagedLayout { num_kv_heads: config.num_kv_heads, head_dim: config.head_dim, page_size, num_pages };
        layout.validate().map_err(|e| ModelError::KvPool(e.to_string()))?;
        let layers = (0..config.num_layers)
            .map(|_| LayerKv {
                k: KvStorage::zeros(dtype, layout.layer_len()),
                v: KvStorage::zeros(dtype, layout.layer_len()),
            })
            .collect();
        Ok(KvPool { layout, dtype, layers })
    }

    /// Allocates as many pages as fit in `budget_bytes`.
    pub fn with_budget(config: &ModelConfig, page_size: usize, budget_bytes: usize, dtype: KvDType) -> Result<Self> {
        let page_bytes = Self::page_bytes(config, page_size, dtype);
        let num_pages = budget_bytes / page_bytes.max(1);
        if num_pages == 0 {
            return Err(ModelError::KvPool(format!(
                "a budget of {budget_bytes} bytes holds no page of {page_bytes} bytes ({page_size} tokens)"
            )));
        }
        Self::new(config, page_size, num_pages, dtype)
    }

    /// Bytes one page takes across all layers, K and V.
    pub fn page_bytes(config: &ModelConfig, page_size: usize, dtype: KvDType) -> usize {
        2 * config.num_layers * page_size * config.num_kv_heads * config.head_dim * dtype.size()
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
            layer.k.copy_within(from..from + len, to);
            layer.v.copy_within(from..from + len, to);
        }
        Ok(())
    }

    /// Reads back one layer's K and V of a slot as f32 (for tests and debugging).
    pub fn read_slot(&self, layer: usize, slot: usize) -> (Vec<f32>, Vec<f32>) {
        let n = self.layout.slot_len();
        let range = slot * n..(slot + 1) * n;
        fn read<T: KvElement>(v: &[T], r: std::ops::Range<usize>) -> Vec<f32> {
            v[r].iter().map(|x| x.to_f32()).collect()
        }
        let pick = |s: &KvStorage| match s {
            KvStorage::F32(v) => read(v, range.clone()),
            KvStorage::F16(v) => read(v, range.clone()),
            KvStorage::BF16(v) => read(v, range.clone()),
        };
        let layer = &self.layers[layer];
        (pick(&layer.k), pick(&layer.v))
    }
}
