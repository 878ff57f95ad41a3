//! The server's own responses, beside the APIs it copies: the cache report (`cache_report` on
//! chat responses), the prompt's parts (in the report and on `/apply-template`), `/v1/cache`,
//! and `/v1/cache/requests`, which the cache page polls (requests, timeline, branches).

use serde::Serialize;
use serde_json::Value as Json;

/// `cache_report`: how much of the prompt was cached, and where and why reuse stopped.
#[derive(Debug, Serialize)]
pub(crate) struct CacheReport {
    /// The prompt's tokens.
    pub prompt_tokens: usize,
    /// Those that came from the cache.
    pub cached_tokens: usize,
    /// Why reuse stopped (`MissReason::as_str`), where it stopped early.
    pub reason: Option<&'static str>,
    /// Where it stopped.
    pub divergence: Option<Divergence>,
    /// The previous version of the conversation it was compared with.
    pub previous: Option<PreviousVersion>,
    /// Cached tokens read back from the disk tier, where any were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_from_disk: Option<usize>,
    /// Cached tokens recomputed from the nearest snapshot (hybrid models), where any were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recomputed_for_snapshot: Option<usize>,
    /// Where the prompt's tokens go, where the client asked for the report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_parts: Option<PromptParts>,
}

/// Where reuse stopped: placed in the conversation for a chat prompt, a token for raw text.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Divergence {
    /// In a chat prompt.
    Placed {
        /// The first token not reused.
        token: usize,
        /// `tools`, `system`, `message` or `generation_prompt`.
        part: &'static str,
        /// The message it is in.
        message_index: Option<usize>,
        /// That message's role.
        role: Option<String>,
        /// The prompt's text before it.
        before: String,
        /// The prompt's text from it on.
        after: String,
        /// The previous version's text from it on.
        previous_after: Option<String>,
    },
    /// In a raw-text prompt.
    At {
        /// The first token not reused.
        token: usize,
    },
}

/// The previous version of a conversation, as the report compares with it.
#[derive(Debug, Serialize)]
pub(crate) struct PreviousVersion {
    /// Tokens it shares with this prompt from the start.
    pub common_prefix_tokens: usize,
    /// Its prompt's tokens.
    pub prompt_tokens: usize,
    /// Its prompt's and reply's tokens.
    pub total_tokens: usize,
}

/// `prompt_parts`: the prompt's tokens per part and per message.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PromptParts {
    /// Leading system (and developer) messages.
    pub system: PartCount,
    /// The tool schemas.
    pub tools: PartCount,
    /// User messages (and system messages after the first other one).
    pub user: PartCount,
    /// Assistant messages, but for the two below.
    pub assistant: PartCount,
    /// Their reasoning.
    pub reasoning: PartCount,
    /// Their tool calls' arguments.
    pub tool_call_arguments: PartCount,
    /// Tool results.
    pub tool: PartCount,
    /// What follows the last message.
    pub generation_prompt: PartCount,
    /// Each message's tokens; left out where the list would be long (the cache page's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<MessageCount>>,
}

/// Tokens of a part, and of them cached and computed where that is known.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct PartCount {
    /// Tokens.
    pub tokens: usize,
    /// From the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached: Option<usize>,
    /// Computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub computed: Option<usize>,
}

impl PartCount {
    /// `tokens`, of which `cached` from the cache where that is known.
    pub(crate) fn new(tokens: usize, cached: Option<usize>) -> Self {
        PartCount { tokens, cached, computed: cached.map(|c| tokens - c) }
    }
}

/// One message's tokens.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MessageCount {
    /// Its tokens.
    #[serde(flatten)]
    pub count: PartCount,
    /// Its index in the request.
    pub index: usize,
    /// Its role, as the request wrote it (any JSON: it is echoed, not checked).
    pub role: Json,
    /// Its bytes in the prompt, header included, where it was found.
    pub bytes: Option<[usize; 2]>,
}

/// `GET /v1/cache`.
#[derive(Debug, Serialize)]
pub(crate) struct CacheState {
    /// Tokens per page.
    pub page_size: usize,
    /// KV pages in all.
    pub pages_total: usize,
    /// Pages the prefix cache holds.
    pub pages_cached: usize,
    /// Tokens it holds.
    pub tokens_cached: usize,
    /// Cached over prompt tokens, since start.
    pub hit_ratio: f64,
    /// Prompt tokens since start.
    pub prompt_tokens: u64,
    /// Of them cached.
    pub cached_tokens: u64,
    /// Pages evicted.
    pub evicted_pages: u64,
    /// Tokens evicted.
    pub evicted_tokens: u64,
    /// Recurrent-state snapshots kept.
    pub snapshots: usize,
    /// Their bytes.
    pub snapshot_bytes: usize,
    /// Snapshot slots in all.
    pub snapshot_slots: usize,
    /// Snapshots evicted.
    pub evicted_snapshots: u64,
    /// The disk tier.
    pub disk: DiskState,
    /// The most reused recent prefixes.
    pub top_prefixes: Vec<TopPrefix>,
}

/// `/v1/cache`'s `disk`: each field is the count of that name in the engine's `DiskStats` or
/// `DiskMetrics` (`written_bytes` is `bytes_written`), but the mean of `read_seconds`.
#[derive(Debug, Serialize)]
pub(crate) struct DiskState {
    pub enabled: bool,
    pub bytes: u64,
    pub budget_bytes: u64,
    pub files: usize,
    pub tokens: usize,
    pub pending_writes: usize,
    pub restores: u64,
    pub restored_tokens: u64,
    pub files_read: u64,
    pub pages_read: u64,
    pub read_seconds_mean: f64,
    pub damaged_files: u64,
    pub files_written: u64,
    pub written_bytes: u64,
    pub write_errors: u64,
    pub evicted_files: u64,
    pub evicted_bytes: u64,
    pub snapshots: usize,
    pub snapshots_restored: u64,
}

/// A recent prefix in `/v1/cache`.
#[derive(Debug, Serialize)]
pub(crate) struct TopPrefix {
    /// Its tokens.
    pub tokens: usize,
    /// How often later prompts reused it.
    pub uses: u64,
    /// Its first tokens as text, for an admin key only (other clients' prompts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
}

/// `GET /v1/cache/requests`.
#[derive(Debug, Serialize)]
pub(crate) struct CachePage {
    /// The key is an admin key: texts are shown.
    pub admin: bool,
    /// The model's name.
    pub model: String,
    /// A hybrid model (snapshots matter).
    pub hybrid: bool,
    /// The last requests, newest first.
    pub requests: Vec<RequestEntry>,
    /// Totals per time bucket.
    pub timeline: Timeline,
    /// Recent sequences in the tree.
    pub sequences: usize,
    /// Their shared prefixes.
    pub branches: Vec<Branch>,
}

/// One recent request on the cache page: the fields of `recent.rs`'s `Entry`, with `kind`,
/// `turn` and `computed_tokens` derived from them.
#[derive(Debug, Serialize)]
pub(crate) struct RequestEntry {
    pub id: u64,
    pub unix_ms: u64,
    pub status: &'static str,
    pub kind: &'static str,
    pub session: Option<String>,
    pub tenant: String,
    pub turn: Option<&'static str>,
    pub messages: Option<usize>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub computed_tokens: usize,
    pub restored_from_disk: usize,
    pub recomputed_for_snapshot: Option<usize>,
    pub reason: Option<&'static str>,
    /// The cache report's `divergence`, as it was written (its texts taken out but for an
    /// admin key).
    pub divergence: Json,
    /// The report's `prompt_parts` as it carried them, without the per-message list (`null`
    /// until they are known).
    pub parts: Json,
    pub parts_status: &'static str,
    pub generated_tokens: usize,
    pub finish: Option<&'static str>,
    pub queue_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub prefill_ms: Option<f64>,
    pub decode_tokens_per_second: Option<f64>,
    /// The prompt's start, for an admin key only (`null` where there is none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview: Option<Option<String>>,
}

/// The timeline: totals per bucket of time.
#[derive(Debug, Serialize)]
pub(crate) struct Timeline {
    /// Each bucket's span.
    pub bucket_seconds: u64,
    /// From the first that saw a request to now, oldest first.
    pub buckets: Vec<TimelineBucket>,
}

/// One bucket of the timeline: `recent/timeline.rs`'s `Bucket`, its means in milliseconds
/// (`null` where it has none).
#[derive(Debug, Serialize)]
pub(crate) struct TimelineBucket {
    pub start_unix: u64,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub computed_tokens: u64,
    pub ttft_first_ms: Option<f64>,
    pub ttft_first_count: u64,
    pub ttft_later_ms: Option<f64>,
    pub ttft_later_count: u64,
}

/// A branch of the recent sequences' prefix tree.
#[derive(Debug, Serialize)]
pub(crate) struct Branch {
    /// Tokens before it.
    pub start: usize,
    /// Its length.
    pub tokens: usize,
    /// `start + tokens`.
    pub end: usize,
    /// Sequences through it.
    pub sequences: usize,
    /// Their reuse count.
    pub uses: u64,
    /// Where they part ways after it (cut at a depth and a width).
    pub children: Vec<Branch>,
    /// Children not shown.
    pub more_children: usize,
    /// Its first tokens as text, for an admin key only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
}
