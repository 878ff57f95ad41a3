//! The CUDA kernels (feature `cuda`) against the CPU kernels on random batches of awkward
//! shapes: every head size with a kernel, GQA groups 1-8, page sizes 1, 5 and 16, scrambled
//! page tables, decode rows over long contexts (the split-and-merge pass) next to prefill chunks,
//! f32/f16/bf16 pools, and q8_0/q4_0 block pages (K and V of different formats too). K/V writes
//! must match bitwise (the value formats round to nearest even on both; the block formats rotate
//! and quantize with the same operations in the same order); outputs within `TOLERANCE` (f32 sums
//! in another order; the GPU's exp2 is an approximation).
//!
//! Needs a GPU: without one (or without a driver, as on CI, which only builds this), the test says
//! so and checks nothing.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::Rng;
use radix_kernels::cuda::{CudaAttentionBatch, CudaKvCache};
use radix_kernels::half::{bf16, f16};
use radix_kernels::{KV_BLOCK, KvElement, KvQ4_0, KvQ8_0, PagedLayout, SequenceAttention, paged_attention, write_kv};

/// Largest |gpu - cpu| allowed, relative to the largest |cpu| of the case.
const TOLERANCE: f32 = 2e-4;

fn device() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIPPED: no CUDA device to run the kernels on ({e})");
            None
        }
    }
}

/// A K/V format as the GPU pool holds it.
trait GpuKv: KvElement + PartialEq + std::fmt::Debug {
    fn upload(cache: &[Self], device: &Device) -> Tensor;
    fn download(t: &Tensor) -> Vec<Self>;
    fn cache(t: &Tensor) -> CudaKvCache<'_>;
}

macro_rules! values_kv {
    ($t:ty) => {
        impl GpuKv for $t {
            fn upload(cache: &[Self], device: &Device) -> Tensor {
                Tensor::from_slice(cache, cache.len(), device).unwrap()
            }
            fn download(t: &Tensor) -> Vec<Self> {
                t.to_vec1::<$t>().unwrap()
            }
            fn cache(t: &Tensor) -> CudaKvCache<'_> {
                CudaKvCache::Values(t)
            }
        }
    };
}

values_kv!(f32);
values_kv!(f16);
values_kv!(bf16);

impl GpuKv for KvQ8_0 {
    fn upload(cache: &[Self], device: &Device) -> Tensor {
        let bytes: Vec<u8> =
            cache.iter().flat_map(|b| b.d.to_le_bytes().into_iter().chain(b.qs.iter().map(|&q| q as u8))).collect();
        Tensor::from_vec(bytes.clone(), bytes.len(), device).unwrap()
    }
    fn download(t: &Tensor) -> Vec<Self> {
        let bytes = t.to_vec1::<u8>().unwrap();
        let block =
            |b: &[u8]| KvQ8_0 { d: f16::from_le_bytes([b[0], b[1]]), qs: std::array::from_fn(|j| b[2 + j] as i8) };
        bytes.chunks_exact(2 + KV_BLOCK).map(block).collect()
    }
    fn cache(t: &Tensor) -> CudaKvCache<'_> {
        CudaKvCache::Q8_0(t)
    }
}

impl GpuKv for KvQ4_0 {
    fn upload(cache: &[Self], device: &Device) -> Tensor {
        let bytes: Vec<u8> = cache.iter().flat_map(|b| b.d.to_le_bytes().into_iter().chain(b.qs)).collect();
        Tensor::from_vec(bytes.clone(), bytes.len(), device).unwrap()
    }
    fn download(t: &Tensor) -> Vec<Self> {
        let bytes = t.to_vec1::<u8>().unwrap();
        let block = |b: &[u8]| KvQ4_0 { d: f16::from_le_bytes([b[0], b[1]]), qs: std::array::from_fn(|j| b[2 + j]) };
        bytes.chunks_exact(2 + KV_BLOCK / 2).map(block).collect()
    }
    fn cache(t: &Tensor) -> CudaKvCache<'_> {
        CudaKvCache::Q4_0(t)
    }
}

struct Case {
    layout: PagedLayout,
    num_heads: usize,
    /// (query_len, context_len) per sequence.
    shapes: Vec<(usize, usize)>,
}

fn random_case(rng: &mut Rng, head_dim: usize) -> Case {
    let num_kv_heads = 1 + (rng.next() % 4) as usize;
    let group = [1, 2, 3, 4, 8][(rng.next() % 5) as usize];
    let page_size = [1, 5, 16][(rng.next() % 3) as usize];
    let mut shapes = Vec::new();
    for _ in 0..1 + rng.next() % 4 {
        let shape = match rng.next() % 3 {
            0 => (1, 1 + (rng.next() % 1500) as usize), // decode over a long context
            1 => {
                let q = 1 + (rng.next() % 70) as usize; // prefill chunk over a cached prefix
                (q, q + (rng.next() % 300) as usize)
            }
            _ => {
                let q = 1 + (rng.next() % 90) as usize; // whole prefill
                (q, q)
            }
        };
        shapes.push(shape);
    }
    let tokens: usize = shapes.iter().map(|s| s.1.div_ceil(page_size) * page_size).sum();
    let layout = PagedLayout { num_kv_heads, head_dim, page_size, num_pages: tokens / page_size + 3 };
    Case { layout, num_heads: num_kv_heads * group, shapes }
}

fn run_case<K: GpuKv, V: GpuKv>(rng: &mut Rng, device: &Device, case: &Case) -> f32 {
    let l = case.layout;
    // Scrambled page tables over the whole pool.
    let mut pages: Vec<u32> = (0..l.num_pages as u32).collect();
    for i in (1..pages.len()).rev() {
        pages.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut tables = Vec::new();
    for &(_, ctx) in &case.shapes {
        let n = ctx.div_ceil(l.page_size);
        tables.push(pages.drain(..n).collect::<Vec<u32>>());
    }
    let mut seqs = Vec::new();
    let mut slots = Vec::new();
    let mut start = 0;
    for (&(q, ctx), table) in case.shapes.iter().zip(&tables) {
        seqs.push(SequenceAttention { query_start: start, query_len: q, context_len: ctx, page_table: table });
        for p in ctx - q..ctx {
            slots.push(table[p / l.page_size] * l.page_size as u32 + (p % l.page_size) as u32);
        }
        start += q;
    }
    let n = start;
    let (row, slot_len) = (case.num_heads * l.head_dim, l.slot_len());
    let fill = |rng: &mut Rng, len: usize| (0..len).map(|_| rng.activation()).collect::<Vec<f32>>();
    let mut k_cache: Vec<K> = radix_kernels::kv_from_f32(&fill(rng, l.layer_len()));
    let mut v_cache: Vec<V> = radix_kernels::kv_from_f32(&fill(rng, l.layer_len()));
    let (q, k_new, v_new) = (fill(rng, n * row), fill(rng, n * slot_len), fill(rng, n * slot_len));

    let gpu_k = K::upload(&k_cache, device);
    let gpu_v = V::upload(&v_cache, device);
    let batch = CudaAttentionBatch::new(device, &l, case.num_heads, n, &seqs, &slots).unwrap();
    let upload = |x: &[f32], cols: usize| Tensor::from_slice(x, (n, cols), device).unwrap();
    let (k_gpu, v_gpu) = (K::cache(&gpu_k), V::cache(&gpu_v));
    batch.write_kv(&upload(&k_new, slot_len), &upload(&v_new, slot_len), k_gpu, v_gpu).unwrap();
    let scale = 1.0 / (l.head_dim as f32).sqrt();
    let gpu_out = batch.attention(&upload(&q, row), k_gpu, v_gpu, scale).unwrap();

    write_kv(&l, &k_new, &v_new, &slots, &mut k_cache, &mut v_cache).unwrap();
    let mut out = vec![0.0f32; n * row];
    paged_attention(&l, case.num_heads, scale, &q, &k_cache, &v_cache, &seqs, &mut out).unwrap();

    assert!(K::download(&gpu_k) == k_cache, "K writes differ from the CPU's ({})", std::any::type_name::<K>());
    assert!(V::download(&gpu_v) == v_cache, "V writes differ from the CPU's ({})", std::any::type_name::<V>());
    let got = gpu_out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scale_of = out.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
    let worst = got.iter().zip(&out).fold(0.0f32, |m, (a, b)| m.max((a - b).abs())) / scale_of;
    assert!(
        worst < TOLERANCE,
        "{}/{} {:?} heads {} shapes {:?} ({:?}): error {worst}",
        std::any::type_name::<K>(),
        std::any::type_name::<V>(),
        l,
        case.num_heads,
        case.shapes,
        batch
    );
    worst
}

#[test]
fn cuda_attention_matches_the_cpu_kernels() {
    let Some(device) = device() else { return };
    let mut rng = Rng(0x5eed_cafe);
    let mut worst = 0.0f32;
    let mut cases = 0;
    for head_dim in [16, 32, 64, 96, 128] {
        for _ in 0..12 {
            let case = random_case(&mut rng, head_dim);
            worst = worst.max(run_case::<f32, f32>(&mut rng, &device, &case));
            worst = worst.max(run_case::<f16, f16>(&mut rng, &device, &case));
            worst = worst.max(run_case::<bf16, bf16>(&mut rng, &device, &case));
            cases += 3;
        }
    }
    eprintln!("{cases} cases, worst relative error {worst:e}");
}

/// q8_0 and q4_0 pages, alone and paired with f16 and each other: the GPU writes the CPU's bytes
/// (rotated into the Hadamard basis, then quantized) and attends over them as the CPU does.
#[test]
fn cuda_attention_reads_quantized_pages_as_the_cpu_does() {
    let Some(device) = device() else { return };
    let mut rng = Rng(0x000b_10c5);
    let mut worst = 0.0f32;
    let mut cases = 0;
    for head_dim in [32, 64, 96, 128] {
        for _ in 0..4 {
            let case = random_case(&mut rng, head_dim);
            worst = worst.max(run_case::<KvQ8_0, KvQ8_0>(&mut rng, &device, &case));
            worst = worst.max(run_case::<KvQ4_0, KvQ4_0>(&mut rng, &device, &case));
            worst = worst.max(run_case::<KvQ8_0, KvQ4_0>(&mut rng, &device, &case));
            worst = worst.max(run_case::<KvQ4_0, KvQ8_0>(&mut rng, &device, &case));
            worst = worst.max(run_case::<f16, KvQ8_0>(&mut rng, &device, &case));
            worst = worst.max(run_case::<f16, KvQ4_0>(&mut rng, &device, &case));
            worst = worst.max(run_case::<KvQ8_0, f16>(&mut rng, &device, &case));
            worst = worst.max(run_case::<KvQ4_0, f16>(&mut rng, &device, &case));
            cases += 8;
        }
    }
    // A long decode, split and merged, with the output rotated back after the merge.
    let case = Case {
        layout: PagedLayout { num_kv_heads: 2, head_dim: 128, page_size: 16, num_pages: 6_000 / 16 + 4 },
        num_heads: 8,
        shapes: vec![(1, 6_000)],
    };
    worst = worst.max(run_case::<KvQ8_0, KvQ4_0>(&mut rng, &device, &case));
    eprintln!("{} quantized cases, worst relative error {worst:e}", cases + 1);
}

#[test]
fn cuda_attention_splits_long_decodes_and_merges_them() {
    let Some(device) = device() else { return };
    let mut rng = Rng(7);
    // One decode row over 6,000 positions: too few blocks without splitting the keys.
    let case = Case {
        layout: PagedLayout { num_kv_heads: 2, head_dim: 128, page_size: 16, num_pages: 6_000 / 16 + 4 },
        num_heads: 8,
        shapes: vec![(1, 6_000)],
    };
    run_case::<f16, f16>(&mut rng, &device, &case);
    let l = case.layout;
    let table: Vec<u32> = (0..l.num_pages as u32).collect();
    let seqs = [SequenceAttention { query_start: 0, query_len: 1, context_len: 6_000, page_table: &table }];
    let batch = CudaAttentionBatch::new(&device, &l, 8, 1, &seqs, &[5_999]).unwrap();
    assert!(batch.num_splits() > 1, "a lone decode over 6,000 positions should be split: {batch:?}");
}

#[test]
fn cuda_attention_rejects_bad_batches() {
    let Some(device) = device() else { return };
    let l = PagedLayout { num_kv_heads: 1, head_dim: 64, page_size: 4, num_pages: 2 };
    let table = [0u32, 5];
    let seqs = [SequenceAttention { query_start: 0, query_len: 1, context_len: 8, page_table: &table }];
    assert!(CudaAttentionBatch::new(&device, &l, 1, 1, &seqs, &[0]).is_err(), "page 5 is outside the pool");
    let l80 = PagedLayout { head_dim: 80, ..l };
    assert!(CudaAttentionBatch::new(&device, &l80, 1, 0, &[], &[]).unwrap_err().to_string().contains("head_dim"));
    let ok = [SequenceAttention { query_start: 0, query_len: 1, context_len: 1, page_table: &[0] }];
    let batch = CudaAttentionBatch::new(&device, &l, 1, 1, &ok, &[0]).unwrap();
    let cache = Tensor::zeros(l.layer_len(), DType::F16, &device).unwrap();
    let short = Tensor::zeros(3, DType::F16, &device).unwrap();
    let q = Tensor::zeros((1, 64), DType::F32, &device).unwrap();
    let values = CudaKvCache::Values;
    assert!(batch.attention(&q, values(&short), values(&cache), 0.125).is_err(), "a cache of the wrong size");
    assert!(batch.attention(&q, values(&cache), values(&cache), f32::NAN).is_err(), "a NaN scale");
    let f32_cache = Tensor::zeros(l.layer_len(), DType::F32, &device).unwrap();
    let err = batch.attention(&q, values(&f32_cache), values(&cache), 0.125).unwrap_err().to_string();
    assert!(err.contains("no CUDA kernel"), "f32 K with f16 V: {err}");
    let bytes = Tensor::zeros(l.layer_len() / KV_BLOCK * 34, DType::U8, &device).unwrap();
    assert!(batch.attention(&q, CudaKvCache::Q8_0(&bytes), values(&cache), 0.125).is_ok(), "q8_0 K, f16 V");
    let err = batch.attention(&q, CudaKvCache::Q4_0(&bytes), values(&cache), 0.125).unwrap_err().to_string();
    assert!(err.contains("expected"), "q8_0's bytes as q4_0: {err}");
    let l16 = PagedLayout { head_dim: 16, ..l };
    let b16 = CudaAttentionBatch::new(&device, &l16, 1, 1, &ok, &[0]).unwrap();
    let (q16, small) = (q.narrow(1, 0, 16).unwrap(), Tensor::zeros(l16.layer_len(), DType::U8, &device).unwrap());
    let err = b16.attention(&q16, CudaKvCache::Q8_0(&small), CudaKvCache::Q8_0(&small), 0.25).unwrap_err();
    assert!(err.to_string().contains("block"), "heads of 16 values are not whole q8_0 blocks: {err}");
}
