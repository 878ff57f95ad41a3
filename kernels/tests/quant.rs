//! The quantized matmuls, every type and kernel, against references and against themselves.
//!
//! - Every available kernel gives bitwise the portable kernel's outputs, on the file's layout
//!   and on the interleaved copy; kernels this CPU lacks are skipped with
//!   a message naming the missing instruction set.
//! - Against the f64 product of the dequantized weights and the quantize-dequantized
//!   activations (the same math, the only difference the f32 rounding of scale products and
//!   accumulation): within `1e-5 * Σ|w x|` per output.
//! - Against the f32 product of the dequantized weights and the *unquantized* activations
//!   (uniform in [-1, 1), as llama.cpp's test draws them): normalized mean squared error under
//!   5e-4, llama.cpp's bound for quantized matmuls in `test-backend-ops` (the 8-bit activations
//!   are the only error left).
//! - Property tests: random shapes, row subsets (a MoE expert's rows), splits into tasks and
//!   thread counts give bitwise the same rows, and so does any batch a row is part of.

use half::f16;
use proptest::prelude::*;
use radix_kernels::KernelError;
use radix_kernels::quant::{
    LayerInput, Layout, Q8_0Acts, Q8KActs, QK8_0, QuantKernel, QuantMatrix, QuantType, Split, WeightBytes,
    quantize_block_q8_0,
};

mod common;

use common::Rng;

/// Random blocks of `ty`: random value bits, f16 scales (and minimums) of varied sizes, never
/// infinite or NaN.
fn random_blocks(rng: &mut Rng, ty: QuantType, n_out: usize, k: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut bytes: Vec<u8> = (0..n_out * ty.row_bytes(k)).map(|_| rng.next() as u8).collect();
    for block in bytes.chunks_exact_mut(bb) {
        let mut scale = |at: usize, size: f32| {
            let v = f16::from_f32(size * (0.2 + rng.unit().abs()));
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        };
        match ty {
            QuantType::Q4_1 | QuantType::Q5_1 => {
                scale(0, 0.01);
                scale(2, -0.05);
            }
            QuantType::Q4_K | QuantType::Q5_K => {
                scale(0, 0.002);
                scale(2, 0.004);
            }
            QuantType::Q6_K => scale(208, 0.001),
            _ => scale(0, 0.01),
        }
    }
    bytes
}

fn matrix(rng: &mut Rng, ty: QuantType, n_out: usize, k: usize) -> QuantMatrix {
    QuantMatrix::new(ty, n_out, k, WeightBytes::from_vec(random_blocks(rng, ty, n_out, k))).unwrap()
}

/// `w` and its interleaved copy.
fn layouts(w: &QuantMatrix) -> Vec<QuantMatrix> {
    let i = w.interleaved();
    assert_eq!(i.layout(), Layout::Interleaved);
    vec![w.clone(), i]
}

fn activations(rng: &mut Rng, m: usize, k: usize) -> Vec<f32> {
    (0..m * k).map(|_| rng.activation()).collect()
}

fn run(w: &QuantMatrix, x: &[f32], rows: Option<&[u32]>, kernel: QuantKernel, split: Split) -> Vec<f32> {
    let input = LayerInput::new(x, w.k()).unwrap();
    let m = rows.map_or(input.rows(), <[u32]>::len);
    let mut out = vec![f32::NAN; m * w.n_out()];
    w.matmul_with(&input, rows, &mut out, kernel, split).unwrap();
    out
}

/// Every kernel of `kernels` gives bitwise `want` for `x` times `w` (`what` names the case).
fn assert_kernels_give(w: &QuantMatrix, x: &[f32], want: &[f32], kernels: &[QuantKernel], what: &str) {
    for &kernel in kernels {
        let got = run(w, x, None, kernel, Split::default());
        assert!(
            got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: {} on {:?} differs from portable in place",
            kernel.name(),
            w.layout()
        );
    }
}

/// The kernels this CPU runs; the others are reported as skipped, with why.
fn kernels() -> Vec<QuantKernel> {
    QuantKernel::ALL
        .into_iter()
        .filter(|&k| {
            let ok = k.is_available();
            if !ok {
                let why = match k {
                    QuantKernel::Avx2 => "AVX2 + FMA + F16C",
                    QuantKernel::AvxVnni => "AVX-VNNI or AVX-512 VNNI + VL",
                    _ => "AVX-512 F + BW + VL + VNNI",
                };
                eprintln!("skipping the {} kernel: this CPU (or RADIX_CPU_ISA) lacks {why}", k.name());
            }
            ok
        })
        .collect()
}

fn nmse(got: &[f32], want: &[f64]) -> f64 {
    let err: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).powi(2)).sum();
    err / want.iter().map(|w| w * w).sum::<f64>()
}

/// Every type, awkward shapes (row counts around the tiles, one and several blocks): kernels
/// agree bit for bit and stay within the tolerances of the module doc.
#[test]
fn every_type_matches_references_and_kernels_agree() {
    let mut rng = Rng(0x5eed);
    let kernels = kernels();
    for ty in QuantType::ALL {
        // Over all the shapes of a type: one output alone can sit near zero by cancellation.
        let (mut outputs, mut exact) = (Vec::new(), Vec::new());
        // (20, 9, 21): more activation rows than one group call takes, in parts of four, over more
        // blocks than one span of decoded scales.
        for (n_out, blocks, m) in [(1, 1, 1), (7, 3, 2), (8, 2, 5), (17, 2, 3), (33, 1, 9), (16, 4, 1), (20, 9, 21)] {
            let k = blocks * ty.block_values();
            let w = matrix(&mut rng, ty, n_out, k);
            // Uniform, as in llama.cpp's test (outliers coarsen a 256-value block's step).
            let x: Vec<f32> = (0..m * k).map(|_| rng.unit()).collect();
            let want = run(&w, &x, None, QuantKernel::Portable, Split::default());
            for layout in layouts(&w) {
                assert_kernels_give(&layout, &x, &want, &kernels, &format!("{ty:?} {n_out}x{k}, {m} rows"));
                let rows = |w: &QuantMatrix| -> Vec<u32> {
                    let mut all = vec![0.0f32; n_out * k];
                    for (r, row) in all.chunks_exact_mut(k).enumerate() {
                        w.dequantize_row(r, row).unwrap();
                    }
                    all.iter().map(|v| v.to_bits()).collect()
                };
                assert!(
                    rows(&layout) == rows(&w),
                    "{ty:?} {n_out}x{k}: {:?} rows dequantize differently",
                    layout.layout()
                );
            }
            let wd = w.dequantize();
            let xd = match ty.block_values() {
                QK8_0 => Q8_0Acts::quantize(&x, k).unwrap().dequantize(),
                _ => Q8KActs::quantize(&x, k).unwrap().dequantize(),
            };
            for i in 0..m {
                for j in 0..n_out {
                    let (wj, xi, xdi) = (&wd[j * k..(j + 1) * k], &x[i * k..(i + 1) * k], &xd[i * k..(i + 1) * k]);
                    let dot = |a: &[f32]| wj.iter().zip(a).map(|(&w, &x)| w as f64 * x as f64).sum::<f64>();
                    let mag: f64 = wj.iter().zip(xdi).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum();
                    let (got, sm) = (want[i * n_out + j] as f64, dot(xdi));
                    assert!((got - sm).abs() <= 1e-5 * mag + 1e-30, "{ty:?} ({i}, {j}): {got} vs {sm} (Σ|wx| {mag})");
                    exact.push(dot(xi));
                }
            }
            outputs.extend(want);
        }
        let e = nmse(&outputs, &exact);
        assert!(e < 5e-4, "{ty:?}: NMSE {e:e} against unquantized activations");
        eprintln!("{ty:?}: NMSE {e:e} against unquantized activations");
    }
}

/// Dequantization follows GGML: hand-built blocks give the values GGML's formulas give.
#[test]
fn dequantize_follows_ggml_formulas() {
    let half = |v: f32| f16::from_f32(v).to_le_bytes();
    // Q4_0: d = 0.5, byte j = j | (15 - j) << 4: value j = (j - 8) / 2, j + 16 = (15 - j - 8) / 2.
    let mut b = half(0.5).to_vec();
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let w = QuantMatrix::new(QuantType::Q4_0, 1, 32, WeightBytes::from_vec(b)).unwrap().dequantize();
    assert_eq!([w[0], w[15], w[16], w[31]], [-4.0, 3.5, 3.5, -4.0]);
    // Q5_1: d = 1, m = -16, high bits set for odd values only: value j = (j % 16 + 16 (j odd)) - 16.
    let mut b = half(1.0).to_vec();
    b.extend(half(-16.0));
    b.extend(0xAAAA_AAAAu32.to_le_bytes());
    b.extend((0..16u8).map(|j| j | (j << 4)));
    let w = QuantMatrix::new(QuantType::Q5_1, 1, 32, WeightBytes::from_vec(b)).unwrap().dequantize();
    for (j, &v) in w.iter().enumerate() {
        assert_eq!(v, (j % 16 + if j % 2 == 1 { 16 } else { 0 }) as f32 - 16.0, "value {j}");
    }
    // Q6_K: all low bits 1, high bits 2 (value 33 - 32 = 1), scales s, d = 0.25: w = 0.25 s.
    let mut b = vec![0x11u8; 128];
    b.extend([0xAAu8; 64]);
    b.extend((0..16).map(|s| (s as i8 - 8) as u8));
    b.extend(half(0.25));
    let w = QuantMatrix::new(QuantType::Q6_K, 1, 256, WeightBytes::from_vec(b)).unwrap().dequantize();
    for (j, &v) in w.iter().enumerate() {
        assert_eq!(v, 0.25 * (j / 16) as f32 - 2.0, "value {j}");
    }
}

/// The largest values every type stores (every value bit set; Q8_0 at -128) against activations
/// at ±127: where a kernel adds products in 16 bits before widening them, this is where they
/// would overflow. Every kernel and layout still gives the portable kernel's bits.
#[test]
fn extreme_values_stay_exact() {
    let kernels = kernels();
    for ty in QuantType::ALL {
        let (n_out, k) = (16, 2 * ty.block_values());
        let scales = random_blocks(&mut Rng(9), ty, n_out, k);
        let mut bytes = vec![if ty == QuantType::Q8_0 { 0x80 } else { 0xFF }; scales.len()];
        // The scales (and Q6_K's int8 sub-block scales) as random_blocks drew them.
        let bb = ty.block_bytes();
        for (block, drawn) in bytes.chunks_exact_mut(bb).zip(scales.chunks_exact(bb)) {
            let keep = match ty {
                QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => 0..4,
                QuantType::Q6_K => 192..210,
                _ => 0..2,
            };
            block[keep.clone()].copy_from_slice(&drawn[keep]);
        }
        let w = QuantMatrix::new(ty, n_out, k, WeightBytes::from_vec(bytes)).unwrap();
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; 3 * k];
            let want = run(&w, &x, None, QuantKernel::Portable, Split::default());
            for layout in layouts(&w) {
                assert_kernels_give(&layout, &x, &want, &kernels, &format!("{ty:?} at the extremes ({sign})"));
            }
        }
    }
}

/// One row alone (a decode step) equals the same row inside a long batch (a prefill), for
/// every type, on the fastest kernel.
#[test]
fn a_row_alone_equals_the_row_in_a_batch() {
    let mut rng = Rng(77);
    for ty in QuantType::ALL {
        let (n_out, k, m) = (40, 2 * ty.block_values().max(256), 67);
        let w = matrix(&mut rng, ty, n_out, k);
        let w = layouts(&w).pop().unwrap();
        let x = activations(&mut rng, m, k);
        let batch = run(&w, &x, None, QuantKernel::Auto, Split::default());
        for i in [0, 1, 33, 66] {
            let alone = run(&w, &x[i * k..(i + 1) * k], None, QuantKernel::Auto, Split::default());
            assert_eq!(
                alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                batch[i * n_out..(i + 1) * n_out].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{ty:?} row {i}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random shapes, row subsets, splits and thread counts: every output row is bitwise the
    /// row computed alone on the portable kernel.
    #[test]
    fn rows_do_not_depend_on_batch_split_or_threads(
        ty in 0usize..8,
        n_out in 1usize..40,
        blocks in 1usize..7,
        m in 1usize..20,
        subset in proptest::collection::vec(0u32..20, 0..8),
        rows_per_task in 1usize..48,
        acts_per_task in 1usize..20,
        threads in 1usize..4,
        interleave in any::<bool>(),
        seed in 1u64..u64::MAX,
    ) {
        let ty = QuantType::ALL[ty];
        let k = blocks * ty.block_values();
        let mut rng = Rng(seed);
        let in_place = matrix(&mut rng, ty, n_out, k);
        let w = if interleave { layouts(&in_place).pop().unwrap() } else { in_place.clone() };
        let x = activations(&mut rng, m, k);
        let subset: Vec<u32> = subset.into_iter().filter(|&r| (r as usize) < m).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let split = Split { rows_per_task: Some(rows_per_task), acts_per_task: Some(acts_per_task) };
        let got = pool.install(|| run(&w, &x, Some(&subset), QuantKernel::Auto, split));
        for (i, &r) in subset.iter().enumerate() {
            let r = r as usize;
            let alone = run(&in_place, &x[r * k..(r + 1) * k], None, QuantKernel::Portable, Split::default());
            for j in 0..n_out {
                prop_assert_eq!(got[i * n_out + j].to_bits(), alone[j].to_bits(), "{:?} row {} out {}", ty, r, j);
            }
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
    let bytes = WeightBytes::from_vec(vec![0u8; 3 * 144]);
    for (n_out, k, len) in [(3, 0, 0), (3, 255, 3 * 144), (0, 256, 0), (3, 256, 3 * 144 - 1), (4, 256, 3 * 144)] {
        let r = QuantMatrix::new(QuantType::Q4_K, n_out, k, bytes.slice(0..len).unwrap());
        assert!(r.is_err(), "{n_out} x {k} over {len} bytes");
    }
    assert!(bytes.slice(10..3 * 144 + 1).is_err());
    let w = QuantMatrix::new(QuantType::Q4_K, 3, 256, bytes).unwrap();
    let x = vec![1.0f32; 512];
    let input = LayerInput::new(&x, 256).unwrap();
    let mut out = vec![7.0f32; 6];
    let wrong_out = w.matmul(&input, &mut out[..5]);
    assert!(matches!(wrong_out, Err(KernelError::LengthMismatch { .. })), "{wrong_out:?}");
    assert!(w.matmul_rows(&input, &[0, 2], &mut out).is_err(), "row 2 of 2 rows");
    let other_k = vec![1.0f32; 512];
    assert!(w.matmul(&LayerInput::new(&other_k, 512).unwrap(), &mut out[..3]).is_err());
    assert!(out.iter().all(|&v| v == 7.0), "an error leaves out untouched: {out:?}");
    assert!(w.dequantize_row(3, &mut [0.0; 256]).is_err());
    assert!(LayerInput::new(&x, 300).is_err());
}
