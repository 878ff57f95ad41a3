//! Anthropic's Messages API responses: the message, its content blocks, the named SSE events
//! of a stream, `count_tokens`' answer and the error body. Each object's `type` comes first,
//! as Anthropic writes it.

use serde::Serialize;
use serde_json::Value as Json;

/// `usage`: uncached prompt tokens are `input_tokens`, cached ones `cache_read_input_tokens`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Usage {
    /// Prompt tokens computed.
    pub input_tokens: usize,
    /// Tokens generated.
    pub output_tokens: usize,
    /// Always 0: the cache is filled as a side effect, never billed.
    pub cache_creation_input_tokens: usize,
    /// Prompt tokens from the cache.
    pub cache_read_input_tokens: usize,
}

/// A message (the whole response, or `message_start`'s with no content yet).
#[derive(Debug, Serialize)]
pub(crate) struct Message {
    /// `msg_…`.
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `assistant`.
    pub role: &'static str,
    /// The model's name.
    pub model: String,
    /// The blocks.
    pub content: Vec<ContentBlock>,
    /// Why it ended (`null` while it streams).
    pub stop_reason: Option<&'static str>,
    /// The stop string that ended it.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

/// A content block.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentBlock {
    /// Reasoning.
    Thinking {
        /// The text.
        thinking: String,
        /// Always empty: nothing is signed.
        signature: &'static str,
    },
    /// Reply text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call.
    ToolUse {
        /// `toolu_…`.
        id: String,
        /// The tool.
        name: String,
        /// The model's arguments: whatever JSON object it wrote.
        input: Json,
    },
}

/// What a `content_block_delta` adds.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub(crate) enum BlockDelta {
    /// Reasoning text.
    #[serde(rename = "thinking_delta")]
    Thinking {
        /// The text.
        thinking: String,
    },
    /// Reply text.
    #[serde(rename = "text_delta")]
    Text {
        /// The text.
        text: String,
    },
    /// Tool-call argument text.
    #[serde(rename = "input_json_delta")]
    InputJson {
        /// The text.
        partial_json: String,
    },
}

/// `message_delta`'s `delta`.
#[derive(Debug, Serialize)]
pub(crate) struct MessageDelta {
    /// Why it ended.
    pub stop_reason: &'static str,
    /// The stop string that ended it.
    pub stop_sequence: Option<String>,
}

/// A stream event; its `type` is also the SSE event's name ([`StreamEvent::name`]).
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum StreamEvent {
    /// The message, empty.
    MessageStart {
        /// It.
        message: Message,
    },
    /// Keeps the connection warm.
    Ping,
    /// A block opens.
    ContentBlockStart {
        /// Its place.
        index: usize,
        /// It, empty.
        content_block: ContentBlock,
    },
    /// A block grows.
    ContentBlockDelta {
        /// Its place.
        index: usize,
        /// What it gains.
        delta: BlockDelta,
    },
    /// A block closes.
    ContentBlockStop {
        /// Its place.
        index: usize,
    },
    /// The message ends: final usage and stop reason.
    MessageDelta {
        /// Token counts.
        usage: Usage,
        /// Why.
        delta: MessageDelta,
    },
    /// The stream ends.
    MessageStop,
}

impl StreamEvent {
    /// The SSE event name (`event:`), the same as its `type`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::Ping => "ping",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
        }
    }
}

/// `count_tokens`' answer.
#[derive(Debug, Serialize)]
pub(crate) struct TokenCount {
    /// The prompt's tokens.
    pub input_tokens: usize,
}

/// The error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorDetail,
}

#[derive(Debug, Serialize)]
struct ErrorDetail {
    #[serde(rename = "type")]
    kind: &'static str,
    message: String,
}

impl ErrorBody {
    /// An error of Anthropic's `kind` saying `message`.
    pub(crate) fn new(kind: &'static str, message: String) -> Self {
        ErrorBody { kind: "error", error: ErrorDetail { kind, message } }
    }
}
