//! Which model and KV settings a disk cache belongs to. Page files are kept in a directory named
//! by this identity and carry it in their header, so another model, another file of the same
//! model, or another KV dtype, page size or device never reads them.
//!
//! The weights are recognised by content, not by path or mtime: each file's size and a hash of
//! its first and last MiB (a GGUF header with its metadata and the last tensors' data; a
//! safetensors header and its last tensors), so a model file moved or copied keeps its cache
//! and a different file of the same size does not share it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Bytes hashed at each end of a weights file.
const SAMPLE: u64 = 1 << 20;

/// The format of the identity; changing what goes into it changes it.
const IDENTITY_VERSION: &str = "radix-serve disk tier v1";

/// A model's identity for the disk tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// The hash everything below goes into.
    pub id: [u8; 16],
    /// What went into it, for `model.txt` beside the pages (people reading the directory).
    pub description: String,
}

impl ModelIdentity {
    /// The identity of the model whose weights are at `weights` (a file, or a directory of
    /// safetensors and `config.json`), computed with `settings`: everything else that changes
    /// the K/V (architecture and shapes, RoPE, KV dtype, page size, device).
    pub fn of(weights: &Path, settings: &str) -> std::io::Result<Self> {
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
        let digest = hasher.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        Ok(ModelIdentity { id, description })
    }

    /// The identity in hex, the name of its directory.
    pub fn hex(&self) -> String {
        self.id.iter().map(|b| format!("{b:02x}")).collect()
    }
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
        let id = |p: &Path, s: &str| ModelIdentity::of(p, s).unwrap().id;
        assert_eq!(id(&a, "f16 page 1"), id(&copy, "f16 page 1"), "a copy is the same model");
        assert_ne!(id(&a, "f16 page 1"), id(&b, "f16 page 1"), "another file of the same size is not");
        assert_ne!(id(&a, "f16 page 1"), id(&a, "f16 page 4"), "other KV settings are not");
        assert_ne!(id(&small, "s"), id(&a, "s"));
        assert_eq!(ModelIdentity::of(&a, "x").unwrap().hex().len(), 32);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
