//! Greedy decoding of a Qwen3.5-0.8B-shaped model (random bf16 weights written by
//! `scripts/gen_qwen35_shaped.py`'s `write_checkpoint`, a directory named by
//! `RADIX_QWEN35_SHAPED`) on `RADIX_TEST_DEVICE` against the CPU path: 4 prompts, 32 tokens
//! each. `benches/gpu/check.sh` writes the checkpoint on the GPU machine (1.6 GB, too large to
//! carry) and runs this; without the directory the test says so and checks nothing.
//!
//! What must hold: free-running greedy equal, unless the two paths' logits differ across a near
//! tie. Each step is checked teacher-forced (both fed the CPU path's tokens): where the argmaxes
//! differ, the CPU path's top-two margin must be below the largest logit difference of that
//! step, or the test fails. The counts go to the log.

use std::path::PathBuf;

use radix_models::{ForwardBatch, KvDType, KvPool, LoadOptions, Model, StatePool, parse_device};

const TOKENS: usize = 32;

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

fn margin(v: &[f32]) -> f32 {
    let top = argmax(v) as usize;
    let second = v.iter().enumerate().filter(|&(i, _)| i != top).map(|(_, &x)| x).fold(f32::NEG_INFINITY, f32::max);
    v[top] - second
}

struct Session<'a> {
    model: &'a Model,
    kv: KvPool,
    state: StatePool,
    table: Vec<u32>,
    len: usize,
}

impl<'a> Session<'a> {
    fn new(model: &'a Model) -> Self {
        let kv = model.new_kv_pool(16, 32, KvDType::F16).unwrap();
        Session { model, kv, state: model.new_state_pool(1).unwrap(), table: (0..32).collect(), len: 0 }
    }

    fn feed(&mut self, tokens: &[u32]) -> Vec<f32> {
        self.len += tokens.len();
        let mut batch = ForwardBatch::default();
        batch.push_with_state(tokens, self.len, self.table.clone(), true, Some(0));
        let logits = self.model.forward_with_state(&batch, &mut self.kv, Some(&mut self.state)).unwrap();
        logits.get(0).unwrap().to_vec1::<f32>().unwrap()
    }
}

fn greedy(model: &Model, prompt: &[u32]) -> Vec<u32> {
    let mut s = Session::new(model);
    let mut logits = s.feed(prompt);
    let mut out = Vec::new();
    while out.len() < TOKENS {
        out.push(argmax(&logits));
        logits = s.feed(&out[out.len() - 1..]);
    }
    out
}

#[test]
fn qwen35_shape_greedy_matches_the_cpu_path() {
    let Some(dir) = std::env::var_os("RADIX_QWEN35_SHAPED").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: RADIX_QWEN35_SHAPED names no Qwen3.5-0.8B-shaped checkpoint (benches/gpu/check.sh writes one)"
        );
        return;
    };
    let spec = std::env::var("RADIX_TEST_DEVICE").unwrap_or_default();
    let options = match spec.as_str() {
        "" | "cpu" => LoadOptions { threads: 4, tensor_path: true, ..Default::default() },
        s => LoadOptions { threads: 4, device: parse_device(s).unwrap(), ..Default::default() },
    };
    let cpu = Model::load(&dir, &LoadOptions { threads: 16, ..Default::default() }).unwrap();
    let dev = Model::load(&dir, &options).unwrap();
    let vocab = cpu.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|p| (0..[7u32, 40, 100, 250][p as usize]).map(|i| (i * 7919 + p * 104_729 + 11) % vocab).collect())
        .collect();
    let mut free_equal = 0;
    for (i, prompt) in prompts.iter().enumerate() {
        let want = greedy(&cpu, prompt);
        let got = greedy(&dev, prompt);
        free_equal += usize::from(got == want);
        // Teacher-forced: both fed the CPU path's tokens.
        let (mut a, mut b) = (Session::new(&cpu), Session::new(&dev));
        let (mut la, mut lb) = (a.feed(prompt), b.feed(prompt));
        let (mut agree, mut near_ties, mut worst) = (0, 0, 0.0f32);
        for &t in &want {
            let diff = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
            worst = worst.max(diff);
            if argmax(&la) == argmax(&lb) {
                agree += 1;
            } else {
                assert!(
                    margin(&la) < diff,
                    "prompt {i}: the argmax differs with a margin {} over the logits' difference {diff}",
                    margin(&la)
                );
                near_ties += 1;
            }
            la = a.feed(&[t]);
            lb = b.feed(&[t]);
        }
        eprintln!(
            "{spec}: prompt {i} ({} tokens): free-running greedy equal: {}; teacher-forced argmax agrees \
             {agree}/{TOKENS}, {near_ties} near ties; largest logit difference {worst:.3e}",
            prompt.len(),
            got == want
        );
    }
    eprintln!("{spec}: free-running greedy equal on {free_equal} of {} prompts", prompts.len());
}
