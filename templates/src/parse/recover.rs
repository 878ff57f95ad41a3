//! Tool calls written without the model's framing. Small models asked to call a tool often
//! answer with the call object alone, bare or in a ```json fence, instead of inside
//! `<tool_call>` tags. Where the request declared tools (`tool_choice: "auto"`), a reply whose
//! content is nothing but such an object (or an array of them), naming a declared tool with
//! arguments that fit its parameters schema, becomes that tool call.
//!
//! Ordinary answers are never turned into calls: the content must start with `{`, `[` or a
//! ```json (or bare ```) fence and hold nothing else; the object may have only the keys a call
//! has (`name`, `arguments` or `parameters`, `type`, `id`); the name must be declared; the
//! arguments must be an object that meets the schema's `required`, `properties` types and
//! `additionalProperties: false`. While a reply could still be such a call its content is
//! held back; it is released the moment it cannot (other text, another fence language,
//! broken JSON), so prose and code stream as before.

use serde_json::Value as Json;

use super::ParseEvent;

/// A tool the request declared: its name and its JSON-schema `parameters`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredTool {
    /// The function name.
    pub name: String,
    /// The parameters schema (`{}` when none was given).
    pub parameters: Json,
}

/// The filter over a reply's events (see the module docs).
#[derive(Debug)]
pub(crate) struct BareCallRecovery {
    tools: Vec<DeclaredTool>,
    id_prefix: String,
    state: State,
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Content so far could still be a call; it is held.
    Holding(String),
    /// Decided: events pass through.
    Passing,
}

/// What the held content looks like so far.
enum Shape {
    /// It could still become a call.
    Open,
    /// It cannot be one.
    Not,
}

impl BareCallRecovery {
    pub(crate) fn new(tools: Vec<DeclaredTool>, id_prefix: String) -> Self {
        BareCallRecovery { tools, id_prefix, state: State::Holding(String::new()) }
    }

    /// Filters the events of one push; with `at_end`, decides what is still held.
    pub(crate) fn filter(&mut self, events: Vec<ParseEvent>, at_end: bool) -> Vec<ParseEvent> {
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            let State::Holding(held) = &mut self.state else {
                out.push(event);
                continue;
            };
            match event {
                ParseEvent::Content(text) => {
                    held.push_str(&text);
                    if matches!(shape(held), Shape::Not) {
                        self.release(&mut out);
                    }
                }
                // Reasoning before the answer is not the answer: it passes, the hold goes on.
                ParseEvent::Reasoning(_) => out.push(event),
                // The model framed a call itself: nothing to recover.
                other => {
                    self.release(&mut out);
                    out.push(other);
                }
            }
        }
        if at_end && let State::Holding(held) = &self.state {
            match self.calls(held) {
                Some(calls) => {
                    for (index, (name, arguments)) in calls.into_iter().enumerate() {
                        let id = format!("{}{index}", self.id_prefix);
                        out.push(ParseEvent::ToolCallStart { index, id, name });
                        out.push(ParseEvent::ToolCallArguments { index, delta: arguments });
                    }
                    self.state = State::Passing;
                }
                None => self.release(&mut out),
            }
        }
        out
    }

    fn release(&mut self, out: &mut Vec<ParseEvent>) {
        if let State::Holding(held) = std::mem::replace(&mut self.state, State::Passing)
            && !held.is_empty()
        {
            out.push(ParseEvent::Content(held));
        }
    }

    /// The calls the whole reply `text` makes, if it is nothing but calls of declared tools.
    fn calls(&self, text: &str) -> Option<Vec<(String, String)>> {
        let value: Json = serde_json::from_str(unfenced(text.trim())?).ok()?;
        let objects = match value {
            Json::Array(items) if !items.is_empty() => items,
            object @ Json::Object(_) => vec![object],
            _ => return None,
        };
        objects.iter().map(|o| self.call(o)).collect()
    }

    fn call(&self, object: &Json) -> Option<(String, String)> {
        let fields = object.as_object()?;
        if fields.keys().any(|k| !matches!(k.as_str(), "name" | "arguments" | "parameters" | "type" | "id")) {
            return None;
        }
        let name = fields.get("name")?.as_str()?;
        let tool = self.tools.iter().find(|t| t.name == name)?;
        let arguments = match fields.get("arguments").or_else(|| fields.get("parameters")) {
            None => Json::Object(Default::default()),
            Some(Json::String(text)) => serde_json::from_str(text).ok()?,
            Some(value) => value.clone(),
        };
        fits(&arguments, &tool.parameters).then(|| (name.to_owned(), arguments.to_string()))
    }
}

/// The JSON inside a ```json (or bare ```) fence that is all of `text`, or `text` itself when it
/// is not fenced.
fn unfenced(text: &str) -> Option<&str> {
    let Some(rest) = text.strip_prefix("```") else { return Some(text) };
    let (language, body) = rest.split_once('\n')?;
    if !matches!(language.trim(), "" | "json") {
        return None;
    }
    body.trim_end().strip_suffix("```").map(str::trim)
}

/// Whether held content could still be a bare call.
fn shape(held: &str) -> Shape {
    let text = held.trim_start();
    let Some(first) = text.chars().next() else { return Shape::Open };
    match first {
        '{' | '[' => json_shape(text),
        '`' => {
            if !"```".starts_with(&text[..text.len().min(3)]) {
                return Shape::Not;
            }
            let Some(rest) = text.strip_prefix("```") else { return Shape::Open };
            let Some((language, body)) = rest.split_once('\n') else {
                // The language tag is still coming: `json` or nothing may follow.
                let tag = rest.trim();
                return if "json".starts_with(tag) { Shape::Open } else { Shape::Not };
            };
            if !matches!(language.trim(), "" | "json") {
                return Shape::Not;
            }
            match body.find("```") {
                // After the closing fence only whitespace may follow.
                Some(end) if !body[end + 3..].trim().is_empty() => Shape::Not,
                Some(end) => json_shape(body[..end].trim()),
                // The closing fence may be arriving: its first backticks are not JSON.
                None => json_shape(body.trim().trim_end_matches('`')),
            }
        }
        _ => Shape::Not,
    }
}

/// Whether `text` (starting with the JSON) is a JSON value still open, or one complete value
/// with nothing after it.
fn json_shape(text: &str) -> Shape {
    if text.is_empty() {
        return Shape::Open;
    }
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Json>();
    match values.next() {
        Some(Ok(_)) if text[values.byte_offset()..].trim().is_empty() => Shape::Open,
        Some(Err(e)) if e.is_eof() => Shape::Open,
        _ => Shape::Not,
    }
}

/// Whether `value` meets the parts of a JSON schema a call's arguments are checked against:
/// the type, `required`, the declared `properties`' types, and `additionalProperties: false`.
fn fits(value: &Json, schema: &Json) -> bool {
    let Some(schema) = schema.as_object() else { return true };
    if let Some(expected) = schema.get("type")
        && !type_matches(value, expected)
    {
        return false;
    }
    let Some(object) = value.as_object() else { return true };
    let properties = schema.get("properties").and_then(Json::as_object);
    if let Some(required) = schema.get("required").and_then(Json::as_array)
        && required.iter().filter_map(Json::as_str).any(|key| !object.contains_key(key))
    {
        return false;
    }
    for (key, item) in object {
        match properties.and_then(|p| p.get(key)) {
            Some(property) => {
                if let Some(expected) = property.get("type")
                    && !type_matches(item, expected)
                {
                    return false;
                }
            }
            None if schema.get("additionalProperties") == Some(&Json::Bool(false)) => return false,
            None => {}
        }
    }
    true
}

fn type_matches(value: &Json, expected: &Json) -> bool {
    let one = |name: &str| match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => value.as_f64().is_some_and(|n| n.fract() == 0.0),
        _ => true,
    };
    match expected {
        Json::String(name) => one(name),
        Json::Array(names) => names.iter().filter_map(Json::as_str).any(one),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::parse::ParsedMessage;

    fn tools() -> Vec<DeclaredTool> {
        vec![DeclaredTool {
            name: "read".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"], "additionalProperties": false}),
        }]
    }

    /// The message a reply makes, fed in pieces of `chunk` bytes.
    fn parse(reply: &str, chunk: usize) -> (ParsedMessage, Vec<ParseEvent>) {
        let mut recovery = BareCallRecovery::new(tools(), "call_".into());
        let mut events = Vec::new();
        let chars: Vec<char> = reply.chars().collect();
        for piece in chars.chunks(chunk) {
            events.extend(recovery.filter(vec![ParseEvent::Content(piece.iter().collect())], false));
        }
        events.extend(recovery.filter(Vec::new(), true));
        (ParsedMessage::from_events(events.clone()), events)
    }

    #[test]
    fn a_bare_or_fenced_call_of_a_declared_tool_becomes_a_call() {
        let replies = [
            r#"{"name": "read", "arguments": {"path": "src/main.rs"}}"#,
            "\n```json\n{\"name\": \"read\", \"arguments\": {\"path\": \"src/main.rs\"}}\n```\n",
            "```\n{\"name\": \"read\", \"parameters\": {\"path\": \"src/main.rs\"}}\n```",
            r#"{"name": "read", "arguments": "{\"path\": \"src/main.rs\"}"}"#,
            r#"[{"type": "function", "name": "read", "arguments": {"path": "src/main.rs"}}]"#,
        ];
        for reply in replies {
            for chunk in [1, 3, 1000] {
                let (message, _) = parse(reply, chunk);
                assert_eq!(message.content, "", "{reply:?}");
                assert_eq!(message.tool_calls.len(), 1, "{reply:?}");
                assert_eq!(message.tool_calls[0].name, "read");
                assert_eq!(message.tool_calls[0].id, "call_0");
                assert_eq!(message.tool_calls[0].arguments, r#"{"path":"src/main.rs"}"#);
            }
        }
    }

    #[test]
    fn prose_code_and_other_json_stay_content() {
        let replies = [
            "To read it, call {\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}.",
            "{\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}\nThat reads the file.",
            "```python\nprint({\"name\": \"read\"})\n```",
            "```json\n{\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}\n```\nDone.",
            r#"{"name": "write", "arguments": {"path": "a"}}"#,
            r#"{"name": "read", "arguments": {"limit": 3}}"#,
            r#"{"name": "read", "arguments": {"path": "a", "mode": "x"}}"#,
            r#"{"name": "read", "arguments": {"path": 7}}"#,
            r#"{"name": "read", "age": 41}"#,
            r#"{"name": "read", "arguments": {"path": "a"}"#,
            "[1, 2, 3]",
            "",
        ];
        for reply in replies {
            let (message, _) = parse(reply, 2);
            assert!(message.tool_calls.is_empty(), "{reply:?}");
            assert_eq!(message.content, reply, "nothing is lost");
        }
    }

    #[test]
    fn content_is_released_as_soon_as_it_cannot_be_a_call() {
        let mut recovery = BareCallRecovery::new(tools(), "call_".into());
        let events = recovery.filter(vec![ParseEvent::Content("Sure".into())], false);
        assert_eq!(events, vec![ParseEvent::Content("Sure".into())], "prose streams at once");
        let mut recovery = BareCallRecovery::new(tools(), "call_".into());
        assert!(recovery.filter(vec![ParseEvent::Content("```js".into())], false).is_empty(), "`js` may be `json`");
        assert_eq!(recovery.filter(vec![ParseEvent::Content("x\n".into())], false).len(), 1, "```jsx is not");
        let mut recovery = BareCallRecovery::new(tools(), "call_".into());
        assert!(recovery.filter(vec![ParseEvent::Content("{\"name\"".into())], false).is_empty());
        assert_eq!(recovery.filter(vec![ParseEvent::Content(": 5} and".into())], false).len(), 1);
    }

    #[test]
    fn reasoning_passes_and_framed_calls_end_the_hold() {
        let mut recovery = BareCallRecovery::new(tools(), "call_".into());
        let thinking = ParseEvent::Reasoning("I should read it.".into());
        assert_eq!(recovery.filter(vec![thinking.clone()], false), vec![thinking]);
        let start = ParseEvent::ToolCallStart { index: 0, id: "call_0".into(), name: "read".into() };
        let out = recovery.filter(vec![ParseEvent::Content("\n".into()), start.clone()], false);
        assert_eq!(out, vec![ParseEvent::Content("\n".into()), start]);
    }
}
