//! The engine, owned by one engine thread (ARCHITECTURE.md §1, §3): each step schedules
//! (`scheduler.rs`), runs one forward pass, and postprocesses the logits (`postprocess.rs`:
//! sampling, constraints, stop tokens and stop strings); the prefix cache (`prefix_cache.rs`
//! over the radix tree in `radix.rs` and the page allocator in `pages.rs`) owns every page; the
//! disk tier (`disk_tier/`) keeps the tree's pages in files too, across evictions and restarts.

pub mod cache_key;
pub mod cache_report;
pub mod constraint;
pub mod core;
pub mod disk_tier;
pub mod handle;
pub mod metrics;
pub mod pages;
mod postprocess;
mod prefix_cache;
pub mod radix;
pub mod request;
pub mod sampler;
mod scheduler;
mod sequence;
pub mod stop;

pub use cache_key::{CacheKey, CacheNamespace};
pub use cache_report::{CacheReport, MissReason, PreviousVersion, RecentPrefix, Tenant};
pub use constraint::{Constraint, ConstraintFactory};
pub use core::{DEFAULT_SNAPSHOT_INTERVAL, EngineConfig, EngineCore, EngineStats, ScheduledStep};
pub use disk_tier::identity::build_id;
pub use disk_tier::{DiskStats, DiskTier, ModelIdentity, OpenReport};
pub use handle::EngineHandle;
pub use metrics::{DiskMetrics, EngineMetrics, Histogram};
pub use pages::PageAllocator;
pub use radix::{Evicted, Inserted, NodeId, PrefixMatch, RadixCache, SnapshotHit, SnapshotPrefix};
pub use request::{EngineEvent, FinishReason, GenerateRequest, Timings, TokenLogprobs};
pub use sampler::{Sampler, SamplingParams};
pub use stop::{StopMatcher, StopOutput};
