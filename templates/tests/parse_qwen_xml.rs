//! Qwen3.5's XML tool calls: found from the real template, streamed at every split, typed from
//! the declared tools' schemas, and read back from what the template itself renders.

mod common;
mod parse_common;

use std::sync::OnceLock;

use parse_common::*;
use proptest::prelude::*;
use proptest::sample::Index;
use radix_templates::parse::{DeclaredTool, OutputFormat, ParseEvent, ParsedMessage, ParserOptions, StreamingParser};
use radix_templates::testing::parse_complete;
use radix_templates::{ChatTemplate, ModelFormat, RenderInput, TemplateSource};
use serde_json::{Value as Json, json};

fn qwen35_source() -> TemplateSource {
    TemplateSource::from_path(&common::asset_path("qwen35_template")).expect("the Qwen3.5 template loads")
}

fn qwen35() -> &'static ChatTemplate {
    static TEMPLATE: OnceLock<ChatTemplate> = OnceLock::new();
    TEMPLATE.get_or_init(|| ChatTemplate::new(qwen35_source()).expect("the Qwen3.5 template compiles"))
}

fn with_tools(tools: Vec<DeclaredTool>) -> ParserOptions {
    ParserOptions { declared_tools: tools, ..qwen_xml() }
}

fn args_of(message: &ParsedMessage) -> Vec<Json> {
    message.tool_calls.iter().map(|c| serde_json::from_str(&c.arguments).expect("arguments are JSON")).collect()
}

#[test]
fn the_real_template_selects_the_xml_parser_and_opens_reasoning() {
    let format = ModelFormat::from_source(&qwen35_source());
    assert_eq!(format.output, OutputFormat::QwenXml);
    let qwen3 = TemplateSource::from_path(&common::asset_path("qwen3").join("tokenizer_config.json")).unwrap();
    assert_eq!(ModelFormat::from_source(&qwen3).output, OutputFormat::Hermes, "Qwen3 stays Hermes");

    let prompt = |kwargs: Json| {
        qwen35()
            .render(&RenderInput {
                messages: vec![json!({"role": "user", "content": "Hi"})],
                add_generation_prompt: true,
                kwargs: kwargs.as_object().unwrap().clone(),
                ..Default::default()
            })
            .unwrap()
    };
    let thinking = format.parser_options(&prompt(json!({})), "call_".into(), true, Vec::new());
    assert!(thinking.starts_in_reasoning && thinking.format == OutputFormat::QwenXml);
    let quiet = format.parser_options(&prompt(json!({"enable_thinking": false})), "call_".into(), true, Vec::new());
    assert!(!quiet.starts_in_reasoning);
    assert!(format.tool_call_framing().is_some(), "forced calls go inside Hermes' tags");
}

#[test]
fn every_xml_fixture_streams_the_same_at_every_split() {
    for f in fixtures().into_iter().filter(|f| f.opts.format == OutputFormat::QwenXml) {
        for cut in 0..=f.text.len() {
            if !f.text.is_char_boundary(cut) {
                continue;
            }
            let events = stream(&f.opts, [&f.text[..cut], &f.text[cut..]]);
            check_marker_invariants(&events, HERMES_MARKERS).unwrap_or_else(|e| panic!("{} at {cut}: {e}", f.name));
            assert_eq!(ParsedMessage::from_events(events), f.expected, "{} split at {cut}", f.name);
        }
    }
}

#[test]
fn the_name_comes_first_then_one_parameter_at_a_time() {
    let mut p = StreamingParser::new(ParserOptions { tool_call_id_prefix: "chatcmpl-9-".into(), ..qwen_xml() });
    assert_eq!(p.push("Let me check.\n\n<tool_"), vec![ParseEvent::Content("Let me check.\n\n".into())]);
    assert!(p.push("call>\n<function=get_wea").is_empty(), "no markup leaks into content");
    assert_eq!(
        p.push("ther>\n<parameter=city>\nPar"),
        vec![ParseEvent::ToolCallStart { index: 0, id: "chatcmpl-9-0".into(), name: "get_weather".into() }]
    );
    assert_eq!(
        p.push("is\n</parameter>"),
        vec![ParseEvent::ToolCallArguments { index: 0, delta: "{\"city\": \"Paris\"".into() }]
    );
    assert!(p.push("\n<parameter=days>\n3\n</param").is_empty(), "a value waits for the tag that ends it");
    assert_eq!(
        p.push("eter>\n</function>\n</tool_call>"),
        vec![ParseEvent::ToolCallArguments { index: 0, delta: ", \"days\": 3}".into() }]
    );
    assert!(p.finish().is_empty());
}

#[test]
fn a_parameter_is_emitted_when_its_value_ends() {
    let mut p = StreamingParser::new(qwen_xml());
    let mut events = p.push("<tool_call>\n<function=f>\n<parameter=city>\nParis\n");
    assert_eq!(events.len(), 1, "only the start: {events:?}");
    events = p.push("</parameter>");
    assert_eq!(events, vec![ParseEvent::ToolCallArguments { index: 0, delta: "{\"city\": \"Paris\"".into() }]);
    events = p.finish();
    assert_eq!(events, vec![ParseEvent::ToolCallArguments { index: 0, delta: "}".into() }]);
}

#[test]
fn declared_string_parameters_stay_strings() {
    let call = "<tool_call>\n<function=lookup>\n<parameter=zip>\n12345\n</parameter>\n<parameter=strict>\nTrue\n</parameter>\n<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>";
    let untyped = parse_complete(&qwen_xml(), call);
    assert_eq!(args_of(&untyped), vec![json!({"zip": 12345, "strict": true, "limit": 5})]);
    let tools = vec![DeclaredTool {
        name: "lookup".into(),
        parameters: json!({"type": "object", "properties": {
            "zip": {"type": "string"}, "strict": {"type": "boolean"}, "limit": {"type": "integer"}}}),
    }];
    let typed = parse_complete(&with_tools(tools.clone()), call);
    assert_eq!(args_of(&typed), vec![json!({"zip": "12345", "strict": true, "limit": 5})]);
    // Another tool's schema does not apply.
    let other = parse_complete(&with_tools(tools), &call.replace("lookup", "search"));
    assert_eq!(args_of(&other), vec![json!({"zip": 12345, "strict": true, "limit": 5})]);
}

#[test]
fn a_grammar_forced_hermes_call_reads_back() {
    let framing = ModelFormat::new(OutputFormat::QwenXml).tool_call_framing().unwrap();
    let text = format!("{}{{\"name\": \"f\", \"arguments\": {{\"a\": [1]}}}}{}", framing.open, framing.close);
    assert_eq!(parse_complete(&qwen_xml(), &text), msg("", None, &[("f", "{\"a\": [1]}")]));
}

/// An argument value of any JSON type; strings never hold the tags that end a value.
fn argument() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::from),
        any::<i64>().prop_map(Json::from),
        (-400i32..400).prop_map(|n| json!(f64::from(n) / 4.0)),
        prop::sample::select(vec![1e-7, 0.1, 1e20, 1.5e300, 123456.789]).prop_map(|f| json!(f)),
        "[a-zA-Z0-9 <>/=\n\"{}\\[\\]:,.☀️é-]{0,20}".prop_map(Json::from),
        prop::sample::select(vec!["True", "null", "42", "[1]", "\n", " x ", "</think>", "<tool_call>"])
            .prop_map(Json::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Json::Array),
            prop::collection::vec(("[a-z]{1,4}", inner), 0..3).prop_map(|kv| Json::Object(kv.into_iter().collect())),
        ]
    })
    .prop_filter("no value-ending tag", |v| {
        let text = v.to_string();
        !["</parameter>", "<parameter=", "</function>", "</tool_call>"].iter().any(|t| text.contains(t))
    })
}

fn schema_type(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

type Call = (String, serde_json::Map<String, Json>);

fn calls() -> impl Strategy<Value = Vec<Call>> {
    let call = ("[a-z_]{1,12}", prop::collection::vec(("[a-z_]{1,8}", argument()), 0..5))
        .prop_map(|(name, args)| (name, args.into_iter().collect()));
    prop::collection::vec(call, 1..4)
}

/// What the model replies after Qwen3.5's generation prompt (`<|im_start|>assistant\n<think>\n`)
/// when it writes this turn: the template's own rendering of the turn.
fn rendered_reply(reasoning: &str, content: &str, calls: &[Call]) -> String {
    let tool_calls: Vec<Json> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| json!({"id": format!("c{i}"), "type": "function", "function": {"name": name, "arguments": args}}))
        .collect();
    let messages = vec![
        json!({"role": "user", "content": "Go."}),
        json!({"role": "assistant", "reasoning_content": reasoning, "content": content, "tool_calls": tool_calls}),
    ];
    let text = qwen35().render(&RenderInput { messages, ..Default::default() }).expect("renders");
    const OPEN: &str = "<|im_start|>assistant\n<think>\n";
    let reply = &text[text.rfind(OPEN).expect("the turn opens reasoning") + OPEN.len()..];
    reply.strip_suffix("<|im_end|>\n").expect("the turn ends").to_owned()
}

fn declared(calls: &[Call]) -> Vec<DeclaredTool> {
    calls
        .iter()
        .map(|(name, args)| {
            let properties: serde_json::Map<String, Json> =
                args.iter().map(|(k, v)| (k.clone(), json!({"type": schema_type(v)}))).collect();
            DeclaredTool { name: name.clone(), parameters: json!({"type": "object", "properties": properties}) }
        })
        .collect()
}

fn cut_points() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..8)
}

fn streamed(o: &ParserOptions, text: &str, cuts: &[Index]) -> ParsedMessage {
    let offsets: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
    let events = stream(o, split_at(text, &offsets));
    check_marker_invariants(&events, HERMES_MARKERS).expect("marker invariants");
    ParsedMessage::from_events(events)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever arguments the template renders, the parser reads back the same calls, with the
    /// reasoning and content the template shows, for any chunking.
    #[test]
    fn the_templates_own_calls_read_back(
        reasoning in "[a-zA-Z .,\n]{0,24}",
        content in "[a-zA-Z .,!?\n]{0,24}",
        calls in calls(),
        cuts in cut_points(),
    ) {
        let reply = rendered_reply(&reasoning, &content, &calls);
        let o = ParserOptions { starts_in_reasoning: true, ..with_tools(declared(&calls)) };
        let got = streamed(&o, &reply, &cuts);
        prop_assert_eq!(&got, &parse_complete(&o, &reply));
        let reasoning = reasoning.trim();
        prop_assert_eq!(got.reasoning_content.as_deref(), (!reasoning.is_empty()).then_some(reasoning));
        let content = content.trim();
        let shown = if content.is_empty() { String::new() } else { format!("{content}\n\n") };
        prop_assert_eq!(&got.content, &shown, "reply {:?}", reply);
        let names: Vec<&str> = got.tool_calls.iter().map(|c| c.name.as_str()).collect();
        prop_assert_eq!(names, calls.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>());
        let want: Vec<Json> = calls.iter().map(|(_, a)| Json::Object(a.clone())).collect();
        prop_assert_eq!(args_of(&got), want, "reply {:?}", reply);
    }

    /// Without schemas, values the template writes unambiguously still read back.
    #[test]
    fn untyped_values_read_back_where_unambiguous(
        name in "[a-z_]{1,12}",
        text in "[a-z]{1,5} [a-zA-Z <>/\n\"{}☀️]{0,12}",
        number in any::<i64>(),
        flag in any::<bool>(),
        list in prop::collection::vec(any::<i32>(), 0..4),
        cuts in cut_points(),
    ) {
        let args = json!({"text": text, "number": number, "flag": flag, "list": list, "none": null});
        let calls = vec![(name, args.as_object().unwrap().clone())];
        let reply = rendered_reply("", "", &calls);
        let o = ParserOptions { starts_in_reasoning: true, ..qwen_xml() };
        prop_assert_eq!(args_of(&streamed(&o, &reply, &cuts)), vec![args]);
    }
}
