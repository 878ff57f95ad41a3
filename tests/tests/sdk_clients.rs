//! End-to-end: the official OpenAI and Anthropic Python SDKs (pinned in
//! tests/python/requirements.txt, installed by scripts/sdk-env.sh) against the real binary.
//! Each script in tests/python/ runs all its checks and exits non-zero if any failed; its
//! output is shown either way.

mod common;

use std::process::Command;

use common::{Server, workspace_root};

/// The SDK virtualenv's python, created on first use.
fn sdk_python() -> String {
    let script = workspace_root().join("scripts/sdk-env.sh");
    let out = Command::new("bash").arg(&script).output().expect("bash runs");
    assert!(
        out.status.success(),
        "scripts/sdk-env.sh failed (the SDK tests need PyPI once):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 path").trim().to_owned()
}

/// Runs one script; returns whether it passed, and prints its output.
fn run_script(python: &str, server: &Server, script: &str) -> bool {
    let dir = workspace_root().join("tests/python");
    // -B: no __pycache__ in the source tree.
    let out = Command::new(python)
        .arg("-B")
        .arg(dir.join(script))
        .current_dir(&dir)
        .env("RADIX_BASE_URL", &server.base)
        .output()
        .expect("the SDK python runs");
    println!(
        "== {script} ({})\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.success()
}

/// Slow (~15 s quiet, a minute on a busy machine): two Python interpreters import the official SDKs and run every check
/// of their scripts against one server.
#[test]
fn official_python_sdks() {
    let python = sdk_python();
    // A template that shows tools and makes the model's `<tool_call>` output parse as calls;
    // SmolLM2's own template has no tool format.
    let template = workspace_root().join("benches/templates/chatml_tools.jinja");
    let server = Server::start(&["--chat-template-file", template.to_str().unwrap()]);
    let failed: Vec<&str> = ["test_openai_sdk.py", "test_anthropic_sdk.py"]
        .into_iter()
        .filter(|script| !run_script(&python, &server, script))
        .collect();
    assert!(failed.is_empty(), "SDK scripts failed: {failed:?} (their output is above)");
    server.wait_idle();
}
