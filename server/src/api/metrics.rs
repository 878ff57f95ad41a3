//! `GET /metrics` (Prometheus text format) and `GET /v1/cache` (the prefix cache report).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::ApiState;
use super::response::radix::{CacheState, DiskState, TopPrefix};
use super::response::to_json;
use crate::engine::Histogram;

/// Prompts shown in `/v1/cache`'s `top_prefixes`.
const TOP_PREFIXES: usize = 10;
/// Tokens of each shown prompt's head.
const HEAD_TOKENS: usize = 24;

/// HTTP requests answered, by route and status.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
}

impl HttpMetrics {
    fn count(&self, endpoint: &str, status: u16) {
        let mut requests = self.requests.lock().expect("metrics lock is never poisoned");
        *requests.entry((endpoint.to_owned(), status)).or_default() += 1;
    }
}

/// Counts every answered request by its route pattern (never the raw path, which a client could
/// vary without end) and status.
pub(super) async fn count_requests(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let endpoint = request.extensions().get::<MatchedPath>().map_or("other", |p| p.as_str()).to_owned();
    let response = next.run(request).await;
    state.http_metrics.count(&endpoint, response.status().as_u16());
    response
}

/// The routes of this module.
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new().route("/metrics", get(metrics)).route("/v1/cache", get(cache))
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, count) in h.bounds.iter().zip(&h.counts) {
        cumulative += count;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
}

fn scalar(out: &mut String, kind: &str, name: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

fn hit_ratio(cached: u64, prompt: u64) -> f64 {
    if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 }
}

async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    let m = state.engine.metrics();
    let s = state.engine.stats();
    let mut out = String::new();
    let name = "radix_serve_http_requests_total";
    let _ = writeln!(out, "# HELP {name} HTTP requests answered, by route and status.\n# TYPE {name} counter");
    for ((endpoint, status), n) in state.http_metrics.requests.lock().expect("metrics lock is never poisoned").iter() {
        let endpoint = endpoint.replace('\\', "\\\\").replace('"', "\\\"");
        let _ = writeln!(out, "{name}{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}");
    }
    let counters = [
        ("radix_serve_requests_admitted_total", "Requests admitted by the engine.", m.requests_admitted),
        ("radix_serve_prompt_tokens_total", "Prompt tokens of admitted requests.", m.prompt_tokens),
        ("radix_serve_cached_tokens_total", "Prompt tokens found in the prefix cache.", m.cached_tokens),
        ("radix_serve_prefill_tokens_total", "Prompt tokens computed (not found in the cache).", m.prefill_tokens),
        ("radix_serve_generated_tokens_total", "Tokens generated.", m.generated_tokens),
        ("radix_serve_spec_rounds_total", "Speculative decoding: verify passes over drafted tokens.", m.spec_rounds),
        ("radix_serve_spec_drafted_tokens_total", "Speculative decoding: tokens drafted.", m.spec_drafted_tokens),
        (
            "radix_serve_spec_accepted_tokens_total",
            "Speculative decoding: drafted tokens the model accepted.",
            m.spec_accepted_tokens,
        ),
        (
            "radix_serve_spec_head_drafted_tokens_total",
            "Speculative decoding: tokens of those drafted by the model's multi-token-prediction head.",
            m.spec_head_drafted_tokens,
        ),
        ("radix_serve_cache_evicted_pages_total", "KV pages evicted from the prefix cache.", m.evicted_pages),
        ("radix_serve_cache_evicted_tokens_total", "Tokens of the KV pages evicted.", m.evicted_tokens),
        ("radix_serve_cache_evicted_snapshots_total", "Recurrent-state snapshots evicted.", m.evicted_snapshots),
        ("radix_serve_disk_restores_total", "Requests whose prompt was partly read back from disk.", m.disk.restores),
        ("radix_serve_disk_restored_tokens_total", "Prompt tokens read back from disk.", m.disk.restored_tokens),
        ("radix_serve_disk_files_read_total", "Page and snapshot files read from disk.", m.disk.files_read),
        (
            "radix_serve_disk_snapshots_restored_total",
            "Requests of a hybrid model resumed from a recurrent-state snapshot read back from disk.",
            m.disk.snapshots_restored,
        ),
        ("radix_serve_disk_pages_read_total", "KV pages read back from the disk tier.", m.disk.pages_read),
        (
            "radix_serve_disk_damaged_files_total",
            "Page or snapshot files found damaged or missing (recomputed).",
            m.disk.damaged_files,
        ),
        ("radix_serve_disk_files_written_total", "Page and snapshot files written.", m.disk.files_written),
        ("radix_serve_disk_written_bytes_total", "Bytes of page and snapshot files written.", m.disk.bytes_written),
        ("radix_serve_disk_write_errors_total", "Page or snapshot file writes that failed.", m.disk.write_errors),
        (
            "radix_serve_disk_evicted_files_total",
            "Page and snapshot files removed (budget, damage).",
            m.disk.evicted_files,
        ),
        ("radix_serve_disk_evicted_bytes_total", "Bytes of page and snapshot files removed.", m.disk.evicted_bytes),
    ];
    for (name, help, value) in counters {
        scalar(&mut out, "counter", name, help, value);
    }
    let ratio = hit_ratio(m.cached_tokens, m.prompt_tokens);
    scalar(&mut out, "gauge", "radix_serve_cache_hit_ratio", "Cached over prompt tokens since start.", ratio);
    let gauges = [
        ("radix_serve_kv_pages_total", "KV pages in the pool.", s.pages_total),
        ("radix_serve_kv_pages_used", "KV pages not free (running sequences and cache).", s.pages_total - s.pages_free),
        ("radix_serve_kv_pages_free", "Free KV pages.", s.pages_free),
        ("radix_serve_kv_pages_cached", "KV pages held by the prefix cache.", s.pages_cached),
        ("radix_serve_kv_page_size_tokens", "Tokens per KV page.", s.page_size),
        ("radix_serve_sequences_running", "Sequences running.", s.running),
        ("radix_serve_sequences_waiting", "Requests waiting for admission.", state.engine.queued()),
        ("radix_serve_cache_snapshots", "Recurrent-state snapshots in the prefix cache.", s.snapshots),
        ("radix_serve_cache_snapshot_bytes", "Bytes of those snapshots.", s.snapshots * s.snapshot_bytes),
        ("radix_serve_cache_snapshot_slots", "Snapshot slots of the --state-cache budget.", s.snapshot_slots),
        ("radix_serve_state_slots_free", "Running-sequence state slots free.", s.state_slots_free),
        ("radix_serve_disk_files", "Page files of the disk tier.", s.disk.files),
        ("radix_serve_disk_tokens", "Tokens whose KV pages are on disk.", s.disk.tokens),
        ("radix_serve_disk_pending_writes", "Files queued and not yet written.", s.disk.pending_writes),
        ("radix_serve_disk_snapshots", "Recurrent-state snapshot files of the disk tier.", s.disk.snapshots),
    ];
    for (name, help, value) in gauges {
        scalar(&mut out, "gauge", name, help, value);
    }
    scalar(
        &mut out,
        "gauge",
        "radix_serve_sequences_max",
        "Sequences that may run at once (--parallel).",
        state.total_slots,
    );
    // For schedulers that weigh KV pressure (an inference-extension gateway's kv-cache scorer):
    // the prefix cache fills the pool over time and gives pages back on demand, so the pressure is
    // the pages running sequences hold beyond it.
    let held = s.pages_total.saturating_sub(s.pages_free).saturating_sub(s.pages_cached);
    let usage = if s.pages_total == 0 { 0.0 } else { held as f64 / s.pages_total as f64 };
    let help = "Fraction of KV pages neither free nor in the prefix cache (held by running sequences).";
    scalar(&mut out, "gauge", "radix_serve_kv_usage_ratio", help, usage);
    scalar(&mut out, "gauge", "radix_serve_disk_bytes", "Bytes of page and snapshot files on disk.", s.disk.bytes);
    scalar(
        &mut out,
        "gauge",
        "radix_serve_disk_budget_bytes",
        "The --cache-disk budget in bytes.",
        s.disk.budget_bytes,
    );
    let ttft = "Seconds from submission to the first token.";
    histogram(&mut out, "radix_serve_time_to_first_token_seconds", ttft, &m.time_to_first_token);
    let tpot = "Mean seconds between output tokens, per request.";
    histogram(&mut out, "radix_serve_time_per_output_token_seconds", tpot, &m.time_per_output_token);
    let queue = "Seconds from submission to admission.";
    histogram(&mut out, "radix_serve_queue_time_seconds", queue, &m.queue_time);
    let read = "Seconds each restore from disk took (files read into the KV pool).";
    histogram(&mut out, "radix_serve_disk_read_seconds", read, &m.disk.read_seconds);
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], out).into_response()
}

/// The disk tier's part of `/v1/cache`.
fn disk_state(s: &crate::engine::DiskStats, m: &crate::engine::DiskMetrics) -> DiskState {
    let h = &m.read_seconds;
    DiskState {
        enabled: s.enabled,
        bytes: s.bytes,
        budget_bytes: s.budget_bytes,
        files: s.files,
        tokens: s.tokens,
        pending_writes: s.pending_writes,
        restores: m.restores,
        restored_tokens: m.restored_tokens,
        files_read: m.files_read,
        pages_read: m.pages_read,
        read_seconds_mean: if h.count == 0 { 0.0 } else { h.sum / h.count as f64 },
        damaged_files: m.damaged_files,
        files_written: m.files_written,
        written_bytes: m.bytes_written,
        write_errors: m.write_errors,
        evicted_files: m.evicted_files,
        evicted_bytes: m.evicted_bytes,
        snapshots: s.snapshots,
        snapshots_restored: m.snapshots_restored,
    }
}

/// The cache's state; the text of the top prefixes only for an admin key (`--admin-api-key`),
/// since it is other clients' prompts.
async fn cache(State(state): State<Arc<ApiState>>, headers: axum::http::HeaderMap) -> Response {
    let admin = state.admin_keys.enabled() && state.admin_keys.accepts(&headers);
    let m = state.engine.metrics();
    let s = state.engine.stats();
    let prefixes = state.engine.recent_prefixes().await.unwrap_or_default();
    let top: Vec<_> = prefixes
        .iter()
        .take(TOP_PREFIXES)
        .map(|p| TopPrefix {
            tokens: p.tokens.len(),
            uses: p.uses,
            head: admin.then(|| {
                let head = &p.tokens[..p.tokens.len().min(HEAD_TOKENS)];
                state.tokenizer.decode(head, false).unwrap_or_default()
            }),
        })
        .collect();
    let body = CacheState {
        page_size: s.page_size,
        pages_total: s.pages_total,
        pages_cached: s.pages_cached,
        tokens_cached: s.pages_cached * s.page_size,
        hit_ratio: hit_ratio(m.cached_tokens, m.prompt_tokens),
        prompt_tokens: m.prompt_tokens,
        cached_tokens: m.cached_tokens,
        evicted_pages: m.evicted_pages,
        evicted_tokens: m.evicted_tokens,
        snapshots: s.snapshots,
        snapshot_bytes: s.snapshots * s.snapshot_bytes,
        snapshot_slots: s.snapshot_slots,
        evicted_snapshots: m.evicted_snapshots,
        disk: disk_state(&s.disk, &m.disk),
        top_prefixes: top,
    };
    axum::Json(to_json(&body)).into_response()
}
