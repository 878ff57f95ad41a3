//! The responses each API writes, as serde structs, one file per wire format: OpenAI's
//! (`openai.rs`), Anthropic's (`anthropic.rs`), llama.cpp's (`llama.rs`) and the server's own
//! (`radix.rs`: the cache report, `/v1/cache`, the cache page's data). Field order is the
//! order on the wire, an `Option` without `skip_serializing_if` is written as `null`, and one
//! with it is left out, as the clients of each API expect.

pub(crate) mod anthropic;
pub(crate) mod llama;
pub(crate) mod openai;
pub(crate) mod radix;

use serde::Serialize;
use serde_json::Value as Json;

use crate::engine::Timings as EngineTimings;

/// A response as a JSON value, for the paths that add fields or send it as an SSE event.
///
/// Values, not bytes: `f32` fields (the sampling settings) are written as `serde_json::Value`
/// writes them (widened to `f64`), as the server always has, where serializing the struct to
/// text directly would print the shorter `f32` spelling. These structs have only string keys,
/// so the conversion cannot fail; `Null` stands in should one ever not.
pub(crate) fn to_json<T: Serialize>(value: &T) -> Json {
    serde_json::to_value(value).unwrap_or(Json::Null)
}

/// llama.cpp's `timings` object, which llama-server's OpenAI routes carry too, as ours do.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Timings {
    cache_n: usize,
    prompt_n: usize,
    prompt_ms: f64,
    prompt_per_token_ms: f64,
    prompt_per_second: f64,
    predicted_n: usize,
    predicted_ms: f64,
    predicted_per_token_ms: f64,
    predicted_per_second: f64,
    /// Speculative decoding (as llama-server, only when the request drafted): tokens drafted
    /// and of them accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    draft_n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    draft_n_accepted: Option<usize>,
}

impl Timings {
    /// The engine's timings, with the rates llama.cpp derives from them.
    pub(crate) fn new(t: &EngineTimings) -> Self {
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1000.0 / ms } else { 0.0 };
        let per_token = |n: usize, ms: f64| if n > 0 { ms / n as f64 } else { 0.0 };
        Timings {
            cache_n: t.cache_n,
            prompt_n: t.prompt_n,
            prompt_ms: t.prompt_ms,
            prompt_per_token_ms: per_token(t.prompt_n, t.prompt_ms),
            prompt_per_second: rate(t.prompt_n, t.prompt_ms),
            predicted_n: t.predicted_n,
            predicted_ms: t.predicted_ms,
            predicted_per_token_ms: per_token(t.predicted_n, t.predicted_ms),
            predicted_per_second: rate(t.predicted_n, t.predicted_ms),
            draft_n: (t.draft_n > 0).then_some(t.draft_n),
            draft_n_accepted: (t.draft_n > 0).then_some(t.draft_n_accepted),
        }
    }
}
