//! Appends a seeded random multi-token-prediction head to a Qwen3.5 or Qwen3.5-MoE GGUF, laid out
//! as llama.cpp's converter writes one (`conversion/qwen.py`, `_QwenMtpMixin`): decoder layer `L`
//! (the first after the model's `L` layers) with the tensors of the model's last full-attention
//! layer (its MLP dense or sparse as the model's), shaped like them, and `nextn.eh_proj`, `nextn.enorm`, `nextn.hnorm`,
//! `nextn.shared_head_norm`; `block_count` becomes `L + 1`, `nextn_predict_layers` 1, and a
//! `recurrent_layers` list gets the new layer as not recurrent. This is how
//! `models/tests/fixtures/tiny/qwen35mtp/model-f32.gguf` is made from the tiny `qwen35` fixture:
//!
//! ```text
//! cargo run -p radix-models --example add_mtp_head -- \
//!     models/tests/fixtures/tiny/qwen35/model-f32.gguf models/tests/fixtures/tiny/qwen35mtp/model-f32.gguf
//! ```
//!
//! `models/tests/fixtures/tiny/qwen35moemtp/model-f32.gguf` is made the same way from `qwen35moe`.
//!
//! Values: matrices normal(0, 0.1), vectors (norms, the shared expert's gate) 1 + normal(0, 0.2) (GGUF norms have llama.cpp's
//! `+1` folded in), drawn in tensor-name order from SplitMix64 (seed 0 unless a third
//! argument gives one). Tensors stay f32.

use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use radix_models::SplitMix64;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output, seed) = match args.as_slice() {
        [i, o] => (PathBuf::from(i), PathBuf::from(o), 0),
        [i, o, s] => match s.parse() {
            Ok(seed) => (PathBuf::from(i), PathBuf::from(o), seed),
            Err(_) => return usage(&format!("SEED `{s}` is not a number")),
        },
        _ => return usage("give IN.gguf OUT.gguf [SEED]"),
    };
    match run(&input, &output, seed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("add_mtp_head: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("add_mtp_head: {problem}\nusage: add_mtp_head IN.gguf OUT.gguf [SEED]");
    ExitCode::from(2)
}

fn run(input: &PathBuf, output: &PathBuf, seed: u64) -> Result<(), String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let mut file = std::fs::File::open(input).map_err(|e| fail(&input.display().to_string(), &e))?;
    let content = gguf_file::Content::read(&mut file).map_err(|e| fail("not a GGUF file", &e))?;
    let arch = content.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned();
    let arch = match arch {
        Some(a) if a == "qwen35" || a == "qwen35moe" => a,
        other => return Err(format!("{} is a {other:?} model, not qwen35 or qwen35moe", input.display())),
    };
    let key = |k: &str| format!("{arch}.{k}");
    if content.metadata.contains_key(&key("nextn_predict_layers")) {
        return Err(format!("{} already carries a multi-token-prediction head", input.display()));
    }
    let layers =
        content.metadata.get(&key("block_count")).and_then(|v| v.to_u32().ok()).ok_or("no qwen35.block_count")?
            as usize;
    // The model's last full-attention layer gives the shapes.
    let donor = (0..layers)
        .rev()
        .find(|l| content.tensor_infos.contains_key(&format!("blk.{l}.attn_q.weight")))
        .ok_or("no full-attention layer to take shapes from")?;
    let mut names: Vec<String> = content.tensor_infos.keys().cloned().collect();
    names.sort();
    let mut tensors = Vec::new();
    for name in &names {
        tensors.push((name.clone(), content.tensor(&mut file, name, &Device::Cpu).map_err(|e| fail(name, &e))?));
    }
    let hidden =
        content.tensor_infos.get("token_embd.weight").map(|t| t.shape.dims()[1]).ok_or("no token_embd.weight")?;
    let mut rng = SplitMix64::new(seed);
    // Every tensor of the donor layer (attention, norms, and the dense or sparse MLP), renamed.
    let donor_prefix = format!("blk.{donor}.");
    let mut added: Vec<(String, Vec<usize>)> = content
        .tensor_infos
        .iter()
        .filter_map(|(name, info)| {
            let t = name.strip_prefix(&donor_prefix)?;
            Some((format!("blk.{layers}.{t}"), info.shape.dims().to_vec()))
        })
        .collect();
    added.push((format!("blk.{layers}.nextn.eh_proj.weight"), vec![hidden, 2 * hidden]));
    for norm in ["enorm", "hnorm", "shared_head_norm"] {
        added.push((format!("blk.{layers}.nextn.{norm}.weight"), vec![hidden]));
    }
    added.sort();
    for (name, shape) in added {
        let len: usize = shape.iter().product();
        let values: Vec<f32> = match shape.len() {
            1 => (0..len).map(|_| 1.0 + 0.2 * normal(&mut rng)).collect(),
            _ => (0..len).map(|_| 0.1 * normal(&mut rng)).collect(),
        };
        let tensor = Tensor::from_vec(values, shape, &Device::Cpu).map_err(|e| fail(&name, &e))?;
        tensors.push((name.clone(), QTensor::quantize(&tensor, GgmlDType::F32).map_err(|e| fail(&name, &e))?));
    }
    let mut metadata: Vec<(String, gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for (k, v) in &mut metadata {
        if *k == key("block_count") {
            *v = gguf_file::Value::U32(layers as u32 + 1);
        } else if *k == key("attention.recurrent_layers")
            && let gguf_file::Value::Array(flags) = v
        {
            flags.push(gguf_file::Value::Bool(false));
        }
    }
    metadata.push((key("nextn_predict_layers"), gguf_file::Value::U32(1)));
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).map_err(|e| fail(&dir.display().to_string(), &e))?;
    }
    let mut out = std::fs::File::create(output).map_err(|e| fail(&output.display().to_string(), &e))?;
    let md: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &md, &ts).map_err(|e| fail("writing", &e))?;
    eprintln!("add_mtp_head: {} with a head at layer {layers} -> {}", input.display(), output.display());
    Ok(())
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut SplitMix64) -> f32 {
    let u = 1.0 - rng.next_f64();
    let v = rng.next_f64();
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}
