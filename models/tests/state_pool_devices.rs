//! The recurrent state in a pool of tensors (how a CUDA model keeps it, in GPU memory) gives
//! the model exactly what the host pool gives it: on the CPU the Gated DeltaNet reads each
//! sequence's slot out of the tensors and writes it back, so the same tiny hybrid and hybrid
//! MoE models over both pools must agree bitwise, through prefill chunks, decode steps, a
//! mixed batch and snapshots copied between slots. On a GPU (`RADIX_TEST_DEVICE`) the same
//! runs compare the device (our CUDA kernels on a pool in GPU memory) with the CPU path,
//! within the model's tolerance.

use std::path::Path;

use radix_models::{Device, ForwardBatch, KvDType, LoadOptions, Model, StatePool, parse_device};

fn fixture(arch: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch).join("model-f32.gguf")
}

/// A run's logits: three sequences prefilled in chunks (one resumed from a snapshot of
/// another), then decode steps of all three in one batch.
fn run(model: &Model, mut state: StatePool) -> Vec<Vec<f32>> {
    let page_size = 4;
    let mut kv = model.new_kv_pool(page_size, 96, KvDType::F32).unwrap();
    let tables: Vec<Vec<u32>> = (0..3).map(|s| (s * 32..(s + 1) * 32).collect()).collect();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 120).collect();
    let mut out = Vec::new();
    let mut forward = |batch: &ForwardBatch, kv: &mut _, state: &mut StatePool| {
        let logits = model.forward_with_state(batch, kv, Some(state)).unwrap();
        for r in 0..logits.dim(0).unwrap() {
            out.push(logits.get(r).unwrap().to_vec1::<f32>().unwrap());
        }
    };
    // Sequence 0 in chunks of 13, 7 and 20 tokens; sequence 1 whole.
    for (a, b) in [(0, 13), (13, 20), (20, 40)] {
        let mut batch = ForwardBatch::default();
        batch.push_with_state(&prompt[a..b], b, tables[0].clone(), true, Some(0));
        if a == 0 {
            batch.push_with_state(&prompt[..31], 31, tables[1].clone(), true, Some(1));
        }
        forward(&batch, &mut kv, &mut state);
    }
    // Sequence 2 resumes sequence 1's state after 31 tokens (its K/V pages are copied too).
    state.copy_slot(1, 2).unwrap();
    for (&from, &to) in tables[1].iter().zip(&tables[2]).take(8) {
        kv.copy_page(from, to, page_size).unwrap();
    }
    let mut batch = ForwardBatch::default();
    batch.push_with_state(&prompt[31..36], 36, tables[2].clone(), true, Some(2));
    forward(&batch, &mut kv, &mut state);
    let mut lens = [40usize, 31, 36];
    for step in 0..6u32 {
        let mut batch = ForwardBatch::default();
        for (s, len) in lens.iter_mut().enumerate() {
            *len += 1;
            batch.push_with_state(&[(step * 11 + s as u32 * 3) % 120], *len, tables[s].clone(), true, Some(s as u32));
        }
        forward(&batch, &mut kv, &mut state);
    }
    assert_eq!(state.read_slot(0).unwrap().len(), state.read_slot(2).unwrap().len());
    out
}

#[test]
fn a_pool_of_tensors_runs_as_the_host_pool() {
    for arch in ["qwen35", "qwen35moe"] {
        let options = LoadOptions { threads: 2, ..Default::default() };
        let model = Model::load(&fixture(arch), &options).unwrap();
        let host = run(&model, StatePool::new(model.config(), 3).unwrap());
        let tensors = run(&model, StatePool::on_device(model.config(), 3, &Device::Cpu).unwrap());
        assert_eq!(host.len(), 3 + 1 + 1 + 18);
        assert_eq!(host, tensors, "{arch}: a pool of tensors changed the logits");
    }
}

/// On `RADIX_TEST_DEVICE` (a CUDA device): the state pool in GPU memory under our kernels
/// against the CPU path. Relative L2 of each row's logits within 1e-3 (f32 weights and state;
/// f32 K/V; the sums in another order; fast-math exp).
#[test]
fn the_device_state_pool_matches_the_cpu_path() {
    let Some(spec) = std::env::var("RADIX_TEST_DEVICE").ok().filter(|s| !s.is_empty() && s != "cpu") else {
        eprintln!("SKIPPED: RADIX_TEST_DEVICE names no GPU; the CPU half of this check is the test above");
        return;
    };
    let device = parse_device(&spec).unwrap_or_else(|e| panic!("RADIX_TEST_DEVICE={spec}: {e}"));
    for arch in ["qwen35", "qwen35moe"] {
        let cpu = Model::load(&fixture(arch), &LoadOptions { threads: 2, ..Default::default() }).unwrap();
        let dev =
            Model::load(&fixture(arch), &LoadOptions { threads: 2, device: device.clone(), ..Default::default() })
                .unwrap();
        let state = dev.new_state_pool(3).unwrap();
        assert!(state.device().is_some_and(|d| d.same_device(&device)), "{arch}: the pool is on the device");
        let want = run(&cpu, cpu.new_state_pool(3).unwrap());
        let got = run(&dev, state);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let diff: f32 = g.iter().zip(w).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
            let norm: f32 = w.iter().map(|b| b * b).sum::<f32>().sqrt();
            eprintln!("{arch} {spec}: row {i}: relative L2 {:e}", diff / norm);
            assert!(diff / norm < 1e-3, "{arch}: row {i}: relative L2 {}", diff / norm);
        }
    }
}
