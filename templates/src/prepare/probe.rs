//! Finding out what a template accepts by rendering tiny sentinel conversations once at load,
//! instead of guessing from the template's name.

use serde_json::{Value as Json, json};

use crate::render::{ChatTemplate, RenderInput};

/// What a template was found to accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateBehavior {
    /// A system message after the first renders in place.
    pub renders_later_system: bool,
    /// Content given as an array of `{"type": "text", "text": …}` parts renders as its text.
    pub accepts_content_parts: bool,
    /// Tool-call arguments given as a JSON string render verbatim (else they must be objects).
    pub accepts_string_arguments: bool,
    /// An assistant message with tool calls and no content renders.
    pub accepts_missing_tool_call_content: bool,
    /// Assistant `tool_calls` appear in the prompt.
    pub renders_tool_calls: bool,
    /// Messages with role `tool` appear in the prompt.
    pub renders_tool_role: bool,
    /// Two user messages in a row render (Gemma's template requires strict alternation).
    pub accepts_consecutive_roles: bool,
    /// The request's `tools` (their names) appear in the prompt.
    pub renders_tool_definitions: bool,
}

impl Default for TemplateBehavior {
    /// A template that accepts everything: preparation then only merges leading system messages.
    fn default() -> Self {
        TemplateBehavior {
            renders_later_system: true,
            accepts_content_parts: true,
            accepts_string_arguments: true,
            accepts_missing_tool_call_content: true,
            renders_tool_calls: true,
            renders_tool_role: true,
            accepts_consecutive_roles: true,
            renders_tool_definitions: true,
        }
    }
}

const PROBE_SYSTEM: &str = "radix-probe-later-system";
const PROBE_PART: &str = "radix-probe-content-part";
const PROBE_TOOL: &str = "radix_probe_tool";
const PROBE_ARGUMENT_KEY: &str = "radix_probe_argument";
const PROBE_RESULT: &str = "radix-probe-tool-result";
const PROBE_DEFINED_TOOL: &str = "radix_probe_defined_tool";

fn user(text: &str) -> Json {
    json!({"role": "user", "content": text})
}

fn assistant_call(arguments: Json, content: Option<&str>) -> Json {
    let mut message = json!({"role": "assistant", "tool_calls": [{
        "id": "call_probe", "type": "function",
        "function": {"name": PROBE_TOOL, "arguments": arguments}}]});
    if let Some(content) = content {
        message["content"] = json!(content);
    }
    message
}

impl TemplateBehavior {
    /// Renders sentinel conversations to find out what `template` accepts.
    pub fn probe(template: &ChatTemplate) -> Self {
        let render = |messages: Vec<Json>| {
            template.render(&RenderInput { messages, add_generation_prompt: true, ..Default::default() })
        };
        let renders_later_system = render(vec![
            user("radix-probe-user-1"),
            json!({"role": "assistant", "content": "radix-probe-assistant"}),
            json!({"role": "system", "content": PROBE_SYSTEM}),
            user("radix-probe-user-2"),
        ])
        .is_ok_and(|out| in_order(&out, &["radix-probe-assistant", PROBE_SYSTEM, "radix-probe-user-2"]));

        let accepts_content_parts =
            render(vec![json!({"role": "user", "content": [{"type": "text", "text": PROBE_PART}]})])
                .is_ok_and(|out| out.contains(PROBE_PART) && !out.contains("'text'") && !out.contains("\"text\""));

        // Tool calls are probed between two user turns, so that the tool role does not matter.
        let arguments = format!("{{\"{PROBE_ARGUMENT_KEY}\": 1}}");
        let call_turn = |call_arguments: Json, content: Option<&str>| {
            vec![user("radix-probe-user-1"), assistant_call(call_arguments, content), user("radix-probe-user-2")]
        };
        let with_string_arguments = render(call_turn(json!(arguments), Some("")));
        let renders_tool_calls = with_string_arguments.as_ref().is_ok_and(|out| out.contains(PROBE_TOOL))
            || render(call_turn(json!({PROBE_ARGUMENT_KEY: 1}), Some(""))).is_ok_and(|out| out.contains(PROBE_TOOL));
        let accepts_string_arguments = match &with_string_arguments {
            Ok(out) => out.contains(&arguments) || !out.contains(PROBE_ARGUMENT_KEY),
            Err(_) => render(call_turn(json!({PROBE_ARGUMENT_KEY: 1}), Some(""))).is_err(),
        };
        let accepts_missing_tool_call_content =
            render(call_turn(json!(arguments), None)).is_ok() || with_string_arguments.is_err();

        // The call before the result is written the way the template takes arguments, so a
        // template that only rejects string arguments (Qwen3.5) still shows its own tool role.
        let probe_arguments = if accepts_string_arguments { json!(arguments) } else { json!({PROBE_ARGUMENT_KEY: 1}) };
        let renders_tool_role = render(vec![
            user("radix-probe-user-1"),
            assistant_call(probe_arguments, Some("")),
            json!({"role": "tool", "tool_call_id": "call_probe", "content": PROBE_RESULT}),
        ])
        .is_ok_and(|out| out.contains(PROBE_RESULT));

        let accepts_consecutive_roles = render(vec![user("radix-probe-user-1"), user("radix-probe-user-2")])
            .is_ok_and(|out| in_order(&out, &["radix-probe-user-1", "radix-probe-user-2"]));

        let renders_tool_definitions = template
            .render(&RenderInput {
                messages: vec![user("radix-probe-user-1")],
                tools: Some(vec![json!({"type": "function", "function": {
                    "name": PROBE_DEFINED_TOOL, "description": "A probe.",
                    "parameters": {"type": "object", "properties": {}}}})]),
                add_generation_prompt: true,
                ..Default::default()
            })
            .is_ok_and(|out| out.contains(PROBE_DEFINED_TOOL));

        TemplateBehavior {
            renders_tool_definitions,
            renders_later_system,
            accepts_content_parts,
            accepts_string_arguments,
            accepts_missing_tool_call_content,
            renders_tool_calls,
            renders_tool_role,
            accepts_consecutive_roles,
        }
    }
}

fn in_order(haystack: &str, needles: &[&str]) -> bool {
    let mut from = 0;
    for needle in needles {
        match haystack[from..].find(needle) {
            Some(at) => from += at + needle.len(),
            None => return false,
        }
    }
    true
}
