//! Parts of replies several APIs share: ids, `created`, OpenAI's `usage`, llama.cpp's
//! `timings`, and the text of parse events.

use std::time::{SystemTime, UNIX_EPOCH};

use radix_templates::parse::{OutputFormat, ParseEvent, ParserOptions};
use serde_json::{Value as Json, json};

use super::output::Generation;
use crate::engine::Timings;

/// A suffix that makes ids unique within this process and across restarts.
pub(crate) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("{:x}{n:x}", t)
}

/// Seconds since the epoch, for `created`.
pub(crate) fn created() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// OpenAI's `usage` object of a finished generation that shows `completion` tokens.
pub(crate) fn usage(generation: &Generation, completion: usize) -> Json {
    let prompt = generation.prompt_tokens;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": generation.pipeline.reasoning_tokens}
    })
}

/// llama.cpp's `timings` object.
pub(crate) fn timings_json(t: &Timings) -> Json {
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1000.0 / ms } else { 0.0 };
    let per_token = |n: usize, ms: f64| if n > 0 { ms / n as f64 } else { 0.0 };
    json!({
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": per_token(t.prompt_n, t.prompt_ms),
        "prompt_per_second": rate(t.prompt_n, t.prompt_ms),
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": per_token(t.predicted_n, t.predicted_ms),
        "predicted_per_second": rate(t.predicted_n, t.predicted_ms),
    })
}

/// Raw text out: no reasoning or tool-call parsing.
pub(crate) fn plain_parser() -> ParserOptions {
    ParserOptions {
        format: OutputFormat::Plain,
        starts_in_reasoning: false,
        tool_call_id_prefix: String::new(),
        tools_enabled: false,
        declared_tools: Vec::new(),
    }
}

/// The text of parse events (all content under [`plain_parser`]).
pub(crate) fn text_of(events: &[ParseEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ParseEvent::Content(t) | ParseEvent::Reasoning(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}
