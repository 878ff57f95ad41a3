//! Errors of model loading and running.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model. Messages name the file, tensor or
/// setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A model file could not be read or parsed.
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("{path}: missing tensor `{name}` (is this a complete {arch} model?)")]
    MissingTensor {
        /// The file searched.
        path: PathBuf,
        /// The tensor's name in that file.
        name: String,
        /// The architecture being loaded.
        arch: String,
    },
    /// The model's architecture is not one we run.
    #[error("unsupported architecture `{0}`: radix-serve runs llama, qwen2 and qwen3")]
    UnsupportedArchitecture(String),
    /// A weight's quantization type is not one we run.
    #[error(
        "tensor `{name}` has unsupported type {dtype}: supported are F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"
    )]
    UnsupportedQuantization {
        /// The tensor.
        name: String,
        /// Its type.
        dtype: String,
    },
    /// A configuration value is missing or inconsistent.
    #[error("model config: {0}")]
    Config(String),
    /// The model source (path or hub id) could not be resolved.
    #[error("{0}")]
    Source(String),
    /// The default model could not be fetched or failed its checks.
    #[error("cannot fetch {0}")]
    Fetch(String),
    /// A batch handed to `forward` is inconsistent with itself or with the KV pool.
    #[error("invalid batch: {0}")]
    Batch(String),
    /// The KV pool cannot be allocated as asked.
    #[error("KV pool: {0}")]
    KvPool(String),
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// The attention kernel rejected its inputs.
    #[error("attention kernel: {0}")]
    Kernel(#[from] radix_kernels::KernelError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
