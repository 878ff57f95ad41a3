//! `--device` names the device or fails with a message saying what to do, before any weights
//! load: in a CPU build a GPU device names the feature to build with; in a CUDA build on a
//! machine without a GPU, `cuda:0` says the device cannot be opened.

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
