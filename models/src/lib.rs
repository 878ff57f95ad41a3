//! Model weights, tokenizers and architectures for radix-serve.
//!
//! - [`tokenizer`]: text to token ids and back, loaded from a `tokenizer.json` or built from a
//!   GGUF file's metadata, with an incremental detokenizer for streaming.
#![warn(missing_docs)]

pub mod tokenizer;

mod allocator;
pub mod batch;
mod candle_pool;
pub mod config;
mod cpu_matmul;
pub mod default_model;
pub mod device;
pub mod error;
pub mod kv_pool;
mod layers;
pub mod model;
pub mod recommended_sampling;
mod rng;
mod rope;
pub mod source;
pub mod state_pool;
mod weights;

pub use allocator::{configure_allocator, release_freed_heap};
pub use batch::{ForwardBatch, SequenceChunk};
pub use candle_pool::configure_candle_pool;
pub use config::{Architecture, HybridConfig, ModelConfig, MoeConfig};
pub use device::{Device, device_name, parse_device};
pub use error::{ModelError, Result};
pub use kv_pool::{KvDType, KvPool, KvTypes};
pub use model::{LoadOptions, Model, MtpDraftRequest, PassLogits};
/// The instruction-set level of the CPU kernels (`RADIX_CPU_ISA` lowers it).
pub use radix_kernels::CpuIsa;
pub use recommended_sampling::RecommendedSampling;
pub use rng::SplitMix64;
pub use source::{HubOptions, ModelFiles, resolve_model};
pub use state_pool::StatePool;
pub use weights::{RandomFormat, RandomWeights};
