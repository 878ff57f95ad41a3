//! The engine: the radix prefix cache, the KV page allocator, the scheduler and step loop, and
//! the sampler, all owned by one engine thread (DESIGN.md §1-2).

pub mod cache_report;
pub mod constraint;
pub mod core;
pub mod handle;
pub mod metrics;
pub mod pages;
pub mod radix;
pub mod request;
pub mod sampler;
mod sequence;
pub mod stop;

pub use cache_report::{CacheReport, MissReason, PreviousVersion, RecentPrefix};
pub use constraint::{Constraint, ConstraintFactory};
pub use core::{EngineConfig, EngineCore, EngineStats};
pub use handle::EngineHandle;
pub use metrics::{EngineMetrics, Histogram};
pub use pages::PageAllocator;
pub use radix::{Inserted, NodeId, PrefixMatch, RadixCache};
pub use request::{EngineEvent, FinishReason, GenerateRequest, Timings, TokenLogprobs};
pub use sampler::{Sampler, SamplingParams};
pub use stop::{StopMatcher, StopOutput};
