//! The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A Messages body is read into typed structs (request/anthropic.rs), converted into the chat
//! body (anthropic_convert.rs) and prepared by chat.rs into the same generation spec, so both
//! APIs render the same prompt and share the radix cache. Only the reply's
//! shape is Anthropic's: content blocks (thinking, text, tool_use), `stop_reason`, usage split
//! into uncached `input_tokens` and `cache_read_input_tokens`, named SSE events when streaming.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use radix_templates::parse::{ParseEvent, ParsedMessage};
use serde_json::{Map, Value as Json};

use super::anthropic_convert::to_chat_body;
use super::chat::{PreparedChat, prepare};
use super::driver::{Done, Progress, WireEvent, WireFormat, respond};
use super::output::{Ending, Generation, Piece};
use super::preparation::off_workers;
use super::reply::unique_suffix;
use super::request::parse_body;
use super::response::anthropic::{BlockDelta, ContentBlock, Message, MessageDelta, StreamEvent, TokenCount, Usage};
use super::response::to_json;
use super::{ApiError, ApiState};
use crate::engine::Timings;

/// The routes of this module that queue generation on the engine.
pub(super) fn generation_routes() -> Router<Arc<ApiState>> {
    Router::new().route("/v1/messages", post(messages))
}

/// The routes of this module around generation.
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new().route("/v1/messages/count_tokens", post(count_tokens))
}

/// Answers every error of the Anthropic routes (the handlers', the guards', axum's) in
/// Anthropic's shape, whose clients parse only that: the error rides on the response.
pub(super) async fn error_shape(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let response = next.run(request).await;
    match response.extensions().get::<ApiError>() {
        Some(error) => error.clone().into_anthropic_response(),
        None => response,
    }
}

/// Parses, converts and prepares a Messages body.
fn read(state: &ApiState, body: &[u8], generation: bool, key: Option<&str>) -> Result<PreparedChat, ApiError> {
    let chat = to_chat_body(&parse_body(body)?, generation, state.keep_billing_header)?;
    let mut prepared = prepare(state, chat, key)?;
    prepared.spec.parser.tool_call_id_prefix = format!("toolu_{}_", unique_suffix());
    Ok(prepared)
}

async fn count_tokens(State(state): State<Arc<ApiState>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = state.api_keys.presented(&headers);
    match off_workers(&state, move |state| read(state, &body, false, key.as_deref())).await {
        Ok(prepared) => {
            axum::Json(to_json(&TokenCount { input_tokens: prepared.spec.request.prompt.len() })).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn messages(State(state): State<Arc<ApiState>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = state.api_keys.presented(&headers);
    match off_workers(&state, move |state| read(state, &body, true, key.as_deref())).await {
        Ok(prepared) => {
            let wire = AnthropicWire { model: state.model_name.clone(), blocks: Blocks::default(), started: false };
            respond(&state, prepared.spec, wire, prepared.stream).await
        }
        Err(e) => e.into_response(),
    }
}

/// `stop_reason` and `stop_sequence`. Anthropic's order: a reply cut by the token limit says
/// `max_tokens` even inside a tool call (its input may be incomplete), unlike OpenAI's `tool_calls`.
fn stop_reason(ending: &Ending, tool_calls: bool) -> (&'static str, Option<String>) {
    match ending {
        Ending::Word(word) => ("stop_sequence", Some(word.clone())),
        Ending::Length => ("max_tokens", None),
        Ending::Eos if tool_calls => ("tool_use", None),
        Ending::Eos => ("end_turn", None),
    }
}

/// Uncached prompt tokens are `input_tokens`; cached ones `cache_read_input_tokens`.
fn usage(generation: &Generation) -> Usage {
    Usage {
        input_tokens: generation.prompt_tokens - generation.cached_tokens.min(generation.prompt_tokens),
        output_tokens: generation.tokens.len(),
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: generation.cached_tokens,
    }
}

fn message_id() -> String {
    format!("msg_{}", unique_suffix())
}

/// A tool call's input object (`{}` when the model's argument text is not a JSON object).
fn tool_input(arguments: &str) -> Json {
    serde_json::from_str::<Json>(arguments).ok().filter(Json::is_object).unwrap_or_else(|| Json::Object(Map::new()))
}

/// The kind of the content block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    Tool(usize),
}

/// Turns parse events into content-block events: a block opens on its first event and closes
/// when another kind begins.
#[derive(Default)]
struct Blocks {
    index: usize,
    open: Option<Block>,
}

impl Blocks {
    fn push(&mut self, event: &ParseEvent) -> Vec<StreamEvent> {
        let (block, start, delta) = match event {
            ParseEvent::Reasoning(text) => (
                Block::Thinking,
                Some(ContentBlock::Thinking { thinking: String::new(), signature: "" }),
                Some(BlockDelta::Thinking { thinking: text.clone() }),
            ),
            ParseEvent::Content(text) => (
                Block::Text,
                Some(ContentBlock::Text { text: String::new() }),
                Some(BlockDelta::Text { text: text.clone() }),
            ),
            ParseEvent::ToolCallStart { index, id, name } => {
                let input = Json::Object(Map::new());
                (Block::Tool(*index), Some(ContentBlock::ToolUse { id: id.clone(), name: name.clone(), input }), None)
            }
            ParseEvent::ToolCallArguments { index, delta } => {
                (Block::Tool(*index), None, Some(BlockDelta::InputJson { partial_json: delta.clone() }))
            }
        };
        let mut out = Vec::new();
        let starts_call = matches!(event, ParseEvent::ToolCallStart { .. });
        if self.open != Some(block) || starts_call {
            // Arguments of a call whose start was never seen have no block to go to.
            let Some(start) = start else { return out };
            out.extend(self.close());
            self.open = Some(block);
            out.push(StreamEvent::ContentBlockStart { index: self.index, content_block: start });
        }
        if let Some(delta) = delta {
            out.push(StreamEvent::ContentBlockDelta { index: self.index, delta });
        }
        out
    }

    fn close(&mut self) -> Option<StreamEvent> {
        self.open.take()?;
        let stop = StreamEvent::ContentBlockStop { index: self.index };
        self.index += 1;
        Some(stop)
    }
}

/// A stream event as the driver sends it.
fn named(event: StreamEvent) -> WireEvent {
    WireEvent::Named(event.name(), to_json(&event))
}

/// Anthropic's wire format: content blocks (thinking, text, tool_use) and named events.
struct AnthropicWire {
    model: String,
    blocks: Blocks,
    /// `message_start` was sent.
    started: bool,
}

impl WireFormat for AnthropicWire {
    fn on_piece(&mut self, piece: &Piece, at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let mut out = Vec::new();
        // message_start waits for the first piece, so its usage knows the cached prefix.
        if !self.started {
            self.started = true;
            let message = Message {
                id: message_id(),
                kind: "message",
                role: "assistant",
                model: self.model.clone(),
                content: Vec::new(),
                stop_reason: None,
                stop_sequence: None,
                usage: Usage { output_tokens: 0, ..usage(at.generation) },
            };
            out.push(named(StreamEvent::MessageStart { message }));
            out.push(named(StreamEvent::Ping));
        }
        out.extend(piece.events.iter().flat_map(|e| self.blocks.push(e)).map(named));
        Ok(out)
    }

    fn finish(&mut self, (ending, _): &(Ending, Timings), at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let generation = at.generation;
        let mut out: Vec<WireEvent> = self.blocks.close().into_iter().map(named).collect();
        let (stop_reason, stop_sequence) = stop_reason(ending, generation.pipeline.tool_calls);
        let delta = MessageDelta { stop_reason, stop_sequence };
        out.push(named(StreamEvent::MessageDelta { usage: usage(generation), delta }));
        out.push(named(StreamEvent::MessageStop));
        Ok(out)
    }

    fn error_event(&self, error: &ApiError) -> WireEvent {
        WireEvent::Named("error", error.anthropic_body())
    }

    fn complete(self, Done { generation, events, ending, .. }: Done) -> Result<Response, ApiError> {
        let (stop_reason, stop_sequence) = stop_reason(&ending, generation.pipeline.tool_calls);
        let message = ParsedMessage::from_events(events);
        let mut content = Vec::new();
        if let Some(thinking) = message.reasoning_content {
            content.push(ContentBlock::Thinking { thinking, signature: "" });
        }
        if !message.content.is_empty() {
            content.push(ContentBlock::Text { text: message.content });
        }
        for call in message.tool_calls {
            let input = tool_input(&call.arguments);
            content.push(ContentBlock::ToolUse { id: call.id, name: call.name, input });
        }
        let body = Message {
            id: message_id(),
            kind: "message",
            role: "assistant",
            model: self.model,
            content,
            stop_reason: Some(stop_reason),
            stop_sequence,
            usage: usage(generation),
        };
        Ok(axum::Json(to_json(&body)).into_response())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parse_events_become_content_blocks() {
        let events = [
            ParseEvent::Reasoning("Let me ".into()),
            ParseEvent::Reasoning("look.".into()),
            ParseEvent::Content("Reading.".into()),
            ParseEvent::ToolCallStart { index: 0, id: "toolu_x_0".into(), name: "read".into() },
            ParseEvent::ToolCallArguments { index: 0, delta: "{\"path\": ".into() },
            ParseEvent::ToolCallArguments { index: 0, delta: "\"a\"}".into() },
            ParseEvent::ToolCallStart { index: 1, id: "toolu_x_1".into(), name: "list".into() },
            ParseEvent::ToolCallArguments { index: 7, delta: "lost".into() },
        ];
        let mut blocks = Blocks::default();
        let mut out: Vec<StreamEvent> = events.iter().flat_map(|e| blocks.push(e)).collect();
        out.extend(blocks.close());
        assert!(blocks.close().is_none(), "closing twice emits nothing");
        let out: Vec<(&str, Json)> = out.iter().map(|e| (e.name(), to_json(e))).collect();
        let summary: Vec<String> = out
            .iter()
            .map(|(name, data)| {
                let detail = match *name {
                    "content_block_start" => data["content_block"]["type"].as_str().unwrap().to_owned(),
                    "content_block_delta" => data["delta"].to_string(),
                    _ => String::new(),
                };
                format!("{name} {} {detail}", data["index"])
            })
            .collect();
        assert_eq!(
            summary,
            [
                "content_block_start 0 thinking",
                r#"content_block_delta 0 {"type":"thinking_delta","thinking":"Let me "}"#,
                r#"content_block_delta 0 {"type":"thinking_delta","thinking":"look."}"#,
                "content_block_stop 0 ",
                "content_block_start 1 text",
                r#"content_block_delta 1 {"type":"text_delta","text":"Reading."}"#,
                "content_block_stop 1 ",
                "content_block_start 2 tool_use",
                r#"content_block_delta 2 {"type":"input_json_delta","partial_json":"{\"path\": "}"#,
                r#"content_block_delta 2 {"type":"input_json_delta","partial_json":"\"a\"}"}"#,
                "content_block_stop 2 ",
                "content_block_start 3 tool_use",
                "content_block_stop 3 ",
            ]
        );
        assert_eq!(
            out[7].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_x_0", "name": "read", "input": {}})
        );
    }

    #[test]
    fn tool_input_is_always_an_object() {
        assert_eq!(tool_input("{\"a\": [1]}"), json!({"a": [1]}));
        assert_eq!(tool_input("{\"a\": "), json!({}), "cut off by max_tokens");
        assert_eq!(tool_input("[1]"), json!({}));
    }
}
