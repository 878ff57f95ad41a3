//! ARCHITECTURE.md stays true: every repository path it names exists, and its map of mechanisms
//! names the file of each mechanism a newcomer looks for (issue 14's list). A rename that
//! forgets the document fails here instead of misleading the next reader.

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
