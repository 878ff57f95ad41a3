//! Totals per [`BUCKET_SECONDS`] over the last hour, for the cache page's charts: requests,
//! prompt tokens served from the cache and computed, and time to first token of conversations'
//! first turns and of their later turns (a request whose messages hold an assistant turn).

use std::collections::VecDeque;

use crate::api::response::radix::{Timeline as Shown, TimelineBucket};

/// Seconds per bucket.
pub(super) const BUCKET_SECONDS: u64 = 10;
/// Buckets kept: one hour.
const BUCKETS: u64 = 360;

/// A sum and a count, for a mean.
#[derive(Debug, Default, Clone, Copy)]
struct Mean {
    sum: f64,
    count: u64,
}

impl Mean {
    fn value(self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

#[derive(Debug, Default, Clone)]
struct Bucket {
    /// Unix seconds where it starts (a multiple of [`BUCKET_SECONDS`]).
    start: u64,
    requests: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft_first: Mean,
    ttft_later: Mean,
}

/// The buckets, oldest first; only those that saw something are stored.
#[derive(Debug, Default)]
pub(super) struct Timeline {
    buckets: VecDeque<Bucket>,
}

impl Timeline {
    /// The bucket of `now_ms` (a clock stepping back lands in the newest one).
    fn bucket(&mut self, now_ms: u64) -> &mut Bucket {
        let mut start = now_ms / 1000 / BUCKET_SECONDS * BUCKET_SECONDS;
        let newest = self.buckets.back().map(|b| b.start);
        if let Some(newest) = newest.filter(|&n| n >= start) {
            start = newest;
        } else {
            self.buckets.push_back(Bucket { start, ..Bucket::default() });
        }
        while self.buckets.front().is_some_and(|b| b.start + BUCKETS * BUCKET_SECONDS <= start) {
            self.buckets.pop_front();
        }
        self.buckets.back_mut().expect("a bucket was just found or added")
    }

    /// A request was admitted with this prompt, of which `cached` tokens came from the cache.
    pub(super) fn started(&mut self, now_ms: u64, prompt: usize, cached: usize) {
        let bucket = self.bucket(now_ms);
        bucket.requests += 1;
        bucket.prompt_tokens += prompt as u64;
        bucket.cached_tokens += cached.min(prompt) as u64;
    }

    /// A request's first token came `ttft_ms` after it was submitted; `later_turn` says whether
    /// its conversation had an assistant turn already (`None`: a raw prompt, counted in neither).
    pub(super) fn first_token(&mut self, now_ms: u64, later_turn: Option<bool>, ttft_ms: f64) {
        let bucket = self.bucket(now_ms);
        let mean = match later_turn {
            Some(true) => &mut bucket.ttft_later,
            Some(false) => &mut bucket.ttft_first,
            None => return,
        };
        mean.sum += ttft_ms;
        mean.count += 1;
    }

    /// Every bucket from the first stored one within the hour to `now_ms`'s, empty ones
    /// included, so that a chart's x axis is time.
    pub(super) fn shown(&self, now_ms: u64) -> Shown {
        let now = now_ms / 1000 / BUCKET_SECONDS * BUCKET_SECONDS;
        let oldest = now.saturating_sub((BUCKETS - 1) * BUCKET_SECONDS);
        let mut stored = self.buckets.iter().filter(|b| b.start >= oldest).peekable();
        let mut out = Vec::new();
        if let Some(first) = stored.peek().map(|b| b.start) {
            let last = now.max(self.buckets.back().map_or(now, |b| b.start));
            let mut start = first;
            while start <= last {
                let bucket = match stored.peek() {
                    Some(b) if b.start == start => stored.next().cloned().unwrap_or_default(),
                    _ => Bucket { start, ..Bucket::default() },
                };
                out.push(TimelineBucket {
                    start_unix: bucket.start,
                    requests: bucket.requests,
                    prompt_tokens: bucket.prompt_tokens,
                    cached_tokens: bucket.cached_tokens,
                    computed_tokens: bucket.prompt_tokens - bucket.cached_tokens,
                    ttft_first_ms: bucket.ttft_first.value(),
                    ttft_first_count: bucket.ttft_first.count,
                    ttft_later_ms: bucket.ttft_later.value(),
                    ttft_later_count: bucket.ttft_later.count,
                });
                start += BUCKET_SECONDS;
            }
        }
        Shown { bucket_seconds: BUCKET_SECONDS, buckets: out }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value as Json;

    use super::*;
    use crate::api::response::to_json;

    impl Timeline {
        fn json(&self, now_ms: u64) -> Json {
            to_json(&self.shown(now_ms))
        }
    }

    #[test]
    fn buckets_sum_their_requests_and_fill_gaps() {
        let mut t = Timeline::default();
        let t0 = 1_000_000_000_000; // ms, on a bucket boundary
        t.started(t0 + 1_000, 100, 40);
        t.first_token(t0 + 2_000, Some(false), 300.0);
        t.started(t0 + 25_000, 120, 100);
        t.first_token(t0 + 25_500, Some(true), 50.0);
        t.started(t0 + 26_000, 120, 500); // cached never counts past the prompt
        t.first_token(t0 + 27_000, Some(true), 70.0);
        t.first_token(t0 + 27_000, None, 1.0);
        let json = t.json(t0 + 31_000);
        let buckets = json["buckets"].as_array().unwrap();
        assert_eq!(buckets.len(), 4, "{json}");
        assert_eq!(buckets[0]["requests"], 1);
        assert_eq!(buckets[0]["computed_tokens"], 60);
        assert_eq!(buckets[0]["ttft_first_ms"], 300.0);
        assert_eq!(buckets[0]["ttft_later_ms"], Json::Null);
        assert_eq!(buckets[1]["requests"], 0, "a gap is an empty bucket");
        assert_eq!(buckets[2]["requests"], 2);
        assert_eq!(buckets[2]["cached_tokens"], 220);
        assert_eq!(buckets[2]["ttft_later_ms"], 60.0);
        assert_eq!(buckets[2]["ttft_later_count"], 2);
        assert_eq!(buckets[3]["start_unix"], (t0 + 30_000) / 1000);
    }

    #[test]
    fn only_the_last_hour_is_kept() {
        let mut t = Timeline::default();
        let t0 = 1_000_000_000_000;
        t.started(t0, 1, 0);
        t.started(t0 + 3_600_000, 2, 0);
        assert_eq!(t.buckets.len(), 1, "the first bucket is an hour old");
        let json = t.json(t0 + 3_600_000);
        assert_eq!(json["buckets"].as_array().unwrap().len(), 1);
        // A clock that steps back counts in the newest bucket.
        t.started(t0 + 10_000, 3, 0);
        assert_eq!(t.buckets.back().unwrap().requests, 2);
        assert!(Timeline::default().json(t0)["buckets"].as_array().unwrap().is_empty());
    }
}
