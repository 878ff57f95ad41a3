//! Property tests of how a sequence's K/V may be laid over the paged pool: for random prompts,
//! chunk schedules, page sizes and scrambled page tables, the last token's logits do not depend
//! on how the prompt was fed (one pass, chunked prefill, chunked prefill then decode steps), and
//! a sequence that reuses another's prefix pages (sharing whole pages, copying a partly filled
//! last page with `KvPool::copy_page`) and computes only its suffix gets the logits it would get
//! alone from scratch, while the sequence it shares with is left intact. This is what the radix
//! cache relies on.
//!
//! Pools persist across cases, so pages handed out hold K/V of earlier cases: a kernel reading
//! outside a sequence's context would show up as a mismatch.
//!
//! Exactness: every comparison is bitwise. Where a sequence's K/V sit (which pages, page size 1,
//! 4 or 16) never mattered; how the tokens are chunked did while candle's f32 matmul took
//! another path for inputs of 1 or 2 rows (a decode step's K/V and logits a few ulps off the
//! one-pass ones, relative L2 up to 3.7e-6). On our dense kernel, whose rows never depend on the
//! batch (radix_kernels::dense), chunked prefill, decode steps and a shared prefix give the
//! one-pass logits bit for bit. The tolerances below only bound the report of a failure.

use std::sync::Mutex;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use radix_models::{ForwardBatch, KvDType, KvPool, KvTypes, LoadOptions, Model};

/// Relative L2 allowed between two ways of computing the same logits with f32 K/V.
const F32_TOLERANCE: f32 = 1e-5;
/// With f16 K/V, K/V that differ in the last f32 bits may round to neighbouring f16 values
/// (2^-11 apart), so the few-ulp differences above grow: worst seen 5.5e-5 over 300 cases.
const F16_TOLERANCE: f32 = 1e-3;

const CASES: u32 = 24;
const MAX_PROMPT: usize = 60;
const MAX_SUFFIX: usize = 20;

fn fixture(arch: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch).join("model.safetensors")
}

fn rel_l2(ours: &[f32], want: &[f32]) -> f32 {
    let diff: f32 = ours.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f32 = want.iter().map(|b| b * b).sum();
    (diff / norm).sqrt()
}

/// Worst error and bitwise agreement seen per comparison, printed at the end of each test.
#[derive(Default)]
struct Stats {
    rows: Vec<(&'static str, f32, usize, usize)>,
}

impl Stats {
    fn record(&mut self, what: &'static str, err: f32, bitwise: bool) {
        let i = match self.rows.iter().position(|r| r.0 == what) {
            Some(i) => i,
            None => {
                self.rows.push((what, 0.0, 0, 0));
                self.rows.len() - 1
            }
        };
        let row = &mut self.rows[i];
        row.1 = row.1.max(err);
        row.2 += bitwise as usize;
        row.3 += 1;
    }

    fn print(&self, name: &str) {
        for (what, worst, bitwise, total) in &self.rows {
            eprintln!("{name}: {what}: worst relative L2 {worst:e}, bitwise equal {bitwise}/{total}");
        }
    }
}

/// Hands out a case's pages from a seeded shuffle of the whole pool.
struct Pages {
    free: Vec<u32>,
    page_size: usize,
}

impl Pages {
    fn new(num_pages: usize, page_size: usize, seed: u64) -> Self {
        let mut free: Vec<u32> = (0..num_pages as u32).collect();
        let mut state = seed | 1;
        for i in (1..free.len()).rev() {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            free.swap(i, (state % (i as u64 + 1)) as usize);
        }
        Pages { free, page_size }
    }

    fn take(&mut self) -> u32 {
        self.free.pop().expect("test pool is large enough")
    }

    /// Grows `table` to hold `tokens` tokens.
    fn cover(&mut self, table: &mut Vec<u32>, tokens: usize) {
        while table.len() * self.page_size < tokens {
            let p = self.take();
            table.push(p);
        }
    }
}

/// Feeds `tokens[done..done + len]` of a sequence whose first `done` tokens are in `table`.
fn step(
    model: &Model,
    pool: &mut KvPool,
    pages: &mut Pages,
    table: &mut Vec<u32>,
    tokens: &[u32],
    done: usize,
) -> Vec<f32> {
    pages.cover(table, done + tokens.len());
    let mut batch = ForwardBatch::default();
    batch.push(tokens, done + tokens.len(), table.clone(), true);
    let logits = model.forward(&batch, pool).unwrap();
    assert_eq!(logits.dims(), [1, model.config().vocab_size]);
    logits.get(0).unwrap().to_vec1::<f32>().unwrap()
}

/// Feeds `tokens` in chunks of the given sizes (cycled, the last cut short); returns the last
/// logits and the page table.
fn run(model: &Model, pool: &mut KvPool, pages: &mut Pages, tokens: &[u32], sizes: &[usize]) -> (Vec<f32>, Vec<u32>) {
    let mut table = Vec::new();
    let mut done = 0;
    let mut logits = Vec::new();
    for &size in sizes.iter().cycle() {
        if done == tokens.len() {
            break;
        }
        let len = size.min(tokens.len() - done);
        logits = step(model, pool, pages, &mut table, &tokens[done..done + len], done);
        done += len;
    }
    (logits, table)
}

#[derive(Debug, Clone)]
struct Case {
    prompt: Vec<u32>,
    chunks: Vec<usize>,
    page_size: usize,
    seed: u64,
    decode_from: Index,
    shared: Index,
    suffix: Vec<u32>,
}

fn case(vocab: u32) -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0..vocab, 1..=MAX_PROMPT),
        prop::collection::vec(1usize..=17, 1..6),
        prop::sample::select(vec![1usize, 4, 16]),
        any::<u64>(),
        any::<Index>(),
        any::<Index>(),
        prop::collection::vec(0..vocab, 1..=MAX_SUFFIX),
    )
        .prop_map(|(prompt, chunks, page_size, seed, decode_from, shared, suffix)| Case {
            prompt,
            chunks,
            page_size,
            seed,
            decode_from,
            shared,
            suffix,
        })
}

/// Which comparisons must be bitwise equal.
struct Exactness {
    chunked: bool,
    decode: bool,
    shared_prefix: bool,
    page_size: bool,
}

fn check_arch(arch: &str, kv: impl Into<KvTypes>, tolerance: f32, exact: Exactness, cases: u32) {
    let kv: KvTypes = kv.into();
    let model =
        Model::load(&fixture(arch), &LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() })
            .unwrap();
    let vocab = model.config().vocab_size as u32;
    // One pool per page size, kept across cases. A case uses at most 7 sequences of up to
    // MAX_PROMPT + MAX_SUFFIX + 1 tokens.
    let pools: Mutex<Vec<(usize, KvPool)>> = Mutex::new(
        [1usize, 4, 16]
            .into_iter()
            .map(|ps| {
                let pages = 7 * (MAX_PROMPT + MAX_SUFFIX + 1).div_ceil(ps) + 7;
                (ps, KvPool::new(model.config(), ps, pages, kv).unwrap())
            })
            .collect(),
    );
    let stats = Mutex::new(Stats::default());
    let name = format!("{arch} ({kv} KV)");
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    runner
        .run(&case(vocab), |c| {
            let mut pools = pools.lock().unwrap();
            let mut stats = stats.lock().unwrap();
            let n = c.prompt.len();

            // Placement: the same schedule over other pages, and over every page size.
            let mut by_page_size = Vec::new();
            for (ps, pool) in pools.iter_mut() {
                let mut pages = Pages::new(pool.num_pages(), *ps, c.seed.rotate_left(17));
                by_page_size.push(run(&model, pool, &mut pages, &c.prompt, &c.chunks).0);
            }
            let pool = &mut pools.iter_mut().find(|(ps, _)| *ps == c.page_size).unwrap().1;
            let mut pages = Pages::new(pool.num_pages(), c.page_size, c.seed);
            let mut compare = |what: &'static str, got: &[f32], want: &[f32], bitwise: bool| {
                let err = rel_l2(got, want);
                let same = got == want;
                stats.record(what, err, same);
                prop_assert!(err.is_finite() && err <= tolerance, "{what}: relative L2 {err} > {tolerance}");
                if bitwise {
                    prop_assert!(same, "{what}: expected bitwise equal logits, relative L2 {err}");
                }
                Ok::<(), TestCaseError>(())
            };

            // The reference: the whole prompt in one pass.
            let (one_pass, table_a) = run(&model, pool, &mut pages, &c.prompt, &[n]);

            // Chunked prefill.
            let (chunked, _) = run(&model, pool, &mut pages, &c.prompt, &c.chunks);
            compare("chunked prefill", &chunked, &one_pass, exact.chunked)?;
            let elsewhere = &by_page_size[[1, 4, 16].iter().position(|&ps| ps == c.page_size).unwrap()];
            compare("same schedule, other pages", &chunked, elsewhere, true)?;
            for other in &by_page_size {
                compare("same schedule, other page size", &chunked, other, exact.page_size)?;
            }

            // Chunked prefill of the first k tokens, then decode steps.
            let k = c.decode_from.index(n) + 1;
            let (mut logits, mut table) = run(&model, pool, &mut pages, &c.prompt[..k], &c.chunks);
            for done in k..n {
                logits = step(&model, pool, &mut pages, &mut table, &c.prompt[done..done + 1], done);
            }
            compare("chunked prefill + decode", &logits, &one_pass, exact.decode)?;

            // B shares A's first p tokens: whole pages by reference, a partly filled last page
            // copied, then computes only its suffix.
            let p = c.shared.index(n) + 1;
            let ps = c.page_size;
            let b: Vec<u32> = c.prompt[..p].iter().chain(&c.suffix).copied().collect();
            let mut table_b = table_a[..p / ps].to_vec();
            if p % ps != 0 {
                let copy = pages.take();
                pool.copy_page(table_a[p / ps], copy, p % ps).unwrap();
                table_b.push(copy);
            }
            let shared = step(&model, pool, &mut pages, &mut table_b, &c.suffix, p);
            let (scratch, _) = run(&model, pool, &mut pages, &b, &[b.len()]);
            compare("shared prefix + suffix", &shared, &scratch, exact.shared_prefix)?;

            // A is intact: it decodes one more token as if alone.
            let mut table_a = table_a;
            let t = c.suffix[0];
            let continued = step(&model, pool, &mut pages, &mut table_a, &[t], n);
            let a_t: Vec<u32> = c.prompt.iter().copied().chain([t]).collect();
            let (scratch, _) = run(&model, pool, &mut pages, &a_t, &[a_t.len()]);
            compare("sharer decodes after copy-on-write", &continued, &scratch, exact.decode)?;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    stats.lock().unwrap().print(&name);
}

/// Everything is invisible bitwise (see the module comment).
const BITWISE: Exactness = Exactness { chunked: true, decode: true, shared_prefix: true, page_size: true };

#[test]
fn llama_chunking_is_invisible() {
    check_arch("llama", KvDType::F32, F32_TOLERANCE, BITWISE, CASES);
}

#[test]
fn qwen2_chunking_is_invisible() {
    check_arch("qwen2", KvDType::F32, F32_TOLERANCE, BITWISE, CASES);
}

#[test]
fn qwen3_chunking_is_invisible() {
    check_arch("qwen3", KvDType::F32, F32_TOLERANCE, BITWISE, CASES);
}

#[test]
fn f16_kv_chunking_is_invisible() {
    check_arch("qwen3", KvDType::F16, F16_TOLERANCE, BITWISE, 12);
}

/// Quantized K/V blocks depend only on their own token's values, so chunking, decode steps and
/// shared prefixes stay invisible bit for bit with q8_0 K and q4_0 V too.
#[test]
fn quantized_kv_chunking_is_invisible() {
    check_arch("qwen3", KvTypes { k: KvDType::Q8_0, v: KvDType::Q4_0 }, F16_TOLERANCE, BITWISE, 12);
}
