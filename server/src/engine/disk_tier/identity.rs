//! Which model, KV settings and server build a disk cache belongs to. Page files are kept in a
//! directory named by this identity and carry it in their header, so another model, another
//! file of the same model, another KV dtype, page size or device, or another build of the
//! server never reads them.
//!
//! The weights are recognised by content, not by path or mtime: each file's size and a hash of
//! its first and last MiB (a GGUF header with its metadata and the last tensors' data; a
//! safetensors header and its last tensors), so a model file moved or copied keeps its cache
//! and a different file of the same size does not share it.
//!
//! The build is the hash of the server's own executable ([`build_id`]): another build may
//! compute K/V and states a little otherwise (a kernel's summation order), and what it left
//! must not change this one's answers. The crate version alone does not change between
//! commits. What stays the same across builds is the identity's *model key*; a directory with
//! this model key and another build is dead (no build of ours reads it again, short of going
//! back to that exact binary), and so is any directory of an older identity format:
//! [`DiskTier::open`](super::DiskTier::open) removes both.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Bytes hashed at each end of a weights file.
const SAMPLE: u64 = 1 << 20;

/// The format of the identity; changing what goes into it changes it.
const IDENTITY_VERSION: &str = "radix-serve disk tier v2";

/// What every format's first line of `model.txt` starts with.
const IDENTITY_FORMAT_PREFIX: &str = "radix-serve disk tier v";

/// The line of `model.txt` that names the model key (see the module's doc).
const MODEL_KEY_LINE: &str = "model key ";

/// A model's identity for the disk tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// The hash everything below goes into: the model key and the build.
    pub id: [u8; 16],
    /// The hash of all but the build: the same for every build of the server.
    pub model_key: [u8; 16],
    /// What went into it, for `model.txt` beside the pages (people reading the directory, and
    /// [`Self::is_dead_directory`] reading another directory's).
    pub description: String,
}

impl ModelIdentity {
    /// The identity of the model whose weights are at `weights` (a file, or a directory of
    /// safetensors and `config.json`), computed with `settings`: everything else that changes
    /// the K/V (architecture and shapes, RoPE, KV dtype, page size, device); `build` tells the
    /// server's builds apart ([`build_id`]).
    pub fn of(weights: &Path, settings: &str, build: &str) -> std::io::Result<Self> {
        let mut hasher = Sha256::new();
        let mut description = format!("{IDENTITY_VERSION}\n{settings}\n");
        hasher.update(description.as_bytes());
        let files = if weights.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(weights)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".gguf")
                })
                .collect();
            files.sort();
            files
        } else {
            vec![weights.to_path_buf()]
        };
        for path in files {
            let (size, sample) = sample(&path)?;
            let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            // In a directory the names tell the files apart; a single file is known by content only.
            let name = if weights.is_dir() { name } else { String::new() };
            hasher.update(format!("{name}:{size}:").as_bytes());
            hasher.update(sample);
            description.push_str(&format!("weights {}: {size} bytes\n", path.display()));
        }
        let model_key = first_16(hasher.finalize().as_slice());
        let id = first_16(Sha256::new().chain_update(model_key).chain_update(build.as_bytes()).finalize().as_slice());
        description.push_str(&format!("build {build}\n{MODEL_KEY_LINE}{}\n", hex(&model_key)));
        Ok(ModelIdentity { id, model_key, description })
    }

    /// Whether `description`, another directory's `model.txt`, is dead to this server: this
    /// model's under another build (the same model key, another identity), or any model's
    /// under an older identity format, which no build of this format computes again.
    pub fn is_dead_directory(&self, description: &str, dir_name: &str) -> bool {
        let format = description.lines().next().unwrap_or_default();
        if format.starts_with(IDENTITY_FORMAT_PREFIX) && format != IDENTITY_VERSION {
            return true;
        }
        let key = description.lines().find_map(|line| line.strip_prefix(MODEL_KEY_LINE));
        key == Some(hex(&self.model_key).as_str()) && dir_name != self.hex()
    }

    /// The identity in hex, the name of its directory.
    pub fn hex(&self) -> String {
        hex(&self.id)
    }
}

/// The running server's build: the first 8 bytes of the SHA-256 of its executable, in hex.
/// It reads the whole file (a release binary is ~25 MB): the server asks once, at start-up.
pub fn build_id() -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut File::open(std::env::current_exe()?)?, &mut hasher)?;
    Ok(hex(&hasher.finalize()[..8]))
}

fn first_16(digest: &[u8]) -> [u8; 16] {
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file's size and the SHA-256 of its first and last [`SAMPLE`] bytes.
fn sample(path: &Path) -> std::io::Result<(u64, [u8; 32])> {
    let mut file = File::open(path)?;
    let size = file.metadata()?.len();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; SAMPLE.min(size) as usize];
    file.read_exact(&mut buf)?;
    hasher.update(&buf);
    if size > SAMPLE {
        let tail = SAMPLE.min(size - SAMPLE);
        file.seek(SeekFrom::Start(size - tail))?;
        buf.resize(tail as usize, 0);
        file.read_exact(&mut buf)?;
        hasher.update(&buf);
    }
    Ok((size, hasher.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_follows_content_and_settings_not_the_path() {
        let dir = std::env::temp_dir().join(format!("radix-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let big: Vec<u8> = (0..3 * SAMPLE as usize).map(|i| (i % 251) as u8).collect();
        let a = write("a.gguf", &big);
        let copy = write("copy-of-a.gguf", &big);
        let mut changed_tail = big.clone();
        *changed_tail.last_mut().unwrap() ^= 1;
        let b = write("b.gguf", &changed_tail);
        let small = write("small.gguf", b"tiny model");
        let id = |p: &Path, s: &str| ModelIdentity::of(p, s, "build 1").unwrap().id;
        assert_eq!(id(&a, "f16 page 1"), id(&copy, "f16 page 1"), "a copy is the same model");
        assert_ne!(id(&a, "f16 page 1"), id(&b, "f16 page 1"), "another file of the same size is not");
        assert_ne!(id(&a, "f16 page 1"), id(&a, "f16 page 4"), "other KV settings are not");
        assert_ne!(id(&small, "s"), id(&a, "s"));
        assert_eq!(ModelIdentity::of(&a, "x", "build 1").unwrap().hex().len(), 32);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn another_build_is_another_identity_with_the_same_model_key() {
        let dir = std::env::temp_dir().join(format!("radix-identity-build-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let weights = dir.join("m.gguf");
        std::fs::write(&weights, b"some weights").unwrap();
        let other_weights = dir.join("n.gguf");
        std::fs::write(&other_weights, b"other weights").unwrap();
        let old = ModelIdentity::of(&weights, "f16", "aaaa").unwrap();
        let new = ModelIdentity::of(&weights, "f16", "bbbb").unwrap();
        let other_model = ModelIdentity::of(&other_weights, "f16", "aaaa").unwrap();
        let other_settings = ModelIdentity::of(&weights, "bf16", "aaaa").unwrap();
        assert_ne!(old.id, new.id);
        assert_eq!(old.model_key, new.model_key);
        assert!(new.is_dead_directory(&old.description, &old.hex()));
        assert!(!new.is_dead_directory(&new.description, &new.hex()), "its own directory is not another build");
        assert!(!new.is_dead_directory(&other_model.description, &other_model.hex()));
        assert!(!new.is_dead_directory(&other_settings.description, &other_settings.hex()));
        let v1 = "radix-serve disk tier v1\nkv dtype F16\nweights /m.gguf: 12 bytes\n";
        assert!(new.is_dead_directory(v1, "00"), "an older format is dead to every model");
        assert!(!new.is_dead_directory("test model\nno key here\n", "00"), "what it cannot tell stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_build_id_is_stable_within_a_process() {
        let id = build_id().unwrap();
        assert_eq!(id.len(), 16);
        assert_eq!(id, build_id().unwrap());
    }
}
