//! The K-quant kernels against ggml's dequantization (written out here from its reference
//! `dequantize_row_q4_K` / `_q6_K`, independent of the packing), and the AVX-512 paths against
//! the portable ones bit for bit.

use super::*;

/// SplitMix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random GGML blocks: random value and scale bytes, small finite f16 scales.
fn random_blocks(format: KQuant, n_out: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n_out * k / QK_K {
        let mut block: Vec<u8> = (0..format.block_bytes()).map(|_| rng.byte()).collect();
        let scale = |rng: &mut Rng| f16::from_f32(0.001 + 0.01 * rng.unit().abs()).to_le_bytes();
        match format {
            KQuant::Q4K => {
                block[0..2].copy_from_slice(&scale(rng));
                block[2..4].copy_from_slice(&scale(rng));
            }
            KQuant::Q6K => {
                let n = block.len();
                block[n - 2..].copy_from_slice(&scale(rng));
            }
        }
        bytes.extend(block);
    }
    bytes
}

/// ggml's `dequantize_row_q4_K` for one block.
fn dequantize_q4k(b: &[u8]) -> Vec<f32> {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let dmin = f16::from_le_bytes([b[2], b[3]]).to_f32();
    let (scales, qs) = (&b[4..16], &b[16..]);
    let mut y = vec![0.0; QK_K];
    for j in 0..4 {
        let (sc1, m1) = q4k_scale_min(2 * j, scales);
        let (sc2, m2) = q4k_scale_min(2 * j + 1, scales);
        for l in 0..32 {
            let q = qs[32 * j + l];
            y[64 * j + l] = d * sc1 as f32 * (q & 0xF) as f32 - dmin * m1 as f32;
            y[64 * j + 32 + l] = d * sc2 as f32 * (q >> 4) as f32 - dmin * m2 as f32;
        }
    }
    y
}

/// ggml's `dequantize_row_q6_K` for one block.
fn dequantize_q6k(b: &[u8]) -> Vec<f32> {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16::from_le_bytes([b[208], b[209]]).to_f32();
    let mut y = vec![0.0; QK_K];
    for half in 0..2 {
        let (ql, qh, sc, y) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..], &mut y[128 * half..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
    y
}

fn dequantize(format: KQuant, bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(format.block_bytes())
        .flat_map(|b| match format {
            KQuant::Q4K => dequantize_q4k(b),
            KQuant::Q6K => dequantize_q6k(b),
        })
        .collect()
}

/// Both formats, row counts from 1 to past two full passes of 8, selected rows out of order
/// and repeated: each output is the f64 product of the dequantized weights and the
/// dequantized activations up to f32 accumulation.
#[test]
fn matmul_rows_equals_dequantized_product() {
    let mut rng = Rng(7);
    let (n_out, k, x_rows) = (48, 512, 20);
    let x: Vec<f32> = (0..x_rows * k).map(|_| rng.unit() * 3.0).collect();
    let mut xq = Q8KRows::default();
    xq.quantize(&x, k).unwrap();
    assert_eq!((xq.rows(), xq.k()), (x_rows, k));
    let xd = xq.dequantize();
    for format in [KQuant::Q4K, KQuant::Q6K] {
        let bytes = random_blocks(format, n_out, k, &mut rng);
        let w = dequantize(format, &bytes);
        let m = KQuantMatrix::from_ggml_bytes(format, n_out, k, &bytes).unwrap();
        assert_eq!((m.n_out(), m.k(), m.format()), (n_out, k, format));
        for rows in [vec![5u32], vec![3, 0, 3], (0..x_rows as u32).rev().collect::<Vec<_>>()] {
            let mut out = vec![0.0f32; rows.len() * n_out];
            m.matmul_rows(&xq, &rows, &mut out).unwrap();
            for (i, &r) in rows.iter().enumerate() {
                let xr = &xd[r as usize * k..(r as usize + 1) * k];
                for j in 0..n_out {
                    let want: f64 = w[j * k..(j + 1) * k].iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let scale: f64 =
                        w[j * k..(j + 1) * k].iter().zip(xr).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let got = out[i * n_out + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * scale + 1e-6,
                        "{format:?} rows {rows:?} [{i}, {j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// The AVX-512 kernels and quantization give bitwise the portable code's results (skipped,
/// saying so, on CPUs without AVX-512 VNNI).
#[test]
fn avx512_equals_portable() {
    if !kquant_kernel_is_fast() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let mut rng = Rng(11);
    let k = 768;
    // Values on a grid of halves hit the rounding ties; a zero block and a NaN are in too.
    let mut x: Vec<f32> =
        (0..9 * k).map(|i| if i % 3 == 0 { (rng.unit() * 20.0).round() / 2.0 } else { rng.unit() }).collect();
    x[k..k + QK_K].fill(0.0);
    x[2 * k + 5] = f32::NAN;
    for v in &mut x[3 * k..4 * k] {
        *v *= 1e-30;
    }
    let mut fast = vec![ActBlock::ZERO; x.len() / QK_K];
    let mut portable = fast.clone();
    for ((x, f), p) in x.chunks_exact(QK_K).zip(&mut fast).zip(&mut portable) {
        quantize_block(x.try_into().unwrap(), f, true);
        quantize_block(x.try_into().unwrap(), p, false);
        assert_eq!(f.qs, p.qs);
        assert_eq!(f.d.to_bits(), p.d.to_bits());
        assert_eq!((f.neg32_sums16, f.sums32), (p.neg32_sums16, p.sums32));
    }
    let xq = Q8KRows { k, blocks: fast };
    let kb = k / QK_K;
    for m in 1..=MAX_ACT_ROWS {
        let acts: Vec<&[ActBlock]> = (0..m).map(|r| xq.row(r)).collect();
        for format in [KQuant::Q4K, KQuant::Q6K] {
            let bytes = random_blocks(format, TILE_ROWS, k, &mut rng);
            let mat = KQuantMatrix::from_ggml_bytes(format, TILE_ROWS, k, &bytes).unwrap();
            let (mut a, mut b) = ([[0.0f32; TILE_ROWS]; MAX_ACT_ROWS], [[0.0f32; TILE_ROWS]; MAX_ACT_ROWS]);
            match &mat.tiles {
                Tiles::Q4K(t) => {
                    q4k_dot(&t[..kb], &acts, &mut a, true);
                    q4k_dot(&t[..kb], &acts, &mut b, false);
                }
                Tiles::Q6K(t) => {
                    q6k_dot(&t[..kb], &acts, &mut a, true);
                    q6k_dot(&t[..kb], &acts, &mut b, false);
                }
            }
            let bits =
                |s: &[[f32; TILE_ROWS]; MAX_ACT_ROWS]| s[..m].iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{format:?}, {m} rows");
        }
    }
    let gate: Vec<f32> = (0..100).map(|_| rng.unit() * 10.0).collect();
    let up: Vec<f32> = (0..100).map(|_| rng.unit()).collect();
    let (mut a, mut b) = (gate.clone(), gate.clone());
    swiglu(&mut a, &up);
    swiglu_portable(&mut b, &up);
    assert_eq!(a, b);
    for ((&g, &u), &v) in gate.iter().zip(&up).zip(&a) {
        let want = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
        assert!((v as f64 - want).abs() <= 1e-6 * want.abs() + 1e-7, "swiglu({g}, {u}) = {v}, want {want}");
    }
}

/// Bad shapes are errors, not panics.
#[test]
fn bad_shapes_are_errors() {
    let bytes = vec![0u8; 16 * Q4_K_BLOCK_BYTES];
    assert!(KQuantMatrix::from_ggml_bytes(KQuant::Q4K, 16, 255, &bytes).is_err());
    assert!(KQuantMatrix::from_ggml_bytes(KQuant::Q4K, 8, 512, &bytes[..8 * 2 * Q4_K_BLOCK_BYTES]).is_err());
    assert!(KQuantMatrix::from_ggml_bytes(KQuant::Q4K, 16, 512, &bytes).is_err());
    let m = KQuantMatrix::from_ggml_bytes(KQuant::Q4K, 16, 256, &bytes).unwrap();
    let mut xq = Q8KRows::default();
    assert!(xq.quantize(&[0.0; 300], 256).is_err());
    xq.quantize(&[0.5; 512], 256).unwrap();
    let mut out = vec![0.0; 16];
    assert!(m.matmul_rows(&xq, &[2], &mut out).is_err());
    assert!(m.matmul_rows(&xq, &[0, 1], &mut out).is_err());
    m.matmul_rows(&xq, &[1], &mut out).unwrap();
}
