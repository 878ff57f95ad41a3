//! The experts on radix-kernels' kernels against the same experts on candle's matmuls, and a
//! row's output against the same row in other batches.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};
use radix_kernels::quant::{QuantMatrix, WeightBytes};

use super::*;
use crate::layers::Weight;
use crate::rng::SplitMix64;

/// A `[n, k]` matrix of random values in [-0.5, 0.5) (times `scale`), quantized to `dtype`: on
/// candle's kernels and on ours (the same blocks).
fn linear(rng: &mut SplitMix64, n: usize, k: usize, dtype: GgmlDType, scale: f32) -> (Linear, Linear) {
    let w: Vec<f32> = (0..n * k).map(|_| ((rng.next_f64() as f32) - 0.5) * scale).collect();
    let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    if dtype == GgmlDType::F32 {
        return (
            Linear::new(Weight::Candle(QMatMul::Tensor(t.clone()))),
            Linear::new(Weight::Candle(QMatMul::Tensor(t))),
        );
    }
    let q = QTensor::quantize(&t, dtype).unwrap();
    let ty = crate::cpu_matmul::quant_type(dtype).unwrap();
    let ours = QuantMatrix::new(ty, n, k, WeightBytes::from_vec(q.data().unwrap().into_owned())).unwrap();
    (Linear::new(Weight::Candle(QMatMul::from_qtensor(q).unwrap())), Linear::new(Weight::Quant(Arc::new(ours))))
}

/// Relative L2 distance.
fn rel_l2(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// A 16-expert, top-4 layer whose experts are Q4_K (gate, up) and Q4_K or Q6_K (down, as
/// Q4_K_M files mix them), on both paths, for one row (decode), a few, and enough that every
/// expert takes several rows. Both paths sum 8-bit integer products of the same blocks; they
/// differ in how activations round to 8 bits (candle rounds halves away from zero, we round as
/// llama.cpp does, to even), in the order of float sums and in the SwiGLU's `exp` (a few ulp),
/// which moves rows by around 1e-4.
#[test]
fn experts_on_our_kernels_equal_candle_experts() {
    let (hidden, inner, n) = (512, 256, 16);
    let mut rng = SplitMix64::new(3);
    let (mut candle, mut ours) = (Vec::new(), Vec::new());
    for e in 0..n {
        let (gc, go) = linear(&mut rng, inner, hidden, GgmlDType::Q4K, 0.2);
        let (uc, uo) = linear(&mut rng, inner, hidden, GgmlDType::Q4K, 0.2);
        let (dc, d_o) = linear(&mut rng, hidden, inner, if e % 2 == 0 { GgmlDType::Q6K } else { GgmlDType::Q4K }, 0.2);
        candle.push(Expert { gate: gc, up: uc, down: dc });
        ours.push(Expert { gate: go, up: uo, down: d_o });
    }
    assert!(cpu::cpu_experts(&candle).is_none(), "candle's matrices stay on candle's path");
    let on_cpu = cpu::cpu_experts(&ours).expect("every matrix is on our kernels");
    let (router, _) = linear(&mut rng, n, hidden, GgmlDType::F32, 1.0);
    let layer = |experts, on_cpu| SparseMoe {
        router: router.clone(),
        experts,
        num_experts: n,
        experts_per_token: 4,
        norm_topk_prob: true,
        shared: None,
        on_cpu,
        placement: ExpertPlacement::WithModel,
    };
    // Each row's experts and weights, as a router would choose them.
    let routed_for = |rows: usize| {
        let mut routed = vec![(Vec::new(), Vec::new()); n];
        for row in 0..rows {
            for j in 0..4 {
                let e = (row * 5 + j * 3) % n;
                routed[e].0.push(row as u32);
                routed[e].1.push(0.1 + 0.2 * j as f32);
            }
        }
        routed
    };
    let x: Vec<f32> = (0..70 * hidden).map(|_| (rng.next_f64() as f32) * 2.0 - 1.0).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let experts_of = |rows: usize| {
        let x = Tensor::from_vec(x[..rows * hidden].to_vec(), (rows, hidden), &Device::Cpu).unwrap();
        let y = pool.install(|| cpu::forward(on_cpu.as_slice(), &x, &routed_for(rows))).unwrap();
        y.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let all = experts_of(70);
    for rows in [1, 5, 33] {
        // Batch invariance: these rows are bitwise the first rows of the 70-row batch (the
        // experts' part; the router is a float matmul on candle's kernel).
        let got = experts_of(rows);
        assert!(got.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows} rows differ in a batch of 70");
    }
    let (on_candle, on_kernel) = (layer(candle, None), layer(Vec::new(), Some(on_cpu)));
    for rows in [1, 5, 70] {
        let x = Tensor::from_vec(x[..rows * hidden].to_vec(), (rows, hidden), &Device::Cpu).unwrap();
        let want = on_candle.forward(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let got = pool.install(|| on_kernel.forward(&x)).unwrap();
        assert_eq!(got.dims(), [rows, hidden]);
        let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let err = rel_l2(&got, &want);
        eprintln!("{rows} rows: relative L2 {err:e}");
        assert!(err < 1e-3, "{rows} rows: relative L2 {err}");
    }
}
