//! ARCHITECTURE.md stays true: every repository path it names exists, and its map of mechanisms
//! names the file of each mechanism a newcomer looks for (issue 14's list). A rename that
//! forgets the document fails here instead of misleading the next reader. Short names count
//! too (`engine/core.rs`, `api/snapshot_points.rs`, `run-ab.sh`): each must be a file or folder
//! of the repository, of a crate's `src/`, of `scripts/` or of `benches/`.

use std::path::Path;

use radix_e2e::workspace_root;

/// The mechanisms whose file the map must name: its rows start with these words.
const MECHANISMS: [&str; 16] = [
    "admission",
    "prefix matching",
    "page ownership",
    "eviction",
    "sampling",
    "stop strings",
    "message preparation",
    "rendering",
    "output parsing",
    "streaming",
    "wire format: OpenAI chat",
    "wire format: OpenAI completions",
    "wire format: llama.cpp",
    "wire format: Anthropic",
    "attention: CPU",
    "attention: CUDA",
];

fn document() -> String {
    let path = workspace_root().join("ARCHITECTURE.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{} is readable: {e}", path.display()))
}

/// The `code spans` of a text that look like repository paths: a top-level folder of the
/// workspace, then at least one more component (`server/src/engine/core.rs`, `kernels/cuda/`).
/// Globs and placeholders (`*`, `<`, `{`) are left out; a `path:symbol` suffix is cut.
fn named_paths(text: &str) -> Vec<String> {
    const ROOTS: [&str; 8] = ["server/", "models/", "kernels/", "templates/", "benches/", "tests/", "scripts/", ".ci/"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.split([':', ' ']).next().unwrap_or_default())
        .filter(|span| ROOTS.iter().any(|root| span.starts_with(root) && span.len() > root.len()))
        .filter(|span| !span.contains(['*', '<', '{']))
        .map(str::to_owned)
        .collect()
}

/// Every `code span` that reads as a file (ending `.rs`, `.sh`, `.py`, `.toml`, `.md`) or a
/// folder (ending `/`), whatever it starts with. Routes (`/v1/cache/`), globs and placeholders
/// are left out; a `path:symbol` suffix is cut.
fn path_like_spans(text: &str) -> Vec<String> {
    const ENDINGS: [&str; 6] = [".rs", ".sh", ".py", ".toml", ".md", "/"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.split([':', ' ']).next().unwrap_or_default())
        .filter(|span| ENDINGS.iter().any(|end| span.ends_with(end)))
        .filter(|span| !span.starts_with('/') && !span.contains(['*', '<', '{']))
        .filter(|span| span.chars().any(char::is_alphabetic))
        .map(str::to_owned)
        .collect()
}

/// The places a short name may be relative to: the repository, each crate's `src/`,
/// `scripts/` and `benches/`.
fn bases(root: &Path) -> Vec<std::path::PathBuf> {
    let mut bases = vec![root.to_path_buf(), root.join("scripts"), root.join("benches")];
    let crates = std::fs::read_dir(root).unwrap_or_else(|e| panic!("{} is listable: {e}", root.display()));
    for entry in crates.flatten() {
        if entry.path().join("Cargo.toml").is_file() && entry.path().join("src").is_dir() {
            bases.push(entry.path().join("src"));
        }
    }
    bases
}

#[test]
fn every_path_like_span_exists() {
    let root = workspace_root();
    let bases = bases(&root);
    let spans = path_like_spans(&document());
    assert!(spans.len() >= 100, "the document names files ({} found)", spans.len());
    let missing: Vec<&String> = spans.iter().filter(|s| !bases.iter().any(|b| b.join(s.as_str()).exists())).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that are not in the repository, a crate's src/, scripts/ or benches/: {missing:?}"
    );
}

#[test]
fn path_like_spans_are_every_file_or_folder_span() {
    let text = "`engine/core.rs`, `run-ab.sh`, `models/src/model.rs:forward`, `server/src/api/ui/`, `Cargo.toml`, \
                `/v1/cache/`, `benches/results/*.svg`, `x.json`, `--cache-dir DIR` and `a.md`";
    assert_eq!(
        path_like_spans(text),
        ["engine/core.rs", "run-ab.sh", "models/src/model.rs", "server/src/api/ui/", "Cargo.toml", "a.md"]
    );
}

#[test]
fn every_path_it_names_exists() {
    let root = workspace_root();
    let paths = named_paths(&document());
    assert!(paths.len() >= 30, "the map names files ({} found)", paths.len());
    let missing: Vec<&String> = paths.iter().filter(|p| !root.join(Path::new(p.as_str())).exists()).collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md names paths that do not exist: {missing:?}");
}

#[test]
fn the_map_names_a_file_for_each_mechanism() {
    let doc = document();
    for mechanism in MECHANISMS {
        let row = doc
            .lines()
            .find(|line| line.starts_with(&format!("| {mechanism} |")))
            .unwrap_or_else(|| panic!("ARCHITECTURE.md has a map row for {mechanism:?}"));
        assert!(!named_paths(row).is_empty(), "the {mechanism:?} row names a file: {row}");
    }
}

#[test]
fn path_spans_are_read_as_the_map_writes_them() {
    let text = "see `server/src/engine/core.rs`, `models/src/model.rs:forward`, `kernels/cuda/`, \
                `radix_kernels::paged_attention`, `benches/results/*.svg` and `server/`";
    assert_eq!(named_paths(text), ["server/src/engine/core.rs", "models/src/model.rs", "kernels/cuda/"]);
}
