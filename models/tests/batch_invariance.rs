//! Batch invariance of whole models on the CPU (ARCHITECTURE.md §3, invariant 3, and README
//! "Determinism"): a sequence's logits are bitwise the same whether it runs alone or packed with
//! others, whatever the others are doing (prefilling long chunks, decoding), however its own
//! prompt is chunked, and whatever the thread count. Every architecture, from f32 safetensors
//! (dense float matmuls) and from Q8_0 GGUF (quantized ones), with f16 K/V as the server keeps.
//!
//! Each case: a few sequences with random prompts, each run alone in one chunk schedule, then all
//! together in another (random chunk sizes, sequences joining at different steps), followed by
//! decode steps; the logits after the prompt and after every decode step must agree bit for bit.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use radix_models::{ForwardBatch, KvDType, KvPool, LoadOptions, Model, StatePool};

const SEQUENCES: usize = 3;
const DECODE_STEPS: usize = 3;
const PAGE_SIZE: usize = 4;

fn fixtures(arch: &str) -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch);
    vec![dir.join("model-q8_0.gguf"), dir.join("model.safetensors")]
}

/// One sequence's progress through a run.
struct Running {
    tokens: Vec<u32>,
    prompt_len: usize,
    done: usize,
    table: Vec<u32>,
    slot: Option<u32>,
    /// Logits after the prompt and after each decode step.
    logits: Vec<Vec<f32>>,
}

/// Runs `prompts` (with `DECODE_STEPS` decode steps each, fed fixed tokens) with every sequence's
/// prompt cut into chunks of `chunks[i]` (cycled); sequence `i` joins at step `joins[i]`; a step
/// packs what every joined sequence has next. Returns each sequence's logits.
fn run(model: &Model, prompts: &[Vec<u32>], chunks: &[Vec<usize>], joins: &[usize]) -> Vec<Vec<Vec<f32>>> {
    let config = model.config();
    let mut pool = KvPool::new(config, PAGE_SIZE, 256, KvDType::F16).unwrap();
    let mut state: Option<StatePool> = config.hybrid.is_some().then(|| model.new_state_pool(prompts.len()).unwrap());
    let mut next_page = 0u32;
    let mut seqs: Vec<Running> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut tokens = p.clone();
            tokens.extend((0..DECODE_STEPS as u32).map(|t| (t * 13 + p[0]) % config.vocab_size as u32));
            Running {
                tokens,
                prompt_len: p.len(),
                done: 0,
                table: Vec::new(),
                slot: state.is_some().then_some(i as u32),
                logits: Vec::new(),
            }
        })
        .collect();
    let mut step = 0;
    let mut chunk_index = vec![0usize; seqs.len()];
    while seqs.iter().any(|s| s.logits.len() < DECODE_STEPS + 1) {
        let mut batch = ForwardBatch::default();
        let mut members = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate() {
            if step < joins[i] || s.logits.len() == DECODE_STEPS + 1 {
                continue;
            }
            let len = if s.done < s.prompt_len {
                let size = chunks[i][chunk_index[i] % chunks[i].len()];
                chunk_index[i] += 1;
                size.min(s.prompt_len - s.done)
            } else {
                1
            };
            let end = s.done + len;
            while s.table.len() * PAGE_SIZE < end {
                s.table.push(next_page);
                next_page += 1;
            }
            let wants = end >= s.prompt_len;
            batch.push_with_state(&s.tokens[s.done..end], end, s.table.clone(), wants, s.slot);
            members.push((i, wants));
            s.done = end;
        }
        step += 1;
        if members.is_empty() {
            continue;
        }
        let logits = model.forward_with_state(&batch, &mut pool, state.as_mut()).unwrap();
        let rows = logits.to_vec2::<f32>().unwrap();
        let mut row = rows.into_iter();
        for (i, wants) in members {
            if wants {
                seqs[i].logits.push(row.next().expect("a row per sequence that wants logits"));
            }
        }
    }
    seqs.into_iter().map(|s| s.logits).collect()
}

fn check(arch: &str, cases: u32) {
    for path in fixtures(arch) {
        // The model runs on its own pool of this many threads.
        let models: Vec<Model> = (1..=3)
            .map(|threads| Model::load(&path, &LoadOptions { threads, ..Default::default() }).unwrap())
            .collect();
        let vocab = models[0].config().vocab_size as u32;
        let strategy = (
            prop::collection::vec(prop::collection::vec(0..vocab, 1..40), SEQUENCES),
            prop::collection::vec(prop::collection::vec(1usize..24, 1..4), SEQUENCES),
            prop::collection::vec(0usize..6, SEQUENCES),
            1usize..4,
        );
        let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
        let result = runner.run(&strategy, |(prompts, chunks, joins, threads)| {
            let together = run(&models[threads - 1], &prompts, &chunks, &joins);
            for (i, prompt) in prompts.iter().enumerate() {
                // Alone, in one chunk, on one thread.
                let alone = run(&models[0], std::slice::from_ref(prompt), &[vec![prompt.len()]], &[0]).remove(0);
                for (step, (a, b)) in alone.iter().zip(&together[i]).enumerate() {
                    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                    prop_assert!(
                        same,
                        "{}: sequence {} step {}: packed logits differ from alone",
                        path.display(),
                        i,
                        step
                    );
                }
            }
            Ok(())
        });
        if let Err(e) = result {
            panic!("{arch}: {e}");
        }
    }
}

#[test]
fn llama_rows_never_depend_on_the_batch() {
    check("llama", 6);
}

#[test]
fn qwen2_rows_never_depend_on_the_batch() {
    check("qwen2", 6);
}

#[test]
fn qwen3_rows_never_depend_on_the_batch() {
    check("qwen3", 6);
}

#[test]
fn qwen3moe_rows_never_depend_on_the_batch() {
    check("qwen3moe", 6);
}

#[test]
fn qwen35_rows_never_depend_on_the_batch() {
    check("qwen35", 6);
}

#[test]
fn qwen35moe_rows_never_depend_on_the_batch() {
    check("qwen35moe", 6);
}
