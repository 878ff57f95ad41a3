//! Anthropic Messages request → the OpenAI chat body that the rest of the server reads
//! (chat.rs `prepare`), so the same conversation through either API renders the same prompt
//! and hits the same cached prefix: `tool_use` blocks become assistant `tool_calls`,
//! `tool_result` blocks become `tool` messages, `system` becomes the leading system message.

use std::io;

use serde_json::{Map, Value as Json, json};

/// Converts a Messages body into an OpenAI chat body. `generation` is false for
/// `count_tokens`, which takes no `max_tokens`. The error is the message of an HTTP 400.
pub(super) fn to_chat_body(body: &Json, generation: bool) -> Result<Json, String> {
    let Json::Object(body) = body else {
        return Err("the request body must be a JSON object".into());
    };
    let mut messages = Vec::new();
    if let Some(system) = field(body, "system") {
        messages.push(json!({"role": "system", "content": system_text(system)?}));
    }
    let input = match field(body, "messages") {
        Some(Json::Array(input)) if !input.is_empty() => input,
        Some(Json::Array(_)) => return Err("messages: at least one message is required".into()),
        Some(_) => return Err("messages: must be an array of message objects".into()),
        None => return Err("messages: Field required".into()),
    };
    for (i, message) in input.iter().enumerate() {
        convert_message(i, message, &mut messages)?;
    }
    let mut out = Map::new();
    // An assistant message at the end is a prefill: the reply continues it (Anthropic's semantics).
    let prefill = input.last().and_then(|m| m.get("role")).and_then(Json::as_str) == Some("assistant");
    out.insert("messages".into(), Json::Array(messages));
    if prefill {
        out.insert("add_generation_prompt".into(), json!(false));
        out.insert("continue_final_message".into(), json!(true));
    }
    if let Some(tools) = field(body, "tools") {
        out.insert("tools".into(), convert_tools(tools)?);
    }
    if let Some(choice) = field(body, "tool_choice") {
        let (choice, parallel) = convert_tool_choice(choice)?;
        out.insert("tool_choice".into(), choice);
        if let Some(parallel) = parallel {
            out.insert("parallel_tool_calls".into(), json!(parallel));
        }
    }
    match field(body, "max_tokens") {
        Some(n) if n.as_u64().is_some_and(|n| n >= 1) => {
            out.insert("max_tokens".into(), n.clone());
        }
        Some(_) => return Err("max_tokens: must be an integer of at least 1".into()),
        None if generation => return Err("max_tokens: Field required".into()),
        None => {}
    }
    // Sampling fields mean the same in both APIs; chat.rs validates their types and ranges.
    for name in ["temperature", "top_p", "top_k", "stream"] {
        if let Some(value) = field(body, name) {
            out.insert(name.into(), value.clone());
        }
    }
    if let Some(stops) = field(body, "stop_sequences") {
        if !stops.as_array().is_some_and(|a| a.iter().all(Json::is_string)) {
            return Err("stop_sequences: must be an array of strings".into());
        }
        out.insert("stop".into(), stops.clone());
    }
    if let Some(thinking) = field(body, "thinking") {
        let enabled = match thinking.get("type").and_then(Json::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => return Err("thinking: 'type' must be 'enabled' or 'disabled'".into()),
        };
        out.insert("chat_template_kwargs".into(), json!({"enable_thinking": enabled}));
    }
    Ok(Json::Object(out))
}

fn field<'a>(body: &'a Map<String, Json>, name: &str) -> Option<&'a Json> {
    body.get(name).filter(|v| !v.is_null())
}

/// `system` as a string or text blocks (their `cache_control` is ignored: our cache is automatic).
/// Blocks are joined with a blank line, as the leading system messages of a chat request are.
fn system_text(system: &Json) -> Result<String, String> {
    match system {
        Json::String(s) => Ok(s.clone()),
        Json::Array(blocks) => {
            let texts = blocks
                .iter()
                .enumerate()
                .map(|(j, b)| match block_type(b) {
                    Some("text") => text_of(b).ok_or_else(|| format!("system[{j}].text: must be a string")),
                    _ => Err(format!("system[{j}]: only text blocks are supported")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join("\n\n"))
        }
        _ => Err("system: must be a string or an array of text blocks".into()),
    }
}

fn block_type(block: &Json) -> Option<&str> {
    block.get("type").and_then(Json::as_str)
}

fn text_of(block: &Json) -> Option<String> {
    block.get("text").and_then(Json::as_str).map(str::to_owned)
}

/// One text part is a plain string (as an OpenAI client would send it); several stay parts.
fn text_content(mut texts: Vec<String>) -> Json {
    if texts.len() <= 1 {
        json!(texts.pop().unwrap_or_default())
    } else {
        texts.into_iter().map(|t| json!({"type": "text", "text": t})).collect()
    }
}

fn convert_message(i: usize, message: &Json, out: &mut Vec<Json>) -> Result<(), String> {
    let role = match message.get("role") {
        Some(Json::String(role)) if role == "user" || role == "assistant" => role.as_str(),
        Some(_) => return Err(format!("messages[{i}].role: must be 'user' or 'assistant'")),
        None if message.is_object() => return Err(format!("messages[{i}].role: Field required")),
        None => return Err(format!("messages[{i}]: must be an object")),
    };
    let blocks = match message.get("content") {
        Some(Json::String(text)) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Json::Array(blocks)) => blocks,
        _ => return Err(format!("messages[{i}].content: must be a string or an array of content blocks")),
    };
    if role == "user" { user_blocks(i, blocks, out) } else { assistant_blocks(i, blocks, out) }
}

/// Text blocks make user messages; each `tool_result` becomes a `tool` message in its place.
fn user_blocks(i: usize, blocks: &[Json], out: &mut Vec<Json>) -> Result<(), String> {
    let mut texts = Vec::new();
    let flush = |texts: &mut Vec<String>, out: &mut Vec<Json>| {
        if !texts.is_empty() {
            out.push(json!({"role": "user", "content": text_content(std::mem::take(texts))}));
        }
    };
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match block_type(block) {
            Some("text") => texts.push(text_of(block).ok_or_else(|| format!("{at}.text: must be a string"))?),
            Some("tool_result") => {
                flush(&mut texts, out);
                let id = block.get("tool_use_id").and_then(Json::as_str);
                let id = id.ok_or_else(|| format!("{at}.tool_use_id: must be a string"))?;
                // `is_error` has no OpenAI counterpart; the result text says what failed.
                let content = tool_result_text(&at, block.get("content"))?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            Some(other) => return Err(format!("{at}: content blocks of type '{other}' are not supported here")),
            None => return Err(format!("{at}: must be an object with a string 'type'")),
        }
    }
    flush(&mut texts, out);
    Ok(())
}

fn tool_result_text(at: &str, content: Option<&Json>) -> Result<String, String> {
    match content {
        None | Some(Json::Null) => Ok(String::new()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(Json::Array(blocks)) => {
            let texts = blocks
                .iter()
                .map(|b| match block_type(b) {
                    Some("text") => text_of(b).ok_or_else(|| format!("{at}.content: text blocks need a string 'text'")),
                    _ => Err(format!("{at}.content: only text blocks are supported in tool results")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join("\n"))
        }
        Some(_) => Err(format!("{at}.content: must be a string or an array of text blocks")),
    }
}

/// Text, thinking and `tool_use` blocks make one assistant message with content,
/// `reasoning_content` and `tool_calls`.
fn assistant_blocks(i: usize, blocks: &[Json], out: &mut Vec<Json>) -> Result<(), String> {
    let (mut texts, mut reasoning, mut calls) = (Vec::new(), None::<String>, Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match block_type(block) {
            Some("text") => texts.push(text_of(block).ok_or_else(|| format!("{at}.text: must be a string"))?),
            Some("thinking") => {
                let thinking = block.get("thinking").and_then(Json::as_str);
                let thinking = thinking.ok_or_else(|| format!("{at}.thinking: must be a string"))?;
                reasoning.get_or_insert_with(String::new).push_str(thinking);
            }
            // Encrypted reasoning of another model: nothing we can render.
            Some("redacted_thinking") => {}
            Some("tool_use") => {
                let text = |name: &str| {
                    block.get(name).and_then(Json::as_str).ok_or_else(|| format!("{at}.{name}: must be a string"))
                };
                let input = match block.get("input") {
                    None | Some(Json::Null) => json!({}),
                    Some(input @ Json::Object(_)) => input.clone(),
                    Some(_) => return Err(format!("{at}.input: must be an object")),
                };
                calls.push(json!({"id": text("id")?, "type": "function",
                    "function": {"name": text("name")?, "arguments": python_json(&input)}}));
            }
            Some(other) => return Err(format!("{at}: content blocks of type '{other}' are not supported here")),
            None => return Err(format!("{at}: must be an object with a string 'type'")),
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

fn convert_tools(tools: &Json) -> Result<Json, String> {
    let Some(tools) = tools.as_array() else {
        return Err("tools: must be an array".into());
    };
    let mut out = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        // Anthropic's server tools (web search, code execution, ...) run on their side: none here.
        if block_type(tool).is_some_and(|t| t != "custom") {
            continue;
        }
        let name = tool.get("name").and_then(Json::as_str).ok_or_else(|| format!("tools[{i}].name: Field required"))?;
        let schema = match tool.get("input_schema") {
            Some(schema @ Json::Object(_)) => schema.clone(),
            _ => return Err(format!("tools[{i}].input_schema: must be a JSON schema object")),
        };
        let mut function = json!({"name": name});
        if let Some(description) = tool.get("description").filter(|d| !d.is_null()) {
            function["description"] = description.clone();
        }
        function["parameters"] = schema;
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Json::Array(out))
}

/// `tool_choice` in OpenAI's terms, and `parallel_tool_calls` when the client disabled them.
fn convert_tool_choice(choice: &Json) -> Result<(Json, Option<bool>), String> {
    let parallel = choice.get("disable_parallel_tool_use").and_then(Json::as_bool).map(|disable| !disable);
    let openai = match block_type(choice) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice.get("name").and_then(Json::as_str);
            let name = name.ok_or_else(|| "tool_choice.name: Field required for type 'tool'".to_owned())?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err("tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'".into()),
    };
    Ok((openai, parallel))
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
