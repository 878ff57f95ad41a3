//! Writes a Qwen3.5 GGUF's multi-token-prediction head into a transformers checkpoint of the same
//! model, as Qwen3.5/3.6 checkpoints keep it: `mtp.fc`, `mtp.pre_fc_norm_embedding`,
//! `mtp.pre_fc_norm_hidden`, `mtp.norm` and the layer under `mtp.layers.0.`, norms without the
//! `+1` llama.cpp's converter folds in (`conversion/qwen.py`, `_QwenMtpMixin`, undone), and
//! `mtp_num_hidden_layers: 1` in `config.json`. This is how
//! `models/tests/fixtures/tiny/qwen35mtp/hf/` is made from the fixture's GGUF and the tiny `qwen35`
//! checkpoint, so that one head loads from both formats:
//!
//! ```text
//! cargo run -p radix-models --example mtp_head_to_hf -- \
//!     models/tests/fixtures/tiny/qwen35mtp/model-f32.gguf models/tests/fixtures/tiny/qwen35 \
//!     models/tests/fixtures/tiny/qwen35mtp/hf
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};

/// The head layer's tensors: GGUF's name after `blk.N.`, transformers' after `mtp.`.
const HEAD_TENSORS: [(&str, &str); 15] = [
    ("attn_norm", "layers.0.input_layernorm"),
    ("attn_q", "layers.0.self_attn.q_proj"),
    ("attn_k", "layers.0.self_attn.k_proj"),
    ("attn_v", "layers.0.self_attn.v_proj"),
    ("attn_output", "layers.0.self_attn.o_proj"),
    ("attn_q_norm", "layers.0.self_attn.q_norm"),
    ("attn_k_norm", "layers.0.self_attn.k_norm"),
    ("post_attention_norm", "layers.0.post_attention_layernorm"),
    ("ffn_gate", "layers.0.mlp.gate_proj"),
    ("ffn_up", "layers.0.mlp.up_proj"),
    ("ffn_down", "layers.0.mlp.down_proj"),
    ("nextn.eh_proj", "fc"),
    ("nextn.enorm", "pre_fc_norm_embedding"),
    ("nextn.hnorm", "pre_fc_norm_hidden"),
    ("nextn.shared_head_norm", "norm"),
];

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let [gguf, hf, out] = args.as_slice() else {
        eprintln!("mtp_head_to_hf: give HEAD.gguf HF_DIR OUT_DIR\nusage: mtp_head_to_hf HEAD.gguf HF_DIR OUT_DIR");
        return ExitCode::from(2);
    };
    match run(gguf, hf, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mtp_head_to_hf: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(gguf: &Path, hf: &Path, out: &Path) -> Result<(), String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let mut file = std::fs::File::open(gguf).map_err(|e| fail(&gguf.display().to_string(), &e))?;
    let content = gguf_file::Content::read(&mut file).map_err(|e| fail("not a GGUF file", &e))?;
    let layers = content
        .metadata
        .get("qwen35.block_count")
        .and_then(|v| v.to_u32().ok())
        .ok_or("no qwen35.block_count: not a Qwen3.5 GGUF")? as usize;
    let heads = content.metadata.get("qwen35.nextn_predict_layers").and_then(|v| v.to_u32().ok()).unwrap_or(0);
    if heads != 1 {
        return Err(format!("{} carries {heads} multi-token-prediction heads, not 1", gguf.display()));
    }
    let head = layers - 1;
    let weights = hf.join("model.safetensors");
    let mut tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(&weights, &Device::Cpu).map_err(|e| fail(&weights.display().to_string(), &e))?;
    for (ours, theirs) in HEAD_TENSORS {
        let name = format!("blk.{head}.{ours}.weight");
        let t = content.tensor(&mut file, &name, &Device::Cpu).map_err(|e| fail(&name, &e))?;
        let t = t.dequantize(&Device::Cpu).map_err(|e| fail(&name, &e))?;
        // transformers' Qwen3.5 norms scale by `1 + w`.
        let t = if ours.ends_with("norm") { (t - 1.0).map_err(|e| fail(&name, &e))? } else { t };
        tensors.insert(format!("mtp.{theirs}.weight"), t);
    }
    let config_path = hf.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| fail(&config_path.display().to_string(), &e))?;
    let mut config: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail("config.json", &e))?;
    let text_config = match config.get_mut("text_config") {
        Some(inner) => inner,
        None => &mut config,
    };
    text_config["mtp_num_hidden_layers"] = serde_json::json!(1);
    std::fs::create_dir_all(out).map_err(|e| fail(&out.display().to_string(), &e))?;
    let pretty = serde_json::to_string_pretty(&config).map_err(|e| fail("config.json", &e))?;
    std::fs::write(out.join("config.json"), pretty + "\n").map_err(|e| fail("writing config.json", &e))?;
    candle_core::safetensors::save(&tensors, out.join("model.safetensors")).map_err(|e| fail("writing", &e))?;
    eprintln!("mtp_head_to_hf: {} + the head of {} -> {}", hf.display(), gguf.display(), out.display());
    Ok(())
}
