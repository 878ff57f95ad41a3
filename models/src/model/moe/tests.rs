//! The experts on radix-kernels' K-quant kernel against the same experts on candle's matmuls.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};

use super::*;
use crate::layers::Weight;
use crate::rng::SplitMix64;

/// A `[n, k]` matrix of random values in [-0.5, 0.5) (times `scale`), quantized to `dtype`.
fn linear(rng: &mut SplitMix64, n: usize, k: usize, dtype: GgmlDType, scale: f32) -> Linear {
    let w: Vec<f32> = (0..n * k).map(|_| ((rng.next_f64() as f32) - 0.5) * scale).collect();
    let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    let weight = match dtype {
        GgmlDType::F32 => QMatMul::Tensor(t),
        _ => QMatMul::from_qtensor(QTensor::quantize(&t, dtype).unwrap()).unwrap(),
    };
    Linear::new(Weight::Candle(weight))
}

/// Relative L2 distance.
fn rel_l2(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// A 16-expert, top-4 layer whose experts are Q4_K (gate, up) and Q4_K or Q6_K (down, as
/// Q4_K_M files mix them), on both paths, for one row (decode), a few, and enough that every
/// expert takes more than one pass of eight rows. Both paths sum the same 8-bit integer
/// products (one matrix alone agrees with candle's to a relative L2 of 1.3e-7 to 1.7e-7 at
/// 5 to 70 rows); they differ in the order of float sums, the SwiGLU's `exp` (a few ulp) and
/// so, rarely, in which way a value of the down projection's input rounds to 8 bits, which
/// moves a row by a few 1e-3. Measured: 4e-7 (1 row), 3e-7 (5), 8e-5 (70).
#[test]
fn packed_experts_equal_candle_experts() {
    if !radix_kernels::quant::kquant_kernel_is_fast() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI, so the K-quant kernel is not used");
        return;
    }
    let (hidden, inner, n) = (512, 256, 16);
    let mut rng = SplitMix64::new(3);
    let experts: Vec<Expert> = (0..n)
        .map(|e| Expert {
            gate: linear(&mut rng, inner, hidden, GgmlDType::Q4K, 0.2),
            up: linear(&mut rng, inner, hidden, GgmlDType::Q4K, 0.2),
            down: linear(&mut rng, hidden, inner, if e % 2 == 0 { GgmlDType::Q6K } else { GgmlDType::Q4K }, 0.2),
        })
        .collect();
    let packed = packed::pack_experts(&experts).unwrap().expect("Q4_K/Q6_K experts are packed");
    let router = linear(&mut rng, n, hidden, GgmlDType::F32, 1.0);
    let layer = |experts, packed| SparseMoe {
        router: router.clone(),
        experts,
        num_experts: n,
        experts_per_token: 4,
        norm_topk_prob: true,
        shared: None,
        packed,
    };
    let (on_candle, on_kernel) = (layer(experts, None), layer(Vec::new(), Some(packed)));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    for rows in [1, 5, 70] {
        let x: Vec<f32> = (0..rows * hidden).map(|_| (rng.next_f64() as f32) * 2.0 - 1.0).collect();
        let x = Tensor::from_vec(x, (rows, hidden), &Device::Cpu).unwrap();
        let want = on_candle.forward(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let got = pool.install(|| on_kernel.forward(&x)).unwrap();
        assert_eq!(got.dims(), [rows, hidden]);
        let err = rel_l2(&got.flatten_all().unwrap().to_vec1::<f32>().unwrap(), &want);
        eprintln!("{rows} rows: relative L2 {err:e}");
        assert!(err < 1e-3, "{rows} rows: relative L2 {err}");
    }
}
