//! The engine's counts of the moment, for `/health` and tests: the scheduler's and the cache's.

use super::disk_tier::DiskStats;

/// A snapshot of the engine's state, for `/health` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Sequences running.
    pub running: usize,
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Pages in the pool.
    pub pages_total: usize,
    /// Free pages.
    pub pages_free: usize,
    /// Pages held by the prefix cache.
    pub pages_cached: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Hybrid models: recurrent-state snapshots in the prefix cache.
    pub snapshots: usize,
    /// Hybrid models: slots set aside for snapshots (the `--state-cache` budget).
    pub snapshot_slots: usize,
    /// Hybrid models: snapshot slots neither in the cache nor held by a running sequence.
    pub snapshot_slots_free: usize,
    /// Hybrid models: bytes of one snapshot (one sequence's recurrent state).
    pub snapshot_bytes: usize,
    /// Hybrid models: state slots for running sequences, and how many of them are free.
    pub state_slots: usize,
    /// See [`EngineStats::state_slots`].
    pub state_slots_free: usize,
    /// The disk tier (`--cache-dir`); `enabled: false` without one.
    pub disk: DiskStats,
}
