//! `--device` names the device or fails with a message saying what to do, before any weights
//! load: in a CPU build a GPU device names the feature to build with; in a CUDA build on a
//! machine without a GPU, `cuda:0` says the device cannot be opened. Security flags that would
//! leave the server less safe than asked are start-up errors too.

mod common;

use std::process::Command;

use radix_e2e::asset_path as asset;

fn start_with_device(device: &str) -> (bool, String) {
    let model = asset("smollm2");
    let out = Command::new(common::binary())
        .args(["--port", "0", "--device", device, "-m"])
        .arg(&model)
        .output()
        .expect("radix-serve runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_or_missing_devices_are_clear_errors() {
    let cases = [
        ("gpu", "unknown device `gpu`"),
        ("cuda:x", "is not a device number"),
        ("cpu:1", "one CPU device"),
        ("cuda:0", "CUDA"),
        ("metal", "Metal"),
    ];
    for (device, says) in cases {
        let (ok, stderr) = start_with_device(device);
        assert!(!ok, "--device {device} should fail here");
        assert!(stderr.contains(says), "--device {device}: expected `{says}` in:\n{stderr}");
        assert!(stderr.contains("--device"), "--device {device}: the error should name the flag:\n{stderr}");
        assert!(!stderr.contains("panicked"), "--device {device} panicked:\n{stderr}");
    }
}

/// Flags that would leave the server less safe than asked refuse to start, saying why.
#[test]
fn unsafe_security_flags_are_start_up_errors() {
    let model = asset("smollm2");
    let cases: [(&[&str], &str); 3] = [
        (&["--api-key", ""], "--api-key has no usable key"),
        (&["--api-key", " , "], "--api-key has no usable key"),
        (&["--cors-origin", "localhost:3000"], "--cors-origin"),
    ];
    for (flags, says) in cases {
        let out = Command::new(common::binary())
            .args(["--port", "0", "-m"])
            .arg(&model)
            .args(flags)
            .output()
            .expect("radix-serve runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} must not start");
        assert!(stderr.contains(says), "{flags:?}: expected `{says}` in:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?} panicked:\n{stderr}");
    }
}

/// `-c` is the context served: the default KV budget grows to hold it (it used to stay at
/// 256 MiB and lower a Qwen3-0.6B-shaped model's 16,384 to 2,339), and a `--kv-cache` too small
/// for an explicit `-c` is a start-up error naming both figures, not a server that answers 400
/// to prompts the user asked it to take.
#[test]
fn the_context_asked_for_is_the_context_served() {
    let model = asset("smollm2");
    let out = Command::new(common::binary())
        .args(["--port", "0", "-c", "16384", "--kv-cache", "64", "-m"])
        .arg(&model)
        .output()
        .expect("radix-serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "conflicting -c and --kv-cache must not start");
    assert!(stderr.contains("-c 16384 needs") && stderr.contains("--kv-cache is 64 MiB"), "{stderr}");
    assert!(stderr.contains("raise --kv-cache to"), "{stderr}");

    // SmolLM2 takes 22.5 KiB of KV a token: 16,384 of them are more than the old 256 MiB.
    let server = common::Server::start(&["-c", "16384"]);
    let log = server.log().join("\n");
    assert!(log.contains("context 16384;"), "the start-up line names the context asked for:\n{log}");
    let props = server.get("/props");
    assert_eq!(props["default_generation_settings"]["n_ctx"], 16384, "{props}");
}

/// llama-server's expert-offload flags are accepted (with their short spellings) and, on the
/// CPU, change nothing and say so in the log; a bad value is a CLI error naming the flag. The
/// server is stopped right after loading by an unrelated start-up error (`--cache-disk` without
/// `--cache-dir`), which comes after the load notes.
#[test]
fn expert_offload_flags_are_accepted_on_the_cpu() {
    let model = asset("smollm2");
    for flags in [&["--cpu-moe"][..], &["-ncmoe", "3"], &["--n-cpu-moe=2", "-cmoe"]] {
        let out = Command::new(common::binary())
            .args(["--port", "0", "--cache-disk", "1", "-m"])
            .arg(&model)
            .args(flags)
            .output()
            .expect("radix-serve runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: the --cache-disk error stops it");
        assert!(stderr.contains("the model runs on the CPU, where its experts are already"), "{flags:?}:\n{stderr}");
        assert!(stderr.contains("--cache-disk needs --cache-dir"), "{flags:?}: the load went on:\n{stderr}");
    }
    let out = Command::new(common::binary())
        .args(["--port", "0", "--n-cpu-moe", "many", "-m"])
        .arg(&model)
        .output()
        .expect("radix-serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--n-cpu-moe"), "{stderr}");
}
