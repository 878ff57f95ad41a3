//! The preparation rules of ARCHITECTURE.md §5, one by one, on a template that accepts everything
//! (so only the rule under test changes anything) and on the fixture templates.

mod common;

use radix_templates::ChatRequest;
use radix_templates::prepare::{TemplateBehavior, prepare_request};
use serde_json::{Value as Json, json};

fn request(messages: Json) -> ChatRequest {
    ChatRequest::from_json(&json!({ "messages": messages })).unwrap()
}

fn prepared(messages: Json, behavior: TemplateBehavior) -> Vec<Json> {
    prepare_request(&request(messages), &behavior).unwrap().messages
}

#[test]
fn leading_system_run_merges_with_blank_line_and_bytes_untouched() {
    let stable = "  stable block\n  with trailing space \n";
    let out = prepared(
        json!([
            {"role": "system", "content": stable},
            {"role": "developer", "content": [{"type": "text", "text": "cwd: /x"}, {"type": "text", "text": "date"}]},
            {"role": "user", "content": "hi"},
        ]),
        TemplateBehavior::default(),
    );
    assert_eq!(out.len(), 2);
    assert_eq!(out[0], json!({"role": "system", "content": format!("{stable}\n\ncwd: /x\ndate")}));
    assert_eq!(out[1]["content"], "hi");
}

#[test]
fn later_system_stays_in_place_when_the_template_renders_it() {
    let messages = json!([
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1"},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": "U2"},
    ]);
    assert_eq!(prepared(messages.clone(), TemplateBehavior::default()), messages.as_array().unwrap().clone());

    let folding = TemplateBehavior { renders_later_system: false, ..TemplateBehavior::default() };
    let out = prepared(messages, folding);
    let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(out[0]["content"], "S", "the first system block is never touched");
    assert_eq!(out[3]["content"], "reminder\n\nU2");
}

#[test]
fn trailing_later_system_joins_the_previous_user_message_or_stands_alone() {
    let folding = TemplateBehavior { renders_later_system: false, ..TemplateBehavior::default() };
    let out = prepared(json!([{"role": "user", "content": "U"}, {"role": "system", "content": "late"}]), folding);
    assert_eq!(out, vec![json!({"role": "user", "content": "U\n\nlate"})]);
    let out = prepared(
        json!([{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}, {"role": "system", "content": "late"}]),
        folding,
    );
    assert_eq!(out[2], json!({"role": "user", "content": "late"}));
}

#[test]
fn tool_polyfills_turn_calls_and_results_into_text() {
    let behavior = TemplateBehavior {
        renders_tool_calls: false,
        renders_tool_role: false,
        accepts_consecutive_roles: false,
        ..TemplateBehavior::default()
    };
    let out = prepared(
        json!([
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\":\".\"}"}},
                {"id": "2", "type": "function", "function": {"name": "pwd", "arguments": {}}}]},
            {"role": "tool", "tool_call_id": "1", "content": "a.rs"},
            {"role": "tool", "tool_call_id": "2", "content": "/x"},
            {"role": "user", "content": "thanks"},
        ]),
        behavior,
    );
    let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(
        out[1]["content"],
        "<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"path\":\".\"}}\n</tool_call>\n\
         <tool_call>\n{\"name\": \"pwd\", \"arguments\": {}}\n</tool_call>"
    );
    assert!(out[1].get("tool_calls").is_none());
    assert_eq!(
        out[2]["content"],
        "<tool_response>\na.rs\n</tool_response>\n<tool_response>\n/x\n</tool_response>\n\nthanks"
    );
}

#[test]
fn arguments_become_objects_only_where_the_template_needs_them() {
    let messages = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
    ]);
    let kept = prepared(messages.clone(), TemplateBehavior::default());
    assert_eq!(kept[1]["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
    let objects = TemplateBehavior {
        accepts_string_arguments: false,
        accepts_missing_tool_call_content: false,
        ..TemplateBehavior::default()
    };
    let out = prepared(messages, objects);
    assert_eq!(out[1]["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
    assert_eq!(out[1]["content"], "");
}

#[test]
fn unsupported_content_parts_are_a_clear_error() {
    let flattening = TemplateBehavior { accepts_content_parts: false, ..TemplateBehavior::default() };
    let err = prepare_request(
        &request(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])),
        &flattening,
    )
    .unwrap_err();
    assert!(err.to_string().contains("messages[0]: content parts of type 'image_url' are not supported"), "{err}");
}

#[test]
fn probes_find_what_each_fixture_template_accepts() {
    let behaviors: Vec<(String, TemplateBehavior)> =
        common::templates().into_iter().map(|c| (c.id, TemplateBehavior::probe(&c.template))).collect();
    let of = |id: &str| behaviors.iter().find(|(i, _)| i == id).unwrap().1;
    assert!(of("qwen3").renders_later_system && of("qwen3").renders_tool_calls && of("qwen3").renders_tool_role);
    assert!(!of("qwen3").accepts_content_parts && !of("qwen3").accepts_missing_tool_call_content);
    assert!(!of("strict_system").renders_later_system);
    assert!(!of("drops_later_system").renders_later_system);
    assert!(!of("gemma3").accepts_consecutive_roles && !of("gemma3").renders_tool_calls);
    assert!(of("gemma3").accepts_content_parts);
}
