//! The last requests the engine ran, for the cache page (`GET /v1/cache/requests`, ui.rs): per
//! request its prompt's parts with their cached shares, where reuse stopped and why, time to
//! first token and decode speed, its session and tenant; and totals per 10 seconds over the
//! last hour. Fed by each generation's engine events (Started, Token, Finished, Failed) in
//! `output.rs`, whatever API the request came through.
//!
//! The prompt's parts cost a second encoding of the prompt (the byte offset of every token)
//! and a render without tools, so they are computed only when the page asks: a request keeps
//! what computing them needs (its rendered prompt and messages, within [`KEPT_BYTES`] over all
//! requests) until then. With no page open nothing is computed. A request that asked for its
//! own `cache_report` already has them.
//!
//! Prompt text never leaves here without the admin key: the divergence's text on each side
//! and a preview of the last message are served only to `--admin-api-key` (as `/v1/cache`
//! does with prefix heads). A tenant is shown as a hash with a per-process random key, so
//! that a label cannot be tested against a guessed API key offline.

pub(super) mod branches;
mod timeline;

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use radix_templates::prepare::ControlSpellings;
use serde_json::Value as Json;

use super::cache_report::{CacheContext, Explained};
use super::prompt_structure::message_text;
use super::response::radix::{self as response, RequestEntry};
use super::response::to_json;
use crate::engine::{FinishReason, GenerateRequest, Tenant, Timings};
use timeline::Timeline;

/// Requests remembered.
pub(super) const CAPACITY: usize = 64;
/// Bytes (estimated) of prompts kept for computing their parts later, over all requests; the
/// oldest are dropped first past it.
const KEPT_BYTES: usize = 32 << 20;
/// Characters of the last message shown to the admin key.
const PREVIEW_CHARS: usize = 160;

tokio::task_local! {
    /// The routing key (`x-session-affinity`, `x-smg-routing-key`) of the request being served.
    static SESSION: Option<String>;
}

/// Makes the request's routing key, if any, the session label of the generation it starts
/// (`router_compat.rs` checked it already and answered 400 for a bad one).
pub(super) async fn session_scope(request: Request, next: Next) -> Response {
    let key = super::router_compat::routing_key(request.headers()).ok().flatten();
    SESSION.scope(key, next.run(request)).await
}

/// What a request's prompt parts stand at.
enum Parts {
    /// A raw text prompt: no messages, no parts.
    None,
    /// Not computed yet; what computing them needs.
    Kept(Box<CacheContext>, usize),
    /// Being computed for a page.
    Computing,
    /// `prompt_parts`, as in the cache report.
    Ready(Json),
    /// Not kept (over [`KEPT_BYTES`]) or not computable.
    Dropped,
}

/// One remembered request.
struct Entry {
    id: u64,
    unix_ms: u64,
    status: &'static str,
    session: Option<String>,
    tenant: String,
    chat: bool,
    /// The request's messages include an assistant turn (a conversation's later turn).
    later_turn: Option<bool>,
    messages: Option<usize>,
    /// Admin only: the head of the last message.
    preview: Option<String>,
    prompt_tokens: usize,
    cached_tokens: usize,
    restored_from_disk: usize,
    recomputed_for_snapshot: Option<usize>,
    reason: Option<&'static str>,
    /// The cache report's divergence, text included (shown to the admin key only).
    divergence: Json,
    parts: Parts,
    generated_tokens: usize,
    finish: Option<&'static str>,
    queue_ms: Option<f64>,
    ttft_ms: Option<f64>,
    prefill_ms: Option<f64>,
    decode_tokens_per_second: Option<f64>,
}

struct Inner {
    next_id: u64,
    entries: VecDeque<Entry>,
    timeline: Timeline,
}

/// The remembered requests (newest first) and the timeline.
pub struct RecentRequests {
    inner: Mutex<Inner>,
    tenant_key: RandomState,
}

impl Default for RecentRequests {
    fn default() -> Self {
        RecentRequests {
            inner: Mutex::new(Inner { next_id: 1, entries: VecDeque::new(), timeline: Timeline::default() }),
            tenant_key: RandomState::new(),
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

impl RecentRequests {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("the recent-requests lock is never poisoned")
    }

    fn tenant_label(&self, tenant: Tenant) -> String {
        if tenant == Tenant::default() {
            return "shared".into();
        }
        format!("{:06x}", self.tenant_key.hash_one(tenant) & 0xff_ffff)
    }

    /// Starts remembering a request about to be submitted; `context` is its chat context
    /// (`None` for a raw text prompt).
    pub(crate) fn watch(self: &Arc<Self>, request: &GenerateRequest, context: Option<&CacheContext>) -> Watch {
        let messages = context.map(|c| &c.chat.messages);
        let preview = messages.and_then(|m| m.last()).map(|m| {
            let text = message_text(m);
            match text.char_indices().nth(PREVIEW_CHARS) {
                Some((cut, _)) => format!("{}…", &text[..cut]),
                None => text,
            }
        });
        let entry = Entry {
            id: 0,
            unix_ms: unix_ms(),
            status: "waiting",
            session: SESSION.try_with(Clone::clone).ok().flatten(),
            tenant: self.tenant_label(request.tenant),
            chat: context.is_some(),
            later_turn: messages.map(|m| m.iter().any(|m| m["role"] == "assistant")),
            messages: messages.map(Vec::len),
            preview,
            prompt_tokens: request.prompt.len(),
            cached_tokens: 0,
            restored_from_disk: 0,
            recomputed_for_snapshot: None,
            reason: None,
            divergence: Json::Null,
            parts: Parts::None,
            generated_tokens: 0,
            finish: None,
            queue_ms: None,
            ttft_ms: None,
            prefill_ms: None,
            decode_tokens_per_second: None,
        };
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.entries.push_front(Entry { id, ..entry });
        inner.entries.truncate(CAPACITY);
        Watch { store: Arc::clone(self), id, begun: Instant::now(), first_token: false, ended: false }
    }

    /// Runs `f` on request `id`'s entry, if still remembered.
    fn update(&self, id: u64, f: impl FnOnce(&mut Entry, &mut Timeline)) {
        let mut inner = self.lock();
        let Inner { entries, timeline, .. } = &mut *inner;
        if let Some(entry) = entries.iter_mut().find(|e| e.id == id) {
            f(entry, timeline);
        }
    }

    /// Takes the kept contexts of the newest `limit` requests whose parts are not computed yet,
    /// marking them as being computed.
    pub(super) fn take_pending(self: &Arc<Self>, limit: usize) -> PendingParts {
        let mut inner = self.lock();
        let mut items = Vec::new();
        for entry in inner.entries.iter_mut().take(limit) {
            if matches!(entry.parts, Parts::Kept(..))
                && let Parts::Kept(context, bytes) = std::mem::replace(&mut entry.parts, Parts::Computing)
            {
                items.push((entry.id, context, bytes, entry.cached_tokens));
            }
        }
        PendingParts { store: Arc::clone(self), items, current: None }
    }

    /// Stores computed parts (`None`: they could not be computed).
    pub(super) fn set_parts(&self, id: u64, parts: Option<Json>) {
        self.update(id, |entry, _| entry.parts = parts.map_or(Parts::Dropped, Parts::Ready));
    }

    /// The newest `limit` requests, newest first, as the page reads them; prompt text only
    /// for `admin`.
    pub(super) fn requests(&self, limit: usize, admin: bool) -> Vec<RequestEntry> {
        self.lock().entries.iter().take(limit).map(|e| e.shown(admin)).collect()
    }

    /// The timeline's buckets from the first that saw a request.
    pub(super) fn timeline(&self) -> response::Timeline {
        self.lock().timeline.shown(unix_ms())
    }

    /// Drops kept contexts, oldest first, until they fit [`KEPT_BYTES`].
    fn trim_kept(inner: &mut Inner) {
        let mut total = 0;
        for entry in inner.entries.iter_mut() {
            if let Parts::Kept(_, bytes) = entry.parts {
                total += bytes;
                if total > KEPT_BYTES {
                    entry.parts = Parts::Dropped;
                }
            }
        }
    }
}

impl Entry {
    fn shown(&self, admin: bool) -> RequestEntry {
        let mut divergence = self.divergence.clone();
        if !admin && let Some(d) = divergence.as_object_mut() {
            for text in ["before", "after", "previous_after"] {
                d.remove(text);
            }
        }
        let (parts, parts_status) = match &self.parts {
            Parts::None => (Json::Null, "none"),
            Parts::Kept(..) | Parts::Computing => (Json::Null, "pending"),
            Parts::Ready(parts) => (parts_json(parts), "ready"),
            Parts::Dropped => (Json::Null, "dropped"),
        };
        RequestEntry {
            id: self.id,
            unix_ms: self.unix_ms,
            status: self.status,
            kind: if self.chat { "chat" } else { "text" },
            session: self.session.clone(),
            tenant: self.tenant.clone(),
            turn: self.later_turn.map(|later| if later { "later" } else { "first" }),
            messages: self.messages,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            computed_tokens: self.prompt_tokens - self.cached_tokens.min(self.prompt_tokens),
            restored_from_disk: self.restored_from_disk,
            recomputed_for_snapshot: self.recomputed_for_snapshot,
            reason: self.reason,
            divergence,
            parts,
            parts_status,
            generated_tokens: self.generated_tokens,
            finish: self.finish,
            queue_ms: self.queue_ms,
            ttft_ms: self.ttft_ms,
            prefill_ms: self.prefill_ms,
            decode_tokens_per_second: self.decode_tokens_per_second,
            preview: admin.then(|| self.preview.clone()),
        }
    }
}

/// The cache report's `prompt_parts` without the per-message list (its length can be the
/// conversation's): each part's `tokens`, `cached`, `computed`.
fn parts_json(parts: &Json) -> Json {
    let mut parts = parts.clone();
    if let Some(map) = parts.as_object_mut() {
        map.remove("messages");
    }
    parts
}

/// Prompt parts to compute, taken from the store. Those not computed when it is dropped (a
/// page that left before its turn) go back; one whose computing panicked is dropped.
pub(super) struct PendingParts {
    store: Arc<RecentRequests>,
    items: Vec<(u64, Box<CacheContext>, usize, usize)>,
    current: Option<u64>,
}

impl PendingParts {
    /// Whether there is nothing to compute.
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Computes every request's parts into the store (on a blocking thread: it encodes prompts),
    /// with the tokenizer's control-token spellings (`ApiState::content_controls`), as
    /// `/apply-template` and the cache report do.
    pub(super) fn compute(mut self, controls: Option<&ControlSpellings>) {
        while let Some((id, mut context, _, cached)) = self.items.pop() {
            self.current = Some(id);
            context.controls = controls.cloned();
            let parts = context.prompt_parts(cached);
            self.store.set_parts(id, parts.as_ref().map(to_json));
            self.current = None;
        }
    }
}

impl Drop for PendingParts {
    fn drop(&mut self) {
        let mut inner = self.store.lock();
        for entry in inner.entries.iter_mut() {
            if Some(entry.id) == self.current {
                entry.parts = Parts::Dropped;
            } else if let Some(k) = self.items.iter().position(|item| item.0 == entry.id) {
                let (_, context, bytes, _) = self.items.swap_remove(k);
                entry.parts = Parts::Kept(context, bytes);
            }
        }
    }
}

/// One request being watched; dropping it before the end marks the request aborted (the client
/// left).
pub(crate) struct Watch {
    store: Arc<RecentRequests>,
    id: u64,
    begun: Instant,
    first_token: bool,
    ended: bool,
}

impl Watch {
    /// The engine admitted the request: what the cache held, explained; `context` is its chat
    /// context, kept for computing the prompt's parts if the report does not carry them.
    pub(crate) fn started(&mut self, explained: &Explained, context: Option<CacheContext>) {
        let report = &explained.report;
        let queue_ms = ms(self.begun);
        let mut inner = self.store.lock();
        let Inner { entries, timeline, .. } = &mut *inner;
        let Some(entry) = entries.iter_mut().find(|e| e.id == self.id) else { return };
        entry.status = "running";
        entry.queue_ms = Some(queue_ms);
        entry.prompt_tokens = report.prompt_tokens;
        entry.cached_tokens = report.cached_tokens;
        entry.restored_from_disk = report.restored_from_disk;
        entry.recomputed_for_snapshot = report.recomputed_for_snapshot;
        entry.reason = explained.reason.map(|r| r.as_str());
        entry.divergence = explained.json["divergence"].clone();
        entry.parts = match (explained.json.get("prompt_parts"), context) {
            (Some(parts), _) => Parts::Ready(parts.clone()),
            (None, Some(context)) => {
                let bytes = 2 * context.prompt_text.len() + 12 * context.prompt.len();
                Parts::Kept(Box::new(context), bytes)
            }
            (None, None) if entry.chat => Parts::Dropped,
            (None, None) => Parts::None,
        };
        timeline.started(unix_ms(), report.prompt_tokens, report.cached_tokens);
        RecentRequests::trim_kept(&mut inner);
    }

    /// A token arrived (only the first one is timed).
    pub(crate) fn token(&mut self) {
        if !self.first_token {
            self.first_token = true;
            self.first_output();
        }
    }

    fn first_output(&self) {
        let ttft = ms(self.begun);
        self.store.update(self.id, |entry, timeline| {
            entry.ttft_ms = Some(ttft);
            timeline.first_token(unix_ms(), entry.later_turn, ttft);
        });
    }

    /// Generation ended this way, with these timings.
    pub(crate) fn finished(&mut self, reason: &FinishReason, timings: &Timings) {
        if !self.first_token {
            // Ended without a token sent (a stop token first): that is when output began.
            self.token();
        }
        self.ended = true;
        self.store.update(self.id, |entry, _| {
            entry.status = "finished";
            entry.generated_tokens = timings.predicted_n;
            entry.finish = Some(match reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
                FinishReason::StopString(_) => "stop_string",
            });
            entry.prefill_ms = Some(timings.prompt_ms);
            // llama.cpp's predicted_ms runs from the first token to the last: n - 1 intervals.
            entry.decode_tokens_per_second = (timings.predicted_n >= 2 && timings.predicted_ms > 0.0)
                .then(|| (timings.predicted_n - 1) as f64 * 1000.0 / timings.predicted_ms);
        });
    }

    /// The request failed.
    pub(crate) fn failed(&mut self) {
        self.ended = true;
        self.store.update(self.id, |entry, _| entry.status = "failed");
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.ended {
            self.store.update(self.id, |entry, _| entry.status = "aborted");
        }
    }
}

#[cfg(test)]
mod tests;
