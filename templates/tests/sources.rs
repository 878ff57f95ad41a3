//! Loading templates: named-template lists, model directories, GGUF metadata, and clear errors
//! for files that are not what they claim.

mod common;

use radix_templates::{ChatRequest, ChatTemplate, TemplateError, TemplateSource};
use serde_json::json;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("radix-templates-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn named_template_list_picks_tool_use_when_tools_are_given() {
    let dir = scratch("named");
    let config = dir.join("tokenizer_config.json");
    let body = json!({
        "bos_token": {"content": "<s>", "__type": "AddedToken"},
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}default"},
            {"name": "tool_use", "template": "{{ bos_token }}tools:{{ tools | length }}"}
        ]
    });
    std::fs::write(&config, body.to_string()).unwrap();
    let template = ChatTemplate::new(TemplateSource::from_path(&config).unwrap()).unwrap();
    let plain = ChatRequest::from_json(&json!({"messages": [{"role": "user", "content": "x"}]})).unwrap();
    assert_eq!(template.render(&plain.render_input()).unwrap(), "<s>default");
    let with_tools = ChatRequest { tools: Some(vec![json!({"type": "function"})]), ..plain };
    assert_eq!(template.render(&with_tools.render_input()).unwrap(), "<s>tools:1");
}

#[test]
fn model_directory_prefers_chat_template_jinja() {
    let dir = scratch("modeldir");
    std::fs::write(dir.join("tokenizer_config.json"), json!({"eos_token": "</s>", "chat_template": "old"}).to_string())
        .unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "new{{ eos_token }}\n").unwrap();
    let source = TemplateSource::from_path(&dir).unwrap();
    let request = ChatRequest::from_json(&json!({"messages": [{"role": "user", "content": "x"}]})).unwrap();
    // Jinja2 drops a single trailing newline of the template source, as minijinja does.
    assert_eq!(ChatTemplate::new(source).unwrap().render(&request.render_input()).unwrap(), "new</s>");
}

#[test]
fn gguf_metadata_yields_template_and_special_tokens() {
    let source = TemplateSource::from_path(&common::asset_path("smollm2")).unwrap();
    assert!(source.templates["default"].contains("<|im_start|>"));
    assert_eq!(source.special_tokens.get("bos_token").map(String::as_str), Some("<|im_start|>"));
    assert_eq!(source.special_tokens.get("eos_token").map(String::as_str), Some("<|im_end|>"));
}

#[test]
fn broken_files_are_named_in_clear_errors() {
    let dir = scratch("broken");
    let not_gguf = dir.join("model.gguf");
    std::fs::write(&not_gguf, b"GGUF\x03\x00\x00\x00\xff").unwrap();
    let err = TemplateSource::from_path(&not_gguf).unwrap_err();
    assert!(matches!(err, TemplateError::BadSource { .. }) && err.to_string().contains("model.gguf"), "{err}");

    let huge = dir.join("huge.gguf");
    let mut bytes = b"GGUF\x03\x00\x00\x00".to_vec();
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend(u64::MAX.to_le_bytes()); // a key claiming 2^64 bytes
    std::fs::write(&huge, bytes).unwrap();
    assert!(TemplateSource::from_path(&huge).unwrap_err().to_string().contains("implausibly long"));

    let no_template = dir.join("tokenizer_config.json");
    std::fs::write(&no_template, "{}").unwrap();
    assert!(matches!(TemplateSource::from_path(&no_template), Err(TemplateError::NoTemplate { .. })));
    let bad_json = dir.join("bad.json");
    std::fs::write(&bad_json, "{").unwrap();
    assert!(TemplateSource::from_path(&bad_json).unwrap_err().to_string().contains("invalid JSON"));
}
