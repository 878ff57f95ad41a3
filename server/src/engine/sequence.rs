//! A running or waiting request inside the engine.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::cache_key::CacheKey;
use super::radix::NodeId;
use super::request::{EngineEvent, FinishReason, GenerateRequest, Timings};
use super::sampler::Sampler;
use super::stop::StopText;

/// One request's state on the engine thread.
#[derive(Debug)]
pub(crate) struct Sequence {
    /// Prompt followed by the generated tokens.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// Leading tokens whose K/V are in `pages`.
    pub(crate) computed: usize,
    /// Page table: the matched cached prefix's pages first (owned by the tree), then ours.
    pub(crate) pages: Vec<u32>,
    /// The locked tree node of the matched prefix.
    pub(crate) node: Option<NodeId>,
    /// Hybrid models: the state pool slot holding its recurrent state while it runs.
    pub(crate) state_slot: Option<u32>,
    pub(crate) cached_tokens: usize,
    /// How far the KV alone matched the cache (a hybrid model resumes at `cached_tokens`, the
    /// deepest snapshot, which may be earlier).
    pub(crate) kv_matched: usize,
    /// Hybrid models: the snapshot slot to resume from, until it is copied into `state_slot`.
    pub(crate) restore_from: Option<u32>,
    /// Hybrid models: prompt positions still to snapshot, descending (the next one last);
    /// prefill chunks end at each.
    pub(crate) snapshot_points: Vec<usize>,
    /// Hybrid models: the request's expected points and the prompt's all-but-last token, in
    /// whole pages, ascending: snapshots there are filed as expected.
    pub(crate) expected_points: Vec<usize>,
    /// Snapshots taken (tokens, slot) and not yet filed in the tree.
    pub(crate) snapshots: Vec<(usize, u32)>,
    /// With pages of more than one token: the state at the last page boundary decoding crossed,
    /// so that the end of generation (rarely on a boundary) still leaves a snapshot where its
    /// cached KV ends.
    pub(crate) rolling_snapshot: Option<(usize, u32)>,
    pub(crate) sampler: Sampler,
    /// The generated text, with stop strings matched in it.
    pub(crate) text: StopText,
    pub(crate) request: GenerateRequest,
    pub(crate) events: UnboundedSender<EngineEvent>,
    pub(crate) arrived: Instant,
    pub(crate) admitted: Option<Instant>,
    pub(crate) first_token: Option<Instant>,
}

/// How a running sequence ends; every ending goes through the engine's one finish path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// Generation ended and the client hears why.
    Finished(FinishReason),
    /// The client is gone: nobody to tell.
    Abandoned,
    /// The request could not be served.
    Failed(String),
}

impl Sequence {
    /// The prefix cache's key for the first `len` tokens.
    pub(crate) fn cache_key(&self, len: usize) -> CacheKey<'_> {
        CacheKey::new(self.request.cache_namespace, &self.tokens[..len])
    }

    /// A request just arrived, waiting for admission; `text` decodes its output.
    pub(crate) fn new(request: GenerateRequest, events: UnboundedSender<EngineEvent>, text: StopText) -> Self {
        let sampler = Sampler::new(request.sampling.clone(), &request.prompt);
        Sequence {
            tokens: request.prompt.clone(),
            prompt_len: request.prompt.len(),
            computed: 0,
            pages: Vec::new(),
            node: None,
            state_slot: None,
            cached_tokens: 0,
            kv_matched: 0,
            restore_from: None,
            snapshot_points: Vec::new(),
            expected_points: Vec::new(),
            snapshots: Vec::new(),
            rolling_snapshot: None,
            sampler,
            text,
            request,
            events,
            arrived: Instant::now(),
            admitted: None,
            first_token: None,
        }
    }

    /// Whether a snapshot after the first `len` tokens is one a later request is expected to
    /// resume from: an expected point, or past the prompt (the reply's end, where the next turn
    /// goes on when the agent sends the reply back).
    pub(crate) fn expects_resume_at(&self, len: usize) -> bool {
        len >= self.prompt_len || self.expected_points.binary_search(&len).is_ok()
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// The client is gone (its receiver was dropped).
    pub(crate) fn abandoned(&self) -> bool {
        self.events.is_closed()
    }

    /// Timings in llama.cpp's terms, as of `now`.
    pub(crate) fn timings(&self, now: Instant) -> Timings {
        let admitted = self.admitted.unwrap_or(self.arrived);
        let first = self.first_token.unwrap_or(now);
        Timings {
            cache_n: self.cached_tokens,
            prompt_n: self.prompt_len - self.cached_tokens,
            prompt_ms: first.duration_since(admitted).as_secs_f64() * 1e3,
            predicted_n: self.generated(),
            predicted_ms: now.duration_since(first).as_secs_f64() * 1e3,
        }
    }
}
