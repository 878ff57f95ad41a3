//! Python semantics of template rendering, pinned by small templates that transformers' own
//! Jinja2 environment rendered (`fixtures/render_semantics.json`, made by
//! `scripts/gen_render_semantics.py`).

mod common;

use std::collections::BTreeMap;

use radix_templates::RenderInput;
use radix_templates::testing::template_from_text;
use serde_json::Value as Json;

#[test]
fn small_templates_render_as_in_jinja2() {
    let path = common::fixtures_dir().join("render_semantics.json");
    let cases: Vec<Json> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["template"].as_str().unwrap();
        let template = template_from_text(text, BTreeMap::new()).unwrap_or_else(|e| panic!("{text}: {e}"));
        // Variables go in as template kwargs; a dummy message satisfies the renderer.
        let input = RenderInput {
            messages: vec![serde_json::json!({"role": "user", "content": ""})],
            kwargs: case["context"].as_object().unwrap().clone(),
            ..Default::default()
        };
        let expected = case["expected"].as_str().expect("every case renders in Jinja2");
        assert_eq!(template.render(&input).unwrap_or_else(|e| panic!("{text}: {e}")), expected, "template: {text}");
    }
}

#[test]
fn raise_exception_and_syntax_errors_are_errors_not_panics() {
    let raising = template_from_text("{{ raise_exception('no ' ~ messages[0].role) }}", BTreeMap::new()).unwrap();
    let input = RenderInput { messages: vec![serde_json::json!({"role": "user"})], ..Default::default() };
    assert_eq!(raising.render(&input).unwrap_err().to_string(), "no user");
    assert!(template_from_text("{% for %}", BTreeMap::new()).unwrap_err().to_string().contains("syntax error"));
    let bad_strftime = template_from_text("{{ strftime_now('%Q%') }}", BTreeMap::new()).unwrap();
    assert!(bad_strftime.render(&input).is_err());
    let date = template_from_text("{{ strftime_now('%Y') }}", BTreeMap::new()).unwrap().render(&input).unwrap();
    assert_eq!(date.len(), 4, "a year: {date}");
}
