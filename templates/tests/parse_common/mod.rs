//! Shared fixtures and helpers for the `parse_*` tests.

#![allow(dead_code)]

mod qwen_xml;

use radix_templates::parse::{OutputFormat, ParseEvent, ParsedMessage, ParserOptions, StreamingParser, ToolCall};

pub const HERMES_MARKERS: &[&str] = &["<think>", "</think>", "<tool_call>", "</tool_call>"];
pub const LLAMA3_MARKERS: &[&str] = &["<|python_tag|>"];

pub fn markers_of(format: OutputFormat) -> &'static [&'static str] {
    match format {
        OutputFormat::Hermes | OutputFormat::QwenXml => HERMES_MARKERS,
        OutputFormat::Llama3Json => LLAMA3_MARKERS,
        OutputFormat::Plain => &[],
    }
}

pub fn opts(format: OutputFormat, tools: bool, in_reasoning: bool) -> ParserOptions {
    ParserOptions {
        format,
        starts_in_reasoning: in_reasoning,
        tool_call_id_prefix: "call_".to_owned(),
        tools_enabled: tools,
        declared_tools: Vec::new(),
    }
}

pub fn hermes() -> ParserOptions {
    opts(OutputFormat::Hermes, true, false)
}

pub fn llama3() -> ParserOptions {
    opts(OutputFormat::Llama3Json, true, false)
}

pub fn qwen_xml() -> ParserOptions {
    opts(OutputFormat::QwenXml, true, false)
}

/// The expected message; calls get ids `call_0`, `call_1`, ...
pub fn msg(content: &str, reasoning: Option<&str>, calls: &[(&str, &str)]) -> ParsedMessage {
    ParsedMessage {
        content: content.to_owned(),
        reasoning_content: reasoning.map(str::to_owned),
        tool_calls: calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| ToolCall {
                id: format!("call_{i}"),
                name: (*name).to_owned(),
                arguments: (*args).to_owned(),
            })
            .collect(),
    }
}

/// Pushes `chunks` then finishes; returns all events.
pub fn stream<'a>(opts: &ParserOptions, chunks: impl IntoIterator<Item = &'a str>) -> Vec<ParseEvent> {
    let mut parser = StreamingParser::new(opts.clone());
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(parser.push(chunk));
    }
    events.extend(parser.finish());
    events
}

/// Splits `text` at the given byte offsets, moved down to char boundaries.
pub fn split_at<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut cuts: Vec<usize> = cuts
        .iter()
        .map(|&c| {
            let mut c = c.min(text.len());
            while !text.is_char_boundary(c) {
                c -= 1;
            }
            c
        })
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut start = 0;
    for c in cuts {
        pieces.push(&text[start..c]);
        start = c;
    }
    pieces.push(&text[start..]);
    pieces
}

/// Every character as its own chunk.
pub fn char_chunks(text: &str) -> Vec<&str> {
    text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect()
}

/// Marker invariants of an event sequence:
/// 1. a text event contains a marker only at its very start (markers that end up as text
///    start their own event, and no event hides a marker after other text);
/// 2. in the content stream and in the reasoning stream, no marker occurrence spans two
///    events (no partial marker was ever emitted);
/// 3. no event is empty.
pub fn check_marker_invariants(events: &[ParseEvent], markers: &[&str]) -> Result<(), String> {
    for kind in ["content", "reasoning"] {
        let texts: Vec<&str> = events
            .iter()
            .filter_map(|e| match (kind, e) {
                ("content", ParseEvent::Content(t)) | ("reasoning", ParseEvent::Reasoning(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        let mut starts = Vec::new();
        let mut all = String::new();
        for t in &texts {
            if t.is_empty() {
                return Err(format!("empty {kind} event"));
            }
            for m in markers {
                if let Some((pos, _)) = t.match_indices(m).find(|(p, _)| *p > 0) {
                    return Err(format!("{kind} event {t:?} holds marker {m:?} at {pos}"));
                }
            }
            starts.push(all.len());
            all.push_str(t);
        }
        starts.push(all.len());
        for m in markers {
            for (pos, _) in all.match_indices(m) {
                let end = pos + m.len();
                if starts.iter().any(|&s| s > pos && s < end) {
                    return Err(format!("{kind} marker {m:?} at {pos} split across events: {texts:?}"));
                }
            }
        }
    }
    for e in events {
        if let ParseEvent::ToolCallArguments { delta, .. } = e
            && delta.is_empty()
        {
            return Err("empty argument delta".to_owned());
        }
    }
    Ok(())
}

/// A realistic reply with the options to parse it and the expected result.
pub struct Fixture {
    pub name: &'static str,
    pub opts: ParserOptions,
    pub text: &'static str,
    pub expected: ParsedMessage,
}

pub(crate) fn fx(name: &'static str, opts: ParserOptions, text: &'static str, expected: ParsedMessage) -> Fixture {
    Fixture { name, opts, text, expected }
}

pub(crate) const WEATHER: &str = r#"{"city": "Paris", "unit": "celsius"}"#;

/// Every fixture: Hermes, Llama 3 and plain here, Qwen XML in [`qwen_xml`].
pub fn fixtures() -> Vec<Fixture> {
    let mut all = base_fixtures();
    all.extend(qwen_xml::fixtures());
    all
}

fn base_fixtures() -> Vec<Fixture> {
    let reasoning = opts(OutputFormat::Hermes, true, true);
    let no_tools = opts(OutputFormat::Hermes, false, false);
    let plain = opts(OutputFormat::Plain, true, true);
    let llama3_no_tools = opts(OutputFormat::Llama3Json, false, false);
    vec![
        fx(
            "plain text",
            hermes(),
            "Hello! How can I help you today?",
            msg("Hello! How can I help you today?", None, &[]),
        ),
        fx(
            "think then answer",
            hermes(),
            "<think>\nThe user greets me.\nI should greet back.\n</think>\n\nHello there!",
            msg("Hello there!", Some("The user greets me.\nI should greet back."), &[]),
        ),
        fx(
            "starts in reasoning",
            reasoning.clone(),
            "Let me compute 2+2.\nThat is 4.\n</think>\n\nThe answer is **4**.",
            msg("The answer is **4**.", Some("Let me compute 2+2.\nThat is 4."), &[]),
        ),
        fx(
            "starts in reasoning, cut off",
            reasoning.clone(),
            "\nThinking about it...\n\n",
            msg("", Some("Thinking about it..."), &[]),
        ),
        fx(
            "starts in reasoning, repeated <think>",
            reasoning.clone(),
            "<think>\nHmm.\n</think>\nOk.",
            msg("Ok.", Some("Hmm."), &[]),
        ),
        fx(
            "one call",
            hermes(),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            msg("", None, &[("get_weather", WEATHER)]),
        ),
        fx(
            "three calls",
            hermes(),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"Louvre hours\", \"limit\": 3}}\n</tool_call>\n",
            msg(
                "",
                None,
                &[
                    ("get_weather", WEATHER),
                    ("get_time", r#"{"tz": "Europe/Paris"}"#),
                    ("search", r#"{"q": "Louvre hours", "limit": 3}"#),
                ],
            ),
        ),
        fx(
            "content then call",
            hermes(),
            "I'll look that up for you.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            msg("I'll look that up for you.\n", None, &[("get_weather", WEATHER)]),
        ),
        fx(
            "qwen3 think then call",
            hermes(),
            "<think>\nThe user wants the weather, I need the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            msg("", Some("The user wants the weather, I need the tool."), &[("get_weather", WEATHER)]),
        ),
        fx(
            "nasty strings in arguments",
            hermes(),
            "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a}b.txt\", \"content\": \"say \\\"hi\\\" </tool_call> {[ \\\\\", \"nested\": {\"list\": [1, [2, {\"x\": \"]\"}]], \"empty\": {}}}}\n</tool_call>",
            msg(
                "",
                None,
                &[(
                    "write_file",
                    "{\"path\": \"a}b.txt\", \"content\": \"say \\\"hi\\\" </tool_call> {[ \\\\\", \"nested\": {\"list\": [1, [2, {\"x\": \"]\"}]], \"empty\": {}}}",
                )],
            ),
        ),
        fx(
            "arguments as a JSON string",
            hermes(),
            "<tool_call>\n{\"name\": \"run\", \"arguments\": \"{\\\"cmd\\\": \\\"ls -la\\\"}\"}\n</tool_call>",
            msg("", None, &[("run", "\"{\\\"cmd\\\": \\\"ls -la\\\"}\"")]),
        ),
        fx(
            "arguments before name, escaped name",
            hermes(),
            "<tool_call>\n{\"arguments\": {\"q\": \"rust\"}, \"name\": \"web_search\\u0021\"}\n</tool_call>",
            msg("", None, &[("web_search!", r#"{"q": "rust"}"#)]),
        ),
        fx(
            "parameters key and extra keys",
            hermes(),
            "<tool_call>\n{\"type\": \"function\", \"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": -2.5e1}}\n</tool_call>",
            msg("", None, &[("add", r#"{"a": 1, "b": -2.5e1}"#)]),
        ),
        fx(
            "call without arguments",
            hermes(),
            "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>",
            msg("", None, &[("get_time", "{}")]),
        ),
        fx(
            "malformed: not json",
            hermes(),
            "Sure.<tool_call>not json</tool_call>",
            msg("Sure.<tool_call>not json</tool_call>", None, &[]),
        ),
        fx(
            "malformed: missing name",
            hermes(),
            "<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>",
            msg("<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>", None, &[]),
        ),
        fx(
            "malformed: name not a string",
            hermes(),
            "Result:\n<tool_call>{\"name\": 42, \"arguments\": {}}</tool_call>",
            msg("Result:\n<tool_call>{\"name\": 42, \"arguments\": {}}</tool_call>", None, &[]),
        ),
        fx(
            "malformed call then a good one",
            hermes(),
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\noops\n</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {\"k\": [true, null]}}</tool_call>",
            msg("\n<tool_call>\noops\n</tool_call>", None, &[("a", "{}"), ("b", r#"{"k": [true, null]}"#)]),
        ),
        fx(
            "unterminated call at the end keeps arguments",
            hermes(),
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust pars",
            msg("", None, &[("search", "{\"query\": \"rust pars")]),
        ),
        fx(
            "unterminated before the name is content",
            hermes(),
            "Let me check. <tool_call>\n{\"na",
            msg("Let me check. <tool_call>\n{\"na", None, &[]),
        ),
        fx(
            "broken after commitment: missing brace",
            hermes(),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>",
            msg("", None, &[("f", r#"{"a": 1}"#)]),
        ),
        fx(
            "broken after commitment: arguments cut by </tool_call>",
            hermes(),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2</tool_call>\nDone",
            msg("\nDone", None, &[("f", "{\"a\": [1, 2")]),
        ),
        fx(
            "junk after a call is content",
            hermes(),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}}\n</tool_call>",
            msg("}\n</tool_call>", None, &[("f", "{}")]),
        ),
        fx(
            "unicode content and reasoning",
            hermes(),
            "<think>\n用户在问天气。🤔\n</think>\n\n今天北京晴，气温 25°C ☀️。Ünïcödé 👍🏽 <tool_call>\n{\"name\": \"記録\", \"arguments\": {\"メモ\": \"晴れ☀️\"}}\n</tool_call>",
            msg(
                "今天北京晴，气温 25°C ☀️。Ünïcödé 👍🏽 ",
                Some("用户在问天气。🤔"),
                &[("記録", r#"{"メモ": "晴れ☀️"}"#)],
            ),
        ),
        fx(
            "tools disabled",
            no_tools,
            "Use <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> to call.",
            msg("Use <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> to call.", None, &[]),
        ),
        fx(
            "literal think tags in an answer",
            hermes(),
            "The tag </think> closes reasoning; <think> opens it. <thinking> is not a tag.",
            msg("The tag </think> closes reasoning; <think> opens it. <thinking> is not a tag.", None, &[]),
        ),
        fx("empty reasoning", hermes(), "<think>\n\n</think>\n\nHi", msg("Hi", None, &[])),
        fx("whitespace before <think>", hermes(), "\n\n<think>\nr\n</think>\nA", msg("A", Some("r"), &[])),
        fx(
            "markers inside reasoning are reasoning",
            hermes(),
            "<think>\nI could emit <tool_call> here.\n\n</think>Ok",
            msg("Ok", Some("I could emit <tool_call> here."), &[]),
        ),
        fx(
            "only newlines are stripped after </think>",
            hermes(),
            "<think>r</think> \n\nA",
            msg(" \n\nA", Some("r"), &[]),
        ),
        fx("leading newlines kept", hermes(), "\n\nHello", msg("\n\nHello", None, &[])),
        fx("html is content", hermes(), "a < b and <b>bold</b> <", msg("a < b and <b>bold</b> <", None, &[])),
        fx(
            "llama3 python_tag",
            llama3(),
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"San Francisco, CA\"}}",
            msg("", None, &[("get_weather", r#"{"location": "San Francisco, CA"}"#)]),
        ),
        fx(
            "llama3 bare json",
            llama3(),
            "\n{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Tokyo\"}}",
            msg("", None, &[("get_weather", r#"{"location": "Tokyo"}"#)]),
        ),
        fx(
            "llama3 semicolons",
            llama3(),
            "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {\"y\": [1, \"}\"]}};<|python_tag|>{\"name\": \"c\", \"parameters\": {}};",
            msg("", None, &[("a", r#"{"x": 1}"#), ("b", r#"{"y": [1, "}"]}"#), ("c", "{}")]),
        ),
        fx(
            "llama3 plain text",
            llama3(),
            "The capital of France is Paris.",
            msg("The capital of France is Paris.", None, &[]),
        ),
        fx(
            "llama3 json answer that is not a call",
            llama3(),
            "{\"name\": \"John\", \"age\": 30}\nThat is the record.",
            msg("{\"name\": \"John\", \"age\": 30}\nThat is the record.", None, &[]),
        ),
        fx(
            "llama3 text starting with a brace",
            llama3(),
            "{Hello} world, {\"name\": \"x\"}",
            msg("{Hello} world, {\"name\": \"x\"}", None, &[]),
        ),
        fx(
            "llama3 content then python_tag",
            llama3(),
            "Let me check.<|python_tag|>{\"name\": \"lookup\", \"parameters\": {\"id\": 7}}",
            msg("Let me check.", None, &[("lookup", r#"{"id": 7}"#)]),
        ),
        fx(
            "llama3 text after a call",
            llama3(),
            "{\"name\": \"a\", \"parameters\": {}} and then some",
            msg(" and then some", None, &[("a", "{}")]),
        ),
        fx(
            "llama3 python code after the tag",
            llama3(),
            "<|python_tag|>print(\"hi\")",
            msg("<|python_tag|>print(\"hi\")", None, &[]),
        ),
        fx(
            "llama3 tools disabled",
            llama3_no_tools,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
            msg("<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", None, &[]),
        ),
        fx(
            "llama3 second object invalid",
            llama3(),
            "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": [1]}",
            msg("; {\"name\": \"b\", \"parameters\": [1]}", None, &[("a", "{}")]),
        ),
        fx(
            "plain keeps markers",
            plain,
            "<think>x</think><tool_call>{}</tool_call><|python_tag|>",
            msg("<think>x</think><tool_call>{}</tool_call><|python_tag|>", None, &[]),
        ),
    ]
}
