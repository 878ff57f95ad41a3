//! Model sources: local paths, and hub repo ids resolved from a local mirror of the Hugging Face
//! cache layout (`models--owner--name/{refs,snapshots}`); nothing reaches the network.

use std::path::{Path, PathBuf};

use radix_models::{HubOptions, LoadOptions, Model, ModelFiles, resolve_model};

fn tiny(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(arch)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("radix-models-hub-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Lays out `files` as the hub cache would after downloading `owner/name` at `main`.
fn mirror(cache: &Path, repo: &str, files: &[(&str, &Path)]) -> PathBuf {
    let root = cache.join(format!("models--{}", repo.replace('/', "--")));
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), COMMIT).unwrap();
    let snapshot = root.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    for (name, source) in files {
        std::fs::copy(source, snapshot.join(name)).unwrap();
    }
    snapshot
}

fn offline(cache: &Path) -> HubOptions {
    HubOptions { revision: None, offline: true, cache_dir: Some(cache.to_owned()) }
}

#[test]
fn repo_id_resolves_to_the_cached_snapshot_and_loads() {
    let cache = scratch("dir");
    let dir = tiny("qwen3");
    // The tiny fixtures carry no tokenizer; empty stand-ins keep the layout complete.
    let empty = cache.join("empty.json");
    std::fs::write(&empty, "{}").unwrap();
    let snapshot = mirror(
        &cache,
        "radix-test/tiny-qwen3",
        &[
            ("config.json", &dir.join("config.json")),
            ("model.safetensors", &dir.join("model.safetensors")),
            ("tokenizer.json", &empty),
            ("tokenizer_config.json", &empty),
        ],
    );
    let files = resolve_model("radix-test/tiny-qwen3", &offline(&cache)).unwrap();
    assert_eq!(files, ModelFiles::Directory(snapshot));
    let model = Model::load(files.path(), &LoadOptions { threads: 1, dequantize_weights: false, ..Default::default() })
        .unwrap();
    assert_eq!(model.config().head_dim, 32);

    // A commit hash as revision reads the snapshot directly.
    let pinned = HubOptions { revision: Some(COMMIT.into()), ..offline(&cache) };
    assert!(matches!(resolve_model("radix-test/tiny-qwen3", &pinned), Ok(ModelFiles::Directory(_))));
}

#[test]
fn repo_gguf_file_and_local_paths_resolve() {
    let cache = scratch("gguf");
    let gguf = tiny("llama").join("model-q8_0.gguf");
    mirror(&cache, "radix-test/tiny-llama-gguf", &[("model-q8_0.gguf", &gguf)]);
    let files = resolve_model("radix-test/tiny-llama-gguf:model-q8_0.gguf", &offline(&cache)).unwrap();
    assert!(matches!(&files, ModelFiles::Gguf(p) if p.ends_with("model-q8_0.gguf")));

    let local = resolve_model(gguf.to_str().unwrap(), &HubOptions::default()).unwrap();
    assert_eq!(local, ModelFiles::Gguf(gguf.clone()));
    let local_dir = resolve_model(tiny("qwen2").to_str().unwrap(), &HubOptions::default()).unwrap();
    assert_eq!(local_dir, ModelFiles::Directory(tiny("qwen2")));
}

#[test]
fn offline_misses_and_bad_specs_are_clear_errors() {
    let cache = scratch("missing");
    let err = resolve_model("radix-test/absent", &offline(&cache)).unwrap_err().to_string();
    assert!(
        err.contains("config.json") && err.contains("HF_HUB_OFFLINE") && err.contains("radix-test/absent"),
        "{err}"
    );
    let other_revision = HubOptions { revision: Some("v2".into()), ..offline(&cache) };
    mirror(&cache, "radix-test/rev", &[("config.json", &tiny("qwen2").join("config.json"))]);
    let err = resolve_model("radix-test/rev", &other_revision).unwrap_err().to_string();
    assert!(err.contains("revision v2"), "{err}");
    let err = resolve_model("no-such-file.gguf", &HubOptions::default()).unwrap_err().to_string();
    assert!(err.contains("neither an existing file"), "{err}");
}
