//! Parity with transformers: every template × conversation fixture renders byte-identically to
//! `apply_chat_template` (hashes in `fixtures/reference_renders.json`, made by
//! `scripts/gen_template_refs.py`), with message preparation off and on; and with preparation on,
//! every template accepts every fixture that transformers accepts in some form.

mod common;

use std::collections::BTreeMap;

use radix_templates::TemplateError;
use radix_templates::prepare::PreparedTemplate;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

struct Reference {
    ok: bool,
    sha256: String,
    len: usize,
    error: String,
    error_kind: String,
}

fn references() -> BTreeMap<(String, String, String), Reference> {
    let path = common::fixtures_dir().join("reference_renders.json");
    let doc: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (
                (s("template"), s("fixture"), s("mode")),
                Reference {
                    ok: e["ok"].as_bool().unwrap(),
                    sha256: s("sha256"),
                    len: e["len"].as_u64().unwrap_or(0) as usize,
                    error: s("error"),
                    error_kind: s("error_kind"),
                },
            )
        })
        .collect()
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares one render with its reference; returns a description of the mismatch.
fn check(ours: &Result<String, TemplateError>, reference: &Reference) -> Option<String> {
    match (ours, reference.ok) {
        (Ok(text), true) if sha256_hex(text) == reference.sha256 && text.len() == reference.len => None,
        (Ok(text), true) => Some(format!(
            "render differs from transformers ({} bytes vs {}):\n---\n{text}\n---",
            text.len(),
            reference.len
        )),
        (Ok(text), false) => Some(format!("transformers fails with {:?} but we render:\n{text}", reference.error)),
        (Err(err), true) => Some(format!("transformers renders but we fail: {err}")),
        (Err(err), false) => {
            let same = match err {
                TemplateError::Raised(message) | TemplateError::BadRequest(message) => *message == reference.error,
                // Jinja2 and minijinja word their own runtime errors differently; the template's
                // own messages (raise_exception) and transformers' request checks must match.
                TemplateError::Render { .. } => reference.error_kind == "other",
                _ => false,
            };
            (!same).then(|| {
                format!("both fail, but with different messages: ours {err:?}, transformers {:?}", reference.error)
            })
        }
    }
}

#[test]
fn renders_match_transformers_with_and_without_preparation() {
    let references = references();
    let templates = common::templates();
    let conversations = common::conversations();
    assert!(conversations.len() >= 25, "at least 25 conversation fixtures");
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in &templates {
        let prepared = PreparedTemplate::new(case.template.clone());
        for (name, request) in &conversations {
            for mode in ["raw", "prepared"] {
                let key = (case.id.clone(), name.clone(), mode.to_owned());
                let Some(reference) = references.get(&key) else {
                    failures.push(format!("{key:?}: no reference render; run scripts/gen_template_refs.py"));
                    continue;
                };
                let ours = match mode {
                    "raw" => case.template.render(&request.render_input()),
                    _ => prepared.render(request),
                };
                checked += 1;
                if let Some(problem) = check(&ours, reference) {
                    failures.push(format!("{} × {name} ({mode}): {problem}", case.id));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {checked} renders differ:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn preparation_makes_every_template_accept_what_transformers_accepts_in_some_form() {
    let references = references();
    let templates = common::templates();
    let mut failures = Vec::new();
    for case in &templates {
        let prepared = PreparedTemplate::new(case.template.clone());
        for (name, request) in common::conversations() {
            let accepted_somehow = ["raw", "prepared"]
                .iter()
                .any(|mode| references.get(&(case.id.clone(), name.clone(), (*mode).to_owned())).is_some_and(|r| r.ok));
            if accepted_somehow && let Err(err) = prepared.render(&request) {
                failures.push(format!("{} × {name}: {err}", case.id));
            }
        }
    }
    assert!(failures.is_empty(), "preparation leaves fixtures rejected:\n{}", failures.join("\n"));
}

#[test]
fn raising_templates_accept_split_and_mid_conversation_system_messages_once_prepared() {
    let templates = common::templates();
    let conversations = common::conversations();
    for id in ["strict_system", "qwen3_5"] {
        let case = templates.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("the {id} template"));
        let prepared = PreparedTemplate::new(case.template.clone());
        for wanted in ["two_system", "three_system", "system_mid"] {
            let (name, request) = conversations
                .iter()
                .find(|(name, _)| name.contains(wanted))
                .unwrap_or_else(|| panic!("a fixture named *{wanted}*"));
            let raw = case.template.render(&request.render_input());
            assert!(
                matches!(&raw, Err(TemplateError::Raised(m)) if m == "System message must be at the beginning."),
                "{id} × {name}: the raw render should raise, got {raw:?}"
            );
            prepared.render(request).unwrap_or_else(|e| panic!("{id} × {name}: prepared render fails: {e}"));
        }
    }
}

/// Qwen3.5 shows one system block, the tools first: the leading system messages merge into it,
/// bytes untouched, so an agent's stable system text stays a prefix of every prompt.
#[test]
fn qwen35_merges_leading_system_messages_into_its_one_system_block() {
    let case = common::templates().into_iter().find(|c| c.id == "qwen3_5").expect("the qwen3_5 template");
    let prepared = PreparedTemplate::new(case.template.clone());
    let conversations = common::conversations();
    for wanted in ["two_system", "three_system"] {
        let (name, request) = conversations.iter().find(|(name, _)| name.contains(wanted)).unwrap();
        let systems: Vec<&str> = request
            .messages
            .iter()
            .take_while(|m| m["role"] == "system")
            .map(|m| m["content"].as_str().unwrap())
            .collect();
        assert!(systems.len() >= 2, "{name}");
        let text = prepared.render(request).unwrap();
        assert_eq!(text.matches("<|im_start|>system\n").count(), 1, "{name}: one system block");
        let block = &text[..text.find("<|im_end|>").unwrap()];
        assert!(block.ends_with(&systems.join("\n\n")), "{name}: the system texts end the block:\n{block}");
        if request.tools.is_some() {
            assert!(block.starts_with("<|im_start|>system\n# Tools"), "{name}: tools come first");
        }
    }
}

/// What probing finds in Qwen3.5's template: it raises on a later system message and on string
/// arguments, and shows everything else itself, so preparation changes nothing it accepts.
#[test]
fn qwen35_preparation_leaves_what_the_template_accepts_untouched() {
    let case = common::templates().into_iter().find(|c| c.id == "qwen3_5").expect("the qwen3_5 template");
    let prepared = PreparedTemplate::new(case.template.clone());
    let b = prepared.behavior;
    assert!(!b.renders_later_system && !b.accepts_string_arguments, "{b:?}");
    assert!(b.renders_tool_calls && b.renders_tool_role && b.renders_tool_definitions, "{b:?}");
    assert!(b.accepts_content_parts && b.accepts_consecutive_roles && b.accepts_missing_tool_call_content, "{b:?}");
    let mut accepted = 0;
    for (name, request) in common::conversations() {
        let Ok(raw) = case.template.render(&request.render_input()) else { continue };
        accepted += 1;
        assert_eq!(prepared.render(&request).unwrap(), raw, "{name}");
    }
    assert!(accepted >= 15, "only {accepted} fixtures render raw");
}
