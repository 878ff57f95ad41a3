//! Choosing where a model runs: `cpu`, `cuda[:N]` or `metal[:N]`.
//!
//! The CPU path keeps weights and the KV pool in host memory and runs radix-kernels' CPU
//! kernels. Every other device runs one shared tensor path (candle ops for norms, RoPE, matmuls
//! and the MLP); only attention differs: our CUDA kernels on `cuda`, a gather of the context plus
//! candle's matmul and softmax elsewhere (Metal). The tensor path also runs on the CPU for tests
//! ([`crate::LoadOptions::tensor_path`]), so the CPU test suite exercises the code the GPUs run.

pub use candle_core::Device;

use crate::error::{ModelError, Result};

/// Parses a device name as `--device` takes it: `cpu`, `cuda`, `cuda:N`, `metal`, `metal:N`.
/// Fails with a message naming the feature to build with when the backend is not compiled in,
/// and with the driver's message when the device cannot be opened.
pub fn parse_device(spec: &str) -> Result<Device> {
    let spec = spec.trim();
    let (kind, ordinal) = match spec.split_once(':') {
        Some((kind, n)) => {
            let n = n.parse::<usize>().map_err(|_| {
                ModelError::Config(format!("device `{spec}`: `{n}` is not a device number (try `cuda:0`)"))
            })?;
            (kind, n)
        }
        None => (spec, 0),
    };
    match kind.to_ascii_lowercase().as_str() {
        "cpu" if ordinal == 0 => Ok(Device::Cpu),
        "cpu" => Err(ModelError::Config(format!("device `{spec}`: there is one CPU device, `cpu`"))),
        "cuda" => open_cuda(ordinal),
        "metal" => open_metal(ordinal),
        _ => Err(ModelError::Config(format!("unknown device `{spec}`: expected cpu, cuda[:N] or metal[:N]"))),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device> {
    Device::new_cuda(ordinal).map_err(|e| {
        ModelError::Config(format!("cannot open CUDA device {ordinal}: {e} (is the NVIDIA driver loaded?)"))
    })
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Device> {
    Err(ModelError::Config(
        "this build has no CUDA support: rebuild with `--features cuda` (needs the CUDA toolkit)".into(),
    ))
}

#[cfg(all(target_os = "macos", feature = "metal"))]
fn open_metal(ordinal: usize) -> Result<Device> {
    Device::new_metal(ordinal).map_err(|e| ModelError::Config(format!("cannot open Metal device {ordinal}: {e}")))
}

#[cfg(not(all(target_os = "macos", feature = "metal")))]
fn open_metal(_ordinal: usize) -> Result<Device> {
    Err(ModelError::Config(
        "this build has no Metal support: Metal needs macOS and a build with `--features metal`".into(),
    ))
}

/// A short name for logs and reports: `cpu`, `cuda:0`, `metal:0`.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_owned(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_or_say_what_is_wrong() {
        assert!(parse_device("cpu").unwrap().is_cpu());
        assert!(parse_device(" CPU ").unwrap().is_cpu());
        for bad in ["gpu", "cpu:1", "cuda:x", "cuda:-1", ""] {
            let e = parse_device(bad).unwrap_err().to_string();
            assert!(e.contains("device"), "{bad}: {e}");
        }
        if !cfg!(feature = "cuda") {
            assert!(parse_device("cuda").unwrap_err().to_string().contains("--features cuda"));
        }
        if !cfg!(all(target_os = "macos", feature = "metal")) {
            assert!(parse_device("metal:0").unwrap_err().to_string().contains("Metal"));
        }
        assert_eq!(device_name(&Device::Cpu), "cpu");
    }
}
