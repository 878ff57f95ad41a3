//! Counters and latency histograms the engine keeps for `/metrics`, measured with the engine's
//! own timestamps (submitted, admitted, first token) so that HTTP overhead does not blur them.

use std::time::{Duration, Instant};

/// Bucket bounds (seconds) for time to first token and queue time: prefill on a CPU takes from
/// milliseconds to minutes.
const LATENCY_BOUNDS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// Bucket bounds (seconds) for time per output token.
const TOKEN_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// A Prometheus-style histogram: cumulative counts are made when it is written out.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Upper bounds of the buckets, in seconds, increasing.
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative); one more than `bounds` for `+Inf`.
    pub counts: Vec<u64>,
    /// Sum of all observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    /// Records one duration.
    pub fn observe(&mut self, d: Duration) {
        let v = d.as_secs_f64();
        let bucket = self.bounds.iter().position(|&b| v <= b).unwrap_or(self.bounds.len());
        self.counts[bucket] += 1;
        self.sum += v;
        self.count += 1;
    }
}

/// Totals since start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetrics {
    /// Requests admitted to run.
    pub requests_admitted: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of which found in the prefix cache.
    pub cached_tokens: u64,
    /// Of which left to compute (prefill).
    pub prefill_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Pages evicted from the radix cache to make room.
    pub evicted_pages: u64,
    /// Tokens those pages held.
    pub evicted_tokens: u64,
    /// Hybrid models: recurrent-state snapshots dropped to make room (with their node or alone).
    pub evicted_snapshots: u64,
    /// Submission to first token.
    pub time_to_first_token: Histogram,
    /// Mean time between output tokens, one observation per request.
    pub time_per_output_token: Histogram,
    /// Submission to admission.
    pub queue_time: Histogram,
    /// The disk tier (`--cache-dir`), all zero without one.
    pub disk: DiskMetrics,
    /// Speculative decoding: verify passes over drafted tokens.
    pub spec_rounds: u64,
    /// Tokens drafted for them.
    pub spec_drafted_tokens: u64,
    /// Of which the model accepted.
    pub spec_accepted_tokens: u64,
    /// Tokens the multi-token-prediction head drafted (`--spec-type draft-mtp`), of those.
    pub spec_head_drafted_tokens: u64,
}

/// The disk tier's totals since start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskMetrics {
    /// Requests that had pages read back from disk.
    pub restores: u64,
    /// Prompt tokens whose K/V were read back (counted in `cached_tokens` too).
    pub restored_tokens: u64,
    /// Requests of a hybrid model that resumed from a snapshot read back from disk.
    pub snapshots_restored: u64,
    /// Page and snapshot files read.
    pub files_read: u64,
    /// Pages read back.
    pub pages_read: u64,
    /// Seconds each restore took (every file it read, into the pool).
    pub read_seconds: Histogram,
    /// Page files found damaged or missing on a read (their pages were recomputed) or refused
    /// at start-up.
    pub damaged_files: u64,
    /// Page files written.
    pub files_written: u64,
    /// Bytes of those files.
    pub bytes_written: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Page files removed to stay within `--cache-disk` (or no longer referenced).
    pub evicted_files: u64,
    /// Bytes of those files.
    pub evicted_bytes: u64,
}

impl Default for DiskMetrics {
    fn default() -> Self {
        DiskMetrics {
            restores: 0,
            restored_tokens: 0,
            files_read: 0,
            pages_read: 0,
            read_seconds: Histogram::new(LATENCY_BOUNDS),
            damaged_files: 0,
            snapshots_restored: 0,
            files_written: 0,
            bytes_written: 0,
            write_errors: 0,
            evicted_files: 0,
            evicted_bytes: 0,
        }
    }
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            requests_admitted: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
            prefill_tokens: 0,
            generated_tokens: 0,
            evicted_pages: 0,
            evicted_tokens: 0,
            evicted_snapshots: 0,
            time_to_first_token: Histogram::new(LATENCY_BOUNDS),
            time_per_output_token: Histogram::new(TOKEN_BOUNDS),
            queue_time: Histogram::new(LATENCY_BOUNDS),
            disk: DiskMetrics::default(),
            spec_rounds: 0,
            spec_drafted_tokens: 0,
            spec_accepted_tokens: 0,
            spec_head_drafted_tokens: 0,
        }
    }
}

impl EngineMetrics {
    /// Counts a verify pass over `drafted` tokens of which the model accepted `accepted`.
    pub(crate) fn observe_draft(&mut self, drafted: usize, accepted: usize) {
        self.spec_rounds += 1;
        self.spec_drafted_tokens += drafted as u64;
        self.spec_accepted_tokens += accepted as u64;
    }

    /// Counts tokens the multi-token-prediction head drafted for a verify pass.
    pub(crate) fn observe_head_draft(&mut self, drafted: usize) {
        self.spec_head_drafted_tokens += drafted as u64;
    }

    /// Counts an admitted request: its prompt, how much of it the cache held, how long it waited.
    pub(crate) fn observe_admission(&mut self, prompt: usize, cached: usize, queued: Duration) {
        self.requests_admitted += 1;
        self.prompt_tokens += prompt as u64;
        self.cached_tokens += cached as u64;
        self.prefill_tokens += (prompt - cached) as u64;
        self.queue_time.observe(queued);
    }

    /// Counts a reply that ends at `now`, however it ended (a client gone after its first token
    /// counts too): its tokens, the time to its first token and the mean time between tokens.
    pub(crate) fn observe_reply(
        &mut self,
        arrived: Instant,
        first_token: Option<Instant>,
        generated: usize,
        now: Instant,
    ) {
        self.generated_tokens += generated as u64;
        let Some(first) = first_token else { return };
        self.time_to_first_token.observe(first.duration_since(arrived));
        if generated > 1 {
            self.time_per_output_token.observe(now.duration_since(first) / (generated as u32 - 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(100));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        assert_eq!(h.counts, vec![1, 1, 1]);
        assert_eq!(h.count, 3);
        assert!((h.sum - 5.6).abs() < 1e-9);
    }
}
