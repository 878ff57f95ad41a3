//! Property tests of output parsing: chunking independence, no partial markers, no panics.

mod parse_common;

use parse_common::*;
use proptest::prelude::*;
use proptest::sample::Index;
use radix_templates::parse::{OutputFormat, ParseEvent, ParsedMessage, ParserOptions, StreamingParser};
use radix_templates::testing::parse_complete;

/// Random cut positions (byte offsets, moved to char boundaries by `split_at`).
fn cuts() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..12)
}

fn split<'a>(text: &'a str, cuts: &[Index]) -> Vec<&'a str> {
    let offsets: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
    split_at(text, &offsets)
}

const FORMATS: [OutputFormat; 4] =
    [OutputFormat::Hermes, OutputFormat::QwenXml, OutputFormat::Llama3Json, OutputFormat::Plain];

fn any_opts() -> impl Strategy<Value = ParserOptions> {
    (prop::sample::select(FORMATS.to_vec()), any::<bool>(), any::<bool>())
        .prop_map(|(format, tools, reasoning)| opts(format, tools, reasoning))
}

/// Text built from marker fragments, JSON punctuation, call skeletons and prose.
fn fragment_text() -> impl Strategy<Value = String> {
    const FRAGMENTS: &[&str] = &[
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "<",
        "</",
        "<t",
        "<th",
        "<thin",
        "</thi",
        "<tool",
        "<tool_c",
        "</tool_call",
        "<|py",
        "<|python_tag|",
        "<function=",
        "<function=f>",
        "</function>",
        "<parameter=",
        "<parameter=a>",
        "</parameter>",
        "<func",
        "</param",
        "</funct",
        "\nTrue\n",
        "None",
        ">",
        "{",
        "}",
        "[",
        "]",
        "\"",
        "\\",
        "\\\"",
        ":",
        ",",
        ";",
        " ",
        "\n",
        "\n\n",
        "\t",
        "{\"name\": \"f\", \"arguments\": ",
        "{\"name\": \"get_weather\", \"parameters\": {",
        "{\"arguments\": {\"a\": 1}, \"name\": \"g\"}",
        "\"name\"",
        "\"arguments\"",
        "\"parameters\"",
        ": \"x\"",
        "{\"a\": [1, {\"b\": \"}\"}]}",
        "true",
        "null",
        "-1.5e3",
        "hello",
        "The answer is",
        "用户",
        "天气☀️",
        "👍🏽",
        "é",
        "\u{0}",
        "\r\n",
    ];
    prop::collection::vec(prop::sample::select(FRAGMENTS), 0..40).prop_map(|v| v.concat())
}

/// A JSON value with strings that contain brackets, quotes, escapes and markers.
fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(vec![
        "1",
        "-2.5e3",
        "true",
        "null",
        "\"x\"",
        "\"}\"",
        "\"]\"",
        "\"\\\"\"",
        "\"</tool_call>\"",
        "\"<think>\"",
        "\"<|python_tag|>\"",
        "\"\\\\\"",
        "\"用户☀️\"",
        "\"\"",
    ])
    .prop_map(str::to_owned);
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec(("[a-z_]{1,6}", inner), 0..4).prop_map(|v| {
                let fields: Vec<String> = v.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
                format!("{{{}}}", fields.join(", "))
            }),
        ]
    })
}

fn json_object() -> impl Strategy<Value = String> {
    prop::collection::vec(("[a-z_]{1,6}", json_value()), 0..4).prop_map(|v| {
        let fields: Vec<String> = v.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
        format!("{{{}}}", fields.join(", "))
    })
}

/// Replies built from realistic pieces (prose, reasoning blocks, valid Hermes and Llama 3
/// calls, separators, marker fragments), optionally cut off at a random point.
fn structured_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z ,.!?用户☀️]{1,12}",
        "[a-z ]{0,10}".prop_map(|r| format!("<think>\n{r}\n</think>\n\n")),
        ("[a-z_]{1,8}", json_value()).prop_map(|(name, args)| {
            format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>\n")
        }),
        ("[a-z_]{1,8}", json_object())
            .prop_map(|(name, args)| { format!("<|python_tag|>{{\"name\": \"{name}\", \"parameters\": {args}}}") }),
        ("[a-z_]{1,8}", prop::collection::vec(("[a-z_]{1,6}", xml_value()), 0..4)).prop_map(|(name, params)| {
            let params: String = params.iter().map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n")).collect();
            format!("<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        }),
        ("[a-z_]{1,8}", json_object())
            .prop_map(|(name, args)| { format!("{{\"name\": \"{name}\", \"parameters\": {args}}}; ") }),
        prop::sample::select(vec![
            " ",
            "\n",
            ";",
            "<",
            "</",
            "<tool_c",
            "</think",
            "<|python",
            "{",
            "}",
            "\"",
            "<function=",
            "<parameter=",
            "</parameter>",
            "</function>",
        ])
        .prop_map(str::to_owned),
    ];
    (prop::collection::vec(piece, 0..6), any::<Index>(), any::<bool>()).prop_map(|(pieces, cut, do_cut)| {
        let text = pieces.concat();
        if do_cut { split(&text, &[cut])[0].to_owned() } else { text }
    })
}

/// A Qwen XML parameter value as the template writes one: a string verbatim, other values as
/// JSON (what `tojson` and Python's `str()` write, near enough for parsing).
fn xml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        json_value(),
        "[a-zA-Z <>/=\n\"{}☀️]{0,16}",
        prop::sample::select(vec!["True", "None", "</think>", "<tool_call>", "a </parameter", ""])
            .prop_map(str::to_owned),
    ]
}

/// Streams `text` in `chunks` and checks it against `parse_complete` and the marker rules.
fn check_stream(o: &ParserOptions, text: &str, chunks: &[&str]) -> Result<ParsedMessage, TestCaseError> {
    let events = stream(o, chunks.iter().copied());
    check_marker_invariants(&events, markers_of(o.format)).map_err(TestCaseError::fail)?;
    let streamed = ParsedMessage::from_events(events);
    let whole = parse_complete(o, text);
    prop_assert_eq!(&streamed, &whole, "chunks {:?}", chunks);
    // Nothing is invented: every call's arguments are a substring of the reply (or "{}"); Qwen
    // XML calls build theirs, always one JSON object.
    for call in &whole.tool_calls {
        let built = o.format == OutputFormat::QwenXml
            && serde_json::from_str::<serde_json::Value>(&call.arguments).is_ok_and(|v| v.is_object());
        let invented = call.arguments != "{}" && !text.contains(&call.arguments) && !built;
        prop_assert!(!invented, "arguments {:?} not in the reply", call.arguments);
        prop_assert!(call.id.starts_with(&o.tool_call_id_prefix));
    }
    if !o.tools_enabled {
        prop_assert!(whole.tool_calls.is_empty());
    }
    Ok(whole)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn fixtures_any_chunking(which in any::<Index>(), cuts in cuts()) {
        let all = fixtures();
        let f = &all[which.index(all.len())];
        let chunks = split(f.text, &cuts);
        let got = check_stream(&f.opts, f.text, &chunks)?;
        prop_assert_eq!(got, f.expected.clone(), "fixture {}", f.name);
    }

    #[test]
    fn fragments_any_chunking(o in any_opts(), text in fragment_text(), cuts in cuts()) {
        check_stream(&o, &text, &split(&text, &cuts))?;
    }

    #[test]
    fn structured_any_chunking(o in any_opts(), text in structured_text(), cuts in cuts()) {
        check_stream(&o, &text, &split(&text, &cuts))?;
    }

    #[test]
    fn structured_one_char_at_a_time(o in any_opts(), text in structured_text()) {
        check_stream(&o, &text, &char_chunks(&text))?;
    }

    #[test]
    fn fragments_one_char_at_a_time(o in any_opts(), text in fragment_text()) {
        check_stream(&o, &text, &char_chunks(&text))?;
    }

    #[test]
    fn arbitrary_strings_any_chunking(o in any_opts(), text in any::<String>(), cuts in cuts()) {
        check_stream(&o, &text, &split(&text, &cuts))?;
    }

    #[test]
    fn arbitrary_id_prefix(prefix in any::<String>(), text in fragment_text()) {
        let o = ParserOptions { tool_call_id_prefix: prefix.clone(), ..hermes() };
        let m = parse_complete(&o, &text);
        for (i, call) in m.tool_calls.iter().enumerate() {
            prop_assert_eq!(&call.id, &format!("{prefix}{i}"));
        }
    }

    /// Text that cannot hold a marker is emitted by the push that delivers it.
    #[test]
    fn markerless_text_is_not_held_back(
        format in prop::sample::select(FORMATS.to_vec()),
        text in "[a-zA-Z0-9àé用☀️.,!?()\\[\\]{}:\"\n ]{0,60}",
        cuts in cuts(),
    ) {
        // The first character is not whitespace (leading whitespace may wait) and not `{`
        // (a Llama 3 call may start there).
        let text = format!("x{text}");
        let o = opts(format, true, false);
        let mut parser = StreamingParser::new(o);
        let mut sent = String::new();
        let mut got = String::new();
        for chunk in split(&text, &cuts) {
            sent.push_str(chunk);
            for e in parser.push(chunk) {
                match e {
                    ParseEvent::Content(t) => got.push_str(&t),
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
            prop_assert_eq!(&got, &sent);
        }
        prop_assert!(parser.finish().is_empty());
    }

    /// A valid call's arguments are streamed as they arrive, not at the end.
    #[test]
    fn hermes_arguments_stream_incrementally(
        value in "[a-z ]{0,20}",
        cuts in cuts(),
    ) {
        let args = format!("{{\"text\": \"{value}\", \"n\": [1, 2]}}");
        let text = format!("<tool_call>\n{{\"name\": \"echo\", \"arguments\": {args}}}\n</tool_call>");
        let prefix_len = text.find(&args).unwrap();
        let mut parser = StreamingParser::new(hermes());
        let mut sent = 0;
        let mut streamed = String::new();
        for chunk in split(&text, &cuts) {
            sent += chunk.len();
            for e in parser.push(chunk) {
                if let ParseEvent::ToolCallArguments { delta, .. } = e {
                    streamed.push_str(&delta);
                }
            }
            // Everything of the arguments that was pushed has been emitted.
            let expected_len = sent.saturating_sub(prefix_len).min(args.len());
            prop_assert_eq!(&streamed, &args[..expected_len]);
        }
    }
}
