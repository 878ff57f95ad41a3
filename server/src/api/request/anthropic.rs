//! The Anthropic Messages API's request body (`POST /v1/messages` and its `count_tokens`), typed:
//! what api/anthropic_convert.rs turns into the chat body both APIs prepare alike. Fields this
//! server has no use for (`metadata`, `cache_control`, `signature`, `citations`, ...) are ignored.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, SeqAccess, Visitor};
use serde_json::{Map, Value as Json};

/// A Messages body.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct MessagesRequest {
    /// The system prompt.
    pub(crate) system: Option<TextOrBlocks<TextBlock>>,
    /// The conversation.
    pub(crate) messages: Vec<InputMessage>,
    /// Tools: the client's own, and Anthropic's server tools (which run only on Anthropic's side).
    pub(crate) tools: Option<Vec<ToolSpec>>,
    /// Whether and which tool must be called.
    pub(crate) tool_choice: Option<ToolChoice>,
    /// The token limit; required when generating.
    pub(crate) max_tokens: Option<u64>,
    /// Softmax temperature.
    pub(crate) temperature: Option<f64>,
    /// Nucleus mass kept.
    pub(crate) top_p: Option<f64>,
    /// Candidates kept.
    pub(crate) top_k: Option<f64>,
    /// Stream named server-sent events.
    pub(crate) stream: Option<bool>,
    /// Stop strings.
    pub(crate) stop_sequences: Option<Vec<String>>,
    /// Extended thinking on or off.
    pub(crate) thinking: Option<Thinking>,
}

/// One message of the conversation.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct InputMessage {
    /// Who wrote it.
    pub(crate) role: Role,
    /// What it says.
    pub(crate) content: TextOrBlocks<ContentBlock>,
}

/// A message's author: the Messages API has no system or tool messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// The user (and tool results).
    User,
    /// The model.
    Assistant,
}

/// A content block of a message; which ones a role may hold is checked where they are converted.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's visible reasoning.
    Thinking {
        /// The reasoning text.
        thinking: String,
    },
    /// Another model's encrypted reasoning: nothing to render.
    RedactedThinking,
    /// A call the model made.
    ToolUse {
        /// The call's id, which its result names.
        id: String,
        /// The tool called.
        name: String,
        /// The arguments (default: none).
        input: Option<Map<String, Json>>,
    },
    /// What a call returned.
    ToolResult {
        /// The call it answers.
        tool_use_id: String,
        /// The result (default: empty).
        content: Option<TextOrBlocks<TextBlock>>,
    },
}

/// A block of text where only text may stand (the system prompt, tool results).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum TextBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
}

impl TextBlock {
    /// The text.
    pub(crate) fn into_text(self) -> String {
        let TextBlock::Text { text } = self;
        text
    }

    /// The text, borrowed.
    pub(crate) fn text(&self) -> &str {
        let TextBlock::Text { text } = self;
        text
    }
}

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ToolSpec {
    /// Absent or `"custom"` for the client's own tools; a server tool's versioned type otherwise.
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    /// The tool's name.
    pub(crate) name: Option<String>,
    /// What it does.
    pub(crate) description: Option<String>,
    /// The JSON schema of its input.
    pub(crate) input_schema: Option<Map<String, Json>>,
}

/// `tool_choice`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ToolChoice {
    /// The model decides.
    Auto {
        /// At most one call.
        disable_parallel_tool_use: Option<bool>,
    },
    /// Some tool must be called.
    Any {
        /// At most one call.
        disable_parallel_tool_use: Option<bool>,
    },
    /// This tool must be called.
    Tool {
        /// The tool.
        name: String,
        /// At most one call.
        disable_parallel_tool_use: Option<bool>,
    },
    /// No tool may be called.
    None,
}

/// `thinking`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Thinking {
    /// Think before answering (`budget_tokens` is not enforced).
    Enabled,
    /// The model decides how much to think; for the models served here that is thinking on.
    Adaptive,
    /// Answer at once.
    Disabled,
}

/// A string or an array of blocks, as Anthropic accepts for every content field.
#[derive(Debug, Clone)]
pub(crate) enum TextOrBlocks<T> {
    /// A plain string: one text block.
    Text(String),
    /// Blocks.
    Blocks(Vec<T>),
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for TextOrBlocks<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A visitor rather than an untagged enum: the error then says what the field may be, and
        // an error inside a block keeps its path (`messages[2].content[1]`).
        struct TextOrBlocksVisitor<T>(PhantomData<T>);
        impl<'de, T: DeserializeOwned> Visitor<'de> for TextOrBlocksVisitor<T> {
            type Value = TextOrBlocks<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(TextOrBlocks::Text(text.to_owned()))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
                Ok(TextOrBlocks::Text(text))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(block) = seq.next_element()? {
                    blocks.push(block);
                }
                Ok(TextOrBlocks::Blocks(blocks))
            }
        }
        deserializer.deserialize_any(TextOrBlocksVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::request::typed;

    #[test]
    fn blocks_keep_their_path_in_errors() {
        let body = json!({"messages": [{"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}, {"type": "image"}]}]});
        let error = typed::<MessagesRequest>(&body).unwrap_err().message();
        assert!(error.contains("messages[1].content[1]") && error.contains("image"), "{error}");
        let body = json!({"messages": [{"role": "user", "content": 7}]});
        let error = typed::<MessagesRequest>(&body).unwrap_err().message();
        assert!(error.contains("messages[0].content") && error.contains("a string or an array"), "{error}");
    }

    #[test]
    fn extra_fields_are_ignored() {
        let body = json!({"metadata": {"user_id": "u"}, "thinking": {"type": "enabled", "budget_tokens": 9},
            "messages": [{"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "redacted_thinking", "data": "x"},
                {"type": "text", "text": "a", "citations": []}]}]});
        let request = typed::<MessagesRequest>(&body).unwrap();
        assert_eq!(request.thinking, Some(Thinking::Enabled));
        let TextOrBlocks::Blocks(blocks) = &request.messages[0].content else { panic!("blocks") };
        assert_eq!(blocks.len(), 3);
        assert!(matches!(blocks[1], ContentBlock::RedactedThinking));
    }
}
