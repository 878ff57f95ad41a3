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
