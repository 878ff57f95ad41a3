//! Where a model comes from: a `.gguf` file, a model directory, or a Hugging Face hub repo id
//! resolved through `hf-hub`'s cache (honouring `HF_HOME`, `HF_HUB_OFFLINE` and a revision).

use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo, RepoType};

use crate::error::{ModelError, Result};

/// The files a model was resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// A single GGUF file (weights, tokenizer and chat template in its metadata).
    Gguf(PathBuf),
    /// A directory with `config.json`, `*.safetensors` and tokenizer files.
    Directory(PathBuf),
}

impl ModelFiles {
    /// The path to hand to [`crate::Model::load`].
    pub fn path(&self) -> &Path {
        match self {
            ModelFiles::Gguf(p) | ModelFiles::Directory(p) => p,
        }
    }
}

/// How to reach the Hugging Face hub.
#[derive(Debug, Clone, Default)]
pub struct HubOptions {
    /// Branch, tag or commit; `main` by default.
    pub revision: Option<String>,
    /// Never download; only the local cache is used (`HF_HUB_OFFLINE=1` sets it).
    pub offline: bool,
    /// The hub cache folder; by default `$HF_HOME/hub` or `~/.cache/huggingface/hub`.
    pub cache_dir: Option<PathBuf>,
}

impl HubOptions {
    /// Options from the environment: `HF_HUB_OFFLINE`, `HF_HOME`.
    pub fn from_env() -> Self {
        let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
        HubOptions { revision: None, offline, cache_dir: None }
    }
}

/// The files of a safetensors model repo, besides the weights that the index names.
const DIRECTORY_FILES: [&str; 3] = ["config.json", "tokenizer.json", "tokenizer_config.json"];

/// Resolves `spec`: an existing path (a `.gguf` file, or a directory holding `config.json` or
/// exactly one `.gguf`), else a hub repo id `owner/name`, or `owner/name:file.gguf` for one
/// GGUF file of a repo.
pub fn resolve_model(spec: &str, hub: &HubOptions) -> Result<ModelFiles> {
    let path = Path::new(spec);
    if path.exists() {
        return resolve_local(path);
    }
    let (repo_id, gguf_file) = match spec.split_once(':') {
        Some((repo, file)) => (repo, Some(file)),
        None => (spec, None),
    };
    let looks_like_repo =
        repo_id.split('/').count() == 2 && !repo_id.starts_with(['.', '/']) && !repo_id.ends_with('/');
    if !looks_like_repo {
        return Err(ModelError::Source(format!(
            "`{spec}` is neither an existing file or directory nor a hub repo id like `Qwen/Qwen3-0.6B`"
        )));
    }
    let cache = match &hub.cache_dir {
        Some(dir) => Cache::new(dir.clone()),
        None => Cache::from_env(),
    };
    let revision = hub.revision.clone().unwrap_or_else(|| "main".to_owned());
    let repo = Repo::with_revision(repo_id.to_owned(), RepoType::Model, revision.clone());
    let fetch = |file: &str| fetch_file(&cache, &repo, file, hub.offline);
    match gguf_file {
        Some(file) => Ok(ModelFiles::Gguf(fetch(file)?)),
        None => {
            let config = fetch("config.json")?;
            for file in &DIRECTORY_FILES[1..] {
                fetch(file)?;
            }
            // Sharded weights are listed by an index; a single file is model.safetensors.
            match fetch("model.safetensors.index.json") {
                Ok(index) => {
                    for shard in shard_names(&index)? {
                        fetch(&shard)?;
                    }
                }
                Err(_) => {
                    fetch("model.safetensors")?;
                }
            }
            let snapshot = config.parent().expect("a cached file lives in a snapshot folder").to_owned();
            Ok(ModelFiles::Directory(snapshot))
        }
    }
}

fn resolve_local(path: &Path) -> Result<ModelFiles> {
    if path.is_file() {
        return Ok(ModelFiles::Gguf(path.to_owned()));
    }
    if path.join("config.json").is_file() {
        return Ok(ModelFiles::Directory(path.to_owned()));
    }
    let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| ModelError::Source(format!("cannot list {}: {e}", path.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(ModelFiles::Gguf(one.clone())),
        [] => Err(ModelError::Source(format!("{} holds neither config.json nor a .gguf file", path.display()))),
        many => Err(ModelError::Source(format!(
            "{} holds {} .gguf files; name the one to load",
            path.display(),
            many.len()
        ))),
    }
}

/// A file of the repo from the cache, downloading it unless offline.
fn fetch_file(cache: &Cache, repo: &Repo, file: &str, offline: bool) -> Result<PathBuf> {
    if let Some(path) = cached_file(cache, repo, file) {
        return Ok(path);
    }
    if offline {
        return Err(ModelError::Source(format!(
            "`{file}` of {} (revision {}) is not in the hub cache at {} and HF_HUB_OFFLINE is set",
            repo.url(),
            repo.revision(),
            cache.path().display()
        )));
    }
    let api = hf_hub::api::sync::ApiBuilder::from_cache(cache.clone())
        .build()
        .map_err(|e| ModelError::Source(format!("cannot reach the Hugging Face hub: {e}")))?;
    api.repo(repo.clone()).get(file).map_err(|e| {
        ModelError::Source(format!("cannot download `{file}` of {} (revision {}): {e}", repo.url(), repo.revision()))
    })
}

/// hf-hub's cache lookup goes through `refs/<revision>`; a revision that is itself a commit
/// hash has no ref, so its snapshot folder is read directly.
fn cached_file(cache: &Cache, repo: &Repo, file: &str) -> Option<PathBuf> {
    if let Some(path) = cache.repo(repo.clone()).get(file) {
        return Some(path);
    }
    let revision = repo.revision();
    let is_commit = revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit());
    let direct = cache.path().join(repo.folder_name()).join("snapshots").join(revision).join(file);
    (is_commit && direct.exists()).then_some(direct)
}

fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index)
        .map_err(|e| ModelError::BadFile { path: index.to_owned(), message: format!("cannot read: {e}") })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::BadFile { path: index.to_owned(), message: format!("invalid JSON: {e}") })?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::BadFile { path: index.to_owned(), message: "no `weight_map` object".into() })?;
    let mut shards: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
    shards.sort();
    shards.dedup();
    Ok(shards)
}
