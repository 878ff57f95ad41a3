use radix_templates::parse::{ParserOptions, StreamingParser};
use serde_json::{Value as Json, json};

use super::*;
use crate::api::request::typed;
use crate::engine::constraint::testing::{smollm2, walk};

fn weather() -> Json {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["unit", "days"],
        "additionalProperties": false
    }}})
}

fn clock() -> Json {
    json!({"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"], "additionalProperties": false
    }}})
}

/// The grammar of a chat body, read as the server reads it.
fn grammar(body: &Json, format: OutputFormat) -> Result<Option<String>, ApiError> {
    Ok(lazy_or_not(body, format)?.map(|(grammar, _)| grammar))
}

/// The grammar of a chat body and whether it applies lazily.
fn lazy_or_not(body: &Json, format: OutputFormat) -> Result<Option<(String, bool)>, ApiError> {
    super::grammar(&typed(body)?, format)
}

/// The constraint of a chat body, read as the server reads it.
fn chat_constraint(
    body: &Json,
    format: OutputFormat,
    tokenizer: &Arc<Tokenizer>,
) -> Result<Option<Constraint>, ApiError> {
    super::chat_constraint(&typed(body)?, format, None, tokenizer)
}

fn status(result: Result<Option<String>, ApiError>) -> u16 {
    result.map_or_else(|e| e.status().as_u16(), |_| 200)
}

/// Parses text as the Hermes output parser would, returning (name, arguments) of each call.
fn hermes_calls(text: &str) -> Vec<(String, Json)> {
    parsed_calls(text, OutputFormat::Hermes)
}

fn parsed_calls(text: &str, format: OutputFormat) -> Vec<(String, Json)> {
    let mut parser = StreamingParser::new(ParserOptions {
        format,
        starts_in_reasoning: false,
        tool_call_id_prefix: "call_".into(),
        tools_enabled: true,
        declared_tools: Vec::new(),
    });
    let mut events = parser.push(text);
    events.extend(parser.finish());
    let message = radix_templates::parse::ParsedMessage::from_events(events);
    message
        .tool_calls
        .iter()
        .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).expect("arguments are JSON")))
        .collect()
}

fn check_weather(arguments: &Json) {
    assert!(["c", "f"].contains(&arguments["unit"].as_str().unwrap()), "{arguments}");
    assert!((1..=9).contains(&arguments["days"].as_i64().unwrap()), "{arguments}");
}

/// Every call is of one of the two declared tools, with valid arguments.
fn check_calls(calls: &[(String, Json)]) {
    for (name, arguments) in calls {
        match name.as_str() {
            "get_weather" => check_weather(arguments),
            "get_time" => assert!(arguments["utc"].is_boolean(), "{arguments}"),
            other => panic!("called {other}"),
        }
    }
}

#[test]
fn free_requests_have_no_grammar() {
    let hermes = OutputFormat::Hermes;
    assert_eq!(grammar(&json!({"messages": []}), hermes).unwrap(), None);
    assert_eq!(grammar(&json!({"tools": [weather()], "tool_choice": "none"}), hermes).unwrap(), None);
    assert_eq!(grammar(&json!({"response_format": {"type": "text"}}), hermes).unwrap(), None);
}

#[test]
fn auto_with_tools_is_a_lazy_grammar_for_every_way_of_opening_a_call() {
    for body in [json!({"tools": [weather(), clock()]}), json!({"tools": [weather(), clock()], "tool_choice": "auto"})]
    {
        let (g, lazy) = lazy_or_not(&body, OutputFormat::Hermes).unwrap().unwrap();
        assert!(lazy, "{g}");
        assert!(g.contains("bare") && g.contains("fenced") && g.contains("<tool_call>"), "{g}");
        assert!(g.contains("get_weather") && g.contains("get_time") && g.contains("whitespace_pattern"), "{g}");
        let (plain, _) = lazy_or_not(&body, OutputFormat::Plain).unwrap().unwrap();
        assert!(!plain.contains("<tool_call>") && plain.contains("fenced"), "no framing of its own: {plain}");
    }
    let (_, lazy) =
        lazy_or_not(&json!({"tools": [weather()], "tool_choice": "required"}), OutputFormat::Hermes).unwrap().unwrap();
    assert!(!lazy, "a forced call is constrained from the first token");
}

/// A reply that opens a bare object under the lazy grammar is a valid call of a declared tool
/// whatever the (random) model picks next; one that opens with prose is never masked.
#[test]
fn a_bare_call_opened_under_auto_is_valid_by_construction() {
    let tokenizer = smollm2();
    let body = json!({"tools": [weather(), clock()]});
    let opening = tokenizer.encode("{\"name\": \"", false).unwrap();
    for seed in 0..4 {
        let mut constraint = chat_constraint(&body, OutputFormat::Hermes, &tokenizer).unwrap().unwrap();
        for &t in &opening {
            constraint.accept(t).unwrap();
        }
        let walked = walk(constraint, &tokenizer, 1.0, seed);
        assert!(walked.ended, "seed {seed}: {:?}", walked.text);
        let text = format!("{{\"name\": \"{}", walked.text);
        let call: Json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        match call["name"].as_str() {
            Some("get_weather") => check_weather(&call["arguments"]),
            Some("get_time") => assert!(call["arguments"]["utc"].is_boolean(), "{text}"),
            other => panic!("a call of an undeclared tool: {other:?} in {text}"),
        }
    }
}

#[test]
fn each_form_builds_the_grammar_it_should() {
    let hermes = OutputFormat::Hermes;
    let named =
        json!({"tools": [weather(), clock()], "tool_choice": {"type": "function", "function": {"name": "get_time"}}});
    let g = grammar(&named, hermes).unwrap().unwrap();
    assert!(g.contains("<tool_call>") && g.contains("get_time") && !g.contains("get_weather"), "{g}");
    assert!(g.contains("calls: call\n"), "a named function is one call: {g}");

    let required = json!({"tools": [weather(), clock()], "tool_choice": "required"});
    let g = grammar(&required, hermes).unwrap().unwrap();
    assert!(g.contains("get_time") && g.contains("get_weather") && g.contains("call)*"), "{g}");
    let single = json!({"tools": [weather(), clock()], "tool_choice": "required", "parallel_tool_calls": false});
    assert!(grammar(&single, hermes).unwrap().unwrap().contains("calls: call\n"));

    let llama = grammar(&required, OutputFormat::Llama3Json).unwrap().unwrap();
    assert!(llama.contains("\"parameters\"") && !llama.contains("<tool_call>"), "{llama}");

    let object = grammar(&json!({"response_format": {"type": "json_object"}}), hermes).unwrap().unwrap();
    assert!(object.starts_with("start: %json {") && object.contains("\"object\""), "{object}");
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let body = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}});
    let g = grammar(&body, hermes).unwrap().unwrap();
    assert!(g.contains("\"integer\""), "{g}");
    let mut with_tools = body.clone();
    with_tools["tools"] = json!([clock()]);
    let g = grammar(&with_tools, hermes).unwrap().unwrap();
    assert!(g.starts_with("start: calls | json"), "auto plus a format lets the model choose: {g}");
}

#[test]
fn malformed_fields_are_400() {
    let hermes = OutputFormat::Hermes;
    let cases = [
        json!({"tool_choice": "required"}),
        json!({"tools": [weather()], "tool_choice": "sometimes"}),
        json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        json!({"tools": [weather()], "tool_choice": {"type": "function"}}),
        json!({"tools": [weather()], "tool_choice": 3}),
        json!({"tools": "x"}),
        json!({"tools": [{"type": "function", "function": {"name": ""}}], "tool_choice": "required"}),
        json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}]}),
        json!({"tools": [weather()], "parallel_tool_calls": "yes"}),
        json!({"response_format": {"type": "yaml"}}),
        json!({"response_format": {"type": "json_schema"}}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 1}}}),
    ];
    for body in cases {
        assert_eq!(status(grammar(&body, hermes)), 400, "{body}");
    }
    // No tool-call format: a forced call could not come back as tool_calls.
    let required = json!({"tools": [weather()], "tool_choice": "required"});
    assert_eq!(status(grammar(&required, OutputFormat::Plain)), 400);
}

#[test]
fn a_schema_the_engine_rejects_is_400() {
    let tokenizer = smollm2();
    let body = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}});
    let e = chat_constraint(&body, OutputFormat::Hermes, &tokenizer).unwrap_err();
    assert_eq!(e.status().as_u16(), 400, "{}", e.message());
}

/// Schemas that compile but fail on the first token (found by probing the server) are 400s
/// with a short message, decided before generation starts.
#[test]
fn hostile_schemas_are_400_before_generation() {
    let tokenizer = smollm2();
    let schemas = [
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        json!({"$defs": {"n": {"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}, "required": ["x"]}},
               "$ref": "#/$defs/n"}),
        json!({"type": "string", "pattern": "^a{1000000}$"}),
        json!({"const": "x".repeat(1 << 20)}),
    ];
    for (i, schema) in schemas.into_iter().enumerate() {
        let body = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}});
        let Err(error) = chat_constraint(&body, OutputFormat::Hermes, &tokenizer) else {
            panic!("schema {i} was accepted");
        };
        assert_eq!(error.status().as_u16(), 400, "schema {i}: {}", error.message());
        assert!(error.message().len() < 500 && !error.message().contains('\n'), "schema {i}: {}", error.message());
    }
}

#[test]
fn random_decoding_under_a_named_function_yields_that_call() {
    let tokenizer = smollm2();
    let body = json!({"tools": [clock(), weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    for (temperature, seed) in [(0.0, 5), (1.0, 6), (1.5, 7)] {
        let c = chat_constraint(&body, OutputFormat::Hermes, &tokenizer).unwrap().unwrap();
        let out = walk(c, &tokenizer, temperature, seed);
        assert!(out.ended, "{:?}", out.text);
        let calls = hermes_calls(&out.text);
        assert_eq!(calls.len(), 1, "{:?}", out.text);
        assert_eq!(calls[0].0, "get_weather");
        check_weather(&calls[0].1);
    }
}

#[test]
fn random_decoding_under_required_calls_one_of_the_tools() {
    let tokenizer = smollm2();
    let body = json!({"tools": [clock(), weather()], "tool_choice": "required", "parallel_tool_calls": false});
    let mut names = std::collections::BTreeSet::new();
    for seed in 10..16 {
        let c = chat_constraint(&body, OutputFormat::Hermes, &tokenizer).unwrap().unwrap();
        let out = walk(c, &tokenizer, 1.0, seed);
        assert!(out.ended, "{:?}", out.text);
        let calls = hermes_calls(&out.text);
        assert_eq!(calls.len(), 1, "{:?}", out.text);
        match calls[0].0.as_str() {
            "get_weather" => check_weather(&calls[0].1),
            "get_time" => assert!(calls[0].1["utc"].is_boolean(), "{}", calls[0].1),
            other => panic!("called {other}"),
        }
        names.insert(calls[0].0.clone());
    }
    assert!(!names.is_empty());
}

#[test]
fn random_decoding_in_llama3_format_parses_as_parallel_calls() {
    let tokenizer = smollm2();
    let body = json!({"tools": [clock(), weather()], "tool_choice": "required"});
    for seed in 20..24 {
        let c = chat_constraint(&body, OutputFormat::Llama3Json, &tokenizer).unwrap().unwrap();
        let out = walk(c, &tokenizer, 1.0, seed);
        assert!(out.ended, "{:?}", out.text);
        let calls = parsed_calls(&out.text, OutputFormat::Llama3Json);
        assert!(!calls.is_empty(), "{:?}", out.text);
        // Every call the grammar let through is whole and valid, however many there are.
        assert_eq!(calls.len(), out.text.matches("{\"name\": ").count(), "{:?}", out.text);
        check_calls(&calls);
    }
}

#[test]
fn tool_arguments_allow_only_declared_keys_unless_the_schema_says_otherwise() {
    let closed = super::closed_objects(json!({
        "type": "object",
        "properties": {
            "place": {"type": "object", "properties": {"city": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "extra": {"type": "object", "properties": {}, "additionalProperties": true}
        }
    }));
    assert_eq!(closed["additionalProperties"], json!(false));
    assert_eq!(closed["properties"]["place"]["additionalProperties"], json!(false));
    assert_eq!(closed["properties"]["tags"]["items"]["additionalProperties"], json!(false));
    assert_eq!(closed["properties"]["extra"]["additionalProperties"], json!(true), "an explicit choice stays");
}

/// A forced call after a prompt that left reasoning open (Qwen3/3.5's `<think>`) closes the
/// reasoning first: the walk writes `</think>` and then a call the parser, starting inside
/// reasoning as it does for such a prompt, returns as a call (not as reasoning text).
#[test]
fn a_forced_call_after_open_reasoning_closes_it_first() {
    let tokenizer = smollm2();
    let body = json!({"tools": [weather()], "tool_choice": "required"});
    for seed in 0..3 {
        let constraint =
            super::chat_constraint(&typed(&body).unwrap(), OutputFormat::Hermes, Some("</think>"), &tokenizer)
                .unwrap()
                .unwrap();
        let walked = walk(constraint, &tokenizer, 1.0, seed);
        assert!(walked.ended && walked.text.starts_with("</think>\n\n"), "seed {seed}: {:?}", walked.text);
        let mut parser = StreamingParser::new(ParserOptions {
            format: OutputFormat::Hermes,
            starts_in_reasoning: true,
            tool_call_id_prefix: "call_".into(),
            tools_enabled: true,
            declared_tools: Vec::new(),
        });
        let mut events = parser.push(&walked.text);
        events.extend(parser.finish());
        let calls = events.iter().filter(|e| format!("{e:?}").contains("get_weather")).count();
        assert!(calls > 0, "seed {seed}: no call in {events:?}");
    }
    // Lazy grammars (tool_choice auto) are left alone: they start at a call's opening.
    let auto = json!({"tools": [weather()]});
    let lazy = super::chat_constraint(&typed(&auto).unwrap(), OutputFormat::Hermes, Some("</think>"), &tokenizer);
    assert!(lazy.unwrap().is_some());
}

/// Under `auto`, a Qwen3.5 reply that opens its own XML call is never forced into JSON: the
/// lazy grammar drops out at `<function=`, so the whole XML call is accepted token by token.
#[test]
fn a_qwen_xml_call_under_auto_stays_free() {
    let tokenizer = smollm2();
    let body = json!({"tools": [weather()]});
    let xml = "<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>";
    let mut constraint = chat_constraint(&body, OutputFormat::QwenXml, &tokenizer).unwrap().unwrap();
    for t in tokenizer.encode(xml, false).unwrap() {
        constraint.accept(t).unwrap_or_else(|e| panic!("token {t} of the XML call was refused: {e}"));
    }
    assert!(!constraint.masking(), "the lazy grammar must not hold an XML call");
    // A bare JSON call is still held to the declared tools.
    let mut constraint = chat_constraint(&body, OutputFormat::QwenXml, &tokenizer).unwrap().unwrap();
    for t in tokenizer.encode("{\"name\": \"", false).unwrap() {
        constraint.accept(t).unwrap();
    }
    assert!(constraint.masking(), "a bare call opened under auto is constrained");
}

/// A tool with a free string, an integer and an optional boolean parameter.
fn note() -> Json {
    json!({"type": "function", "function": {"name": "write_note", "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}, "count": {"type": "integer"}, "pinned": {"type": "boolean"}},
        "required": ["text", "count"]
    }}})
}

/// A Qwen XML call as Qwen3.5's template writes it.
fn xml_call(name: &str, parameters: &[(&str, &str)]) -> String {
    let body: String = parameters.iter().map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n")).collect();
    format!("<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>")
}

/// Whether the constraint of `body` takes all of `text` and may end after it.
fn takes(body: &Json, format: OutputFormat, text: &str) -> bool {
    let tokenizer = smollm2();
    let mut constraint = chat_constraint(body, format, &tokenizer).unwrap().unwrap();
    tokenizer.encode(text, false).unwrap().into_iter().all(|t| constraint.accept(t).is_ok())
        && constraint.is_accepting()
}

/// Parses a Qwen XML reply with the body's tools declared, as the server does.
fn xml_calls(body: &Json, text: &str) -> Vec<(String, Json)> {
    let declared = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| radix_templates::parse::DeclaredTool {
            name: t["function"]["name"].as_str().unwrap().to_owned(),
            parameters: t["function"]["parameters"].clone(),
        })
        .collect();
    let mut parser =
        StreamingParser::new(ParserOptions { declared_tools: declared, ..ParserOptions::new(OutputFormat::QwenXml) });
    let mut events = parser.push(text);
    events.extend(parser.finish());
    let message = radix_templates::parse::ParsedMessage::from_events(events);
    message.tool_calls.iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect()
}

/// A forced call for Qwen3.5 is its own XML, read back as the arguments the schema describes
/// (a string that looks like a number stays a string); its JSON form inside the same tags is
/// not what the model writes, so the grammar refuses it.
#[test]
fn a_forced_qwen_xml_call_is_written_as_xml() {
    let xml = OutputFormat::QwenXml;
    let body = json!({"tools": [note()], "tool_choice": "required"});
    let call = xml_call("write_note", &[("text", "12"), ("count", "3")]);
    assert!(takes(&body, xml, &call), "{call}");
    assert_eq!(xml_calls(&body, &call), vec![("write_note".to_owned(), json!({"text": "12", "count": 3}))]);
    let multiline =
        xml_call("write_note", &[("text", "\nline one\n\n  \"two\" <b>\n"), ("count", "-4"), ("pinned", "true")]);
    assert!(takes(&body, xml, &multiline), "{multiline}");
    assert_eq!(
        xml_calls(&body, &multiline)[0].1,
        json!({"text": "\nline one\n\n  \"two\" <b>\n", "count": -4, "pinned": true})
    );
    let empty = xml_call("write_note", &[("text", ""), ("count", "0")]);
    assert!(takes(&body, xml, &empty) && xml_calls(&body, &empty)[0].1 == json!({"text": "", "count": 0}));

    let json_framed =
        "<tool_call>\n{\"name\": \"write_note\", \"arguments\": {\"text\": \"a\", \"count\": 1}}\n</tool_call>";
    assert!(!takes(&body, xml, json_framed), "JSON inside the tags is not Qwen3.5's format");
    assert!(takes(&body, OutputFormat::Hermes, json_framed), "Hermes keeps its JSON calls");
    assert!(!takes(&body, OutputFormat::Hermes, &call));
}

/// Every way a Qwen XML call can break its tool's schema is refused, as a JSON call's would be.
#[test]
fn a_forced_qwen_xml_call_holds_to_the_schema() {
    let xml = OutputFormat::QwenXml;
    let body = json!({"tools": [note(), weather()], "tool_choice": "required"});
    let rejected = [
        ("a missing required parameter", xml_call("write_note", &[("text", "hi")])),
        ("an undeclared tool", xml_call("write_notes", &[("text", "hi"), ("count", "1")])),
        ("an undeclared parameter", xml_call("write_note", &[("text", "hi"), ("count", "1"), ("color", "red")])),
        ("a string for an integer", xml_call("write_note", &[("text", "hi"), ("count", "three")])),
        ("a padded integer", xml_call("write_note", &[("text", "hi"), ("count", " 3")])),
        ("a value outside an enum", xml_call("get_weather", &[("unit", "k"), ("days", "2")])),
        ("an integer over its maximum", xml_call("get_weather", &[("unit", "c"), ("days", "12")])),
        ("a tag that ends the value early", xml_call("write_note", &[("text", "a</function>b"), ("count", "1")])),
        ("a flood of newlines", xml_call("write_note", &[("text", &format!("a{}b", "\n".repeat(8))), ("count", "1")])),
        ("a flood of spaces", xml_call("write_note", &[("text", &" ".repeat(80)), ("count", "1")])),
        ("an unclosed call", "<tool_call>\n<function=write_note>\n<parameter=text>\nhi\n</parameter>\n".to_owned()),
    ];
    for (what, text) in rejected {
        assert!(!takes(&body, xml, &text), "{what} was accepted: {text}");
    }
    let weather_call = xml_call("get_weather", &[("unit", "f"), ("days", "9")]);
    assert!(takes(&body, xml, &weather_call), "{weather_call}");
    let named =
        json!({"tools": [note(), weather()], "tool_choice": {"type": "function", "function": {"name": "write_note"}}});
    assert!(!takes(&named, xml, &weather_call), "a named function is the only one");
}

/// Parallel calls are separated as the template separates them (a newline between
/// `</tool_call>` and `<tool_call>`); without `parallel_tool_calls` there is one.
#[test]
fn parallel_qwen_xml_calls_follow_the_template() {
    let xml = OutputFormat::QwenXml;
    let body = json!({"tools": [note(), weather()], "tool_choice": "required"});
    let two = format!(
        "{}\n{}",
        xml_call("get_weather", &[("unit", "c"), ("days", "1")]),
        xml_call("write_note", &[("text", "x"), ("count", "2")])
    );
    assert!(takes(&body, xml, &two), "{two}");
    let calls = xml_calls(&body, &two);
    assert_eq!(calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["get_weather", "write_note"]);
    let mut single = body.clone();
    single["parallel_tool_calls"] = json!(false);
    assert!(!takes(&single, xml, &two));
    assert!(!takes(&body, xml, &two.replacen("\n<tool_call>", "\n\n<tool_call>", 1)));
}

/// Whatever a random model picks under a forced Qwen XML grammar, after the reasoning close,
/// is a call of a declared tool with valid arguments.
#[test]
fn random_decoding_under_a_forced_qwen_xml_call_yields_valid_calls() {
    let tokenizer = smollm2();
    let body = json!({"tools": [clock(), weather()], "tool_choice": "required"});
    for seed in 30..36 {
        let constraint =
            super::chat_constraint(&typed(&body).unwrap(), OutputFormat::QwenXml, Some("</think>"), &tokenizer)
                .unwrap()
                .unwrap();
        let walked = walk(constraint, &tokenizer, 1.0, seed);
        assert!(walked.ended, "seed {seed}: {:?}", walked.text);
        let call = walked.text.strip_prefix("</think>\n\n").unwrap_or_else(|| panic!("{:?}", walked.text));
        assert!(call.starts_with("<tool_call>\n<function=get_"), "seed {seed}: {call:?}");
        let calls = xml_calls(&body, call);
        assert_eq!(calls.len(), call.matches("<tool_call>").count(), "{call:?}");
        check_calls(&calls);
    }
}

/// Optional parameters may be left out; bounded strings hold to their lengths; a tool whose
/// schema the XML form cannot hold to (here a `format`) is written as JSON inside the tags,
/// which the parser reads as well; `auto` with a `response_format` offers the XML call or the
/// JSON reply.
#[test]
fn qwen_xml_grammar_edges() {
    let xml = OutputFormat::QwenXml;
    let tag = json!({"type": "function", "function": {"name": "tag", "parameters": {"type": "object",
        "properties": {"label": {"type": "string", "minLength": 2, "maxLength": 4}, "note": {"type": "string"}},
        "required": ["label"]}}});
    let body = json!({"tools": [tag], "tool_choice": "required"});
    assert!(takes(&body, xml, &xml_call("tag", &[("label", "abc")])));
    assert!(takes(&body, xml, &xml_call("tag", &[("label", "ab"), ("note", "n")])));
    assert!(!takes(&body, xml, &xml_call("tag", &[("label", "a")])));
    assert!(!takes(&body, xml, &xml_call("tag", &[("label", "abcde")])));
    assert!(!takes(&body, xml, &xml_call("tag", &[("note", "n"), ("label", "ab")])), "schema order");

    let link = json!({"type": "function", "function": {"name": "open", "parameters": {"type": "object",
        "properties": {"url": {"type": "string", "format": "uri"}}, "required": ["url"]}}});
    let body = json!({"tools": [link, note()], "tool_choice": "required"});
    let g = grammar(&body, xml).unwrap().unwrap();
    assert!(g.contains("\"format\":\"uri\"") && g.contains("<function=write_note>"), "{g}");
    let json_call = "<tool_call>\n{\"name\": \"open\", \"arguments\": {\"url\": \"https://a.b/c\"}}\n</tool_call>";
    assert!(takes(&body, xml, json_call), "{g}");
    assert_eq!(xml_calls(&body, json_call), vec![("open".to_owned(), json!({"url": "https://a.b/c"}))]);

    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let either = json!({"tools": [note()], "response_format": {"type": "json_schema",
        "json_schema": {"name": "x", "schema": schema}}});
    assert!(grammar(&either, xml).unwrap().unwrap().starts_with("start: calls | json"));
    assert!(takes(&either, xml, &xml_call("write_note", &[("text", "t"), ("count", "1")])));
    assert!(takes(&either, xml, "{\"a\": 5}"));
}
