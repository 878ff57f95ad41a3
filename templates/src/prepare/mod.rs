//! Message preparation: make every template accept an agent's conversation while keeping the
//! prompt's start stable, so the radix cache keeps hitting (ARCHITECTURE.md §5).
//!
//! The rules, applied in order:
//! 1. `developer` messages are system messages.
//! 2. Content-part arrays become text where the template cannot print them.
//! 3. Tool-call arguments stay the client's string unless the template needs an object; an
//!    assistant tool-call message without content gets `""` where the template needs text.
//! 4. The leading run of system messages becomes one, contents joined with `"\n\n"`, bytes
//!    untouched, so an agent's stable block stays a prefix of the prompt.
//! 5. A later system message stays in place when the template renders it there; otherwise its
//!    text joins the next user message (or the previous one, or becomes a user message). It is
//!    never hoisted to the top: that would rewrite the prompt's start and miss the cache.
//! 6. Where the template has no tool support, tool calls become `<tool_call>` text in the
//!    assistant's content and tool results become `<tool_response>` user text.
//! 7. Where the template requires alternating turns, neighbouring same-role messages merge.
//! 8. Where the template does not show the request's `tools`, they are described at the end of
//!    the leading system message (one is added if there is none), with calls asked for in the
//!    Hermes `<tool_call>` form, so tools reach every model and its calls can be read back.
//!
//! What a template accepts is found out once by [`TemplateBehavior::probe`].

mod controls;
mod probe;
mod tools;

pub use controls::{ControlSpellings, RenderedPrompt};
pub use probe::TemplateBehavior;

use serde_json::{Map, Value as Json, json};

use crate::TemplateError;
use crate::render::ChatTemplate;
use crate::request::ChatRequest;

/// Prepares a request's messages for a template with the given behaviour (the rules above).
pub fn prepare_request(request: &ChatRequest, behavior: &TemplateBehavior) -> Result<ChatRequest, TemplateError> {
    let mut messages: Vec<Json> = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.iter().enumerate() {
        let mut message = message.clone();
        let Some(fields) = message.as_object_mut() else {
            return Err(TemplateError::BadRequest(format!("messages[{i}] must be an object")));
        };
        if fields.get("role").and_then(Json::as_str) == Some("developer") {
            fields.insert("role".into(), json!("system"));
        }
        if !behavior.accepts_content_parts
            && let Some(Json::Array(parts)) = fields.get("content")
        {
            let text = flatten_parts(parts).map_err(|m| TemplateError::BadRequest(format!("messages[{i}]: {m}")))?;
            fields.insert("content".into(), json!(text));
        }
        if fields.get("role").and_then(Json::as_str) == Some("assistant") {
            prepare_assistant(fields, behavior);
        }
        messages.push(message);
    }
    let mut messages = merge_leading_system(messages);
    if let Some(tools) = request.tools.as_deref().filter(|t| !t.is_empty() && !behavior.renders_tool_definitions) {
        messages = tools::describe_tools(messages, tools);
    }
    if !behavior.renders_later_system {
        messages = fold_later_system(messages);
    }
    if !behavior.renders_tool_calls {
        tools::tool_calls_as_content(&mut messages);
    }
    if !behavior.renders_tool_role {
        messages = tools::tool_results_as_user(messages);
    }
    if !behavior.accepts_consecutive_roles {
        messages = tools::merge_consecutive_roles(messages);
    }
    Ok(ChatRequest { messages, ..request.clone() })
}

pub(crate) fn role(message: &Json) -> Option<&str> {
    message.get("role").and_then(Json::as_str)
}

fn prepare_assistant(fields: &mut Map<String, Json>, behavior: &TemplateBehavior) {
    let has_calls = matches!(fields.get("tool_calls"), Some(Json::Array(calls)) if !calls.is_empty());
    if has_calls && !behavior.accepts_missing_tool_call_content && fields.get("content").is_none_or(Json::is_null) {
        fields.insert("content".into(), json!(""));
    }
    if behavior.accepts_string_arguments {
        return;
    }
    if let Some(Json::Array(calls)) = fields.get_mut("tool_calls") {
        for call in calls {
            let slot = match call.get_mut("function") {
                Some(function) => function.get_mut("arguments"),
                None => call.get_mut("arguments"),
            };
            if let Some(arguments) = slot
                && let Some(parsed) = arguments.as_str().and_then(|s| serde_json::from_str::<Json>(s).ok())
            {
                *arguments = parsed;
            }
        }
    }
}

/// Text parts are concatenated with `"\n"` (as vLLM does); other part types cannot be shown
/// to a text-only template.
fn flatten_parts(parts: &[Json]) -> Result<String, String> {
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        match part.get("type").and_then(Json::as_str) {
            Some("text") | Some("input_text") => match part.get("text").and_then(Json::as_str) {
                Some(text) => texts.push(text),
                None => return Err("a text content part has no string 'text'".into()),
            },
            Some(other) => return Err(format!("content parts of type '{other}' are not supported")),
            None => return Err("a content part has no 'type'".into()),
        }
    }
    Ok(texts.join("\n"))
}

/// The text of a message's content (string, or parts joined as in [`flatten_parts`]).
pub(crate) fn content_text(message: &Json) -> String {
    match message.get("content") {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(parts)) => flatten_parts(parts).unwrap_or_default(),
        _ => String::new(),
    }
}

fn merge_leading_system(messages: Vec<Json>) -> Vec<Json> {
    let leading = messages.iter().take_while(|m| role(m) == Some("system")).count();
    if leading < 2 {
        return messages;
    }
    let mut rest = messages.into_iter();
    let systems: Vec<Json> = rest.by_ref().take(leading).collect();
    let text = systems.iter().map(content_text).collect::<Vec<_>>().join("\n\n");
    let mut merged = systems.into_iter().next().expect("two or more");
    merged["content"] = json!(text);
    std::iter::once(merged).chain(rest).collect()
}

/// Later system messages become user text: prepended to the next user message, else appended
/// to the previous one, else a user message of their own — always at their own position.
fn fold_later_system(messages: Vec<Json>) -> Vec<Json> {
    let mut out: Vec<Json> = Vec::with_capacity(messages.len());
    let mut pending: Option<String> = None;
    for (i, message) in messages.into_iter().enumerate() {
        let is_later_system = i > 0 && role(&message) == Some("system");
        if is_later_system {
            let text = content_text(&message);
            pending = Some(match pending.take() {
                Some(before) => format!("{before}\n\n{text}"),
                None => text,
            });
            continue;
        }
        if let Some(text) = pending.take() {
            if role(&message) == Some("user") {
                let mut message = message;
                message["content"] = json!(format!("{text}\n\n{}", content_text(&message)));
                out.push(message);
                continue;
            }
            attach_to_previous_user_or_push(&mut out, text);
        }
        out.push(message);
    }
    if let Some(text) = pending {
        attach_to_previous_user_or_push(&mut out, text);
    }
    out
}

fn attach_to_previous_user_or_push(out: &mut Vec<Json>, text: String) {
    match out.last_mut() {
        Some(previous) if role(previous) == Some("user") => {
            let joined = format!("{}\n\n{text}", content_text(previous));
            previous["content"] = json!(joined);
        }
        _ => out.push(json!({"role": "user", "content": text})),
    }
}

/// A template together with what probing found it accepts: the one object the server keeps per
/// model to turn requests into prompts.
#[derive(Debug, Clone)]
pub struct PreparedTemplate {
    /// The compiled template.
    pub template: ChatTemplate,
    /// What it accepts.
    pub behavior: TemplateBehavior,
}

impl PreparedTemplate {
    /// Probes `template` once.
    pub fn new(template: ChatTemplate) -> Self {
        let behavior = TemplateBehavior::probe(&template);
        PreparedTemplate { template, behavior }
    }

    /// Whether the request's tools are described by us (rule 8) rather than by the template:
    /// the reply's tool calls then come in the Hermes form whatever the model's family.
    pub fn describes_tools(&self, request: &ChatRequest) -> bool {
        request.tools.as_ref().is_some_and(|t| !t.is_empty()) && !self.behavior.renders_tool_definitions
    }

    /// Prepares and renders a request.
    pub fn render(&self, request: &ChatRequest) -> Result<String, TemplateError> {
        let prepared = prepare_request(request, &self.behavior)?;
        self.template.render(&prepared.render_input())
    }
}
