//! What quantized K/V costs a model's predictions: the KL divergence of every next-token
//! distribution over a long text with K/V stored as each given type, against the same text
//! with f16 K/V (llama.cpp's `llama-perplexity --kl-divergence` measure). Not a test.
//!
//!   kv-kl MODEL.gguf TEXT_FILE [--tokens 8192] [--types q8_0,q8_0/q4_0,q4_0] [--chunk 256]
//!         [--threads 2]
//!
//! The text is tokenized with the model's own tokenizer and cut to `--tokens`; every pool
//! prefills it in the same chunks with a logits row per token (dense models only: a verify
//! chunk, which for attention-only models is an ordinary chunk with every row's logits).
//! Prints, per type: mean, median, p99 and max KL (nats) and how often the top token agrees.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use radix_models::tokenizer::Tokenizer;
use radix_models::{ForwardBatch, KvDType, KvPool, KvTypes, LoadOptions, Model};

#[derive(Parser)]
struct Args {
    /// The model (a GGUF with its tokenizer).
    model: PathBuf,
    /// The text to read (code or prose; at least `--tokens` tokens of it).
    text: PathBuf,
    /// Tokens of the text to score.
    #[arg(long, default_value_t = 8192)]
    tokens: usize,
    /// K/V types to compare with f16: a type, or `K/V`, comma-separated.
    #[arg(long, default_value = "q8_0,q8_0/q4_0,q4_0")]
    types: String,
    /// Tokens per forward pass.
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

fn parse_types(spec: &str) -> Result<KvTypes> {
    let one = |name: &str| KvDType::from_name(name).with_context(|| format!("unknown KV type {name}"));
    Ok(match spec.split_once('/') {
        Some((k, v)) => KvTypes { k: one(k)?, v: one(v)? },
        None => KvTypes::from(one(spec)?),
    })
}

/// Log-probabilities of one logits row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_sum = sum.ln() + max;
    row.iter().map(|&x| x as f64 - log_sum).collect()
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
}

fn main() -> Result<()> {
    let a = Args::parse();
    let configs: Vec<KvTypes> = a.types.split(',').map(parse_types).collect::<Result<_>>()?;
    radix_models::configure_candle_pool(a.threads);
    let model =
        Model::load(&a.model, &LoadOptions { threads: a.threads, dequantize_weights: false, ..Default::default() })
            .with_context(|| format!("loading {}", a.model.display()))?;
    if model.config().hybrid.is_some() {
        bail!("kv-kl scores attention-only models (a hybrid model's verify chunk does not advance its state)");
    }
    let tokenizer = Tokenizer::from_gguf_file(&a.model).context("the model's tokenizer")?;
    let text = std::fs::read_to_string(&a.text).with_context(|| format!("reading {}", a.text.display()))?;
    let mut tokens = tokenizer.encode(&text, false)?;
    if tokens.len() < a.tokens {
        bail!("{} has {} tokens, fewer than --tokens {}", a.text.display(), tokens.len(), a.tokens);
    }
    tokens.truncate(a.tokens);
    let n = tokens.len();
    let page_size = 16;
    let pages = n.div_ceil(page_size) + 1;
    let table: Vec<u32> = (0..pages as u32).collect();
    let mut pools: Vec<KvPool> = std::iter::once(KvTypes::from(KvDType::F16))
        .chain(configs.iter().copied())
        .map(|t| model.new_kv_pool(page_size, pages, t))
        .collect::<radix_models::Result<_>>()?;
    // Per compared type: every position's KL, and how many top tokens agree.
    let mut kl: Vec<Vec<f64>> = vec![Vec::with_capacity(n); configs.len()];
    let mut agree = vec![0usize; configs.len()];
    let started = Instant::now();
    for start in (0..n).step_by(a.chunk) {
        let end = (start + a.chunk).min(n);
        let mut batch = ForwardBatch::default();
        batch.push_verify(&tokens[start..end], end, table.clone(), None);
        let rows: Vec<Vec<Vec<f32>>> = pools
            .iter_mut()
            .map(|pool| model.forward(&batch, pool).and_then(|t| Ok(t.to_vec2::<f32>()?)))
            .collect::<radix_models::Result<_>>()?;
        let (reference, others) = rows.split_first().expect("the f16 pool");
        for (r, want) in reference.iter().enumerate() {
            let p = log_softmax(want);
            for (c, rows) in others.iter().enumerate() {
                let q = log_softmax(&rows[r]);
                kl[c].push(p.iter().zip(&q).map(|(lp, lq)| lp.exp() * (lp - lq)).sum::<f64>().max(0.0));
                agree[c] += usize::from(argmax(want) == argmax(&rows[r]));
            }
        }
        eprintln!("kv-kl: {end}/{n} tokens, {:.0} s", started.elapsed().as_secs_f64());
    }
    println!("{} tokens of {} on {}", n, a.text.display(), a.model.display());
    println!("| K/V | mean KL | median KL | p99 KL | max KL | same top token |");
    println!("|---|---|---|---|---|---|");
    for (c, types) in configs.iter().enumerate() {
        let mut sorted = kl[c].clone();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
        println!(
            "| {} / {} | {mean:.6} | {:.6} | {:.6} | {:.6} | {:.2}% |",
            types.k,
            types.v,
            at(0.5),
            at(0.99),
            sorted[sorted.len() - 1],
            100.0 * agree[c] as f64 / n as f64
        );
    }
    Ok(())
}
