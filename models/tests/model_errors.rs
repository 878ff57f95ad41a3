//! Bad model files and bad batches fail with an `Err` whose message names the problem, never
//! with a panic: truncated and corrupt GGUF files, missing tensors, unsupported architectures and
//! quantization types, broken safetensors directories, inconsistent batches and KV pools.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use radix_models::{ForwardBatch, KvDType, KvPool, LoadOptions, Model, ModelError, SequenceChunk};

fn fixture(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch)
}

/// A fresh scratch folder for one test, in cargo's folder for test files (inside the target
/// directory, emptied by the next run: a folder per process under /tmp was never removed).
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-errors").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn options() -> LoadOptions {
    LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() }
}

/// Loads `path`, which must fail without panicking; returns the error.
fn load_err(path: &Path, what: &str) -> ModelError {
    match std::panic::catch_unwind(AssertUnwindSafe(|| Model::load(path, &options()))) {
        Ok(Ok(_)) => panic!("{what}: {} loaded but should not have", path.display()),
        Ok(Err(e)) => e,
        Err(_) => panic!("{what}: loading {} panicked instead of returning an error", path.display()),
    }
}

fn assert_names(message: &str, needles: &[&str], what: &str) {
    for needle in needles {
        assert!(message.contains(needle), "{what}: message does not name `{needle}`: {message}");
    }
}

/// The fixture's GGUF header and every tensor, in a stable order.
fn read_gguf(path: &Path) -> (gguf_file::Content, Vec<(String, QTensor)>) {
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors = names.into_iter().map(|n| (n.clone(), content.tensor(&mut file, n, &Device::Cpu).unwrap())).collect();
    (content, tensors)
}

/// Writes a GGUF with the given metadata and tensors.
fn write_gguf(path: &Path, metadata: &[(String, gguf_file::Value)], tensors: &[(String, QTensor)]) {
    let mut file = std::fs::File::create(path).unwrap();
    let md: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &md, &ts).unwrap();
}

/// The fixture's metadata, sorted by key.
fn metadata_of(content: &gguf_file::Content) -> Vec<(String, gguf_file::Value)> {
    let mut md: Vec<(String, gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    md.sort_by(|a, b| a.0.cmp(&b.0));
    md
}

#[test]
fn rewritten_fixture_loads() {
    // The writer round trip itself is sound, so the failures below are the edits' doing.
    let (content, tensors) = read_gguf(&fixture("llama").join("model-f32.gguf"));
    let path = scratch("roundtrip").join("model.gguf");
    write_gguf(&path, &metadata_of(&content), &tensors);
    Model::load(&path, &options()).unwrap();
}

#[test]
fn truncated_gguf_fails_with_message() {
    let src = fixture("qwen2").join("model-f32.gguf");
    let bytes = std::fs::read(&src).unwrap();
    let content = gguf_file::Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
    let data_start = content.tensor_data_offset as usize;
    let dir = scratch("truncated");
    // Inside the 24-byte header, all through the metadata and tensor infos, and inside the data.
    let mut cuts: Vec<usize> = vec![0, 1, 3, 4, 7, 8, 12, 16, 20, 23, 24, 25];
    cuts.extend((30..data_start).step_by(37));
    cuts.extend([data_start - 1, data_start, data_start + 1, data_start + 100]);
    cuts.extend((data_start..bytes.len()).step_by((bytes.len() - data_start) / 13).skip(1));
    cuts.extend([bytes.len() - 32, bytes.len() - 1]);
    for cut in cuts {
        let path = dir.join(format!("cut-{cut}.gguf"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let what = format!("GGUF cut at byte {cut} of {} (data from {data_start})", bytes.len());
        let message = load_err(&path, &what).to_string();
        assert_names(&message, &[&path.display().to_string()], &what);
        if cut > data_start {
            // Header fine, a tensor short: the message names it.
            assert_names(&message, &["cannot read tensor `"], &what);
        } else if !message.contains("cannot read tensor `") {
            // (A cut in the padding before the data leaves a readable header.)
            assert_names(&message, &["GGUF"], &what);
        }
    }
}

#[test]
fn corrupt_gguf_header_fails_with_message() {
    let bytes = std::fs::read(fixture("llama").join("model-f32.gguf")).unwrap();
    let dir = scratch("corrupt");
    let patch = |name: &str, at: usize, new: &[u8], needles: &[&str]| {
        let mut b = bytes.clone();
        b[at..at + new.len()].copy_from_slice(new);
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, &b).unwrap();
        let message = load_err(&path, name).to_string();
        assert_names(&message, &[&path.display().to_string(), "GGUF"], name);
        assert_names(&message, needles, name);
    };
    patch("bad-magic", 0, b"GGUX", &["magic"]);
    patch("zero-magic", 0, &[0; 4], &["magic"]);
    patch("bad-version", 4, &99u32.to_le_bytes(), &["version"]);
    patch("huge-tensor-count", 8, &u64::MAX.to_le_bytes(), &["tensor_count"]);
    patch("large-tensor-count", 8, &(1u64 << 20).to_le_bytes(), &["tensors"]);
    patch("huge-metadata-count", 16, &u64::MAX.to_le_bytes(), &["metadata_kv_count"]);
    patch("large-metadata-count", 16, &(1u64 << 20).to_le_bytes(), &["metadata"]);
    // The first key's length prefix.
    patch("huge-key-length", 24, &u64::MAX.to_le_bytes(), &["string length"]);
    // A file of garbage and an empty file.
    for (name, b) in [("garbage", vec![0xA5u8; 4096]), ("empty", Vec::new())] {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, &b).unwrap();
        let message = load_err(&path, name).to_string();
        assert_names(&message, &[&path.display().to_string(), "GGUF"], name);
    }
    // A file that does not exist.
    let path = dir.join("absent.gguf");
    let message = load_err(&path, "absent").to_string();
    assert_names(&message, &[&path.display().to_string(), "cannot open"], "absent");
}

/// Finds the tensor info of `name` in raw GGUF v2/v3 bytes: returns the offset of its n_dims.
fn tensor_info_at(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key.as_slice()).expect("tensor info in file");
    at + key.len()
}

#[test]
fn corrupt_tensor_infos_fail_with_message() {
    let bytes = std::fs::read(fixture("llama").join("model-f32.gguf")).unwrap();
    let dir = scratch("corrupt-infos");
    let name = "blk.0.attn_q.weight";
    let info = tensor_info_at(&bytes, name);
    assert_eq!(u32::from_le_bytes(bytes[info..info + 4].try_into().unwrap()), 2, "2-d tensor");
    let dims = info + 4;
    let dtype = dims + 16;
    let offset = dtype + 4;
    let cases: [(&str, usize, Vec<u8>, &[&str]); 6] = [
        ("many-dims", info, 1000u32.to_le_bytes().to_vec(), &["dimensions"]),
        ("unknown-dtype", dtype, 9999u32.to_le_bytes().to_vec(), &["9999"]),
        ("huge-offset", offset, (u64::MAX - 7).to_le_bytes().to_vec(), &[name]),
        ("large-dims", dims, [(1u64 << 20).to_le_bytes(), (1u64 << 20).to_le_bytes()].concat(), &[name]),
        // The element count overflows usize.
        (
            "overflowing-dims",
            dims,
            [(1u64 << 40).to_le_bytes(), (1u64 << 40).to_le_bytes()].concat(),
            &[name, "overflows"],
        ),
        ("zero-dim", dims, [0u64.to_le_bytes(), 64u64.to_le_bytes()].concat(), &[name, "no elements"]),
    ];
    for (what, at, new, needles) in cases {
        let mut b = bytes.clone();
        b[at..at + new.len()].copy_from_slice(&new);
        let path = dir.join(format!("{what}.gguf"));
        std::fs::write(&path, &b).unwrap();
        let message = load_err(&path, what).to_string();
        assert_names(&message, needles, what);
    }
}

#[test]
fn zero_alignment_fails_with_message() {
    // `general.alignment` = 0 would divide by zero when locating the tensor data.
    let (content, tensors) = read_gguf(&fixture("llama").join("model-f32.gguf"));
    let mut md = metadata_of(&content);
    md.retain(|(k, _)| k != "general.alignment");
    md.push(("general.alignment".into(), gguf_file::Value::U32(0)));
    let path = scratch("zero-align").join("model.gguf");
    write_gguf(&path, &md, &tensors);
    // candle panics here (its panic message is printed); the loader turns that into an error.
    let message = load_err(&path, "zero alignment").to_string();
    assert_names(
        &message,
        &[&path.display().to_string(), "not a readable GGUF file", "divide by zero"],
        "zero alignment",
    );
}

#[test]
fn gguf_without_a_tensor_names_it() {
    for arch in ["llama", "qwen2", "qwen3"] {
        let (content, mut tensors) = read_gguf(&fixture(arch).join("model-f32.gguf"));
        tensors.retain(|(n, _)| n != "blk.0.ffn_up.weight");
        let path = scratch(&format!("missing-{arch}")).join("model.gguf");
        write_gguf(&path, &metadata_of(&content), &tensors);
        let e = load_err(&path, "missing tensor");
        assert!(matches!(e, ModelError::MissingTensor { .. }), "{arch}: {e:?}");
        assert_names(&e.to_string(), &["`blk.0.ffn_up.weight`", arch, &path.display().to_string()], arch);
    }
    // Without the embedding, which also gives the vocabulary size.
    let (content, mut tensors) = read_gguf(&fixture("llama").join("model-f32.gguf"));
    tensors.retain(|(n, _)| n != "token_embd.weight");
    let path = scratch("missing-embedding").join("model.gguf");
    write_gguf(&path, &metadata_of(&content), &tensors);
    assert_names(&load_err(&path, "no embedding").to_string(), &["token_embd.weight"], "no embedding");
}

#[test]
fn gguf_of_unsupported_architecture_names_it() {
    let (content, tensors) = read_gguf(&fixture("llama").join("model-f32.gguf"));
    let mut md = metadata_of(&content);
    for (k, v) in &mut md {
        if k == "general.architecture" {
            *v = gguf_file::Value::String("gemma3".into());
        }
    }
    let path = scratch("gemma3").join("model.gguf");
    write_gguf(&path, &md, &tensors);
    let e = load_err(&path, "gemma3");
    assert!(matches!(e, ModelError::UnsupportedArchitecture(_)), "{e:?}");
    assert_names(&e.to_string(), &["gemma3"], "gemma3");

    // No architecture at all.
    md.retain(|(k, _)| k != "general.architecture");
    let path = scratch("no-arch").join("model.gguf");
    write_gguf(&path, &md, &tensors);
    assert_names(&load_err(&path, "no arch").to_string(), &["general.architecture"], "no arch");
}

#[test]
fn gguf_missing_shape_metadata_names_the_key() {
    let (content, tensors) = read_gguf(&fixture("llama").join("model-f32.gguf"));
    for key in ["llama.block_count", "llama.embedding_length", "llama.feed_forward_length"] {
        let mut md = metadata_of(&content);
        md.retain(|(k, _)| k != key);
        let path = scratch(&format!("no-{key}")).join("model.gguf");
        write_gguf(&path, &md, &tensors);
        assert_names(&load_err(&path, key).to_string(), &[key], key);
    }
    // A count given as a string, and an absurd layer count.
    let wrong: [(&str, gguf_file::Value, &str); 2] = [
        ("llama.block_count", gguf_file::Value::String("two".into()), "llama.block_count"),
        ("llama.block_count", gguf_file::Value::U64(1 << 50), "blk.2."),
    ];
    for (key, value, needle) in wrong {
        let mut md = metadata_of(&content);
        for (k, v) in &mut md {
            if k == key {
                *v = value.clone();
            }
        }
        let path = scratch(&format!("wrong-{key}")).join("model.gguf");
        write_gguf(&path, &md, &tensors);
        assert_names(&load_err(&path, key).to_string(), &[needle], key);
    }
}

#[test]
fn unsupported_quantization_names_tensor_and_type() {
    // candle can quantize to Q8_1 and Q8K (the activation types of its matmuls); its GGUF reader
    // then refuses to read them back, and our loader passes that on naming the tensor.
    let name = "blk.0.ffn_up.weight";
    for dtype in [GgmlDType::Q8_1, GgmlDType::Q8K] {
        let (content, tensors) = read_gguf(&fixture("llama").join("model-f32.gguf"));
        let replaced: Vec<(String, QTensor)> = tensors
            .into_iter()
            .map(|(n, t)| {
                if n != name {
                    return (n, t);
                }
                let dense = if dtype == GgmlDType::Q8K {
                    // Q8K blocks are 256 wide; the shape does not matter, the type is refused first.
                    Tensor::ones((4, 256), candle_core::DType::F32, &Device::Cpu).unwrap()
                } else {
                    t.dequantize(&Device::Cpu).unwrap()
                };
                (n, QTensor::quantize(&dense, dtype).unwrap())
            })
            .collect();
        let path = scratch(&format!("quant-{dtype:?}")).join("model.gguf");
        write_gguf(&path, &metadata_of(&content), &replaced);
        let what = format!("{dtype:?}");
        let message = load_err(&path, &what).to_string();
        assert_names(&message, &[name, &what], &what);
    }
}

/// A copy of the fixture's safetensors directory.
fn safetensors_dir(arch: &str, name: &str) -> PathBuf {
    let dir = scratch(name);
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(arch).join(f), dir.join(f)).unwrap();
    }
    dir
}

#[test]
fn safetensors_dir_problems_are_named() {
    // Sanity: the copy loads, by directory and by file.
    let dir = safetensors_dir("qwen3", "st-ok");
    Model::load(&dir, &options()).unwrap();
    Model::load(&dir.join("model.safetensors"), &options()).unwrap();

    // No config.json.
    let dir = safetensors_dir("qwen3", "st-no-config");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    for path in [dir.clone(), dir.join("model.safetensors")] {
        let message = load_err(&path, "no config").to_string();
        assert_names(&message, &["config.json", "cannot read"], "no config");
    }

    // config.json with an unknown model_type (and architectures naming another).
    let dir = safetensors_dir("qwen3", "st-gemma");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["model_type"] = "gemma3".into();
    json["architectures"] = serde_json::json!(["Gemma3ForCausalLM"]);
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    let e = load_err(&dir, "gemma3 config");
    assert!(matches!(e, ModelError::UnsupportedArchitecture(_)), "{e:?}");
    assert_names(&e.to_string(), &["gemma3"], "gemma3 config");
    // Only architectures, unknown.
    json.as_object_mut().unwrap().remove("model_type");
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    assert_names(&load_err(&dir, "arch only").to_string(), &["Gemma3ForCausalLM"], "arch only");
    // Neither.
    json.as_object_mut().unwrap().remove("architectures");
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    assert_names(&load_err(&dir, "no type").to_string(), &["model_type"], "no type");

    // config.json that is not JSON, or lacks a field.
    let dir = safetensors_dir("qwen3", "st-bad-json");
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    assert_names(&load_err(&dir, "bad json").to_string(), &["config.json"], "bad json");
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    assert_names(&load_err(&dir, "no hidden_size").to_string(), &["hidden_size"], "no hidden_size");
    // A config whose vocabulary disagrees with the embedding.
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["vocab_size"] = 1000.into();
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    assert_names(&load_err(&dir, "vocab 1000").to_string(), &["embedding", "1000"], "vocab 1000");

    // No safetensors file.
    let dir = safetensors_dir("qwen3", "st-none");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let message = load_err(&dir, "no safetensors").to_string();
    assert_names(&message, &[&dir.display().to_string(), "no .safetensors"], "no safetensors");

    // Garbled, truncated and empty safetensors files.
    let bytes = std::fs::read(fixture("qwen3").join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let garbled: [(&str, Vec<u8>); 6] = [
        ("garbage", vec![0x5Au8; 4096]),
        ("empty", Vec::new()),
        ("cut-in-length", bytes[..5].to_vec()),
        ("cut-in-header", bytes[..8 + header_len / 2].to_vec()),
        ("cut-in-data", bytes[..bytes.len() / 2].to_vec()),
        ("huge-header", [u64::MAX.to_le_bytes().as_slice(), &bytes[8..]].concat()),
    ];
    for (what, b) in garbled {
        let dir = safetensors_dir("qwen3", &format!("st-{what}"));
        std::fs::write(dir.join("model.safetensors"), &b).unwrap();
        let message = load_err(&dir, what).to_string();
        assert_names(&message, &[&dir.display().to_string(), "safetensors"], what);
    }
}

#[test]
fn safetensors_without_a_tensor_names_it() {
    let dir = safetensors_dir("qwen2", "st-missing");
    let path = dir.join("model.safetensors");
    let mut tensors: HashMap<String, Tensor> = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    assert!(tensors.remove("model.layers.1.mlp.up_proj.weight").is_some());
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let e = load_err(&dir, "missing up_proj");
    assert!(matches!(e, ModelError::MissingTensor { .. }), "{e:?}");
    assert_names(&e.to_string(), &["model.layers.1.mlp.up_proj.weight", "qwen2"], "missing up_proj");
}

/// A loaded tiny Llama and a pool of 8 pages of 4 slots.
fn model_and_pool() -> (Model, KvPool) {
    let model = Model::load(&fixture("llama").join("model.safetensors"), &options()).unwrap();
    let pool = KvPool::new(model.config(), 4, 8, KvDType::F32).unwrap();
    (model, pool)
}

fn forward_err(model: &Model, batch: &ForwardBatch, pool: &mut KvPool, what: &str) -> String {
    match std::panic::catch_unwind(AssertUnwindSafe(|| model.forward(batch, pool))) {
        Ok(Ok(_)) => panic!("{what}: forward accepted {batch:?}"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("{what}: forward panicked on {batch:?}"),
    }
}

#[test]
fn bad_batches_are_rejected_with_message() {
    let (model, mut pool) = model_and_pool();
    let vocab = model.config().vocab_size as u32;
    let seq = |start, len, context_len, page_table: Vec<u32>| SequenceChunk {
        start,
        len,
        context_len,
        page_table,
        logits: true,
        state_slot: None,
        verify: false,
    };
    let cases: Vec<(&str, ForwardBatch, Vec<&str>)> = vec![
        (
            "token id = vocab",
            ForwardBatch { tokens: vec![1, vocab], sequences: vec![seq(0, 2, 2, vec![0])] },
            vec!["token id 128", "vocabulary of 128"],
        ),
        (
            "token id u32::MAX",
            ForwardBatch { tokens: vec![u32::MAX], sequences: vec![seq(0, 1, 1, vec![0])] },
            vec!["token id 4294967295"],
        ),
        (
            "rows not covering the tokens",
            ForwardBatch { tokens: vec![1, 2, 3], sequences: vec![seq(0, 2, 2, vec![0])] },
            vec!["cover 2 rows", "3 tokens"],
        ),
        ("no sequences", ForwardBatch { tokens: vec![1, 2], sequences: vec![] }, vec!["cover 0 rows", "2 tokens"]),
        (
            "rows overrunning the tokens",
            ForwardBatch { tokens: vec![1, 2], sequences: vec![seq(0, 3, 3, vec![0])] },
            vec!["cover 3 rows", "2 tokens"],
        ),
        (
            "overlapping rows",
            ForwardBatch { tokens: vec![1, 2, 3], sequences: vec![seq(0, 2, 2, vec![0]), seq(1, 2, 2, vec![1])] },
            vec!["sequence 1", "start at 1", "expected 2"],
        ),
        (
            "a gap between rows",
            ForwardBatch { tokens: vec![1, 2, 3], sequences: vec![seq(0, 1, 1, vec![0]), seq(2, 1, 1, vec![1])] },
            vec!["sequence 1", "start at 2", "expected 1"],
        ),
        (
            "an empty sequence",
            ForwardBatch { tokens: vec![1], sequences: vec![seq(0, 1, 1, vec![0]), seq(1, 0, 0, vec![1])] },
            vec!["sequence 1", "0 tokens"],
        ),
        (
            "context shorter than its new tokens",
            ForwardBatch { tokens: vec![1, 2, 3], sequences: vec![seq(0, 3, 2, vec![0])] },
            vec!["context 2", "3 new tokens"],
        ),
        (
            "page table too short",
            ForwardBatch { tokens: vec![1, 2, 3], sequences: vec![seq(0, 3, 10, vec![0, 1])] },
            vec!["2 pages of 4", "10 tokens"],
        ),
        (
            "empty page table",
            ForwardBatch { tokens: vec![1], sequences: vec![seq(0, 1, 1, vec![])] },
            vec!["0 pages of 4", "1 tokens"],
        ),
        (
            "page id = pool size",
            ForwardBatch { tokens: vec![1, 2], sequences: vec![seq(0, 2, 6, vec![3, 8])] },
            vec!["page 8", "pool's 8 pages"],
        ),
        (
            "page id u32::MAX",
            ForwardBatch { tokens: vec![1], sequences: vec![seq(0, 1, 1, vec![u32::MAX])] },
            vec!["page 4294967295"],
        ),
        (
            // An unused trailing page must be in the pool too.
            "unused page outside the pool",
            ForwardBatch { tokens: vec![1], sequences: vec![seq(0, 1, 1, vec![0, 100])] },
            vec!["page 100"],
        ),
    ];
    for (what, batch, needles) in &cases {
        let message = forward_err(&model, batch, &mut pool, what);
        let mut needles = needles.clone();
        needles.push("invalid batch");
        assert_names(&message, &needles, what);
    }
    // The pool still works after all that.
    let mut ok = ForwardBatch::default();
    ok.push(&[1, 2, 3], 3, vec![5], true);
    assert_eq!(model.forward(&ok, &mut pool).unwrap().dims(), [1, vocab as usize]);
}

#[test]
fn pool_of_another_model_is_rejected() {
    let (model, _) = model_and_pool();
    let mut batch = ForwardBatch::default();
    batch.push(&[1, 2, 3], 3, vec![0], true);
    let mut variants = Vec::new();
    let mut c = model.config().clone();
    c.num_layers += 1;
    variants.push(("more layers", c));
    let mut c = model.config().clone();
    c.num_kv_heads = 4;
    variants.push(("more kv heads", c));
    let mut c = model.config().clone();
    c.head_dim = 32;
    variants.push(("wider heads", c));
    for (what, config) in variants {
        let mut pool = KvPool::new(&config, 4, 8, KvDType::F16).unwrap();
        let message = forward_err(&model, &batch, &mut pool, what);
        assert_names(&message, &["KV pool", "does not fit this model"], what);
    }
    // A real other model: the tiny Qwen3 has head_dim 32.
    let qwen3 = Model::load(&fixture("qwen3").join("model.safetensors"), &options()).unwrap();
    let mut pool = KvPool::new(qwen3.config(), 4, 8, KvDType::F32).unwrap();
    let message = forward_err(&model, &batch, &mut pool, "qwen3 pool");
    assert_names(&message, &["2 kv heads x 32 dims", "(2 x 2 x 16)"], "qwen3 pool");
}

#[test]
fn kv_pool_sizes_are_checked() {
    let (model, _) = model_and_pool();
    let config = model.config();
    let page = KvPool::page_bytes(config, 16, KvDType::F16);
    assert_eq!(page, 2 * 2 * 16 * 2 * 16 * 2);
    for budget in [0, 1, page - 1] {
        let e = KvPool::with_budget(config, 16, budget, KvDType::F16).unwrap_err();
        assert_names(
            &e.to_string(),
            &["KV pool", &format!("budget of {budget} bytes"), &format!("{page} bytes")],
            "budget",
        );
    }
    assert_eq!(KvPool::with_budget(config, 16, page, KvDType::F16).unwrap().num_pages(), 1);
    assert_eq!(KvPool::with_budget(config, 16, 3 * page + 1, KvDType::F16).unwrap().num_pages(), 3);
    // Page size 0 and zero pages are refused by the layout, not divided by.
    for (page_size, budget) in [(0, 1 << 20), (16, 0)] {
        let r = std::panic::catch_unwind(|| KvPool::with_budget(config, page_size, budget, KvDType::F32));
        let e = r.unwrap_or_else(|_| panic!("with_budget({page_size}, {budget}) panicked")).unwrap_err();
        assert_names(&e.to_string(), &["KV pool"], "degenerate pool");
    }
    let r = std::panic::catch_unwind(|| KvPool::new(config, 0, 8, KvDType::F32));
    let e = r.unwrap_or_else(|_| panic!("new with page size 0 panicked")).unwrap_err();
    assert_names(&e.to_string(), &["KV pool"], "page size 0");
    // A pool of no pages is allowed, and every batch over it is refused.
    let mut empty = KvPool::new(config, 4, 0, KvDType::F32).unwrap();
    let mut batch = ForwardBatch::default();
    batch.push(&[1], 1, vec![0], true);
    assert_names(&forward_err(&model, &batch, &mut empty, "empty pool"), &["page 0", "0 pages"], "empty pool");
    // copy_page outside the pool.
    let mut pool = KvPool::new(config, 4, 8, KvDType::F32).unwrap();
    for (src, dst, tokens) in [(8, 0, 1), (0, 8, 1), (0, 1, 5), (u32::MAX, 0, 0)] {
        let e = pool.copy_page(src, dst, tokens).unwrap_err();
        assert_names(&e.to_string(), &["KV pool", "outside 8 pages of 4"], "copy_page");
    }
}
