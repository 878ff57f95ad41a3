//! Black-box tests of `radix-serve template`: run the real binary on fixture requests and check
//! its stdout byte for byte against transformers' reference renders.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use radix_e2e::workspace_root;

/// The `radix-serve` binary that `cargo test --workspace` built next to this test.
fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join(format!("radix-serve{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p radix-serve` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

use radix_e2e::asset_path as asset;

fn fixture(name: &str) -> PathBuf {
    workspace_root().join("templates/tests/fixtures").join(name)
}

fn run(args: &[&std::ffi::OsStr], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(binary())
        .arg("template")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.unwrap_or_default()).unwrap();
    child.wait_with_output().unwrap()
}

fn reference(template: &str, fixture: &str, mode: &str) -> Json {
    let doc: Json =
        serde_json::from_str(&std::fs::read_to_string(self::fixture("reference_renders.json")).unwrap()).unwrap();
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["template"] == template && e["fixture"] == fixture && e["mode"] == mode)
        .cloned()
        .unwrap_or_else(|| panic!("no reference for {template} × {fixture} ({mode})"))
}

fn assert_matches_reference(out: &Output, template: &str, fixture: &str, mode: &str) {
    assert!(out.status.success(), "exit {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let want = reference(template, fixture, mode);
    let hex: String = Sha256::digest(&out.stdout).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(out.stdout.len() as u64, want["len"].as_u64().unwrap(), "length differs from transformers");
    assert_eq!(hex, want["sha256"].as_str().unwrap(), "bytes differ from transformers");
}

#[test]
fn prints_the_prepared_prompt_exactly() {
    let config = asset("qwen3").join("tokenizer_config.json");
    let request = fixture("conversations/03_two_system_stable_dynamic.json");
    let out = run(&["--template".as_ref(), config.as_os_str(), "--request".as_ref(), request.as_os_str()], None);
    assert_matches_reference(&out, "qwen3", "03_two_system_stable_dynamic", "prepared");
    assert!(!out.stdout.ends_with(b"\n\n"), "no newline is added after the generation prompt");
}

#[test]
fn no_prepare_renders_messages_as_given() {
    let config = asset("qwen3").join("tokenizer_config.json");
    let request = fixture("conversations/28_long_system_with_tools.json");
    let out = run(
        &[
            "--template".as_ref(),
            config.as_os_str(),
            "--request".as_ref(),
            request.as_os_str(),
            "--no-prepare".as_ref(),
        ],
        None,
    );
    assert_matches_reference(&out, "qwen3", "28_long_system_with_tools", "raw");
}

#[test]
fn reads_the_template_from_gguf_metadata_and_the_request_from_stdin() {
    let gguf = asset("smollm2");
    let body = std::fs::read(fixture("conversations/02_system_user.json")).unwrap();
    let out = run(&["--template".as_ref(), gguf.as_os_str(), "--request".as_ref(), "-".as_ref()], Some(&body));
    assert_matches_reference(&out, "smollm2", "02_system_user", "prepared");
}

#[test]
fn template_errors_go_to_stderr_with_a_failing_exit() {
    let template = fixture("templates/strict_system.jinja");
    let request = fixture("conversations/05_system_mid_conversation.json");
    let args = ["--template".as_ref(), template.as_os_str(), "--request".as_ref(), request.as_os_str()];
    let raw = run(&[&args[..], &["--no-prepare".as_ref()]].concat(), None);
    assert!(!raw.status.success());
    assert!(raw.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&raw.stderr);
    assert!(stderr.contains("System message must be at the beginning."), "stderr: {stderr}");
    // Prepared, the same request renders.
    assert_matches_reference(&run(&args, None), "strict_system", "05_system_mid_conversation", "prepared");
}

#[test]
fn bad_input_is_named_in_the_error() {
    let template = fixture("templates/strict_system.jinja");
    let cases: [(&[u8], &str); 3] = [
        (b"{not json", "not valid JSON"),
        (br#"{"model": "x"}"#, "'messages' is a required property"),
        (br#"{"messages": [{"content": "hi"}]}"#, "messages[0] has no 'role'"),
    ];
    for (body, wanted) in cases {
        let out = run(&["--template".as_ref(), template.as_os_str(), "--request".as_ref(), "-".as_ref()], Some(body));
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(wanted), "wanted {wanted:?} in stderr: {stderr}");
    }
    let missing = run(
        &["--template".as_ref(), "/nonexistent/t.jinja".as_ref(), "--request".as_ref(), "-".as_ref()],
        Some(b"{\"messages\": []}"),
    );
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/t.jinja"));
}
