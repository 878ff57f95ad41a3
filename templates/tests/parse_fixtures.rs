//! Output parsing on realistic replies, whole and streamed.

mod parse_common;

use parse_common::*;
use radix_templates::parse::{OutputFormat, ParseEvent, ParsedMessage, ParserOptions, StreamingParser};
use radix_templates::testing::parse_complete;

#[test]
fn fixtures_parse_as_expected() {
    let mut failures = Vec::new();
    for f in fixtures() {
        let got = parse_complete(&f.opts, f.text);
        if got != f.expected {
            failures.push(format!("{}:\n  got      {:?}\n  expected {:?}", f.name, got, f.expected));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn fixtures_stream_char_by_char() {
    for f in fixtures() {
        let events = stream(&f.opts, char_chunks(f.text));
        check_marker_invariants(&events, markers_of(f.opts.format)).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(ParsedMessage::from_events(events), f.expected, "{}", f.name);
    }
}

#[test]
fn there_are_enough_fixtures() {
    assert!(fixtures().len() >= 60);
    let xml = fixtures().iter().filter(|f| f.opts.format == OutputFormat::QwenXml).count();
    assert!(xml >= 20, "{xml} Qwen XML fixtures");
}

#[test]
fn content_streams_promptly() {
    let mut p = StreamingParser::new(hermes());
    assert_eq!(p.push("Hello wor"), vec![ParseEvent::Content("Hello wor".into())]);
    assert_eq!(p.push("ld <tool"), vec![ParseEvent::Content("ld ".into())]);
    assert_eq!(p.push("box> x"), vec![ParseEvent::Content("<toolbox> x".into())]);
    assert_eq!(p.push(" <"), vec![ParseEvent::Content(" ".into())]);
    assert_eq!(p.finish(), vec![ParseEvent::Content("<".into())]);
    assert!(p.finish().is_empty());
    assert!(p.push("ignored").is_empty());
}

#[test]
fn llama3_plain_text_streams_promptly() {
    let mut p = StreamingParser::new(llama3());
    assert!(p.push("  ").is_empty(), "leading whitespace waits for the first character");
    assert_eq!(p.push("Hi {"), vec![ParseEvent::Content("  Hi {".into())]);
    assert_eq!(p.push("x} <|py"), vec![ParseEvent::Content("x} ".into())]);
    assert_eq!(p.push("thon"), vec![]);
    assert_eq!(p.finish(), vec![ParseEvent::Content("<|python".into())]);
}

#[test]
fn reasoning_streams_and_holds_only_trailing_newlines() {
    let mut p = StreamingParser::new(hermes());
    assert!(p.push("<thi").is_empty());
    assert_eq!(p.push("nk>\nStep one.\n"), vec![ParseEvent::Reasoning("Step one.".into())]);
    assert_eq!(p.push("Step two.\n\n</th"), vec![ParseEvent::Reasoning("\nStep two.".into())]);
    assert!(p.push("ink>\n\n").is_empty());
    assert_eq!(p.push("Answer"), vec![ParseEvent::Content("Answer".into())]);
    assert!(p.finish().is_empty());
}

#[test]
fn tool_call_name_first_then_argument_deltas() {
    let mut p = StreamingParser::new(ParserOptions { tool_call_id_prefix: "chatcmpl-7-".into(), ..hermes() });
    assert_eq!(p.push("Checking.\n<tool_call>\n{\"name\": \"get_"), vec![ParseEvent::Content("Checking.\n".into())]);
    assert_eq!(
        p.push("weather\", \"arguments\": {\"city\": \"Par"),
        vec![
            ParseEvent::ToolCallStart { index: 0, id: "chatcmpl-7-0".into(), name: "get_weather".into() },
            ParseEvent::ToolCallArguments { index: 0, delta: "{\"city\": \"Par".into() },
        ]
    );
    assert_eq!(p.push("is\"}}\n</tool_"), vec![ParseEvent::ToolCallArguments { index: 0, delta: "is\"}".into() }]);
    assert!(p.push("call>\n<tool_call>{\"arguments\": [1,").is_empty(), "arguments before the name wait for it");
    assert_eq!(
        p.push(" 2], \"name\": \"g\"}</tool_call>"),
        vec![
            ParseEvent::ToolCallStart { index: 1, id: "chatcmpl-7-1".into(), name: "g".into() },
            ParseEvent::ToolCallArguments { index: 1, delta: "[1, 2]".into() },
        ]
    );
    assert!(p.finish().is_empty());
}

#[test]
fn malformed_call_text_keeps_markers_at_event_starts() {
    let events = stream(&hermes(), ["Hi <tool_call>{\"x\": \"</think>\"", ", 1] </tool_call>"]);
    assert_eq!(
        events,
        vec![
            ParseEvent::Content("Hi ".into()),
            ParseEvent::Content("<tool_call>{\"x\": \"".into()),
            ParseEvent::Content("</think>\", 1] ".into()),
            ParseEvent::Content("</tool_call>".into()),
        ]
    );
}

#[test]
fn starts_in_reasoning_is_ignored_by_other_formats() {
    let o = opts(OutputFormat::Llama3Json, true, true);
    assert_eq!(parse_complete(&o, "a</think>b"), msg("a</think>b", None, &[]));
    let o = opts(OutputFormat::Plain, true, true);
    assert_eq!(parse_complete(&o, "a</think>b"), msg("a</think>b", None, &[]));
}

#[test]
fn empty_reply() {
    for format in [OutputFormat::Hermes, OutputFormat::QwenXml, OutputFormat::Llama3Json, OutputFormat::Plain] {
        for reasoning in [false, true] {
            let o = opts(format, true, reasoning);
            assert_eq!(parse_complete(&o, ""), ParsedMessage::default());
            assert!(stream(&o, ["", ""]).is_empty());
        }
    }
}

#[test]
fn from_events_tolerates_odd_sequences() {
    let m = ParsedMessage::from_events([
        ParseEvent::ToolCallArguments { index: 5, delta: "{".into() },
        ParseEvent::Reasoning(String::new()),
        ParseEvent::ToolCallStart { index: usize::MAX, id: "x".into(), name: "n".into() },
    ]);
    assert_eq!(m.tool_calls.len(), 2);
    assert_eq!(m.reasoning_content.as_deref(), Some(""));
}

#[test]
fn options_defaults_and_serialization() {
    let o = ParserOptions::new(OutputFormat::Hermes);
    assert!(o.tools_enabled && !o.starts_in_reasoning);
    assert_eq!(o.tool_call_id_prefix, "call_");
    assert_eq!(ParserOptions::default().format, OutputFormat::Plain);
    let m = parse_complete(&o, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
    assert_eq!(
        serde_json::to_value(&m).unwrap(),
        serde_json::json!({
            "content": "",
            "reasoning_content": null,
            "tool_calls": [{"id": "call_0", "name": "f", "arguments": "{\"a\": 1}"}],
        })
    );
}
