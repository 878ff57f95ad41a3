//! Parts of replies several APIs share: ids, `created`, OpenAI's `usage` of a generation, and
//! the text of parse events (the response objects themselves are in `response/`).

use std::time::{SystemTime, UNIX_EPOCH};

use radix_templates::parse::{OutputFormat, ParseEvent, ParserOptions};

use super::output::Generation;
use super::response::openai::Usage;

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

/// OpenAI's `usage` of a finished generation that shows `completion` tokens.
pub(crate) fn usage(generation: &Generation, completion: usize) -> Usage {
    let reasoning = generation.pipeline.reasoning_tokens;
    Usage::new(generation.prompt_tokens, generation.cached_tokens, completion, reasoning)
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
