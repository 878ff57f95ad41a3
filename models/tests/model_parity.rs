//! Parity of our decoder with transformers on tiny random-weight models of each architecture
//! (`fixtures/tiny/*`, made by `scripts/gen_model_refs.py`): logits agree whether a sequence is
//! prefilled in one go, in chunks over the pool, token by token, or batched with others, for
//! page sizes 1 and 16, from safetensors, GGUF F32 and GGUF Q8_0; on the CPU path and on the
//! tensor path (the code GPUs run, here on the CPU), and on `RADIX_TEST_DEVICE` when it names a
//! GPU (`cuda:0` in a build with `--features cuda`, as `benches/gpu/check.sh` runs it).

use std::path::{Path, PathBuf};

use radix_models::{Device, ForwardBatch, KvDType, KvPool, LoadOptions, Model, parse_device};
use serde_json::Value as Json;

/// f32 weights: relative L2 error allowed against transformers.
const F32_TOLERANCE: f32 = 1e-4;
/// Q8_0 weights with quantized matmuls: candle quantizes activations to 8 bits for the dot
/// products, as llama.cpp does. With these random weights (std 0.2, so large activations) that
/// moves logits by 4-5% against transformers on the same dequantized weights; the same file
/// loaded with `dequantize_weights` must match within `F32_TOLERANCE`, which pins the layout.
const Q8_TOLERANCE: f32 = 8e-2;
/// On a GPU, f32 weights against transformers: cuBLAS sums in another order (and may use TF32
/// internally), so bf16-level agreement (2^-7) rather than the CPU's f32-level.
const GPU_F32_TOLERANCE: f32 = 8e-3;

/// Where the third run of every check goes: the GPU named by `RADIX_TEST_DEVICE`, if any.
fn test_device() -> Option<Device> {
    let spec = std::env::var("RADIX_TEST_DEVICE").ok().filter(|s| !s.is_empty() && s != "cpu")?;
    Some(parse_device(&spec).unwrap_or_else(|e| panic!("RADIX_TEST_DEVICE={spec}: {e}")))
}

fn fixture(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch)
}

struct Reference {
    sequences: Vec<Vec<u32>>,
    logits_f32: Vec<Vec<Vec<f32>>>,
    logits_q8_0: Vec<Vec<Vec<f32>>>,
}

fn reference(arch: &str) -> Reference {
    let doc: Json =
        serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("reference.json")).unwrap()).unwrap();
    let logits = |key: &str| -> Vec<Vec<Vec<f32>>> { serde_json::from_value(doc[key].clone()).unwrap() };
    Reference {
        sequences: serde_json::from_value(doc["sequences"].clone()).unwrap(),
        logits_f32: logits("logits_f32"),
        logits_q8_0: logits("logits_q8_0"),
    }
}

fn rel_l2(ours: &[f32], want: &[f32]) -> f32 {
    let diff: f32 = ours.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f32 = want.iter().map(|b| b * b).sum();
    (diff / norm).sqrt()
}

/// Hands out pages in a scrambled order so page tables are never contiguous.
struct Pages {
    free: Vec<u32>,
}

impl Pages {
    fn new(num_pages: usize) -> Self {
        let mut free: Vec<u32> = (0..num_pages as u32).collect();
        // A fixed scramble: deterministic, and adjacent sequence pages land far apart.
        free.sort_by_key(|p| (p.wrapping_mul(2_654_435_761) >> 7) % 1021);
        Pages { free }
    }

    /// Grows `table` to hold `tokens` tokens.
    fn cover(&mut self, table: &mut Vec<u32>, tokens: usize, page_size: usize) {
        while table.len() * page_size < tokens {
            table.push(self.free.pop().expect("test pool is large enough"));
        }
    }
}

/// One sequence fed in the given chunks; returns (position of the last token, logits) per chunk.
fn run_chunks(
    model: &Model,
    pool: &mut KvPool,
    pages: &mut Pages,
    tokens: &[u32],
    chunks: &[usize],
) -> Vec<(usize, Vec<f32>)> {
    let mut table = Vec::new();
    let mut done = 0;
    let mut out = Vec::new();
    for &len in chunks {
        pages.cover(&mut table, done + len, pool.page_size());
        let mut batch = ForwardBatch::default();
        batch.push(&tokens[done..done + len], done + len, table.clone(), true);
        let logits = model.forward(&batch, pool).unwrap();
        done += len;
        out.push((done - 1, logits.get(0).unwrap().to_vec1::<f32>().unwrap()));
    }
    out
}

fn check_model(arch: &str, file: &str, quantized: bool, dequantize_weights: bool) {
    for tensor_path in [false, true] {
        check_model_on(arch, file, quantized, dequantize_weights, tensor_path, Device::Cpu);
    }
    if let Some(device) = test_device() {
        check_model_on(arch, file, quantized, dequantize_weights, true, device);
    }
}

fn check_model_on(
    arch: &str,
    file: &str,
    quantized: bool,
    dequantize_weights: bool,
    tensor_path: bool,
    device: Device,
) {
    let reference = reference(arch);
    let want = if quantized { &reference.logits_q8_0 } else { &reference.logits_f32 };
    let tolerance = match (quantized && !dequantize_weights, device.is_cpu()) {
        (true, _) => Q8_TOLERANCE,
        (false, true) => F32_TOLERANCE,
        (false, false) => GPU_F32_TOLERANCE,
    };
    let where_ = radix_models::device_name(&device);
    let path = fixture(arch).join(file);
    let options = LoadOptions { threads: 2, dequantize_weights, tensor_path, device, ..Default::default() };
    let model = Model::load(&path, &options).unwrap_or_else(|e| panic!("{arch}/{file}: {e}"));
    let mut worst = 0.0f32;
    let mut check = |what: &str, seq: usize, pos: usize, logits: &[f32]| {
        let err = rel_l2(logits, &want[seq][pos]);
        worst = worst.max(err);
        assert!(err < tolerance, "{arch}/{file} {what}: sequence {seq} position {pos}: relative L2 {err}");
    };
    for page_size in [1, 16] {
        let mut pool = model.new_kv_pool(page_size, 256 / page_size + 8, KvDType::F32).unwrap();
        for (s, tokens) in reference.sequences.iter().enumerate() {
            let n = tokens.len();
            let mut pages = Pages::new(pool.num_pages());
            for (pos, logits) in run_chunks(&model, &mut pool, &mut pages, tokens, &[n]) {
                check("one pass", s, pos, &logits);
            }
            let mut pages = Pages::new(pool.num_pages());
            let chunks: Vec<usize> = chunk_schedule(n, s + page_size);
            for (pos, logits) in run_chunks(&model, &mut pool, &mut pages, tokens, &chunks) {
                check("chunked prefill", s, pos, &logits);
            }
            let mut pages = Pages::new(pool.num_pages());
            let decode: Vec<usize> = std::iter::once(2).chain(std::iter::repeat_n(1, n - 2)).collect();
            for (pos, logits) in run_chunks(&model, &mut pool, &mut pages, tokens, &decode) {
                check("decode", s, pos, &logits);
            }
        }
        // Three sequences in one batch: a decode step, a prefill chunk over a cached prefix,
        // and a whole prefill.
        let mut pages = Pages::new(pool.num_pages());
        let seqs = &reference.sequences;
        let mut tables = vec![Vec::new(); 3];
        let prefix = [seqs[0].len() - 1, 6, 0];
        for (i, &p) in prefix.iter().enumerate() {
            if p > 0 {
                pages.cover(&mut tables[i], p, page_size);
                let mut warm = ForwardBatch::default();
                warm.push(&seqs[i][..p], p, tables[i].clone(), false);
                assert_eq!(model.forward(&warm, &mut pool).unwrap().dim(0).unwrap(), 0);
            }
        }
        let mut batch = ForwardBatch::default();
        let ends = [seqs[0].len(), 9, seqs[2].len()];
        for i in 0..3 {
            pages.cover(&mut tables[i], ends[i], page_size);
            batch.push(&seqs[i][prefix[i]..ends[i]], ends[i], tables[i].clone(), true);
        }
        let logits = model.forward(&batch, &mut pool).unwrap();
        for (i, end) in ends.iter().enumerate() {
            check("mixed batch", i, end - 1, &logits.get(i).unwrap().to_vec1::<f32>().unwrap());
        }
    }
    eprintln!(
        "{arch}/{file} (dequantized: {dequantize_weights}, tensor path: {tensor_path}, {where_}): worst relative L2 {worst:e}"
    );
}

/// Chunk sizes 1..=5 cycling from an offset, covering `n` tokens.
fn chunk_schedule(n: usize, offset: usize) -> Vec<usize> {
    let mut chunks = Vec::new();
    let mut left = n;
    let mut i = offset;
    while left > 0 {
        let c = (i % 5 + 1).min(left);
        chunks.push(c);
        left -= c;
        i += 2;
    }
    chunks
}

#[test]
fn llama_matches_transformers() {
    check_model("llama", "model.safetensors", false, false);
    check_model("llama", "model-f32.gguf", false, false);
    check_model("llama", "model-q8_0.gguf", true, true);
    check_model("llama", "model-q8_0.gguf", true, false);
}

#[test]
fn qwen2_matches_transformers() {
    check_model("qwen2", "model.safetensors", false, false);
    check_model("qwen2", "model-f32.gguf", false, false);
    check_model("qwen2", "model-q8_0.gguf", true, true);
    check_model("qwen2", "model-q8_0.gguf", true, false);
}

#[test]
fn qwen3_matches_transformers() {
    check_model("qwen3", "model.safetensors", false, false);
    check_model("qwen3", "model-f32.gguf", false, false);
    check_model("qwen3", "model-q8_0.gguf", true, true);
    check_model("qwen3", "model-q8_0.gguf", true, false);
}

/// Quantized K/V on the GPU against the CPU path over the same formats: both round the rows to
/// the same blocks (rotated, then quantized as ggml does), so they differ only where the GPU's
/// own f32 rounding (`GPU_F32_TOLERANCE`) puts a value on the other side of a quantization step.
/// A wrong block layout or rotation moves logits by tens of percent.
const GPU_QUANTIZED_KV_TOLERANCE: f32 = 2e-2;

/// Quantized K/V pages read by our CUDA kernels (`RADIX_TEST_DEVICE`) give the CPU path's logits
/// over the same formats, prefilled in one go, in chunks and token by token; off CUDA the tensor
/// path refuses them with a message naming where they are read.
#[test]
fn quantized_kv_on_the_device_matches_the_cpu_path() {
    use radix_models::KvTypes;
    let path = fixture("qwen3").join("model.safetensors");
    let load = |tensor_path, device| {
        Model::load(&path, &LoadOptions { threads: 2, tensor_path, device, ..Default::default() }).unwrap()
    };
    let err = load(true, Device::Cpu).new_kv_pool(16, 24, KvDType::Q8_0).unwrap_err().to_string();
    assert!(err.contains("q8_0") && err.contains("CUDA") && err.contains("f16"), "{err}");
    let Some(device) = test_device() else {
        eprintln!("SKIPPED: the GPU half: RADIX_TEST_DEVICE names no GPU (the CPU tensor path's refusal was checked)");
        return;
    };
    let (cpu, gpu) = (load(false, Device::Cpu), load(true, device));
    let reference = reference("qwen3");
    let (q8, q4, f16) = (KvDType::Q8_0, KvDType::Q4_0, KvDType::F16);
    let mut worst = 0.0f32;
    for (k, v) in [(q8, q8), (q8, q4), (q4, q4), (f16, q8), (q4, f16)] {
        let types = KvTypes { k, v };
        for page_size in [1, 16] {
            let pages = 256 / page_size + 8;
            let mut cpu_pool = cpu.new_kv_pool(page_size, pages, types).unwrap();
            let mut gpu_pool = gpu.new_kv_pool(page_size, pages, types).unwrap();
            for (s, tokens) in reference.sequences.iter().enumerate() {
                let n = tokens.len();
                let decode: Vec<usize> = std::iter::once(2).chain(std::iter::repeat_n(1, n - 2)).collect();
                for chunks in [vec![n], chunk_schedule(n, s + page_size), decode] {
                    let want = run_chunks(&cpu, &mut cpu_pool, &mut Pages::new(pages), tokens, &chunks);
                    let got = run_chunks(&gpu, &mut gpu_pool, &mut Pages::new(pages), tokens, &chunks);
                    for ((pos, want), (_, got)) in want.iter().zip(&got) {
                        let err = rel_l2(got, want);
                        worst = worst.max(err);
                        assert!(
                            err < GPU_QUANTIZED_KV_TOLERANCE,
                            "K {k} V {v} page size {page_size} sequence {s} position {pos}: relative L2 {err}"
                        );
                    }
                }
            }
        }
    }
    eprintln!("quantized K/V on the GPU vs the CPU path: worst relative L2 {worst:e}");
}
