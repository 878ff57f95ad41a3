//! Prefill and decode speed of model shapes with random weights on one device (a GPU, usually),
//! with each decode step compared against the memory-bandwidth floor.
//!
//! ```text
//! device-bench --device cuda:0 [--shapes qwen3-0.6b,qwen3-8b] [--formats bf16,q4k]
//!              [--batches 1,8,32] [--contexts 2048,8192] [--decode-steps 8]
//!              [--max-prefill-pairs 134217728] [--json FILE]
//! ```
//!
//! - Weights are random (`radix_models::RandomWeights`) of the named shape, made on the device:
//!   no multi-gigabyte file to write or carry. The KV pool is bf16, pages of 16 tokens.
//! - `decode B @ C`: B sequences whose C context positions hold random K/V (filled, not
//!   prefilled) take `--decode-steps` steps of one token each, after two untimed ones; each step
//!   ends with the argmax of every row read back, as the server's greedy sampler does.
//!   ms/step, tokens/s = B / step time.
//! - The floor of a step is the bytes it must read (every weight once, the lm_head included, plus
//!   B x C positions of K and V in every layer) over the device-to-device copy bandwidth measured
//!   at the start (bytes read + written per second, as copy bandwidth is usually counted).
//!   `floor %` = floor / measured step time.
//! - `prefill B x C`: B sequences of C new tokens, in forward passes of up to 8,192 tokens;
//!   tokens/s = B x C / time. Skipped when B x C x C exceeds `--max-prefill-pairs` (attention
//!   work grows with it; the default keeps one run within the device time a session has).
//! - Shapes: `qwen3-0.6b`, `qwen3-8b` (dense), `qwen3.5-0.8b` (hybrid: Gated DeltaNet layers
//!   over a state pool, a slot per sequence, its state zero rather than random: the work is the
//!   same), `qwen3-30b-a3b` (MoE, 128 experts, top-8; its floor counts the weights a step can
//!   touch at most: the dense part plus min(128, 8 x batch) experts a layer). `tiny` and
//!   `tiny-hybrid` (2 and 4 layers, hidden 256) are for trying the tool on a CPU.
//! - `--cpu-moe-layers N` keeps the first N layers' experts on the CPU (`--n-cpu-moe`).

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use radix_models::{
    Device, ForwardBatch, KvDType, KvPool, LoadOptions, Model, ModelConfig, RandomFormat, RandomWeights, StatePool,
    device_name, parse_device,
};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Prefill and decode speed of random-weight model shapes on a device")]
struct Args {
    /// cpu, cuda[:N] or metal.
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Shapes: qwen3-0.6b, qwen3-8b, qwen3.5-0.8b, qwen3-30b-a3b, tiny, tiny-hybrid.
    #[arg(long, value_delimiter = ',', default_value = "qwen3-0.6b,qwen3-8b")]
    shapes: Vec<String>,
    /// Weight formats: bf16, q4k.
    #[arg(long, value_delimiter = ',', default_value = "bf16,q4k")]
    formats: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batches: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "2048,8192")]
    contexts: Vec<usize>,
    #[arg(long, default_value_t = 8)]
    decode_steps: usize,
    #[arg(long, default_value_t = 1 << 27)]
    max_prefill_pairs: usize,
    /// Host threads (CPU device only).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// MoE shapes: the first N layers' experts stay in host memory on the CPU kernels.
    #[arg(long, default_value_t = 0)]
    cpu_moe_layers: usize,
    /// K/V page types to run each shape with (K and V the same): bf16, f16, f32, q8_0, q4_0.
    #[arg(long, value_delimiter = ',', default_value = "bf16")]
    kv: Vec<String>,
}

const PAGE_SIZE: usize = 16;
const PREFILL_TOKENS_PER_PASS: usize = 8192;

fn shape_config(name: &str) -> Result<ModelConfig> {
    let json = match name {
        "qwen3.5-0.8b" | "tiny-hybrid" => {
            let tiny = name == "tiny-hybrid";
            let layers = if tiny { 4 } else { 24 };
            let types: Vec<&str> =
                (0..layers).map(|i| if (i + 1) % 4 == 0 { "full_attention" } else { "linear_attention" }).collect();
            json!({
                "model_type": "qwen3_5_text", "hidden_size": if tiny { 256 } else { 1024 },
                "num_hidden_layers": layers, "layer_types": types, "num_attention_heads": if tiny { 2 } else { 8 },
                "num_key_value_heads": if tiny { 1 } else { 2 }, "head_dim": 256,
                "intermediate_size": if tiny { 512 } else { 3584 }, "vocab_size": if tiny { 1024 } else { 248_320 },
                "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                "linear_num_key_heads": if tiny { 2 } else { 16 }, "linear_num_value_heads": if tiny { 2 } else { 16 },
                "linear_value_head_dim": 128, "max_position_embeddings": 262_144, "tie_word_embeddings": true,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            })
        }
        "qwen3-30b-a3b" => json!({
            "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
            "vocab_size": 151_936, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960,
            "tie_word_embeddings": false,
        }),
        _ => {
            let (hidden, layers, heads, kv_heads, inter, tied) = match name {
                "qwen3-0.6b" => (1024, 28, 16, 8, 3072, true),
                "qwen3-8b" => (4096, 36, 32, 8, 12288, false),
                "tiny" => (256, 2, 4, 2, 512, true),
                other => {
                    bail!(
                        "unknown shape `{other}` (qwen3-0.6b, qwen3-8b, qwen3.5-0.8b, qwen3-30b-a3b, tiny, tiny-hybrid)"
                    )
                }
            };
            let head_dim = if name == "tiny" { 64 } else { 128 };
            let vocab = if name == "tiny" { 1024 } else { 151_936 };
            json!({
                "model_type": "qwen3", "hidden_size": hidden, "num_hidden_layers": layers,
                "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
                "intermediate_size": inter, "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                "max_position_embeddings": 40960, "tie_word_embeddings": tied,
            })
        }
    };
    Ok(ModelConfig::from_hf_json(&json.to_string())?)
}

/// Bytes a decode step of `batch` sequences reads from weights: every matrix once, the output
/// head included; of a MoE layer's experts, as many as the batch can route to.
fn weight_bytes(c: &ModelConfig, format: RandomFormat, batch: usize) -> f64 {
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    // Qwen3.5's query projection also makes the output gate.
    let q_out = if c.arch.is_qwen35() { 2 * q } else { q };
    let attention = c.hidden_size * (q_out + 2 * kv) + q * c.hidden_size;
    let mut params = c.vocab_size * c.hidden_size;
    for layer in 0..c.num_layers {
        params += match &c.hybrid {
            Some(h) if c.is_recurrent_layer(layer) => {
                let value = h.num_value_heads * h.value_head_dim;
                c.hidden_size * (h.conv_channels() + 2 * value + 2 * h.num_value_heads)
            }
            _ => attention,
        };
        params += match &c.moe {
            Some(m) if m.sparse_layers[layer] => {
                let touched = m.num_experts.min(m.experts_per_token * batch);
                c.hidden_size * m.num_experts + touched * 3 * c.hidden_size * m.expert_intermediate_size
            }
            _ => 3 * c.hidden_size * c.intermediate_size,
        };
    }
    match format {
        RandomFormat::BF16 => params as f64 * 2.0,
        RandomFormat::Q4K => params as f64 * 144.0 / 256.0,
    }
}

fn kv_bytes_per_token(c: &ModelConfig, kv: KvDType) -> f64 {
    (c.num_kv_layers() * 2 * kv.bytes(c.num_kv_heads * c.head_dim)) as f64
}

/// A hybrid model's recurrent state for `batch` sequences (slot `s` for sequence `s`).
fn state_pool(model: &Model, batch: usize) -> Result<Option<StatePool>> {
    Ok(match model.config().hybrid {
        Some(_) => Some(model.new_state_pool(batch)?),
        None => None,
    })
}

/// Device-to-device copy bandwidth, bytes read + written per second.
fn copy_bandwidth(device: &Device) -> Result<f64> {
    let elems = 512usize << 20; // 2 GiB of f32
    let src = candle_core::Tensor::zeros(elems, candle_core::DType::F32, device)?;
    let _ = src.copy()?;
    device.synchronize()?;
    let reps = 10;
    let t = Instant::now();
    for _ in 0..reps {
        let _ = src.copy()?;
    }
    device.synchronize()?;
    Ok((2 * 4 * elems * reps) as f64 / t.elapsed().as_secs_f64())
}

fn token(i: usize, vocab: usize) -> u32 {
    (i * 7919 % vocab) as u32
}

fn decode_step_seconds(model: &Model, pool: &mut KvPool, batch: usize, context: usize, steps: usize) -> Result<f64> {
    let mut state = state_pool(model, batch)?;
    let hybrid = state.is_some();
    let pages_per_seq = (context + steps + 4).div_ceil(PAGE_SIZE);
    let tables: Vec<Vec<u32>> =
        (0..batch).map(|s| ((s * pages_per_seq) as u32..((s + 1) * pages_per_seq) as u32).collect()).collect();
    let vocab = model.config().vocab_size;
    let mut elapsed = 0.0;
    for step in 0..steps + 2 {
        let mut b = ForwardBatch::default();
        for (s, table) in tables.iter().enumerate() {
            let slot = hybrid.then_some(s as u32);
            b.push_with_state(&[token(s + step, vocab)], context + 1 + step, table.clone(), true, slot);
        }
        let t = Instant::now();
        let logits = model.forward_with_state(&b, pool, state.as_mut())?;
        let ids = logits.argmax(1)?.to_vec1::<u32>()?;
        if step >= 2 {
            elapsed += t.elapsed().as_secs_f64();
        }
        anyhow::ensure!(ids.len() == batch, "one id per sequence");
    }
    Ok(elapsed / steps as f64)
}

fn prefill_seconds(model: &Model, pool: &mut KvPool, batch: usize, context: usize) -> Result<f64> {
    let pages_per_seq = context.div_ceil(PAGE_SIZE);
    let vocab = model.config().vocab_size;
    let mut state = state_pool(model, batch)?;
    let hybrid = state.is_some();
    let t = Instant::now();
    let mut done = vec![0usize; batch];
    while done.iter().any(|&d| d < context) {
        let mut b = ForwardBatch::default();
        let mut room = PREFILL_TOKENS_PER_PASS;
        for (s, d) in done.iter_mut().enumerate() {
            if *d == context || room == 0 {
                continue;
            }
            let n = room.min(context - *d);
            let tokens: Vec<u32> = (*d..*d + n).map(|i| token(i + s, vocab)).collect();
            let table = ((s * pages_per_seq) as u32..((s + 1) * pages_per_seq) as u32).collect();
            b.push_with_state(&tokens, *d + n, table, *d + n == context, hybrid.then_some(s as u32));
            *d += n;
            room -= n;
        }
        let logits = model.forward_with_state(&b, pool, state.as_mut())?;
        let _ = logits.argmax(1)?.to_vec1::<u32>()?;
    }
    model.device().synchronize()?;
    Ok(t.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let a = Args::parse();
    radix_models::configure_candle_pool(a.threads);
    radix_models::configure_allocator();
    let device = parse_device(&a.device)?;
    let bandwidth = copy_bandwidth(&device)?;
    println!("device {}: copy bandwidth {:.0} GB/s (read + write)", device_name(&device), bandwidth / 1e9);
    println!();
    println!("| shape | weights | KV | run | batch | context | ms | tokens/s | floor ms | floor % |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let kv_types = a
        .kv
        .iter()
        .map(|name| {
            KvDType::from_name(name).with_context(|| format!("unknown --kv type `{name}` (bf16, f16, f32, q8_0, q4_0)"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut rows = Vec::new();
    let max_batch = a.batches.iter().copied().max().unwrap_or(1);
    let max_context = a.contexts.iter().copied().max().unwrap_or(1);
    for shape in &a.shapes {
        let config = shape_config(shape)?;
        for format in &a.formats {
            let format = match format.as_str() {
                "bf16" => RandomFormat::BF16,
                "q4k" => RandomFormat::Q4K,
                other => bail!("unknown format `{other}` (bf16, q4k)"),
            };
            let t = Instant::now();
            let weights = RandomWeights::new(config.clone(), format, 1)?;
            let options = LoadOptions {
                threads: a.threads,
                device: device.clone(),
                cpu_moe_layers: a.cpu_moe_layers,
                ..Default::default()
            };
            let model = Model::random(weights, &options).with_context(|| format!("{shape} {format:?}"))?;
            eprintln!("{shape} {format:?}: weights ready in {:.1} s", t.elapsed().as_secs_f64());
            for &kv in &kv_types {
                let t = Instant::now();
                let pages = max_batch * (max_context + a.decode_steps + 4).div_ceil(PAGE_SIZE);
                let mut pool = model.new_kv_pool(PAGE_SIZE, pages, kv)?;
                pool.fill_random(1.0)?;
                device.synchronize()?;
                eprintln!("{shape} {format:?}: {pages} {kv} KV pages ready in {:.1} s", t.elapsed().as_secs_f64());
                for &context in &a.contexts {
                    for &batch in &a.batches {
                        let step = decode_step_seconds(&model, &mut pool, batch, context, a.decode_steps)?;
                        let weights = weight_bytes(&config, format, batch);
                        let floor =
                            (weights + batch as f64 * context as f64 * kv_bytes_per_token(&config, kv)) / bandwidth;
                        println!(
                            "| {shape} | {format:?} | {kv} | decode | {batch} | {context} | {:.2} | {:.0} | {:.2} | {:.0}% |",
                            step * 1e3,
                            batch as f64 / step,
                            floor * 1e3,
                            100.0 * floor / step
                        );
                        rows.push(
                        json!({"shape": shape, "weights": format!("{format:?}"), "kv": kv.name(), "run": "decode", "batch": batch,
                        "context": context, "seconds": step, "floor_seconds": floor}),
                    );
                    }
                }
                for &context in &a.contexts {
                    for &batch in &a.batches {
                        if batch * context * context > a.max_prefill_pairs {
                            println!(
                                "| {shape} | {format:?} | {kv} | prefill | {batch} | {context} | skipped: over --max-prefill-pairs | | | |"
                            );
                            continue;
                        }
                        let secs = prefill_seconds(&model, &mut pool, batch, context)?;
                        println!(
                            "| {shape} | {format:?} | {kv} | prefill | {batch} | {context} | {:.1} | {:.0} | | |",
                            secs * 1e3,
                            (batch * context) as f64 / secs
                        );
                        rows.push(
                            json!({"shape": shape, "weights": format!("{format:?}"), "kv": kv.name(), "run": "prefill",
                        "batch": batch, "context": context, "seconds": secs}),
                        );
                    }
                }
            }
        }
    }
    if let Some(path) = &a.json {
        let doc = json!({"device": device_name(&device), "copy_bandwidth": bandwidth, "rows": rows});
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
