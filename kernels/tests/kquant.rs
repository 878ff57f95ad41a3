//! The Q4_K and Q6_K matmuls against f64 references built from an independent decoding of the
//! GGML block layouts (written from ggml's `dequantize_row_q4_K` / `dequantize_row_q6_K`),
//! across kernels and thread counts, and their input validation.
//!
//! Tolerances (per output element `(i, j)`): against the f64 product of the reference-decoded
//! weights and the Q8_K-dequantized activations, `1e-5 * Σ_t |part_t| * |x_t|` where the parts
//! are the scale term and the minimum term of each weight taken separately (Q4_K subtracts
//! them, so their sizes, not the difference, bound the f32 rounding). The integer sums are
//! exact; the error is a few f32 roundings per 256-value block. The scalar and AVX2 kernels,
//! and any thread count, agree bit for bit.

use half::f16;
use radix_kernels::KernelError;
use radix_kernels::quant::{Q4_K_BLOCK_BYTES, Q4KMatrix, Q6_K_BLOCK_BYTES, Q6KMatrix, Q8KRows, Q8Kernel, QK_K};

mod common;

use common::Rng;

/// An f16 scale: mostly ordinary, sometimes the extremes (smallest normal, largest finite, 0).
fn scale(rng: &mut Rng) -> [u8; 2] {
    let v = match rng.next() % 16 {
        0 => f16::MIN_POSITIVE,
        1 => f16::MAX,
        2 => f16::ZERO,
        _ => f16::from_f32(0.02 * (1.0 + rng.unit()) + 1e-4),
    };
    v.to_le_bytes()
}

/// Random Q4_K bytes: every bit pattern of scales and values, scales of varied sizes.
fn random_q4k(rng: &mut Rng, blocks: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(blocks * Q4_K_BLOCK_BYTES);
    for _ in 0..blocks {
        bytes.extend_from_slice(&scale(rng));
        bytes.extend_from_slice(&scale(rng));
        bytes.extend((0..Q4_K_BLOCK_BYTES - 4).map(|_| rng.next() as u8));
    }
    bytes
}

/// Random Q6_K bytes (int8 scales -128 included).
fn random_q6k(rng: &mut Rng, blocks: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(blocks * Q6_K_BLOCK_BYTES);
    for _ in 0..blocks {
        bytes.extend((0..Q6_K_BLOCK_BYTES - 2).map(|_| rng.next() as u8));
        bytes.extend_from_slice(&scale(rng));
    }
    bytes
}

/// ggml's Q4_K decoding: (scale term, minimum term) per value; the weight is their difference.
fn ref_q4k(bytes: &[u8]) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for b in bytes.chunks_exact(Q4_K_BLOCK_BYTES) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
        let dmin = f16::from_le_bytes([b[2], b[3]]).to_f64();
        let sc = &b[4..16];
        let get = |j: usize| -> (u8, u8) {
            if j < 4 {
                (sc[j] & 63, sc[j + 4] & 63)
            } else {
                ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
            }
        };
        let mut q = &b[16..];
        for is in (0..8).step_by(2) {
            let (s1, m1) = get(is);
            let (s2, m2) = get(is + 1);
            out.extend(q[..32].iter().map(|&v| (d * s1 as f64 * (v & 0xF) as f64, dmin * m1 as f64)));
            out.extend(q[..32].iter().map(|&v| (d * s2 as f64 * (v >> 4) as f64, dmin * m2 as f64)));
            q = &q[32..];
        }
    }
    out
}

/// ggml's Q6_K decoding, as (value, 0) pairs to share the checking code with Q4_K.
fn ref_q6k(bytes: &[u8]) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for b in bytes.chunks_exact(Q6_K_BLOCK_BYTES) {
        let d = f16::from_le_bytes([b[208], b[209]]).to_f64();
        let mut y = [0.0f64; QK_K];
        for n in 0..2 {
            let (ql, qh, sc) = (&b[64 * n..], &b[128 + 32 * n..], &b[192 + 8 * n..]);
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                let s = |i: usize| sc[i] as i8 as f64;
                y[128 * n + l] = d * s(is) * q1 as f64;
                y[128 * n + l + 32] = d * s(is + 2) * q2 as f64;
                y[128 * n + l + 64] = d * s(is + 4) * q3 as f64;
                y[128 * n + l + 96] = d * s(is + 6) * q4 as f64;
            }
        }
        out.extend(y.iter().map(|&v| (v, 0.0)));
    }
    out
}

/// The two formats behind one interface, so every check runs on both.
enum Mat {
    Q4(Q4KMatrix),
    Q6(Q6KMatrix),
}

impl Mat {
    fn build(q6: bool, rng: &mut Rng, n_out: usize, k: usize) -> (Mat, Vec<(f64, f64)>) {
        let blocks = n_out * k / QK_K;
        if q6 {
            let bytes = random_q6k(rng, blocks);
            (Mat::Q6(Q6KMatrix::from_ggml_bytes(n_out, k, &bytes).unwrap()), ref_q6k(&bytes))
        } else {
            let bytes = random_q4k(rng, blocks);
            (Mat::Q4(Q4KMatrix::from_ggml_bytes(n_out, k, &bytes).unwrap()), ref_q4k(&bytes))
        }
    }

    fn matmul_with(&self, x: &[f32], out: &mut [f32], kernel: Q8Kernel) -> Result<(), KernelError> {
        match self {
            Mat::Q4(w) => w.matmul_with(x, out, kernel),
            Mat::Q6(w) => w.matmul_with(x, out, kernel),
        }
    }

    fn dequantize(&self) -> Vec<f32> {
        match self {
            Mat::Q4(w) => w.dequantize(),
            Mat::Q6(w) => w.dequantize(),
        }
    }

    fn run(&self, x: &[f32], n_out: usize, k: usize, kernel: Q8Kernel) -> Vec<f32> {
        let mut out = vec![f32::NAN; x.len() / k * n_out];
        self.matmul_with(x, &mut out, kernel).expect("valid shapes");
        out
    }
}

fn kernels() -> Vec<Q8Kernel> {
    [Q8Kernel::Scalar, Q8Kernel::Avx2, Q8Kernel::Vnni].into_iter().filter(|k| k.is_available()).collect()
}

/// Checks one product against the reference, and every kernel against the scalar one.
fn check(q6: bool, rng: &mut Rng, k: usize, n_out: usize, m: usize) {
    let (w, reference) = Mat::build(q6, rng, n_out, k);
    // The matrix's own decoding agrees with the reference one (up to f32 rounding).
    for (got, &(a, b)) in w.dequantize().iter().zip(&reference) {
        let want = a - b;
        assert!((*got as f64 - want).abs() <= 1e-6 * (a.abs() + b.abs()), "q6={q6}: {got} vs {want}");
    }
    let x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
    let xd = Q8KRows::new(&x, k).unwrap().dequantize();
    let out = w.run(&x, n_out, k, Q8Kernel::Scalar);
    for i in 0..m {
        let xi = &xd[i * k..(i + 1) * k];
        for j in 0..n_out {
            let wj = &reference[j * k..(j + 1) * k];
            let want: f64 = wj.iter().zip(xi).map(|(&(a, b), &x)| (a - b) * x as f64).sum();
            let size: f64 = wj.iter().zip(xi).map(|(&(a, b), &x)| (a.abs() + b.abs()) * (x as f64).abs()).sum();
            let got = out[i * n_out + j] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * size + 1e-30,
                "q6={q6} k={k} n_out={n_out} m={m} ({i}, {j}): got {got}, want {want}, size {size}"
            );
        }
    }
    for kernel in kernels() {
        let other = w.run(&x, n_out, k, kernel);
        assert!(
            out.iter().zip(&other).all(|(a, b)| a.to_bits() == b.to_bits()),
            "q6={q6} {kernel:?} differs from scalar at k={k} n_out={n_out} m={m}"
        );
    }
}

#[test]
fn q4_k_and_q6_k_match_the_reference_on_many_shapes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Each listed k, n_out and m appears; sizes kept so the f64 reference stays quick.
    let shapes = [
        (256, 1, 1),
        (1024, 7, 3),
        (3072, 64, 70),
        (256, 1000, 3),
        (1024, 1000, 1),
        (3072, 7, 70),
        (256, 64, 70),
        (1024, 1, 70),
    ];
    for q6 in [false, true] {
        for &(k, n_out, m) in &shapes {
            check(q6, &mut rng, k, n_out, m);
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = Rng(7);
    let (k, n_out, m) = (1024, 100, 70);
    for q6 in [false, true] {
        let (w, _) = Mat::build(q6, &mut rng, n_out, k);
        let x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let base = one.install(|| w.run(&x, n_out, k, Q8Kernel::Auto));
        for threads in [2, 3, 8] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            // Whole products and single rows (the decode split) alike.
            let got = pool.install(|| w.run(&x, n_out, k, Q8Kernel::Auto));
            assert!(base.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "q6={q6} threads={threads}");
            let row = pool.install(|| w.run(&x[..k], n_out, k, Q8Kernel::Auto));
            assert!(base[..n_out].iter().zip(&row).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}

#[test]
fn q8_k_activations_carry_exact_sums_and_bounded_error() {
    let mut rng = Rng(11);
    let k = 512;
    let x: Vec<f32> = (0..3 * k).map(|_| rng.activation()).collect();
    let q = Q8KRows::new(&x, k).unwrap();
    assert_eq!(q.rows(), 3);
    let xd = q.dequantize();
    for (xb, db) in x.chunks_exact(QK_K).zip(xd.chunks_exact(QK_K)) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (a, b) in xb.iter().zip(db) {
            // Half a step of `amax / 127`, plus f32 rounding.
            assert!((a - b).abs() <= amax / 254.0 * 1.0001, "{a} vs {b}");
        }
    }
    // Zeros and NaNs quantize without panicking; a zero block multiplies to zero.
    let mut z = vec![0.0f32; QK_K];
    z[3] = f32::NAN;
    let bytes = random_q4k(&mut rng, 1);
    let w = Q4KMatrix::from_ggml_bytes(1, QK_K, &bytes).unwrap();
    let mut out = [f32::NAN];
    w.matmul(&z, &mut out).unwrap();
    assert_eq!(out[0], 0.0);
}

#[test]
fn bad_shapes_are_errors() {
    let mut rng = Rng(3);
    let q4 = random_q4k(&mut rng, 2);
    let q6 = random_q6k(&mut rng, 2);
    // k not a multiple of 256, zero rows, wrong byte counts.
    assert!(Q4KMatrix::from_ggml_bytes(1, 512 + 32, &q4).is_err());
    assert!(Q4KMatrix::from_ggml_bytes(0, 512, &q4).is_err());
    assert!(Q4KMatrix::from_ggml_bytes(2, 512, &q4).is_err());
    assert!(Q4KMatrix::from_ggml_bytes(1, 512, &q4[1..]).is_err());
    assert!(Q6KMatrix::from_ggml_bytes(1, 0, &q6).is_err());
    assert!(Q6KMatrix::from_ggml_bytes(2, 256, &q6[..Q6_K_BLOCK_BYTES]).is_err());
    assert!(Q6KMatrix::from_ggml_bytes(usize::MAX, 256, &q6).is_err());
    assert!(Q8KRows::new(&[0.0; 300], 300).is_err());
    assert!(Q8KRows::new(&[0.0; 300], 256).is_err());
    let w4 = Q4KMatrix::from_ggml_bytes(1, 512, &q4).unwrap();
    let w6 = Q6KMatrix::from_ggml_bytes(2, 256, &q6).unwrap();
    let x = vec![0.5f32; 512];
    let mut out = vec![0.0f32; 2];
    // Ragged activations, wrong output length, activations of another k.
    assert!(matches!(w4.matmul(&x[..500], &mut out[..1]), Err(KernelError::RaggedRows { .. })));
    assert!(matches!(w4.matmul(&x, &mut out), Err(KernelError::LengthMismatch { .. })));
    assert!(w6.matmul(&x[..300], &mut out).is_err());
    let xq = Q8KRows::new(&x, 512).unwrap();
    assert!(w6.matmul_quantized(&xq, &mut out, Q8Kernel::Auto).is_err());
    // Zero activation rows is an empty product, not an error.
    assert!(w6.matmul(&[], &mut []).is_ok());
    w6.matmul(&x, &mut out[..]).unwrap_err();
    let mut row = vec![0.0f32; 256];
    assert!(w6.dequantize_row(2, &mut row).is_err());
    assert!(w4.dequantize_row(0, &mut row).is_err());
}
