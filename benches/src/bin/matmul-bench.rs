//! Our Q8_0 matmul ([`radix_kernels::quant::Q8_0Matrix`]) against candle's `QMatMul::forward`
//! on the same Q8_0 weights, for SmolLM2-135M's shapes.
//!
//! ```text
//! matmul-bench [--threads 2] [--reps 7] [--m 1,512]
//! ```
//!
//! - Shapes (`k -> n_out`): 576 -> 576 (attention q/o), 576 -> 1536 (MLP gate/up),
//!   1536 -> 576 (MLP down), 576 -> 49152 (tied lm_head).
//! - Weights are random f32 quantized by candle (`QTensor::quantize` to Q8_0); our matrix is
//!   built from the same bytes (`QTensor::data()`). Activations are random f32 `[m, k]`.
//! - Each figure is the median of `--reps` repetitions after a warm-up; a repetition runs the
//!   product enough times to take about 50 ms and reports the time per product. Both run with
//!   `--threads` threads (candle's pool through `CANDLE_NUM_THREADS`, ours on a rayon pool).
//! - `ratio` is candle's time over ours (above 1: ours is faster). `max diff` is the largest
//!   difference between the two outputs relative to the largest output magnitude: both
//!   quantize the activations to 8 bits, candle with f16 scales, ours with f32 ones.
//! - `ours` uses the best kernel of this CPU (VNNI where present); `avx2 ms` times our AVX2
//!   kernel alone, for CPUs without VNNI.

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use clap::Parser;
use radix_kernels::quant::{Q8_0Matrix, Q8Kernel};
use radix_models::SplitMix64;

#[derive(Parser, Debug)]
#[command(about = "Q8_0 matmul: radix-kernels vs candle on SmolLM2's shapes")]
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
}

/// (k, n_out, what) of SmolLM2-135M's matrices.
const SHAPES: [(usize, usize, &str); 4] =
    [(576, 576, "attn q/o"), (576, 1536, "mlp gate/up"), (1536, 576, "mlp down"), (576, 49152, "lm_head")];

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

fn main() -> Result<()> {
    let a = Args::parse();
    // candle 0.11 sizes its matmul pool once per process from CANDLE_NUM_THREADS.
    // SAFETY: set before any other thread exists.
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", a.threads.to_string()) };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(a.threads).build().context("thread pool")?;
    println!("threads {}, median of {} reps; ratio = candle time / ours", a.threads, a.reps);
    println!(
        "{:<18} {:>12} {:>5} {:>10} {:>10} {:>7} {:>9} {:>10}",
        "matrix", "k -> n_out", "m", "candle ms", "ours ms", "ratio", "max diff", "avx2 ms"
    );
    for (k, n_out, what) in SHAPES {
        let w = Tensor::from_vec(values(n_out * k, 1), (n_out, k), &Device::Cpu)?;
        let qt = QTensor::quantize(&w, GgmlDType::Q8_0)?;
        let ours = Q8_0Matrix::from_ggml_bytes(n_out, k, &qt.data()?)?;
        let candle = QMatMul::from_qtensor(qt)?;
        for &m in &a.m {
            let x = values(m * k, 2 + m as u64);
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu)?;
            let mut out = vec![0.0f32; m * n_out];
            let t_candle = time(a.reps, || {
                candle.forward(&xt).expect("candle forward");
            });
            let t_ours =
                pool.install(|| time(a.reps, || ours.matmul_with(&x, &mut out, Q8Kernel::Auto).expect("our matmul")));
            let t_avx2 = Q8Kernel::Avx2.is_available().then(|| {
                let mut out = vec![0.0f32; m * n_out];
                pool.install(|| time(a.reps, || ours.matmul_with(&x, &mut out, Q8Kernel::Avx2).expect("avx2")))
            });
            let reference = candle.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?;
            let scale = reference.iter().fold(0.0f32, |s, v| s.max(v.abs())).max(f32::MIN_POSITIVE);
            let diff = out.iter().zip(&reference).fold(0.0f32, |d, (a, b)| d.max((a - b).abs())) / scale;
            println!(
                "{what:<18} {:>12} {m:>5} {:>10.3} {:>10.3} {:>7.2} {diff:>9.1e} {:>10}",
                format!("{k} -> {n_out}"),
                t_candle * 1e3,
                t_ours * 1e3,
                t_candle / t_ours,
                t_avx2.map_or("-".to_owned(), |t| format!("{:.3}", t * 1e3)),
            );
        }
    }
    Ok(())
}
