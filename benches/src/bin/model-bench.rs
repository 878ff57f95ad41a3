//! Prompt-processing and decode throughput of one GGUF model on our runtime, measured the way
//! `llama-bench` measures llama.cpp, plus the process's peak RSS.
//!
//! ```text
//! model-bench --model FILE.gguf [--threads 2] [--pp 512,2048] [--tg-ctx 512,2048]
//!             [--tg-tokens 32] [--ubatch 512] [--reps 3] [--kv-budget-mib 256] [--kv-dtype f16]
//!             [--pp-depth 8192,32768] [--touch-kv] [--attention] [--verify 4,16] [--mtp] [--json]
//! ```
//!
//! - `pp N`: N prompt tokens into an empty context in forwards of at most `--ubatch` tokens
//!   (logits for the last token only); tokens/s = N / time. As llama-bench's `pp N` (its
//!   default ubatch is 512) and as the server prefills a prompt (`--batch-tokens`, 512 by
//!   default). `--ubatch 0` runs one forward of all N.
//! - `pp N @ D` (`--pp-depth D`): D prompt tokens are prefilled (untimed, once), then N more
//!   are timed in forwards of at most `--ubatch`, each repetition at positions D.. again; as
//!   `llama-bench -p N -d D`: the prefill of a prompt's tail after a long cached prefix.
//! - `tg @ C`: C prompt tokens are prefilled (untimed), then `--tg-tokens` decode steps of one
//!   token each (logits wanted) are timed; tokens/s = steps / time. Like `llama-bench -n 32 -d C`.
//!   Each repetition decodes at positions C.. again, over the same prefilled prefix.
//! - Each figure is the median of `--reps` runs, after an untimed warm-up (a prefill of the first
//!   `--pp` size and a decode step, as llama-bench warms up).
//! - The KV pool is `--kv-budget-mib` of `--kv-dtype`, pages of 16 tokens, as the server
//!   allocates it; if it cannot hold the longest context asked for, it is grown to fit (said on
//!   stderr). `--touch-kv` writes every page once, so the whole budget is resident, as in a
//!   server whose cache has filled up: the peak RSS then bounds serving.
//! - `--attention`: also times the attention kernel alone (`write_kv` + `paged_attention` for
//!   every layer, same shapes, same threads), to split each figure into attention and the rest.
//! - A length of 0 in `--pp` or `--tg-ctx` is skipped (`--pp 0` times decode alone).
//! - `--verify D`: at each `--tg-ctx`, also `--tg-tokens` speculative-decoding rounds that
//!   verify D drafted tokens and reject them all (the last token and D drafts in one forward,
//!   read as the engine reads it: the first row's logits only; then a hybrid model's state
//!   advanced over the one accepted row): what a round of bad drafts costs against the plain
//!   decode step that yields the same one token.
//! - Peak RSS is `VmHWM` of `/proc/self/status` at the end.
//!
//! Token ids are arbitrary (`i * 7919 % vocab`): the cost does not depend on them.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use radix_kernels::half::f16;
use radix_kernels::{PagedLayout, SequenceAttention, paged_attention, write_kv};
use radix_models::{ForwardBatch, KvDType, KvPool, KvTypes, LoadOptions, Model, MtpDraftRequest, StatePool};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Prompt-processing and decode tokens/s of a GGUF model on our runtime")]
struct Args {
    /// The GGUF model.
    #[arg(long)]
    model: PathBuf,
    /// Model threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Prompt lengths to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pp: Vec<usize>,
    /// Contexts at which to time decode (comma-separated).
    #[arg(long = "tg-ctx", value_delimiter = ',', default_value = "512,2048")]
    tg_ctx: Vec<usize>,
    /// Depths at which to time each `--pp` size again, after that many tokens (comma-separated).
    #[arg(long = "pp-depth", value_delimiter = ',')]
    pp_depth: Vec<usize>,
    /// Decode steps timed per repetition.
    #[arg(long = "tg-tokens", default_value_t = 32)]
    tg_tokens: usize,
    /// Most prompt tokens per forward in `--pp` and in the untimed prefills (0: all in one).
    #[arg(long, default_value_t = 512)]
    ubatch: usize,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// KV pool budget in MiB.
    #[arg(long = "kv-budget-mib", default_value_t = 256)]
    kv_budget_mib: usize,
    /// KV element type: f16, bf16, f32, q8_0 or q4_0; `K/V` (e.g. `q8_0/q4_0`) for two.
    #[arg(long = "kv-dtype", default_value = "f16")]
    kv_dtype: String,
    /// Tokens per KV page.
    #[arg(long = "page-size", default_value_t = 16)]
    page_size: usize,
    /// Write every KV page once, so the whole budget is resident for the RSS figure.
    #[arg(long = "touch-kv")]
    touch_kv: bool,
    /// Draft lengths whose all-rejected verify rounds to time at each decode context.
    #[arg(long, value_delimiter = ',')]
    verify: Vec<usize>,
    /// Also time the attention kernel alone with the same shapes.
    #[arg(long)]
    attention: bool,
    /// Load the file's multi-token-prediction head (Qwen3.5/3.6 `nextn` layers): every forward
    /// then also writes its K/V, and a `--verify` round's drafts are the head's (their drafting
    /// timed with the round).
    #[arg(long)]
    mtp: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn status_kib(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn tokens(n: usize, offset: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((offset + i) * 7919 % vocab) as u32).collect()
}

/// Runs one forward of `new` tokens ending at context `context_len` (`logits`: for its last
/// token); a hybrid model's recurrent state is slot 0 of `state` (a forward from position 0
/// starts it afresh; the repeated decode runs at one depth continue a state that ran ahead,
/// which costs the same).
fn forward(
    model: &Model,
    pool: &mut KvPool,
    state: &mut Option<StatePool>,
    pages: &[u32],
    new: &[u32],
    context_len: usize,
    logits: bool,
) -> Result<f64> {
    let mut batch = ForwardBatch::default();
    let need = context_len.div_ceil(pool.page_size());
    batch.push_with_state(new, context_len, pages[..need].to_vec(), logits, state.as_ref().map(|_| 0));
    let t = Instant::now();
    let out = model.forward_with_state(&batch, pool, state.as_mut())?;
    let dt = t.elapsed().as_secs_f64();
    if logits {
        anyhow::ensure!(out.dims()[0] == 1, "expected one row of logits, got {:?}", out.dims());
    }
    Ok(dt)
}

/// One speculative round whose drafts are all rejected: `span` (the last token, then drafts)
/// verified in one forward whose first token lands at position `accepted_end - 1`, then the
/// state advanced over that one row. Returns the seconds of both.
fn reject_all(
    model: &Model,
    pool: &mut KvPool,
    state: &mut Option<StatePool>,
    pages: &[u32],
    span: &[u32],
    accepted_end: usize,
) -> Result<f64> {
    let context_len = accepted_end - 1 + span.len();
    let t = Instant::now();
    let mut span = span.to_vec();
    if let Some(state) = state.as_ref().filter(|_| model.has_mtp_head()) {
        let request = MtpDraftRequest {
            token: span[0],
            position: accepted_end - 1,
            page_table: &pages[..context_len.div_ceil(pool.page_size())],
            state_slot: 0,
            max_tokens: span.len() - 1,
        };
        let drafts = model.draft_mtp(pool, state, &[request], 0.0)?.remove(0);
        anyhow::ensure!(drafts.len() == span.len() - 1, "the head drafted {} tokens", drafts.len());
        span[1..].copy_from_slice(&drafts);
    }
    let mut batch = ForwardBatch::default();
    batch.push_verify(
        &span,
        context_len,
        pages[..context_len.div_ceil(pool.page_size())].to_vec(),
        state.as_ref().map(|_| 0),
    );
    // As the engine reads a round: the first row's logits, which reject the first draft; the
    // other rows' are never computed.
    let out = model.forward_pass(&batch, pool, state.as_mut())?;
    anyhow::ensure!(out.len() == span.len(), "expected a row of logits per verified token, got {}", out.len());
    out.row(0)?;
    if let Some(state) = state.as_mut() {
        model.apply_verified(state, 0, 0..1)?;
        state.discard_verified(0);
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The forwards a prompt of `n` tokens is prefilled in, as the server's scheduler splits it:
/// `(start, end)` of at most `ubatch` tokens each (0: one forward).
fn ubatches(n: usize, ubatch: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = if ubatch == 0 { n.max(1) } else { ubatch };
    (0..n).step_by(step).map(move |start| (start, (start + step).min(n)))
}

/// Prefills `prompt` into an empty context in [`ubatches`]; logits for the last token only.
/// Returns the seconds spent in forwards.
fn prefill(
    model: &Model,
    pool: &mut KvPool,
    state: &mut Option<StatePool>,
    pages: &[u32],
    prompt: &[u32],
    ubatch: usize,
) -> Result<f64> {
    let mut total = 0.0;
    for (start, end) in ubatches(prompt.len(), ubatch) {
        total += forward(model, pool, state, pages, &prompt[start..end], end, end == prompt.len())?;
    }
    Ok(total)
}

/// The attention kernel alone: `write_kv` + `paged_attention` for every layer of a forward of
/// `new` tokens at context `context_len`, on a pool of `threads` threads; the K/V storage is one
/// layer's, reused for every layer (the cost per layer is the same).
struct AttentionProbe {
    pool: rayon::ThreadPool,
    layout: PagedLayout,
    heads: usize,
    layers: usize,
    k: Vec<f16>,
    v: Vec<f16>,
}

impl AttentionProbe {
    fn time(&mut self, new: usize, context_len: usize) -> f64 {
        let l = self.layout;
        let (rows, slot) = (new * self.heads * l.head_dim, l.slot_len());
        let q: Vec<f32> = (0..rows).map(|i| ((i * 31 % 97) as f32 - 48.0) / 97.0).collect();
        let kv: Vec<f32> = (0..new * slot).map(|i| ((i * 17 % 89) as f32 - 44.0) / 89.0).collect();
        let pages: Vec<u32> = (0..context_len.div_ceil(l.page_size) as u32).collect();
        let slots: Vec<u32> = (context_len - new..context_len).map(|p| p as u32).collect();
        let seq = SequenceAttention { query_start: 0, query_len: new, context_len, page_table: &pages };
        let mut out = vec![0.0f32; rows];
        let scale = 1.0 / (l.head_dim as f32).sqrt();
        let (k, v) = (&mut self.k, &mut self.v);
        let t = Instant::now();
        self.pool.install(|| {
            for _ in 0..self.layers {
                write_kv(&l, &kv, &kv, &slots, k, v).expect("write_kv");
                paged_attention(&l, self.heads, scale, &q, k, v, &[seq], &mut out).expect("paged_attention");
            }
        });
        t.elapsed().as_secs_f64()
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let kv_type = |name: &str| KvDType::from_name(name).ok_or_else(|| anyhow::anyhow!("unknown --kv-dtype {name}"));
    let dtype = match a.kv_dtype.split_once('/') {
        Some((k, v)) => KvTypes { k: kv_type(k)?, v: kv_type(v)? },
        None => KvTypes::from(kv_type(&a.kv_dtype)?),
    };
    // candle's matmul pool as radix-serve configures it (threads and spin limit), so this times
    // the server's model path. No other thread exists yet.
    radix_models::configure_candle_pool(a.threads);
    radix_models::configure_allocator();
    let rss_before = status_kib("VmRSS:").unwrap_or(0);
    let t = Instant::now();
    let model = Model::from_gguf(
        &a.model,
        &LoadOptions { threads: a.threads, dequantize_weights: false, mtp: a.mtp, ..Default::default() },
    )
    .with_context(|| format!("loading {}", a.model.display()))?;
    let load_s = t.elapsed().as_secs_f64();
    let rss_model = status_kib("VmRSS:").unwrap_or(0);
    let c = model.config().clone();
    for n in model.load_notes() {
        eprintln!("model-bench: load note: {n}");
    }

    let budget = a.kv_budget_mib << 20;
    let page_bytes = KvPool::page_bytes(&c, a.page_size, dtype);
    let deepest_pp = a.pp_depth.iter().max().map_or(0, |d| d + a.pp.iter().max().copied().unwrap_or(0));
    let longest =
        a.pp.iter().copied().chain(a.tg_ctx.iter().map(|&x| x + a.tg_tokens)).chain([deepest_pp]).max().unwrap_or(1);
    let need_pages = longest.div_ceil(a.page_size);
    let mut pool = KvPool::with_budget(&c, a.page_size, budget, dtype)?;
    if pool.num_pages() < need_pages {
        eprintln!(
            "model-bench: {} MiB holds {} pages of {}; growing to {need_pages} pages for {longest} tokens",
            a.kv_budget_mib,
            pool.num_pages(),
            a.page_size
        );
        pool = KvPool::new(&c, a.page_size, need_pages, dtype)?;
    }
    if a.touch_kv {
        for p in 1..pool.num_pages() as u32 {
            pool.copy_page(0, p, a.page_size)?;
        }
    }
    let mut state = c.hybrid.is_some().then(|| model.new_state_pool(1)).transpose()?;
    let rss_pool = status_kib("VmRSS:").unwrap_or(0);
    let pages: Vec<u32> = (0..pool.num_pages() as u32).collect();
    let vocab = c.vocab_size;

    let mut probe = a.attention.then(|| AttentionProbe {
        pool: rayon::ThreadPoolBuilder::new().num_threads(a.threads).build().expect("attention threads"),
        layout: PagedLayout {
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            page_size: a.page_size,
            num_pages: need_pages,
        },
        heads: c.num_heads,
        layers: c.num_kv_layers(),
        k: vec![f16::ZERO; need_pages * a.page_size * c.num_kv_heads * c.head_dim],
        v: vec![f16::ZERO; need_pages * a.page_size * c.num_kv_heads * c.head_dim],
    });

    // Warm-up, as llama-bench warms up: a prefill of the first prompt size (which also makes
    // candle repack every matrix a prefill touches, a MoE model's experts included, once) and a
    // decode step.
    let warm = a.pp.iter().copied().find(|&n| n > 0).unwrap_or(16).min(longest);
    prefill(&model, &mut pool, &mut state, &pages, &tokens(warm, 0, vocab), a.ubatch)?;
    forward(&model, &mut pool, &mut state, &pages, &tokens(1, warm, vocab), warm + 1, true)?;

    let rss_warm = status_kib("VmRSS:").unwrap_or(0);
    let mut results = Vec::new();
    for &n in a.pp.iter().filter(|&&n| n > 0) {
        let times: Vec<f64> = (0..a.reps)
            .map(|r| prefill(&model, &mut pool, &mut state, &pages, &tokens(n, r, vocab), a.ubatch))
            .collect::<Result<_>>()?;
        let s = median(times);
        let attn = probe.as_mut().map(|p| {
            let once =
                |p: &mut AttentionProbe| ubatches(n, a.ubatch).map(|(start, end)| p.time(end - start, end)).sum();
            median((0..a.reps).map(|_| once(p)).collect())
        });
        eprintln!("model-bench: pp{n}: {:.2} tok/s", n as f64 / s);
        results.push(json!({"test": format!("pp{n}"), "n_prompt": n, "n_gen": 0, "depth": 0,
            "seconds": s, "tokens_per_s": n as f64 / s, "attention_seconds": attn,
            "rss_kib_after": status_kib("VmRSS:"), "peak_rss_kib_after": status_kib("VmHWM:")}));
    }
    // The depth whose prefix the pool holds: a decode at the same depth reuses it (the timed
    // chunks after it overwrite only positions past it), as llama-bench reuses its depth state.
    let mut prefilled = None;
    for &depth in a.pp_depth.iter().filter(|&&d| d > 0) {
        prefill(&model, &mut pool, &mut state, &pages, &tokens(depth, 3000, vocab), a.ubatch)?;
        prefilled = Some(depth);
        for &n in a.pp.iter().filter(|&&n| n > 0) {
            let times: Vec<f64> = (0..a.reps)
                .map(|r| {
                    let chunk = tokens(n, 9000 + r, vocab);
                    ubatches(n, a.ubatch)
                        .map(|(start, end)| {
                            let logits = end == n;
                            forward(&model, &mut pool, &mut state, &pages, &chunk[start..end], depth + end, logits)
                        })
                        .sum()
                })
                .collect::<Result<_>>()?;
            let s = median(times);
            let attn = probe.as_mut().map(|p| {
                let once = |p: &mut AttentionProbe| {
                    ubatches(n, a.ubatch).map(|(start, end)| p.time(end - start, depth + end)).sum()
                };
                median((0..a.reps).map(|_| once(p)).collect())
            });
            eprintln!("model-bench: pp{n}@d{depth}: {:.2} tok/s", n as f64 / s);
            results.push(json!({"test": format!("pp{n}@d{depth}"), "n_prompt": n, "n_gen": 0, "depth": depth,
                "seconds": s, "tokens_per_s": n as f64 / s, "attention_seconds": attn,
                "rss_kib_after": status_kib("VmRSS:"), "peak_rss_kib_after": status_kib("VmHWM:")}));
        }
    }
    for &ctx in a.tg_ctx.iter().filter(|&&c| c > 0) {
        if prefilled != Some(ctx) {
            prefill(&model, &mut pool, &mut state, &pages, &tokens(ctx, 1000, vocab), a.ubatch)?;
            prefilled = Some(ctx);
        }
        let mut times = Vec::new();
        for r in 0..a.reps {
            let mut total = 0.0;
            for i in 0..a.tg_tokens {
                total += forward(
                    &model,
                    &mut pool,
                    &mut state,
                    &pages,
                    &tokens(1, 5000 + r * 100 + i, vocab),
                    ctx + i + 1,
                    true,
                )?;
            }
            times.push(total);
        }
        let s = median(times);
        let attn = probe
            .as_mut()
            .map(|p| median((0..a.reps).map(|_| (0..a.tg_tokens).map(|i| p.time(1, ctx + i + 1)).sum()).collect()));
        let tps = a.tg_tokens as f64 / s;
        eprintln!("model-bench: tg{}@d{ctx}: {tps:.2} tok/s", a.tg_tokens);
        results.push(json!({"test": format!("tg{}@d{ctx}", a.tg_tokens), "n_prompt": 0, "n_gen": a.tg_tokens,
            "depth": ctx, "seconds": s, "tokens_per_s": tps, "attention_seconds": attn,
            "rss_kib_after": status_kib("VmRSS:"), "peak_rss_kib_after": status_kib("VmHWM:")}));
        for &drafted in &a.verify {
            let times: Vec<f64> = (0..a.reps)
                .map(|r| {
                    (0..a.tg_tokens)
                        .map(|i| {
                            let span = tokens(1 + drafted, 7000 + r * 100 + i, vocab);
                            reject_all(&model, &mut pool, &mut state, &pages, &span, ctx + i + 1)
                        })
                        .sum()
                })
                .collect::<Result<_>>()?;
            let round = median(times);
            // The same tokens as an ordinary forward (a prefill chunk, logits for its last row):
            // what verifying adds beyond computing the rows is the rest.
            let times: Vec<f64> = (0..a.reps)
                .map(|r| {
                    (0..a.tg_tokens)
                        .map(|i| {
                            let span = tokens(1 + drafted, 7000 + r * 100 + i, vocab);
                            forward(&model, &mut pool, &mut state, &pages, &span, ctx + i + 1 + drafted, true)
                        })
                        .sum()
                })
                .collect::<Result<_>>()?;
            let chunk = median(times);
            eprintln!(
                "model-bench: verify {drafted} all rejected @d{ctx}: {:.2} tok/s, {:.3}x a decode step, {:.3}x a \
                 forward of the same {} tokens",
                a.tg_tokens as f64 / round,
                round / s,
                round / chunk,
                drafted + 1
            );
            results.push(json!({"test": format!("verify{drafted}@d{ctx}"), "n_prompt": 0, "n_gen": a.tg_tokens,
                "depth": ctx, "seconds": round, "tokens_per_s": a.tg_tokens as f64 / round,
                "over_decode_step": round / s, "over_same_forward": round / chunk, "attention_seconds": null,
                "rss_kib_after": status_kib("VmRSS:"), "peak_rss_kib_after": status_kib("VmHWM:")}));
        }
    }

    let peak = status_kib("VmHWM:").unwrap_or(0);
    let file_bytes = std::fs::metadata(&a.model)?.len();
    let kv_bytes = pool.num_pages() * page_bytes;
    let out = json!({
        "model": a.model.display().to_string(),
        "arch": format!("{:?}", c.arch),
        "file_bytes": file_bytes,
        "threads": a.threads,
        "isa": radix_models::CpuIsa::active().name(),
        "candle_num_threads": std::env::var("CANDLE_NUM_THREADS").unwrap_or_default(),
        "candle_spin_limit": std::env::var("CANDLE_BARRIER_POOL_SPIN_LIMIT").unwrap_or_default(),
        "reps": a.reps,
        "load_seconds": load_s,
        "kv": {"dtype": a.kv_dtype, "page_size": a.page_size, "pages": pool.num_pages(), "bytes": kv_bytes,
               "budget_mib": a.kv_budget_mib, "touched": a.touch_kv},
        "rss_kib": {"start": rss_before, "after_load": rss_model, "after_pool": rss_pool, "after_warmup": rss_warm, "peak": peak,
                    "file_end": status_kib("RssFile:").unwrap_or(0), "anon_end": status_kib("RssAnon:").unwrap_or(0)},
        "results": results,
    });
    if a.json {
        println!("{out}");
    } else {
        println!("model {} ({:.1} MiB), {} threads", a.model.display(), file_bytes as f64 / 1048576.0, a.threads);
        for r in out["results"].as_array().unwrap() {
            let attn = r["attention_seconds"]
                .as_f64()
                .map(|x| format!("  attention {:.0}%", 100.0 * x / r["seconds"].as_f64().unwrap()));
            println!(
                "{:>14} {:>10.2} tok/s{}",
                r["test"].as_str().unwrap(),
                r["tokens_per_s"].as_f64().unwrap(),
                attn.unwrap_or_default()
            );
        }
        println!(
            "peak RSS {:.1} MiB (model file {:.1} MiB + KV {:.1} MiB{} + 150 MiB = bound {:.1} MiB)",
            peak as f64 / 1024.0,
            file_bytes as f64 / 1048576.0,
            kv_bytes as f64 / 1048576.0,
            if a.touch_kv { ", all resident" } else { ", untouched pages not resident" },
            file_bytes as f64 / 1048576.0 + a.kv_budget_mib as f64 + 150.0
        );
    }
    Ok(())
}
