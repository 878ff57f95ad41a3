//! Anthropic Messages request → the chat body the rest of the server prepares (chat.rs
//! `prepare`), so the same conversation through either API renders the same prompt and hits the
//! same cached prefix: `tool_use` blocks become assistant `tool_calls`, `tool_result` blocks
//! become `tool` messages, `system` becomes the leading system message. The body is built with
//! `json!`, not typed: it is no response but the chat body the template reads, whose messages
//! carry the client's content and tool arguments as they came.

use std::io;

use radix_templates::ChatRequest;
use serde_json::{Map, Value as Json, json};

use super::ApiError;
use super::request::anthropic::{
    ContentBlock, InputMessage, MessagesRequest, Role, TextBlock, TextOrBlocks, Thinking,
    ToolChoice as AnthropicChoice, ToolSpec,
};
use super::request::{
    ChatBody, ChatCompletionRequest, FunctionDefinition, GenerationFields, SamplingFields, Stops, ToolChoice,
    ToolDefinition, typed,
};

/// What Claude Code's billing metadata block starts with. It carries a nonce that changes with
/// every request (`x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=<nonce>;`) and
/// comes first in `system`, so kept, it would make every request miss the cache from its first
/// tokens on. It is addressed to Anthropic's billing, not to the model.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// Reads a Messages body into a chat body. `generation` is false for `count_tokens`, which
/// takes no `max_tokens`; with `keep_billing_header` (`--keep-billing-header`) Claude Code's
/// billing block stays in the system prompt. Errors are HTTP 400s that name the field.
pub(super) fn to_chat_body(body: &Json, generation: bool, keep_billing_header: bool) -> Result<ChatBody, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    let mut request: MessagesRequest = typed(body)?;
    if !keep_billing_header && let Some(TextOrBlocks::Blocks(blocks)) = &mut request.system {
        let before = blocks.len();
        blocks.retain(|b| !b.text().trim_start().starts_with(BILLING_HEADER));
        if blocks.len() < before {
            static LOGGED: std::sync::Once = std::sync::Once::new();
            LOGGED.call_once(|| {
                eprintln!(
                    "radix-serve: Claude Code's billing block ({BILLING_HEADER} ...) is left out of prompts: its nonce \
                     changes with every request and would defeat the prefix cache (--keep-billing-header keeps it)"
                )
            });
        }
    }
    convert(request, generation).map_err(ApiError::bad_request)
}

fn convert(request: MessagesRequest, generation: bool) -> Result<ChatBody, String> {
    if request.messages.is_empty() {
        return Err("'messages': at least one message is required".into());
    }
    let max_tokens = match request.max_tokens {
        Some(0) => return Err("'max_tokens': must be an integer of at least 1".into()),
        Some(n) => Some(n as f64),
        None if generation => return Err("'max_tokens': Field required".into()),
        None => None,
    };
    let mut messages = Vec::new();
    if let Some(system) = request.system {
        messages.push(json!({"role": "system", "content": system_text(system)}));
    }
    // An assistant message at the end is a prefill: the reply continues it (Anthropic's semantics).
    let prefill = request.messages.last().is_some_and(|m| m.role == Role::Assistant);
    for (i, message) in request.messages.into_iter().enumerate() {
        convert_message(i, message, &mut messages)?;
    }
    let (tools, definitions) = match request.tools {
        Some(tools) => {
            let (tools, definitions) = convert_tools(tools)?;
            (Some(tools), Some(definitions))
        }
        None => (None, None),
    };
    let (tool_choice, parallel_tool_calls) = request.tool_choice.map(convert_tool_choice).unzip();
    let mut chat_template_kwargs = Map::new();
    if let Some(thinking) = request.thinking {
        chat_template_kwargs.insert("enable_thinking".into(), json!(thinking != Thinking::Disabled));
    }
    let conversation = ChatRequest {
        messages,
        tools,
        chat_template_kwargs,
        add_generation_prompt: !prefill,
        continue_final_message: prefill,
    };
    let fields = ChatCompletionRequest {
        max_tokens,
        tools: definitions,
        tool_choice,
        parallel_tool_calls: parallel_tool_calls.flatten(),
        ..ChatCompletionRequest::default()
    };
    // Sampling fields mean the same in both APIs; SamplingFields validates their ranges.
    let sampling = SamplingFields {
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        ..SamplingFields::default()
    };
    let output = GenerationFields {
        stop: Stops(request.stop_sequences.unwrap_or_default()),
        stream: request.stream,
        ..GenerationFields::default()
    };
    Ok(ChatBody { conversation, fields, sampling, output })
}

/// The text of blocks where only text may stand, joined by `separator`.
fn joined(content: TextOrBlocks<TextBlock>, separator: &str) -> String {
    match content {
        TextOrBlocks::Text(text) => text,
        TextOrBlocks::Blocks(blocks) => {
            blocks.into_iter().map(TextBlock::into_text).collect::<Vec<_>>().join(separator)
        }
    }
}

/// `system` as a string or text blocks (their `cache_control` is ignored: our cache is automatic).
/// Blocks are joined with a blank line, as the leading system messages of a chat request are.
fn system_text(system: TextOrBlocks<TextBlock>) -> String {
    joined(system, "\n\n")
}

/// One text part is a plain string (as an OpenAI client would send it); several stay parts.
fn text_content(mut texts: Vec<String>) -> Json {
    if texts.len() <= 1 {
        json!(texts.pop().unwrap_or_default())
    } else {
        texts.into_iter().map(|t| json!({"type": "text", "text": t})).collect()
    }
}

fn convert_message(i: usize, message: InputMessage, out: &mut Vec<Json>) -> Result<(), String> {
    let role = match message.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let blocks = match message.content {
        TextOrBlocks::Text(text) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        TextOrBlocks::Blocks(blocks) => blocks,
    };
    match message.role {
        Role::User => user_blocks(i, blocks, out),
        Role::Assistant => assistant_blocks(i, blocks, out),
    }
}

fn not_here(at: &str, block: &ContentBlock) -> String {
    let kind = match block {
        ContentBlock::Text { .. } => "text",
        ContentBlock::Thinking { .. } => "thinking",
        ContentBlock::RedactedThinking => "redacted_thinking",
        ContentBlock::ToolUse { .. } => "tool_use",
        ContentBlock::ToolResult { .. } => "tool_result",
    };
    format!("{at}: content blocks of type '{kind}' are not supported here")
}

/// Text blocks make user messages; each `tool_result` becomes a `tool` message in its place.
fn user_blocks(i: usize, blocks: Vec<ContentBlock>, out: &mut Vec<Json>) -> Result<(), String> {
    let mut texts = Vec::new();
    let flush = |texts: &mut Vec<String>, out: &mut Vec<Json>| {
        if !texts.is_empty() {
            out.push(json!({"role": "user", "content": text_content(std::mem::take(texts))}));
        }
    };
    for (j, block) in blocks.into_iter().enumerate() {
        match block {
            ContentBlock::Text { text } => texts.push(text),
            ContentBlock::ToolResult { tool_use_id, content } => {
                flush(&mut texts, out);
                // `is_error` has no OpenAI counterpart; the result text says what failed.
                let content = content.map(|c| joined(c, "\n")).unwrap_or_default();
                out.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}));
            }
            other => return Err(not_here(&format!("messages[{i}].content[{j}]"), &other)),
        }
    }
    flush(&mut texts, out);
    Ok(())
}

/// Text, thinking and `tool_use` blocks make one assistant message with content,
/// `reasoning_content` and `tool_calls`.
fn assistant_blocks(i: usize, blocks: Vec<ContentBlock>, out: &mut Vec<Json>) -> Result<(), String> {
    let (mut texts, mut reasoning, mut calls) = (Vec::new(), None::<String>, Vec::new());
    for (j, block) in blocks.into_iter().enumerate() {
        match block {
            ContentBlock::Text { text } => texts.push(text),
            ContentBlock::Thinking { thinking } => reasoning.get_or_insert_with(String::new).push_str(&thinking),
            // Encrypted reasoning of another model: nothing we can render.
            ContentBlock::RedactedThinking => {}
            ContentBlock::ToolUse { id, name, input } => {
                let input = Json::Object(input.unwrap_or_default());
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": python_json(&input)}}));
            }
            other => return Err(not_here(&format!("messages[{i}].content[{j}]"), &other)),
        }
    }
    let content = if texts.is_empty() && !calls.is_empty() { Json::Null } else { text_content(texts) };
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(reasoning) = reasoning {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Json::Array(calls);
    }
    out.push(message);
    Ok(())
}

/// The client's tools in OpenAI's shape for the template, and as constrained decoding reads them.
fn convert_tools(tools: Vec<ToolSpec>) -> Result<(Vec<Json>, Vec<ToolDefinition>), String> {
    let mut rendered = Vec::new();
    let mut definitions = Vec::new();
    for (i, tool) in tools.into_iter().enumerate() {
        // Anthropic's server tools (web search, code execution, ...) run on their side: none here.
        if tool.kind.as_deref().is_some_and(|t| t != "custom") {
            continue;
        }
        let name = tool.name.ok_or_else(|| format!("tools[{i}].name: Field required"))?;
        let schema =
            tool.input_schema.ok_or_else(|| format!("tools[{i}].input_schema: must be a JSON schema object"))?;
        let schema = Json::Object(schema);
        let mut function = json!({"name": name});
        if let Some(description) = tool.description {
            function["description"] = json!(description);
        }
        function["parameters"] = schema.clone();
        rendered.push(json!({"type": "function", "function": function}));
        definitions.push(ToolDefinition::Function { function: FunctionDefinition { name, parameters: Some(schema) } });
    }
    Ok((rendered, definitions))
}

/// `tool_choice` in OpenAI's terms, and `parallel_tool_calls` when the client said.
fn convert_tool_choice(choice: AnthropicChoice) -> (ToolChoice, Option<bool>) {
    let (choice, disable_parallel) = match choice {
        AnthropicChoice::Auto { disable_parallel_tool_use } => (ToolChoice::Auto, disable_parallel_tool_use),
        AnthropicChoice::Any { disable_parallel_tool_use } => (ToolChoice::Required, disable_parallel_tool_use),
        AnthropicChoice::Tool { name, disable_parallel_tool_use } => {
            (ToolChoice::Function(name), disable_parallel_tool_use)
        }
        AnthropicChoice::None => (ToolChoice::None, None),
    };
    (choice, disable_parallel.map(|disable| !disable))
}

/// JSON text as Python's `json.dumps` writes it (`", "` and `": "`): what the tool-call
/// arguments of an OpenAI client look like, and what models write, so both APIs render alike.
fn python_json(value: &Json) -> String {
    struct PythonSeparators;
    impl serde_json::ser::Formatter for PythonSeparators {
        fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
            if first { Ok(()) } else { writer.write_all(b", ") }
        }
        fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
            if first { Ok(()) } else { writer.write_all(b", ") }
        }
        fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
            writer.write_all(b": ")
        }
    }
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, PythonSeparators);
    serde::Serialize::serialize(value, &mut serializer).expect("a JSON value always serializes");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chat body as the OpenAI request it stands for, with the Messages body's error text.
    fn to_chat_body(body: &Json, generation: bool) -> Result<Json, String> {
        let chat = super::to_chat_body(body, generation, false).map_err(|e| e.message())?;
        let mut out = chat.conversation.to_json();
        if chat.conversation.add_generation_prompt {
            out.as_object_mut().unwrap().remove("add_generation_prompt");
        }
        if !chat.conversation.continue_final_message {
            out.as_object_mut().unwrap().remove("continue_final_message");
        }
        match chat.fields.tool_choice {
            Some(ToolChoice::Function(name)) => {
                out["tool_choice"] = json!({"type": "function", "function": {"name": name}})
            }
            Some(ToolChoice::Required) => out["tool_choice"] = json!("required"),
            Some(ToolChoice::Auto) => out["tool_choice"] = json!("auto"),
            Some(ToolChoice::None) => out["tool_choice"] = json!("none"),
            None => {}
        }
        if let Some(parallel) = chat.fields.parallel_tool_calls {
            out["parallel_tool_calls"] = json!(parallel);
        }
        if !chat.output.stop.0.is_empty() {
            out["stop"] = json!(chat.output.stop.0);
        }
        Ok(out)
    }

    #[test]
    fn claude_codes_billing_block_is_left_out_unless_kept() {
        let body = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
                       {"type": "text", "text": "You are Claude Code."}]});
        let system = |keep| super::to_chat_body(&body, true, keep).unwrap().conversation.messages[0]["content"].clone();
        assert_eq!(system(false), "You are Claude Code.");
        assert_eq!(system(true), "x-anthropic-billing-header: cc_version=1; cch=abc;\n\nYou are Claude Code.");
    }

    #[test]
    fn a_tool_round_trip_becomes_openai_messages() {
        let body = json!({
            "model": "m", "max_tokens": 8, "metadata": {"user_id": "x"}, "unknown": 1,
            "system": [{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "B"}],
            "tools": [{"name": "read", "description": "Read.", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "tool", "name": "read", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"],
            "messages": [
                {"role": "user", "content": "Read a.rs"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "need it", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.rs", "n": [1, 2]}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "fn main"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
                    {"type": "text", "text": "Now?"}]}
            ]
        });
        let chat = to_chat_body(&body, true).unwrap();
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "A\n\nB"},
                {"role": "user", "content": "Read a.rs"},
                {"role": "assistant", "content": null, "reasoning_content": "need it", "tool_calls": [
                    {"id": "toolu_1", "type": "function",
                     "function": {"name": "read", "arguments": "{\"path\": \"a.rs\", \"n\": [1, 2]}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "fn main"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "boom"},
                {"role": "user", "content": "Now?"}
            ])
        );
        assert_eq!(chat["tools"].as_array().unwrap().len(), 1, "server tools are skipped");
        assert_eq!(chat["tools"][0]["function"]["parameters"], json!({"type": "object"}));
        assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "read"}}));
        assert_eq!(chat["parallel_tool_calls"], json!(false));
        assert_eq!(chat["stop"], json!(["END"]));
        assert!(chat.get("continue_final_message").is_none());
    }

    #[test]
    fn a_final_assistant_message_is_continued() {
        let body = json!({"max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "The answer is"}]});
        let chat = to_chat_body(&body, true).unwrap();
        assert_eq!(
            chat["messages"][0]["content"],
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        );
        assert_eq!(chat["continue_final_message"], json!(true));
        assert_eq!(chat["add_generation_prompt"], json!(false));
    }

    #[test]
    fn bad_requests_name_the_field() {
        let cases = [
            (json!([]), "JSON object"),
            (json!({"messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
            (json!({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
            (json!({"max_tokens": 1, "messages": []}), "messages"),
            (json!({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}), "messages[0].role"),
            (json!({"max_tokens": 1, "messages": [{"role": "user", "content": 3}]}), "messages[0].content"),
            (json!({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image"}]}]}), "image"),
            (json!({"max_tokens": 1, "system": 5, "messages": [{"role": "user", "content": "x"}]}), "system"),
            (
                json!({"max_tokens": 1, "tool_choice": {"type": "tool"}, "messages": [{"role": "user", "content": "x"}]}),
                "tool_choice",
            ),
            (
                json!({"max_tokens": 1, "tools": [{"name": "t"}], "messages": [{"role": "user", "content": "x"}]}),
                "input_schema",
            ),
            (
                json!({"max_tokens": 1, "stop_sequences": "x", "messages": [{"role": "user", "content": "x"}]}),
                "stop_sequences",
            ),
        ];
        for (body, needle) in cases {
            let error = to_chat_body(&body, true).unwrap_err();
            assert!(error.contains(needle), "{body}: {error}");
        }
        let count = json!({"messages": [{"role": "user", "content": "x"}]});
        assert!(to_chat_body(&count, false).is_ok(), "count_tokens takes no max_tokens");
    }
}
