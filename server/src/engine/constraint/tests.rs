use serde_json::{Value as Json, json};

use super::testing::{smollm2, walk};
use super::*;

fn factory() -> Arc<ConstraintFactory> {
    ConstraintFactory::shared(&smollm2()).expect("the factory builds")
}

/// A schema whose every value is bounded, so random decoding ends quickly.
fn bounded_schema() -> Json {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 30},
            "metric": {"type": "boolean"}
        },
        "required": ["city", "days", "metric"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false}
    })
}

fn check_bounded(text: &str) {
    let value: Json = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    assert!(["Paris", "Tokyo", "Lima"].contains(&value["city"].as_str().unwrap()), "{text}");
    let days = value["days"].as_i64().unwrap_or_else(|| panic!("days is not an integer in {text}"));
    assert!((1..=30).contains(&days), "{text}");
    assert!(value["metric"].is_boolean(), "{text}");
    assert_eq!(value.as_object().unwrap().len(), 3, "{text}");
}

#[test]
fn the_factory_is_shared_per_tokenizer() {
    let tokenizer = smollm2();
    let a = ConstraintFactory::shared(&tokenizer).unwrap();
    let b = ConstraintFactory::shared(&tokenizer).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.vocab_size, tokenizer.vocab_size());
}

#[test]
fn random_decoding_under_a_schema_yields_valid_json_greedy_and_sampled() {
    let tokenizer = smollm2();
    for (temperature, seed) in [(0.0, 1), (1.0, 2), (1.0, 3), (2.0, 4)] {
        let c = factory().json_schema(bounded_schema()).unwrap();
        let out = walk(c, &tokenizer, temperature, seed);
        assert!(out.ended, "no end at temperature {temperature}: {:?}", out.text);
        check_bounded(&out.text);
    }
}

#[test]
fn the_mask_admits_only_what_the_grammar_allows_next() {
    let tokenizer = smollm2();
    let mut c = factory().lark(r#"start: "yes" | "no""#).unwrap();
    let stop: Vec<u32> = tokenizer.eos_token_ids().iter().copied().collect();
    let mut logits = vec![0.0f32; tokenizer.vocab_size()];
    c.mask_logits(&mut logits, &stop).unwrap();
    let allowed: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize] == 0.0).collect();
    assert!(!allowed.is_empty());
    for &id in &allowed {
        let text = tokenizer.decode(&[id], false).unwrap();
        assert!("yes".starts_with(&text) || "no".starts_with(&text), "{text:?} allowed");
    }
    // Not complete yet: no stop token.
    assert!(stop.iter().all(|&s| logits[s as usize] == f32::NEG_INFINITY));
    let yes = tokenizer.encode("yes", false).unwrap();
    for &t in &yes {
        c.accept(t).unwrap();
    }
    assert!(c.is_accepting());
}

#[test]
fn a_token_outside_the_grammar_is_an_error_not_a_panic() {
    let tokenizer = smollm2();
    let mut c = factory().json_schema(json!({"type": "object"})).unwrap();
    let bad = tokenizer.encode("hello", false).unwrap()[0];
    assert!(c.accept(bad).is_err());
}

#[test]
fn invalid_grammars_and_schemas_are_reported() {
    assert!(factory().lark("start: undefined_rule").is_err());
    let e = factory().json_schema(json!({"type": "no-such-type"})).unwrap_err();
    assert!(e.contains("invalid grammar"), "{e}");
    assert!(factory().json_schema(json!({"$ref": "#/definitions/missing"})).is_err());
}

/// How many tokens the mask leaves after `text` was generated under a lazy grammar of a call
/// of `read`, and whether that grammar is complete.
fn allowed_after(text: &str) -> (usize, bool) {
    let tokenizer = smollm2();
    let call = json!({"type": "object", "properties": {
        "name": {"const": "read"},
        "arguments": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
            "additionalProperties": false}},
        "required": ["name", "arguments"], "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false, "key_separator": ": ", "item_separator": ", "}});
    let mut c = factory().json_schema(call).unwrap().lazy();
    for t in tokenizer.encode(text, false).unwrap() {
        c.accept(t).unwrap();
    }
    if c.is_finished() {
        // The engine ends the reply here; no mask is asked for.
        return (0, true);
    }
    let mut logits = vec![0.0f32; tokenizer.vocab_size()];
    let stop: Vec<u32> = tokenizer.eos_token_ids().iter().copied().collect();
    c.mask_logits(&mut logits, &stop).unwrap();
    (logits.iter().filter(|l| l.is_finite()).count(), false)
}

#[test]
fn a_lazy_grammar_constrains_only_a_reply_that_opens_a_call() {
    let vocab = smollm2().vocab_size();
    for free in ["", " \n", "Sure, the weather", "{\"town\": 3", "```python\nprint(1)", "[1, 2]", "{\"na"] {
        assert_eq!(allowed_after(free).0, vocab, "{free:?} is not masked");
    }
    let (allowed, finished) = allowed_after("{\"name\": \"");
    assert!(allowed < 100, "an opened call is constrained: {allowed} of {vocab} tokens allowed");
    assert!(!finished);
    let (_, finished) = allowed_after("{\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}");
    assert!(finished, "the complete call ends the reply");
}
