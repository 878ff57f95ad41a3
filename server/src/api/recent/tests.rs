use serde_json::json;

use super::*;
use crate::engine::{CacheNamespace, CacheReport, MissReason, SamplingParams};

impl RecentRequests {
    fn requests_json(&self, limit: usize, admin: bool) -> Vec<Json> {
        self.requests(limit, admin).iter().map(to_json).collect()
    }

    fn timeline_json(&self) -> Json {
        to_json(&self.timeline())
    }
}

fn request(prompt: usize, tenant: Tenant) -> GenerateRequest {
    GenerateRequest {
        prompt: vec![1; prompt],
        sampling: SamplingParams::default(),
        max_tokens: 8,
        stop_tokens: Vec::new(),
        stop_strings: Vec::new(),
        use_cache: true,
        constraint: None,
        tenant,
        cache_namespace: CacheNamespace::default(),
        snapshot_points: Vec::new(),
        expected_points: Vec::new(),
        branch_points: Vec::new(),
        draft_max: None,
    }
}

fn explained(prompt: usize, cached: usize, json: Json) -> Explained {
    let report = CacheReport {
        prompt_tokens: prompt,
        cached_tokens: cached,
        divergence: Some(cached),
        reason: Some(MissReason::ChangedContent),
        ..CacheReport::default()
    };
    Explained { report: Box::new(report), reason: Some(MissReason::ChangedContent), json, wanted: false }
}

#[test]
fn a_request_is_followed_from_submission_to_its_end() {
    let store = Arc::new(RecentRequests::default());
    let mut watch = store.watch(&request(100, Tenant::default()), None);
    let waiting = store.requests_json(10, false);
    assert_eq!((waiting[0]["status"].as_str(), waiting[0]["prompt_tokens"].as_u64()), (Some("waiting"), Some(100)));
    let divergence = json!({"token": 60, "part": "system", "message_index": 0, "role": "system",
        "before": "secret before", "after": "secret after", "previous_after": "secret then"});
    watch.started(&explained(100, 60, json!({"divergence": divergence})), None);
    watch.token();
    watch.token();
    let timings = Timings {
        cache_n: 60,
        prompt_n: 40,
        prompt_ms: 12.0,
        predicted_n: 5,
        predicted_ms: 40.0,
        draft_n: 0,
        draft_n_accepted: 0,
    };
    watch.finished(&FinishReason::Length, &timings);
    drop(watch);
    let entry = &store.requests_json(10, false)[0];
    assert_eq!(entry["status"], "finished", "the end, not the drop, decides: {entry}");
    assert_eq!((entry["cached_tokens"].as_u64(), entry["computed_tokens"].as_u64()), (Some(60), Some(40)));
    assert_eq!(entry["reason"], "changed_content");
    assert_eq!(entry["finish"], "length");
    assert_eq!(entry["generated_tokens"], 5);
    assert_eq!(entry["decode_tokens_per_second"], 100.0, "4 intervals in 40 ms");
    assert_eq!(entry["prefill_ms"], 12.0);
    assert!(entry["ttft_ms"].as_f64().is_some_and(|t| t >= 0.0));
    assert_eq!((entry["kind"].as_str(), entry["parts_status"].as_str()), (Some("text"), Some("none")));
    assert_eq!(entry["tenant"], "shared");
    // Without the admin key the divergence keeps its place and loses its text.
    assert_eq!(entry["divergence"], json!({"token": 60, "part": "system", "message_index": 0, "role": "system"}));
    assert!(!entry.to_string().contains("secret"), "{entry}");
    assert!(entry.get("preview").is_none());
    let admin = &store.requests_json(10, true)[0];
    assert_eq!(admin["divergence"]["before"], "secret before");
    let timeline = store.timeline_json();
    let total: u64 = timeline["buckets"].as_array().unwrap().iter().map(|b| b["cached_tokens"].as_u64().unwrap()).sum();
    assert_eq!(total, 60);
}

#[test]
fn a_client_that_leaves_is_an_aborted_request_and_failures_say_so() {
    let store = Arc::new(RecentRequests::default());
    drop(store.watch(&request(10, Tenant::default()), None));
    let mut failed = store.watch(&request(10, Tenant::default()), None);
    failed.failed();
    drop(failed);
    let entries = store.requests_json(10, false);
    assert_eq!(entries[0]["status"], "failed");
    assert_eq!(entries[1]["status"], "aborted");
    assert!(entries[0]["id"].as_u64() > entries[1]["id"].as_u64(), "newest first");
}

#[test]
fn only_the_newest_requests_are_kept_and_served() {
    let store = Arc::new(RecentRequests::default());
    for n in 0..CAPACITY + 5 {
        store.watch(&request(n + 1, Tenant::default()), None).failed();
    }
    assert_eq!(store.requests_json(1000, false).len(), CAPACITY);
    let newest = store.requests_json(3, false);
    assert_eq!(newest.len(), 3);
    assert_eq!(newest[0]["prompt_tokens"].as_u64(), Some(CAPACITY as u64 + 5));
}

#[test]
fn tenants_are_labelled_by_a_keyed_hash() {
    let store = RecentRequests::default();
    let a = Tenant::new(Some("key-a"), None);
    assert_eq!(store.tenant_label(a), store.tenant_label(a));
    assert_ne!(store.tenant_label(a), store.tenant_label(Tenant::new(Some("key-b"), None)));
    assert_eq!(store.tenant_label(Tenant::default()), "shared");
    // Another process (another key) labels the same tenant otherwise.
    let other = RecentRequests::default();
    let labels: Vec<String> = (0..4).map(|_| RecentRequests::default().tenant_label(a)).collect();
    assert!(labels.iter().chain([&other.tenant_label(a)]).any(|l| *l != store.tenant_label(a)));
}

#[test]
fn parts_the_report_carries_are_served_without_the_message_list() {
    let store = Arc::new(RecentRequests::default());
    let mut watch = store.watch(&request(10, Tenant::default()), None);
    let parts = json!({"system": {"tokens": 6, "cached": 6, "computed": 0},
        "user": {"tokens": 4, "cached": 0, "computed": 4}, "messages": [{"index": 0}]});
    watch.started(&explained(10, 6, json!({"divergence": null, "prompt_parts": parts})), None);
    let entry = &store.requests_json(1, false)[0];
    assert_eq!(entry["parts_status"], "ready");
    assert_eq!(entry["parts"]["system"]["cached"], 6);
    assert!(entry["parts"].get("messages").is_none());
    assert!(store.take_pending(10).is_empty(), "nothing left to compute");
    store.set_parts(entry["id"].as_u64().unwrap(), None);
    assert_eq!(store.requests_json(1, false)[0]["parts_status"], "dropped");
}
