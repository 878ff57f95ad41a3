//! OpenAI's request bodies: chat completions and (legacy) text completions.

use radix_templates::ChatRequest;
use serde::Deserialize;
use serde_json::Value as Json;

use super::super::ApiError;
use super::{GenerationBody, GenerationFields, SamplingFields};

/// A chat completion body, read once: the conversation as the template sees it (messages and
/// tools as sent, since templates read any field of them) and every field the server acts on.
/// The Anthropic API builds one of these from its own body, so both APIs prepare alike.
#[derive(Debug, Clone)]
pub(crate) struct ChatBody {
    /// Messages, tools and template options.
    pub(crate) conversation: ChatRequest,
    /// The chat-specific fields.
    pub(crate) fields: ChatCompletionRequest,
    /// Sampling settings.
    pub(crate) sampling: SamplingFields,
    /// Stop strings, streaming, cache use.
    pub(crate) output: GenerationFields,
}

impl ChatBody {
    /// Reads a parsed `POST /v1/chat/completions` body; errors name the field.
    pub(crate) fn from_json(body: &Json) -> Result<Self, ApiError> {
        let conversation = ChatRequest::from_json(body)?;
        let GenerationBody { fields, sampling, output } = GenerationBody::from_json(body)?;
        Ok(ChatBody { conversation, fields, sampling, output })
    }
}

/// The fields of `POST /v1/chat/completions` read here; the messages, tools and template
/// options as the template sees them are read by `radix_templates::ChatRequest`, the sampling
/// and output fields by [`super::SamplingFields`] and [`super::GenerationFields`].
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ChatCompletionRequest {
    /// Choices per request; only 1.
    pub(crate) n: Option<u64>,
    /// The token limit, OpenAI's current name.
    pub(crate) max_completion_tokens: Option<f64>,
    /// The token limit, OpenAI's old name.
    pub(crate) max_tokens: Option<f64>,
    /// Return each token's log-probability.
    pub(crate) logprobs: Option<bool>,
    /// Alternatives per token (with `logprobs`).
    pub(crate) top_logprobs: Option<i64>,
    /// The declared tools, as constrained decoding reads them.
    pub(crate) tools: Option<Vec<ToolDefinition>>,
    /// Whether and which tool must be called; `"none"` also turns tool-call parsing off.
    pub(crate) tool_choice: Option<ToolChoice>,
    /// Several calls in one reply (default true).
    pub(crate) parallel_tool_calls: Option<bool>,
    /// The shape of a reply that is not a tool call.
    pub(crate) response_format: Option<ResponseFormat>,
    /// Return the cache report in the body.
    pub(crate) cache_report: Option<bool>,
    /// OpenAI's end-user id; the tenant when there is no `cache_salt`.
    pub(crate) user: Option<String>,
}

/// One entry of `tools`: only functions exist in the chat API.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ToolDefinition {
    /// `{"type": "function", "function": {...}}`.
    Function {
        /// The function.
        function: FunctionDefinition,
    },
}

/// A function a reply may call.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct FunctionDefinition {
    /// Its name, as a call names it.
    pub(crate) name: String,
    /// The JSON schema of its arguments (default: any object).
    pub(crate) parameters: Option<Json>,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// Call nothing; tool-call parsing is off.
    None,
    /// The model decides.
    Auto,
    /// At least one call to one of the tools.
    Required,
    /// One call to this function.
    Function(String),
}

const TOOL_CHOICE_FORMS: &str =
    "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let named = |choice: &Json| {
            let is_function = choice.get("type").and_then(Json::as_str) == Some("function");
            let name = choice.get("function").and_then(|f| f.get("name")).and_then(Json::as_str);
            name.filter(|_| is_function).map(|name| ToolChoice::Function(name.to_owned()))
        };
        let choice = Json::deserialize(deserializer)?;
        match &choice {
            Json::String(s) if s == "none" => Ok(ToolChoice::None),
            Json::String(s) if s == "auto" => Ok(ToolChoice::Auto),
            Json::String(s) if s == "required" => Ok(ToolChoice::Required),
            Json::Object(_) => named(&choice).ok_or_else(|| D::Error::custom(TOOL_CHOICE_FORMS)),
            _ => Err(D::Error::custom(TOOL_CHOICE_FORMS)),
        }
    }
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// A JSON document valid under a schema.
    JsonSchema {
        /// The named schema.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct JsonSchemaFormat {
    /// The schema (default: anything).
    pub(crate) schema: Option<Json>,
}

/// The fields of `POST /v1/completions` read here; the prompt is read by
/// [`super::prompt_tokens`], the sampling and output fields by [`super::SamplingFields`] and
/// [`super::GenerationFields`].
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct CompletionRequest {
    /// The prompt in any of its forms.
    pub(crate) prompt: Option<Json>,
    /// Choices per request; only 1.
    pub(crate) n: Option<u64>,
    /// Candidates per choice; only 1.
    pub(crate) best_of: Option<u64>,
    /// Echo the prompt; not supported.
    pub(crate) echo: Option<bool>,
    /// Fill-in-the-middle suffix; not supported.
    pub(crate) suffix: Option<String>,
    /// The token limit (default 16).
    pub(crate) max_tokens: Option<i64>,
    /// Alternatives per token whose log-probabilities are returned.
    pub(crate) logprobs: Option<i64>,
}
