//! Arbitrary request JSON never panics request parsing, preparation or rendering: every failure
//! is an error value the server can turn into an HTTP 400.

mod common;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use radix_templates::ChatRequest;
use radix_templates::prepare::{PreparedTemplate, prepare_request};
use serde_json::{Map, Value as Json, json};

fn arbitrary_json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Json::String),
        prop_oneof![Just("<tool_call>"), Just("</think>"), Just("{\"a\":"), Just("<|im_end|>"), Just("{{ x }}")]
            .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            prop::collection::vec(
                (
                    prop_oneof![Just("type".to_owned()), Just("text".to_owned()), Just("name".to_owned()), ".{0,6}"],
                    inner
                ),
                0..4
            )
            .prop_map(|kv| Json::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn arbitrary_message() -> impl Strategy<Value = Json> {
    let role = prop_oneof![
        Just(json!("system")),
        Just(json!("developer")),
        Just(json!("user")),
        Just(json!("assistant")),
        Just(json!("tool")),
        Just(json!("ipython")),
        arbitrary_json(),
    ];
    let content = prop_oneof![
        ".{0,16}".prop_map(Json::String),
        Just(json!([{"type": "text", "text": "part"}, {"type": "image_url", "image_url": {"url": "x"}}])),
        arbitrary_json(),
    ];
    let tool_calls = prop_oneof![
        Just(None),
        arbitrary_json().prop_map(Some),
        (".{0,6}", arbitrary_json()).prop_map(|(name, arguments)| Some(
            json!([{"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}])
        )),
    ];
    (role, prop::option::of(content), tool_calls, prop::option::of(arbitrary_json())).prop_map(
        |(role, content, tool_calls, reasoning)| {
            let mut m = Map::new();
            m.insert("role".into(), role);
            if let Some(c) = content {
                m.insert("content".into(), c);
            }
            if let Some(t) = tool_calls {
                m.insert("tool_calls".into(), t);
            }
            if let Some(r) = reasoning {
                m.insert("reasoning_content".into(), r);
            }
            Json::Object(m)
        },
    )
}

fn arbitrary_body() -> impl Strategy<Value = Json> {
    (
        prop::collection::vec(arbitrary_message(), 0..6),
        prop::option::of(prop::collection::vec(arbitrary_json(), 0..3)),
        prop::option::of(
            prop::collection::vec((prop_oneof![Just("enable_thinking".to_owned()), ".{0,6}"], arbitrary_json()), 0..3)
                .prop_map(|kv| Json::Object(kv.into_iter().collect::<Map<_, _>>())),
        ),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(messages, tools, kwargs, agp, cont)| {
            json!({"messages": messages, "tools": tools, "chat_template_kwargs": kwargs,
                   "add_generation_prompt": agp, "continue_final_message": cont})
        })
}

#[test]
fn the_generator_reaches_the_renderer() {
    // Guards the property below against a generator whose requests are all rejected early.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut accepted = 0;
    for _ in 0..100 {
        let body = arbitrary_body().new_tree(&mut runner).unwrap().current();
        accepted += usize::from(ChatRequest::from_json(&body).is_ok());
    }
    assert!(accepted >= 30, "only {accepted} of 100 generated requests parse");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_requests_never_panic(body in prop_oneof![arbitrary_body(), arbitrary_json()]) {
        thread_local! {
            static TEMPLATES: Vec<PreparedTemplate> =
                common::templates().into_iter().map(|c| PreparedTemplate::new(c.template)).collect();
        }
        let Ok(request) = ChatRequest::from_json(&body) else { return Ok(()) };
        TEMPLATES.with(|templates| {
            for prepared in templates {
                let _ = prepared.template.render(&request.render_input());
                if let Ok(p) = prepare_request(&request, &prepared.behavior) {
                    let _ = prepared.template.render(&p.render_input());
                }
            }
        });
    }
}
