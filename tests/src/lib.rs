//! Test support shared by every crate's tests (the end-to-end tests themselves live in
//! `tests/tests/`): the workspace root, and third-party assets fetched through
//! `scripts/assets.sh`, the one script tests, benches and the README share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate is inside the workspace").to_owned()
}

/// The path of a pinned third-party asset (`scripts/assets.sh path NAME`), fetched if needed.
/// Panics with the script's own message when it cannot be had.
pub fn asset_path(name: &str) -> PathBuf {
    let script = workspace_root().join("scripts/assets.sh");
    let out = Command::new("bash").arg(&script).args(["path", name]).output().expect("bash runs");
    assert!(
        out.status.success(),
        "scripts/assets.sh path {name} failed (tests need the pinned registry assets):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}
