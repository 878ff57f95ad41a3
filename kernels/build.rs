//! With feature `cuda`, compiles `cuda/*.cu` to PTX with nvcc (loaded at run time through
//! candle's custom-kernel API). Without it, does nothing: the CPU build needs no CUDA toolkit.

use std::path::PathBuf;
use std::process::Command;

const SOURCES: [&str; 3] = ["paged_attention", "delta_net", "moe"];
/// Headers the sources include.
const HEADERS: [&str; 1] = ["kv_formats.cuh"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_CUDA");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=NVCC");
    // The same knob candle's kernels use, so both are built for one GPU generation. PTX for an
    // older capability runs on newer GPUs (the driver compiles it at load); 80 is Ampere.
    let cap = std::env::var("CUDA_COMPUTE_CAP").ok().and_then(|c| c.trim().replace('.', "").parse::<u32>().ok());
    let cap = cap.unwrap_or(80);
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin").join("nvcc")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for header in HEADERS {
        println!("cargo:rerun-if-changed={}", PathBuf::from("cuda").join(header).display());
    }
    for name in SOURCES {
        let src = PathBuf::from("cuda").join(format!("{name}.cu"));
        println!("cargo:rerun-if-changed={}", src.display());
        let ptx = out_dir.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "--use_fast_math"])
            .arg(format!("-arch=compute_{cap}"))
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "feature `cuda` needs nvcc, the CUDA compiler: running `{}` failed ({e}). Install the \
                     CUDA toolkit and put nvcc on PATH or set CUDA_HOME (on a machine without a GPU, \
                     `. ../shared/cuda-ci-setup.sh` sets one up)",
                    nvcc.display()
                )
            });
        assert!(status.success(), "nvcc failed on {} ({status})", src.display());
    }
}
