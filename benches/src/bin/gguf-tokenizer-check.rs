//! Checks that a GGUF's tokenizer metadata tokenizes like a reference `tokenizer.json`
//! (for the generated Qwen3-shaped model: like Qwen3's own tokenizer), and loads the model.
//!
//! ```text
//! gguf-tokenizer-check FILE.gguf TOKENIZER_DIR
//! ```

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use radix_models::tokenizer::Tokenizer;
use radix_models::{LoadOptions, Model};

const SAMPLES: &[&str] = &[
    "Hello, world!",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite fn main() {}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "  leading spaces, tabs\tand\nnewlines\n\n\n and numbers 1234567 3.14159",
    "Unicode: héllo wörld 你好，世界 🦀 ∑x² — “quotes”",
    "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"src/main.rs\"}}\n</tool_call>",
    "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n",
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [gguf, dir] = &args[..] else { bail!("usage: gguf-tokenizer-check FILE.gguf TOKENIZER_DIR") };
    let (gguf, dir) = (PathBuf::from(gguf), PathBuf::from(dir));
    let ours = Tokenizer::from_gguf_file(&gguf).context("tokenizer from GGUF")?;
    let reference = Tokenizer::from_model_dir(&dir).context("reference tokenizer")?;
    let mut bad = 0;
    for s in SAMPLES {
        let (a, b) = (ours.encode(s, true)?, reference.encode(s, true)?);
        if a != b {
            bad += 1;
            eprintln!("MISMATCH on {s:?}:\n  gguf {a:?}\n  ref  {b:?}");
        }
        let back = ours.decode(&a, false)?;
        if back != *s {
            bad += 1;
            eprintln!("round trip of {s:?} gave {back:?}");
        }
    }
    println!(
        "tokenizer: {} samples, {} mismatches; vocab {} (ref {}), bos {:?} (add_bos {}), eos {:?}",
        SAMPLES.len(),
        bad,
        ours.vocab_size(),
        reference.vocab_size(),
        ours.bos_token_id(),
        ours.add_bos(),
        ours.eos_token_ids()
    );
    let model = Model::from_gguf(&gguf, &LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() })?;
    println!("model: {:?}", model.config());
    if bad > 0 {
        bail!("{bad} mismatches");
    }
    Ok(())
}
