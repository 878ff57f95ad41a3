//! The engine, owned by one engine thread (ARCHITECTURE.md §1, §3): each step schedules
//! (`scheduler.rs`), runs one forward pass, and postprocesses the logits (`postprocess.rs`:
//! sampling, constraints, stop tokens and stop strings); the request cache (`cache/`: the
//! prefix cache over the radix tree in `radix.rs` and the page allocator, the state slots and
//! snapshots, and the disk tier in `disk_tier/`, which keeps the tree's pages in files too,
//! across evictions and restarts) owns every page and slot a request holds.

mod cache;
pub mod cache_key;
pub mod cache_report;
pub mod constraint;
pub mod core;
pub mod disk_tier;
pub mod draft;
pub mod handle;
pub mod metrics;
mod postprocess;
pub mod radix;
pub mod request;
pub mod sampler;
mod scheduler;
mod sequence;
mod stats;
pub mod stop;

pub use cache::pages::PageAllocator;
pub use cache_key::{CacheKey, CacheNamespace};
pub use cache_report::{CacheReport, MissReason, PreviousVersion, RecentPrefix, Tenant};
pub use constraint::{Constraint, ConstraintFactory};
pub use core::{DEFAULT_BRANCH_SPACING, DEFAULT_SNAPSHOT_INTERVAL, EngineConfig, EngineCore, ScheduledStep};
pub use disk_tier::identity::build_id;
pub use disk_tier::{DiskStats, DiskTier, ModelIdentity, OpenReport};
pub use handle::EngineHandle;
pub use metrics::{DiskMetrics, EngineMetrics, Histogram};
pub use radix::{Evicted, Inserted, NodeId, PrefixMatch, PrefixPeek, RadixCache, SnapshotHit, SnapshotPrefix};
pub use request::{EngineEvent, FinishReason, GenerateRequest, Timings, TokenLogprobs};
pub use sampler::{Sampler, SamplingParams};
pub use stats::EngineStats;
pub use stop::{StopMatcher, StopOutput};
