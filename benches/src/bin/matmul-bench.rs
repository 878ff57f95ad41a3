//! Our quantized matmuls ([`radix_kernels::quant::QuantMatrix`], weights in place) against
//! candle's `QMatMul::forward` on the same GGML blocks, per type and shape, and each of our
//! kernels this CPU runs (portable, AVX2, VNNI, AVX-512).
//!
//! ```text
//! matmul-bench [--threads 2] [--reps 7] [--m 1,512] [--types q4_0,q4_k,...] [--shapes 1024:3072,...]
//! ```
//!
//! - Shapes are `k:n_out` (default: Qwen3-0.6B's q, gate/up and down projections).
//! - Weights are random f32 quantized by candle (`QTensor::quantize`); our matrix borrows the
//!   same bytes (`QTensor::data()`). Activations are random f32 `[m, k]`.
//! - Each figure is the median of `--reps` repetitions after a warm-up; a repetition runs the
//!   product enough times to take about 50 ms and reports the time per product. Both run with
//!   `--threads` threads (candle's pool through `CANDLE_NUM_THREADS`, ours on a rayon pool),
//!   ours including the activations' quantization.
//! - `--layout interleaved` times our weights repacked as the server holds them on x86 (16-row
//!   groups); `GB/s` is the weight bytes our product reads over its time (a shape larger than
//!   the last-level cache, e.g. `1024:151936`, a vocabulary head, shows the memory stream).
//! - `ratio` is candle's time over ours (above 1: ours is faster). `max diff` is the largest
//!   difference between the two outputs relative to the largest output magnitude (both round
//!   activations to 8 bits, differently).

use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use clap::Parser;
use radix_kernels::quant::{LayerInput, QuantKernel, QuantMatrix, QuantType, Split, WeightBytes};
use radix_models::SplitMix64;

#[derive(Parser, Debug)]
#[command(about = "Quantized matmuls: radix-kernels vs candle, per type and kernel")]
struct Args {
    /// Threads for both implementations.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Activation rows to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,512")]
    m: Vec<usize>,
    /// Weight types (comma-separated GGML names, lower case).
    #[arg(long, value_delimiter = ',', default_value = "q4_0,q4_1,q5_0,q8_0,q4_k,q5_k,q6_k")]
    types: Vec<String>,
    /// Shapes `k:n_out` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1024:2048,1024:3072,3072:1024")]
    shapes: Vec<String>,
    /// Our weights' layout: `in-place` (the file's blocks) or `interleaved` (repacked in groups
    /// of 16 rows, as the server loads them on x86).
    #[arg(long, default_value = "in-place")]
    layout: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median seconds per call of `f`, over `reps` repetitions of about 50 ms each.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    let once = t.elapsed().as_secs_f64().max(1e-6);
    let iters = ((0.05 / once).ceil() as usize).clamp(1, 10_000);
    let samples = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    median(samples)
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect()
}

fn parse_type(s: &str) -> Result<(GgmlDType, QuantType)> {
    Ok(match s {
        "q4_0" => (GgmlDType::Q4_0, QuantType::Q4_0),
        "q4_1" => (GgmlDType::Q4_1, QuantType::Q4_1),
        "q5_0" => (GgmlDType::Q5_0, QuantType::Q5_0),
        "q5_1" => (GgmlDType::Q5_1, QuantType::Q5_1),
        "q8_0" => (GgmlDType::Q8_0, QuantType::Q8_0),
        "q4_k" => (GgmlDType::Q4K, QuantType::Q4_K),
        "q5_k" => (GgmlDType::Q5K, QuantType::Q5_K),
        "q6_k" => (GgmlDType::Q6K, QuantType::Q6_K),
        other => bail!("unknown type {other:?}: one of q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k"),
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    let interleaved = match a.layout.as_str() {
        "in-place" => false,
        "interleaved" => true,
        other => bail!("--layout {other:?}: `in-place` or `interleaved`"),
    };
    // candle 0.11 sizes its matmul pool once per process from CANDLE_NUM_THREADS.
    // SAFETY: set before any other thread exists.
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", a.threads.to_string()) };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(a.threads).build().context("thread pool")?;
    let kernels: Vec<QuantKernel> = QuantKernel::ALL.into_iter().filter(|k| k.is_available()).collect();
    println!(
        "threads {}, median of {} reps; ratio = candle time / ours ({}); ISA {}",
        a.threads,
        a.reps,
        QuantKernel::Auto.resolve().name(),
        radix_kernels::CpuIsa::active().name()
    );
    print!(
        "{:<6} {:>12} {:>5} {:>10} {:>10} {:>7} {:>7} {:>9}",
        "type", "k -> n_out", "m", "candle ms", "ours ms", "ratio", "GB/s", "max diff"
    );
    for k in &kernels {
        print!(" {:>10}", format!("{} ms", k.name()));
    }
    println!();
    for t in &a.types {
        let (dtype, ty) = parse_type(t)?;
        for shape in &a.shapes {
            let (k, n_out) = shape.split_once(':').context("a shape is k:n_out")?;
            let (k, n_out): (usize, usize) = (k.parse()?, n_out.parse()?);
            let w = Tensor::from_vec(values(n_out * k, 1), (n_out, k), &Device::Cpu)?;
            let qt = QTensor::quantize(&w, dtype)?;
            let ours = QuantMatrix::new(ty, n_out, k, WeightBytes::from_vec(qt.data()?.into_owned()))?;
            let ours = if interleaved { ours.interleaved() } else { ours };
            let candle = QMatMul::from_qtensor(qt)?;
            for &m in &a.m {
                let x = values(m * k, 2 + m as u64);
                let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu)?;
                let mut out = vec![0.0f32; m * n_out];
                let t_candle = time(a.reps, || {
                    candle.forward(&xt).expect("candle forward");
                });
                let mut run = |kernel: QuantKernel| {
                    pool.install(|| {
                        time(a.reps, || {
                            let input = LayerInput::new(&x, k).expect("whole rows");
                            ours.matmul_with(&input, None, &mut out, kernel, Split::default()).expect("our matmul")
                        })
                    })
                };
                let t_ours = run(QuantKernel::Auto);
                let per_kernel: Vec<f64> = kernels.iter().map(|&kernel| run(kernel)).collect();
                let reference = candle.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?;
                let scale = reference.iter().fold(0.0f32, |s, v| s.max(v.abs())).max(f32::MIN_POSITIVE);
                let diff = out.iter().zip(&reference).fold(0.0f32, |d, (a, b)| d.max((a - b).abs())) / scale;
                print!(
                    "{t:<6} {:>12} {m:>5} {:>10.3} {:>10.3} {:>7.2} {:>7.1} {diff:>9.1e}",
                    format!("{k} -> {n_out}"),
                    t_candle * 1e3,
                    t_ours * 1e3,
                    t_candle / t_ours,
                    ours.bytes().len() as f64 / t_ours / 1e9,
                );
                for t in per_kernel {
                    print!(" {:>10.3}", t * 1e3);
                }
                println!();
            }
        }
    }
    Ok(())
}
