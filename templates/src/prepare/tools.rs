//! Rewrites for templates that lack tool support or require alternating turns: tool calls
//! become text in the assistant's content, tool results become user text, and same-role
//! neighbours merge. Each rewrite is local, so a conversation's earlier turns render the same
//! whatever is appended after them.

use serde_json::{Value as Json, json};

use super::{content_text, role};

/// `<tool_call>` blocks in the Hermes/Qwen form, which our output parser reads back.
fn tool_call_text(call: &Json) -> String {
    let function = call.get("function").unwrap_or(call);
    let name = function.get("name").and_then(Json::as_str).unwrap_or_default();
    let arguments = match function.get("arguments") {
        Some(Json::String(raw)) => raw.clone(),
        Some(other) => other.to_string(),
        None => "{}".to_owned(),
    };
    crate::format::hermes_call_text(&Json::from(name).to_string(), &arguments)
}

/// Moves assistant tool calls into the assistant's content as text.
pub(super) fn tool_calls_as_content(messages: &mut [Json]) {
    for message in messages.iter_mut().filter(|m| role(m) == Some("assistant")) {
        let Some(Json::Array(calls)) = message.as_object_mut().and_then(|m| m.remove("tool_calls")) else {
            continue;
        };
        let mut text = content_text(message);
        for call in &calls {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&tool_call_text(call));
        }
        message["content"] = json!(text);
    }
}

/// Turns tool results into user messages; a run of results becomes one user message.
pub(super) fn tool_results_as_user(messages: Vec<Json>) -> Vec<Json> {
    let mut out: Vec<Json> = Vec::with_capacity(messages.len());
    let mut previous_was_tool = false;
    for message in messages {
        if role(&message) != Some("tool") {
            previous_was_tool = false;
            out.push(message);
            continue;
        }
        let wrapped = crate::format::hermes_result_text(&content_text(&message));
        match out.last_mut() {
            Some(last) if previous_was_tool => {
                let joined = format!("{}\n{wrapped}", content_text(last));
                last["content"] = json!(joined);
            }
            _ => out.push(json!({"role": "user", "content": wrapped})),
        }
        previous_was_tool = true;
    }
    out
}

/// The system text that describes `tools` to a model whose template does not show them, in
/// our words, with calls asked for in the Hermes form our output parser reads.
pub(super) fn tools_description(tools: &[Json]) -> String {
    let mut text = String::from("# Tools\n\nYou can call the tools below, each described by a JSON object:\n<tools>\n");
    for tool in tools {
        text.push_str(&tool.to_string());
        text.push('\n');
    }
    text.push_str(&format!(
        "</tools>\n\nTo call a tool, answer with nothing but one block like this per call:\n{}",
        crate::format::hermes_call_text("\"<tool name>\"", "{<argument names and values>}")
    ));
    text
}

/// Adds the tools' description to the leading system message (after its text, so the
/// system prompt stays a prefix), or as a system message of its own at the start.
pub(super) fn describe_tools(mut messages: Vec<Json>, tools: &[Json]) -> Vec<Json> {
    let description = tools_description(tools);
    match messages.first_mut() {
        Some(first) if role(first) == Some("system") => {
            let text = content_text(first);
            first["content"] = json!(if text.is_empty() { description } else { format!("{text}\n\n{description}") });
        }
        _ => messages.insert(0, json!({"role": "system", "content": description})),
    }
    messages
}

/// Merges neighbouring user messages (and neighbouring assistant messages), joined with
/// `"\n\n"`, for templates that require strictly alternating turns.
pub(super) fn merge_consecutive_roles(messages: Vec<Json>) -> Vec<Json> {
    let mut out: Vec<Json> = Vec::with_capacity(messages.len());
    for message in messages {
        let mergeable = matches!(role(&message), Some("user") | Some("assistant"));
        match out.last_mut() {
            Some(last) if mergeable && role(last) == role(&message) && last.get("tool_calls").is_none() => {
                let joined = format!("{}\n\n{}", content_text(last), content_text(&message));
                if let Some(calls) = message.get("tool_calls") {
                    last["tool_calls"] = calls.clone();
                }
                last["content"] = json!(joined);
            }
            _ => out.push(message),
        }
    }
    out
}
