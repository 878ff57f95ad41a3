//! OpenAI's responses: chat completions and their stream chunks, text completions and theirs,
//! `usage`, and the `/v1/models` list. The non-OpenAI fields the server adds (`timings`,
//! llama-server's; `cache_report`, ours) come last, left out where a response has none.

use radix_templates::parse::ParseEvent;
use serde::Serialize;
use serde_json::Value as Json;

use super::Timings;

/// `usage`.
#[derive(Debug, Serialize)]
pub(crate) struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptTokensDetails,
    completion_tokens_details: CompletionTokensDetails,
}

#[derive(Debug, Serialize)]
struct PromptTokensDetails {
    cached_tokens: usize,
}

#[derive(Debug, Serialize)]
struct CompletionTokensDetails {
    reasoning_tokens: usize,
}

impl Usage {
    /// The usage of `prompt` tokens, `cached` of them from the cache, and `completion` shown
    /// tokens, `reasoning` of them reasoning.
    pub(crate) fn new(prompt: usize, cached: usize, completion: usize, reasoning: usize) -> Self {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
            completion_tokens_details: CompletionTokensDetails { reasoning_tokens: reasoning },
        }
    }
}

/// A response object (`chat.completion`, `chat.completion.chunk`, `text_completion`): the
/// fields every one has around its `choices`.
#[derive(Debug, Serialize)]
pub(crate) struct Completion<C> {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// The object type.
    pub object: &'static str,
    /// Seconds since the epoch.
    pub created: u64,
    /// The model's name.
    pub model: String,
    /// One choice (none in the closing usage chunk).
    pub choices: Vec<C>,
    /// On whole responses and the closing usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's timings, on whole responses and the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// The cache report, where the client asked for it (`cache_report.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_report: Option<Json>,
}

impl<C> Completion<C> {
    /// An object of type `object` with these `choices`, and none of the optional fields.
    pub(crate) fn new(id: &str, object: &'static str, created: u64, model: &str, choices: Vec<C>) -> Self {
        Completion {
            id: id.to_owned(),
            object,
            created,
            model: model.to_owned(),
            choices,
            usage: None,
            timings: None,
            cache_report: None,
        }
    }
}

/// A streamed chat choice.
#[derive(Debug, Serialize)]
pub(crate) struct ChunkChoice {
    /// Always 0.
    pub index: u32,
    /// What this chunk adds.
    pub delta: Delta,
    /// The log-probabilities of the tokens since the last chunk, where asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the last chunk.
    pub finish_reason: Option<&'static str>,
}

/// A chat chunk's `delta`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Delta {
    /// The first chunk's.
    Start {
        /// `assistant`.
        role: &'static str,
        /// Empty.
        content: &'static str,
    },
    /// Reply text.
    Content {
        /// The text.
        content: String,
    },
    /// Reasoning text.
    Reasoning {
        /// The text.
        reasoning_content: String,
    },
    /// A tool call's start or arguments.
    ToolCalls {
        /// One call.
        tool_calls: [ToolCallDelta; 1],
    },
    /// The last chunk's: nothing.
    Empty {},
}

impl Delta {
    /// The delta of one parse event.
    pub(crate) fn of(event: &ParseEvent) -> Self {
        match event {
            ParseEvent::Content(text) => Delta::Content { content: text.clone() },
            ParseEvent::Reasoning(text) => Delta::Reasoning { reasoning_content: text.clone() },
            ParseEvent::ToolCallStart { index, id, name } => Delta::ToolCalls {
                tool_calls: [ToolCallDelta::Start {
                    index: *index,
                    id: id.clone(),
                    kind: "function",
                    function: FunctionCall { name: name.clone(), arguments: String::new() },
                }],
            },
            ParseEvent::ToolCallArguments { index, delta } => Delta::ToolCalls {
                tool_calls: [ToolCallDelta::Arguments {
                    index: *index,
                    function: ArgumentsDelta { arguments: delta.clone() },
                }],
            },
        }
    }
}

/// A streamed tool call.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum ToolCallDelta {
    /// The call starts: its id and name.
    Start {
        /// Which call.
        index: usize,
        /// Its id.
        id: String,
        /// `function`.
        #[serde(rename = "type")]
        kind: &'static str,
        /// Its name, arguments empty.
        function: FunctionCall,
    },
    /// More of its arguments.
    Arguments {
        /// Which call.
        index: usize,
        /// The text added.
        function: ArgumentsDelta,
    },
}

/// `{"arguments": …}`.
#[derive(Debug, Serialize)]
pub(crate) struct ArgumentsDelta {
    arguments: String,
}

/// A function call's name and arguments (JSON text).
#[derive(Debug, Serialize)]
pub(crate) struct FunctionCall {
    /// The function.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// A whole chat choice.
#[derive(Debug, Serialize)]
pub(crate) struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The reply.
    pub message: ChatMessage,
    /// The log-probabilities, where asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Why it ended.
    pub finish_reason: &'static str,
}

/// The reply's message.
#[derive(Debug, Serialize)]
pub(crate) struct ChatMessage {
    /// `assistant`.
    pub role: &'static str,
    /// The text; `null` where the reply is only tool calls.
    pub content: Option<String>,
    /// The reasoning, where the model wrote some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls, where there are any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A whole tool call.
#[derive(Debug, Serialize)]
pub(crate) struct ToolCall {
    /// Its id.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What it calls.
    pub function: FunctionCall,
}

/// A text-completion choice (whole or streamed).
#[derive(Debug, Serialize)]
pub(crate) struct TextChoice {
    /// Always 0.
    pub index: u32,
    /// The text.
    pub text: String,
    /// The log-probabilities, where asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Set when it ended.
    pub finish_reason: Option<&'static str>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub(crate) struct ModelList {
    object: &'static str,
    data: [ModelEntry; 1],
}

#[derive(Debug, Serialize)]
struct ModelEntry {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    context_length: usize,
    meta: ModelMeta,
}

#[derive(Debug, Serialize)]
struct ModelMeta {
    n_ctx_train: usize,
}

impl ModelList {
    /// The one model served, as `name`, with a context of `context_length` tokens.
    pub(crate) fn new(name: &str, context_length: usize) -> Self {
        ModelList {
            object: "list",
            data: [ModelEntry {
                id: name.to_owned(),
                object: "model",
                created: 0,
                owned_by: "radix-serve",
                context_length,
                meta: ModelMeta { n_ctx_train: context_length },
            }],
        }
    }
}

/// The error body: `{"error": {"message", "type", "code"}}`, `code` `null` where none fits.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Serialize)]
struct ErrorDetail {
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
    code: Option<&'static str>,
}

impl ErrorBody {
    /// An error of OpenAI's `kind` saying `message`.
    pub(crate) fn new(message: String, kind: &'static str, code: Option<&'static str>) -> Self {
        ErrorBody { error: ErrorDetail { message, kind, code } }
    }
}

/// One token's log-probability (chat's `logprobs.content`, and llama.cpp's
/// `completion_probabilities`, which add the `id`), with its alternatives.
#[derive(Debug, Serialize)]
pub(crate) struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its id (llama.cpp's form only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// The most likely tokens there (on the sampled token, not on the alternatives).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TokenLogprob>>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Serialize)]
pub(crate) struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<TokenLogprob>,
}

/// A text completion's `logprobs`: parallel lists, one entry per token.
#[derive(Debug, Serialize)]
pub(crate) struct CompletionLogprobs {
    /// The tokens' texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities.
    pub token_logprobs: Vec<f32>,
    /// The alternatives at each, by text. Keyed by the tokens' texts, so a map: two ids that
    /// decode alike share a key, the later one's value in the earlier one's place, as always.
    pub top_logprobs: Vec<serde_json::Map<String, Json>>,
    /// Where each token starts in the text.
    pub text_offset: Vec<usize>,
}
