//! The Q8_0 matmul against straightforward f32 references, across kernels and thread
//! counts, and its input validation.
//!
//! Tolerances (per output element `(i, j)`, with `‖·‖` the Euclidean norm):
//! - against the f32 product of the dequantized weights and the quantize-dequantized
//!   activations (same math, computed in f64): `1e-5 * ‖w_j‖ * ‖x_i‖`. The integer block sums
//!   are exact; the f32 scale products and the accumulation over at most 48 blocks round by
//!   well under that.
//! - against the product with the unquantized activations: `sqrt(32) / 254 * ‖w_j‖ * ‖x_i‖`
//!   plus the above (rounding each activation moves it by at most half its block's step,
//!   `max|x_block| / 254`), and over each whole product a relative Frobenius error under 3%
//!   (the test activations carry 20x outliers, as real ones do, which coarsen their blocks'
//!   steps: the error measures 0.5-1.6% here).
//! - the AVX2, VNNI and portable kernels, and any thread count, agree bit for bit.

use half::f16;
use radix_kernels::KernelError;
use radix_kernels::quant::{Q8_0_BLOCK_BYTES, Q8_0Matrix, Q8Kernel, QK8_0, QuantizedRows, quantize_block_q8_0};

mod common;

use common::Rng;

/// Random GGML Q8_0 bytes: every int8 value (-128 included) and scales of varied sizes.
fn random_ggml(rng: &mut Rng, n_out: usize, k: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(n_out * k / QK8_0 * Q8_0_BLOCK_BYTES);
    for _ in 0..n_out * k / QK8_0 {
        let d = f16::from_f32(0.01 * (1.0 + rng.unit()) + 1e-4);
        bytes.extend_from_slice(&d.to_le_bytes());
        bytes.extend((0..QK8_0).map(|_| rng.next() as u8));
    }
    bytes
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&a, &b)| a as f64 * b as f64).sum()
}

fn run(w: &Q8_0Matrix, x: &[f32], kernel: Q8Kernel) -> Vec<f32> {
    let mut out = vec![f32::NAN; x.len() / w.k() * w.n_out()];
    w.matmul_with(x, &mut out, kernel).expect("valid shapes");
    out
}

/// Checks one product against both references and returns its output.
fn check_shape(rng: &mut Rng, k: usize, n_out: usize, m: usize) -> Vec<f32> {
    let w = Q8_0Matrix::from_ggml_bytes(n_out, k, &random_ggml(rng, n_out, k)).unwrap();
    let x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
    let out = run(&w, &x, Q8Kernel::Auto);
    let wd = w.dequantize();
    let xd = QuantizedRows::new(&x, k).unwrap().dequantize();
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    for i in 0..m {
        let (xi, xdi) = (&x[i * k..(i + 1) * k], &xd[i * k..(i + 1) * k]);
        for j in 0..n_out {
            let wj = &wd[j * k..(j + 1) * k];
            let got = out[i * n_out + j] as f64;
            let scale = norm(wj) * norm(xdi);
            let same_math = dot(wj, xdi);
            let tight = 1e-5 * scale;
            assert!(
                (got - same_math).abs() <= tight,
                "k={k} n_out={n_out} m={m} ({i},{j}): {got} vs {same_math} (tolerance {tight})"
            );
            let plain = dot(wj, xi);
            let loose = (32f64).sqrt() / 254.0 * norm(wj) * norm(xi) + tight;
            assert!(
                (got - plain).abs() <= loose,
                "k={k} n_out={n_out} m={m} ({i},{j}): {got} vs unquantized {plain} (tolerance {loose})"
            );
            err2 += (got - plain).powi(2);
            ref2 += plain.powi(2);
        }
    }
    if m * n_out >= 50 {
        let rel = (err2 / ref2).sqrt();
        assert!(rel < 0.03, "k={k} n_out={n_out} m={m}: relative error {rel} vs unquantized activations");
    }
    out
}

#[test]
fn matches_references_on_awkward_shapes_and_kernels_agree() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for k in [32, 64, 576, 1536, 896] {
        for n_out in [1, 3, 17, 576, 1000] {
            for m in [1, 2, 7, 33, 130] {
                let seed = rng.next() | 1;
                let mut shape_rng = Rng(seed);
                let auto = check_shape(&mut shape_rng, k, n_out, m);
                // Same inputs again, through the portable kernel.
                let mut shape_rng = Rng(seed);
                let w = Q8_0Matrix::from_ggml_bytes(n_out, k, &random_ggml(&mut shape_rng, n_out, k)).unwrap();
                let x: Vec<f32> = (0..m * k).map(|_| shape_rng.activation()).collect();
                let scalar = run(&w, &x, Q8Kernel::Scalar);
                let same = auto.iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "k={k} n_out={n_out} m={m}: the auto and portable kernels differ");
            }
        }
    }
    assert!(Q8Kernel::Auto.is_available() && Q8Kernel::Scalar.is_available());
    if !Q8Kernel::Avx2.is_available() {
        eprintln!("note: no AVX2 on this CPU; only the portable kernel was checked");
    }
    eprintln!(
        "auto kernel checked against the references: AVX2 {}, VNNI {}",
        Q8Kernel::Avx2.is_available(),
        Q8Kernel::Vnni.is_available()
    );
}

#[test]
fn simd_kernels_equal_portable_bitwise() {
    for kernel in [Q8Kernel::Avx2, Q8Kernel::Vnni] {
        if !kernel.is_available() {
            eprintln!("skipped {kernel:?}: this CPU lacks it");
            continue;
        }
        let mut rng = Rng(7);
        for (k, n_out, m) in [(576, 1000, 130), (1536, 17, 33), (896, 3, 7), (32, 576, 1), (64, 1, 2), (1536, 576, 5)] {
            let w = Q8_0Matrix::from_ggml_bytes(n_out, k, &random_ggml(&mut rng, n_out, k)).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
            let (a, s) = (run(&w, &x, kernel), run(&w, &x, Q8Kernel::Scalar));
            let same = a.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{kernel:?}: k={k} n_out={n_out} m={m}");
        }
    }
}

#[test]
fn thread_count_does_not_change_results() {
    let mut rng = Rng(11);
    for (k, n_out, m) in [(576, 1000, 130), (896, 576, 1), (1536, 17, 70)] {
        let w = Q8_0Matrix::from_ggml_bytes(n_out, k, &random_ggml(&mut rng, n_out, k)).unwrap();
        let x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
        let results: Vec<Vec<f32>> = [1, 2, 3, 5]
            .into_iter()
            .map(|threads| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| run(&w, &x, Q8Kernel::Auto))
            })
            .collect();
        for r in &results[1..] {
            assert!(r.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "k={k} n_out={n_out} m={m}");
        }
    }
}

#[test]
fn ggml_bytes_round_trip_through_dequantize() {
    let mut rng = Rng(3);
    let (n_out, k) = (19, 96);
    let bytes = random_ggml(&mut rng, n_out, k);
    let w = Q8_0Matrix::from_ggml_bytes(n_out, k, &bytes).unwrap();
    assert_eq!((w.n_out(), w.k()), (n_out, k));
    let wd = w.dequantize();
    for (block, values) in bytes.chunks_exact(Q8_0_BLOCK_BYTES).zip(wd.chunks_exact(QK8_0)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        for (&q, &v) in block[2..].iter().zip(values) {
            assert_eq!(v, q as i8 as f32 * d);
        }
    }
}

#[test]
fn quantize_weights_stays_within_half_a_step() {
    let mut rng = Rng(5);
    let (n_out, k) = (10, 64);
    let w: Vec<f32> = (0..n_out * k).map(|_| rng.activation()).collect();
    let wd = Q8_0Matrix::quantize(n_out, k, &w).unwrap().dequantize();
    for (orig, deq) in w.chunks_exact(QK8_0).zip(wd.chunks_exact(QK8_0)) {
        let amax = orig.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        // Half a step, plus the f16 rounding of the scale (relative 2^-11) at up to 127 steps.
        let step = amax / 127.0;
        for (&a, &b) in orig.iter().zip(deq) {
            assert!((a - b).abs() <= step * 0.5 + amax * 1e-3, "{a} vs {b} (step {step})");
        }
    }
}

#[test]
fn activation_blocks_quantize_as_documented() {
    let mut rng = Rng(13);
    for _ in 0..200 {
        let x: [f32; QK8_0] = std::array::from_fn(|_| rng.activation());
        let (q, d) = quantize_block_q8_0(&x);
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        assert_eq!(d, amax / 127.0);
        assert!(q.iter().any(|&v| v.unsigned_abs() == 127), "the largest value maps to ±127");
        for (&v, &q) in x.iter().zip(&q) {
            assert!(q != i8::MIN);
            assert!((v - q as f32 * d).abs() <= d * 0.5 * (1.0 + 1e-5), "{v} -> {q} * {d}");
        }
    }
    assert_eq!(quantize_block_q8_0(&[0.0; QK8_0]), ([0; QK8_0], 0.0));
    let mut nan = [1.0f32; QK8_0];
    nan[3] = f32::NAN;
    let (q, d) = quantize_block_q8_0(&nan);
    assert_eq!((q[3], q[0], d), (0, 127, 1.0 / 127.0));
}

#[test]
fn bad_shapes_are_errors_and_leave_out_untouched() {
    let bytes = vec![0u8; 3 * Q8_0_BLOCK_BYTES * 2];
    for (n_out, k, len) in [(3, 0, 0), (3, 33, bytes.len()), (0, 64, 0), (3, 64, bytes.len() - 1), (4, 64, bytes.len())]
    {
        let r = Q8_0Matrix::from_ggml_bytes(n_out, k, &bytes[..len.min(bytes.len())]);
        assert!(r.is_err(), "n_out={n_out} k={k} len={len}");
    }
    assert!(matches!(Q8_0Matrix::from_ggml_bytes(usize::MAX, 64, &bytes), Err(KernelError::BadQuantized(_))));
    assert!(Q8_0Matrix::quantize(2, 64, &[0.0; 127]).is_err());
    assert!(Q8_0Matrix::quantize(2, 48, &[0.0; 96]).is_err());
    assert!(QuantizedRows::new(&[0.0; 65], 32).is_err());
    assert!(QuantizedRows::new(&[0.0; 64], 0).is_err());

    let w = Q8_0Matrix::from_ggml_bytes(3, 64, &bytes).unwrap();
    let mut out = vec![42.0f32; 6];
    let ragged = w.matmul(&[1.0; 65], &mut out[..3]);
    assert!(matches!(ragged, Err(KernelError::RaggedRows { .. })), "{ragged:?}");
    let short_out = w.matmul(&[1.0; 128], &mut out[..5]);
    assert!(matches!(short_out, Err(KernelError::LengthMismatch { .. })), "{short_out:?}");
    let other_k = QuantizedRows::new(&[1.0; 64], 32).unwrap();
    assert!(w.matmul_quantized(&other_k, &mut out, Q8Kernel::Auto).is_err());
    assert!(out.iter().all(|&v| v == 42.0), "an error wrote to out");
    for kernel in [Q8Kernel::Avx2, Q8Kernel::Vnni] {
        if !kernel.is_available() {
            let r = w.matmul_with(&[1.0; 64], &mut out[..3], kernel);
            assert!(matches!(r, Err(KernelError::Unavailable(_))), "{r:?}");
        }
    }

    // No rows is a valid, empty product; non-finite inputs do not panic.
    w.matmul(&[], &mut []).unwrap();
    let mut x = vec![1.0f32; 128];
    x[5] = f32::INFINITY;
    x[70] = f32::NAN;
    w.matmul(&x, &mut out).unwrap();
}

#[test]
fn quantized_activations_can_be_shared() {
    let mut rng = Rng(17);
    let (k, m) = (576, 5);
    let x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
    let xq = QuantizedRows::new(&x, k).unwrap();
    assert_eq!((xq.rows(), xq.quants().len(), xq.scales().len()), (m, m * k, m * k / QK8_0));
    for n_out in [7, 64] {
        let w = Q8_0Matrix::from_ggml_bytes(n_out, k, &random_ggml(&mut rng, n_out, k)).unwrap();
        let mut shared = vec![0.0f32; m * n_out];
        w.matmul_quantized(&xq, &mut shared, Q8Kernel::Auto).unwrap();
        assert_eq!(shared, run(&w, &x, Q8Kernel::Auto));
    }
}
