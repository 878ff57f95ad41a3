//! The responses each API writes, as serde structs, one file per wire format: OpenAI's
//! (`openai.rs`), Anthropic's (`anthropic.rs`) and llama.cpp's (`llama.rs`). Field order is the
//! order on the wire, an `Option` without `skip_serializing_if` is written as `null`, and one
//! with it is left out, as the clients of each API expect.

pub(crate) mod llama;
pub(crate) mod openai;

use serde::Serialize;
use serde_json::Value as Json;

/// A response as a JSON value, for the paths that add fields or send it as an SSE event.
///
/// Values, not bytes: `f32` fields (the sampling settings) are written as `serde_json::Value`
/// writes them (widened to `f64`), as the server always has, where serializing the struct to
/// text directly would print the shorter `f32` spelling. These structs have only string keys,
/// so the conversion cannot fail; `Null` stands in should one ever not.
pub(crate) fn to_json<T: Serialize>(value: &T) -> Json {
    serde_json::to_value(value).unwrap_or(Json::Null)
}
