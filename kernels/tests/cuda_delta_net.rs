//! The Gated DeltaNet and MoE routing CUDA kernels (feature `cuda`) against their plain-Rust
//! models (`radix_kernels::delta_net::device_order`, `radix_kernels::moe::route_device_order`),
//! which the CPU tests hold to the CPU kernels: mixed passes of fresh prefills, continued chunks
//! and decode steps over a state pool of several slots, the Qwen3.5-0.8B shape and the tiny
//! fixtures' (value heads narrower than a block), both head orders; a long decode to catch
//! drift; routing with ties; the dense expert dispatch against a host matmul.
//!
//! Needs a GPU: without one (or without a driver, as on CI, which only builds this), each test
//! says so and checks nothing.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::Rng;
use radix_kernels::cuda::delta_net::CudaRecurrentBatch;
use radix_kernels::cuda::moe::{combine, dense_indexed, route};
use radix_kernels::delta_net::DeltaNetShape;
use radix_kernels::delta_net::device_order::{self, DEVICE_TOLERANCE, RecurrentSequence};
use radix_kernels::moe::route_device_order;

fn device() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIPPED: no CUDA device to run the kernels on ({e})");
            None
        }
    }
}

fn values(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * scale).collect()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Largest |got - want| / (1 + |want|).
fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f32::max)
}

/// One pass on the device and in the model; returns the worst difference of the outputs and
/// states, after checking both pools were touched only in the pass's slots.
#[allow(clippy::too_many_arguments)]
fn run_pass(
    dev: &Device,
    rng: &mut Rng,
    shape: &DeltaNetShape,
    kernel: usize,
    seqs: &[RecurrentSequence],
    slots: usize,
    conv_state: &mut Vec<f32>,
    ssm_state: &mut Vec<f32>,
) -> f32 {
    let nv = shape.num_value_heads;
    let channels = 2 * shape.num_key_heads * shape.key_dim + nv * shape.value_dim;
    let rows: usize = seqs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
    // Activations with an occasional outlier, as real ones have.
    let qkv: Vec<f32> = (0..rows * channels).map(|_| rng.activation() * 0.5).collect();
    let weight = values(rng, channels * kernel, 0.7);
    let (a, b) = (values(rng, rows * nv, 2.0), values(rng, rows * nv, 2.0));
    let rate: Vec<f32> = (0..nv).map(|h| -0.05 - 0.3 * (h % 5) as f32).collect();
    let bias = values(rng, nv, 1.0);
    let t = |v: &[f32]| Tensor::from_slice(v, v.len(), dev).unwrap();
    let (conv_dev, ssm_dev) = (t(conv_state), t(ssm_state));

    let batch = CudaRecurrentBatch::new(dev, rows, seqs).unwrap();
    let mixed = batch.conv(&t(&qkv), &t(&weight), kernel, &conv_dev).unwrap();
    let out = batch.rule(shape, &mixed, &t(&a), &t(&b), &t(&rate), &t(&bias), &ssm_dev).unwrap();
    assert_eq!(out.dims(), [rows, nv * shape.value_dim]);

    let mut want_mixed = vec![0.0; qkv.len()];
    device_order::conv(&qkv, &weight, kernel, conv_state, &mut want_mixed, seqs).unwrap();
    // The rule gets the device's own convolution output, so each kernel is judged alone.
    let mixed_host = host(&mixed);
    let mut want_out = vec![0.0; rows * nv * shape.value_dim];
    device_order::rule(shape, &mixed_host, &a, &b, &rate, &bias, ssm_state, &mut want_out, seqs).unwrap();
    let errs = [
        worst(&mixed_host, &want_mixed),
        worst(&host(&conv_dev), conv_state),
        worst(&host(&out), &want_out),
        worst(&host(&ssm_dev), ssm_state),
    ];
    eprintln!(
        "{shape:?} kernel {kernel}, {} seqs x {rows} rows, {slots} slots: conv {:.1e}, conv state {:.1e}, out {:.1e}, SSM state {:.1e}",
        seqs.len(),
        errs[0],
        errs[1],
        errs[2],
        errs[3]
    );
    // Carry the device's states on, so a long run compounds only the device's own rounding.
    *conv_state = host(&conv_dev);
    *ssm_state = host(&ssm_dev);
    errs.into_iter().fold(0.0, f32::max)
}

#[test]
fn cuda_delta_net_matches_its_model() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x5eed_0035);
    let shapes = [
        // Qwen3.5-0.8B's layers.
        DeltaNetShape { num_key_heads: 16, num_value_heads: 16, key_dim: 128, value_dim: 128, tiled_value_heads: true },
        // The tiny fixtures': value heads narrower than a block, grouped and tiled.
        DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: 16, value_dim: 24, tiled_value_heads: false },
        DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: 16, value_dim: 24, tiled_value_heads: true },
        // Qwen3.5-27B-like: more value than key heads, wide keys.
        DeltaNetShape { num_key_heads: 4, num_value_heads: 12, key_dim: 256, value_dim: 48, tiled_value_heads: true },
    ];
    for shape in shapes {
        for kernel in [4, 2] {
            let slots = 5;
            let nv = shape.num_value_heads;
            let channels = 2 * shape.num_key_heads * shape.key_dim + nv * shape.value_dim;
            let mut conv_state = values(&mut rng, slots * (kernel - 1) * channels, 1.0);
            let mut ssm_state = values(&mut rng, slots * shape.state_len(), 0.3);
            // A fresh prefill, a continued chunk and a decode step in one pass; slot 2 untouched.
            let seqs = [
                RecurrentSequence { first_row: 0, rows: 37, slot: 4, fresh: true },
                RecurrentSequence { first_row: 37, rows: 9, slot: 0, fresh: false },
                RecurrentSequence { first_row: 46, rows: 1, slot: 3, fresh: false },
            ];
            let untouched = (conv_state.clone(), ssm_state.clone());
            let err = run_pass(&dev, &mut rng, &shape, kernel, &seqs, slots, &mut conv_state, &mut ssm_state);
            assert!(err <= DEVICE_TOLERANCE, "{shape:?} kernel {kernel}: worst {err}");
            let conv_len = (kernel - 1) * channels;
            assert_eq!(
                conv_state[2 * conv_len..3 * conv_len],
                untouched.0[2 * conv_len..3 * conv_len],
                "slot 2 (conv)"
            );
            let ssm_len = shape.state_len();
            assert_eq!(ssm_state[2 * ssm_len..3 * ssm_len], untouched.1[2 * ssm_len..3 * ssm_len], "slot 2 (SSM)");
        }
    }
}

/// 200 decode steps of four sequences, each step's device state carried to the next: the error
/// must not grow past the tolerance.
#[test]
fn cuda_delta_net_long_decode_does_not_drift() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x0dec_0de5);
    let shape =
        DeltaNetShape { num_key_heads: 16, num_value_heads: 16, key_dim: 128, value_dim: 128, tiled_value_heads: true };
    let channels = 2 * 16 * 128 + 16 * 128;
    let mut conv_state = vec![0.0; 4 * 3 * channels];
    let mut ssm_state = vec![0.0; 4 * shape.state_len()];
    let mut worst_seen = 0.0f32;
    for step in 0..200 {
        let seqs: Vec<RecurrentSequence> =
            (0..4).map(|i| RecurrentSequence { first_row: i, rows: 1, slot: 3 - i, fresh: step == 0 }).collect();
        worst_seen = worst_seen.max(run_pass(&dev, &mut rng, &shape, 4, &seqs, 4, &mut conv_state, &mut ssm_state));
    }
    assert!(worst_seen <= DEVICE_TOLERANCE, "worst {worst_seen}");
}

#[test]
fn cuda_delta_net_rejects_bad_passes() {
    let Some(dev) = device() else { return };
    let twice = [
        RecurrentSequence { first_row: 0, rows: 1, slot: 1, fresh: false },
        RecurrentSequence { first_row: 1, rows: 1, slot: 1, fresh: false },
    ];
    assert!(CudaRecurrentBatch::new(&dev, 2, &twice).is_err(), "one slot twice");
    let batch = CudaRecurrentBatch::new(&dev, 1, &twice[..1]).unwrap();
    let t = |n: usize| Tensor::zeros(n, DType::F32, &dev).unwrap();
    assert!(batch.conv(&t(8), &t(32), 4, &t(24)).is_err(), "a pool of one slot for slot 1");
    assert!(batch.conv(&t(8), &t(56), 7, &t(96)).is_err(), "width 7 has no kernel");
    let shape =
        DeltaNetShape { num_key_heads: 1, num_value_heads: 1, key_dim: 300, value_dim: 8, tiled_value_heads: false };
    assert!(batch.rule(&shape, &t(608), &t(1), &t(1), &t(1), &t(1), &t(2 * 2400)).is_err(), "key width 300");
}

#[test]
fn cuda_moe_routing_matches_its_model() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x0e0e_7013);
    for (experts, k, renormalize) in [(128, 8, true), (60, 4, false), (512, 10, true), (4, 2, true), (256, 8, true)] {
        let rows = 33;
        let mut logits = values(&mut rng, rows * experts, 4.0);
        // Row 0: a five-way tie at the top, across lanes and registers.
        for e in [3, 35, 67, 99, 1].into_iter().filter(|&e| e < experts) {
            logits[e] = 9.0;
        }
        let (ids, weights) =
            route(&Tensor::from_slice(&logits, (rows, experts), &dev).unwrap(), k, renormalize).unwrap();
        let (ids, weights) = (ids.flatten_all().unwrap().to_vec1::<u32>().unwrap(), host(&weights));
        let (want_ids, want_w) = route_device_order(&logits, experts, k, renormalize).unwrap();
        assert_eq!(ids[..k.min(5)], want_ids[..k.min(5)], "{experts} experts: the tie at row 0");
        let swaps = ids.iter().zip(&want_ids).filter(|(a, b)| a != b).count();
        let err = worst(&weights, &want_w);
        eprintln!("{experts} experts top-{k}: {swaps} of {} ids differ, weights within {err:.1e}", ids.len());
        assert_eq!(swaps, 0, "{experts} experts top-{k}: ids differ from the model");
        assert!(err <= 1e-5, "{experts} experts top-{k}: weights {err}");
    }
}

#[test]
fn cuda_moe_dense_dispatch_matches_a_host_matmul() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0xd15_9a7c);
    let (experts, n, inner, rows, k) = (8, 40, 96, 5, 3);
    let w = values(&mut rng, experts * n * inner, 0.5);
    let x = values(&mut rng, rows * inner, 1.0);
    let ids: Vec<u32> = (0..rows * k).map(|i| ((i * 5 + i / k) % experts) as u32).collect();
    let weights = values(&mut rng, rows * k, 1.0);
    let ids_t = Tensor::from_slice(&ids, (rows, k), &dev).unwrap();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let wt = Tensor::from_slice(&w, (experts, n, inner), &dev).unwrap().to_dtype(dtype).unwrap();
        let w_host = host(&wt.to_dtype(DType::F32).unwrap());
        let xt = Tensor::from_slice(&x, (rows, 1, inner), &dev).unwrap();
        let y = dense_indexed(&wt, &xt, &ids_t).unwrap();
        assert_eq!(y.dims(), [rows, k, n]);
        let mut want = vec![0.0f32; rows * k * n];
        for r in 0..rows {
            for j in 0..k {
                let e = ids[r * k + j] as usize;
                for o in 0..n {
                    want[(r * k + j) * n + o] =
                        (0..inner).map(|c| w_host[(e * n + o) * inner + c] * x[r * inner + c]).sum();
                }
            }
        }
        let err = worst(&host(&y), &want);
        assert!(err < 1e-4, "{dtype:?}: {err}");
        let out = combine(&y, &Tensor::from_slice(&weights, (rows, k), &dev).unwrap()).unwrap();
        let mut want_sum = vec![0.0f32; rows * n];
        for r in 0..rows {
            for j in 0..k {
                for o in 0..n {
                    want_sum[r * n + o] += weights[r * k + j] * want[(r * k + j) * n + o];
                }
            }
        }
        assert!(worst(&host(&out), &want_sum) < 1e-4, "{dtype:?}: combine");
    }
    let bad = Tensor::from_slice(&[9u32, 0, 1], (1, 3), &dev).unwrap();
    let wt = Tensor::from_slice(&w, (experts, n, inner), &dev).unwrap();
    let y = dense_indexed(&wt, &Tensor::from_slice(&x[..inner], (1, 1, inner), &dev).unwrap(), &bad).unwrap();
    assert!(host(&y)[..n].iter().all(|&v| v == 0.0), "an id past the experts reads nothing");
}
