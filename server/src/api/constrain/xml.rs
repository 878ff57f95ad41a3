//! Forced calls in Qwen3.5's XML tool-call format ([`OutputFormat::QwenXml`]), the way its
//! chat template writes an assistant's `tool_calls`:
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! The model was trained on this form only; a JSON call inside the tags would push it off its
//! own distribution. The parameters come from the tool's schema `properties`, in schema order,
//! the required ones always, the optional ones where the model writes them, nothing else. A
//! `"type": "string"` value is raw text (as the template writes strings), any other value
//! compact JSON valid under the property's schema (as `tojson`). The output parser
//! (`radix_templates::parse`, Qwen XML rules) reads raw text as a string exactly where the
//! declared schema says `"type": "string"`, so what is written here reads back as the
//! arguments the schema describes.
//!
//! A tool whose schema the XML form cannot hold to (a combinator or `$ref` at the root, a
//! string with a `pattern` or `format`, names the tags cannot carry) is written as Hermes JSON
//! inside the same tags instead: the parser reads that too, and the call stays valid.
//!
//! [`OutputFormat::QwenXml`]: radix_templates::parse::OutputFormat::QwenXml

use radix_templates::format::ToolCallFraming;
use serde_json::{Map, Value as Json, json};

use super::{Tool, compact};

/// What the grammar writes between `<parameter=KEY>\n` and `\n</parameter>\n`.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    /// Raw text, of `min..=max` characters.
    Text { min: u64, max: Option<u64> },
    /// One of these texts (a string `enum` or `const`).
    OneOf(Vec<String>),
    /// JSON valid under this schema.
    Json(Json),
}

/// One parameter of a call.
#[derive(Debug, Clone, PartialEq)]
struct Parameter {
    /// The property's name, as `<parameter=KEY>` carries it.
    key: String,
    /// Listed in the schema's `required`; an optional one the model may leave out.
    required: bool,
    value: Value,
}

/// Tags the parser ends a value at: raw text holding one would be cut short there.
const VALUE_ENDS: [&str; 4] = ["</parameter>", "<parameter=", "</function>", "</tool_call>"];

/// Raw parameter text: no tag that ends a value, and no whitespace flood (a small model under
/// a grammar, given free text, may write newlines until `max_tokens`): at most a line's worth
/// of whitespace in one place, with at most two blank lines, which code still fits in. The
/// limit is written as runs between other characters: as a complement (`~/.*\s{65}.*/`) it
/// costs the lexer more than its fuel when it checks where the text may end.
const TEXT: &str = r#"TEXT: TAG_FREE & SPACED
TAG_FREE: /(?s:.*)/ & ~/(?s:.*)(<\/parameter>|<parameter=|<\/function>|<\/tool_call>)(?s:.*)/
SPACED: (WHITESPACE /[^ \t\r\n]/)* WHITESPACE
WHITESPACE: /[ \t\r\n]{0,64}/ & /[ \t\r]*(\n[ \t\r]*){0,3}/
"#;

/// The closing tag is part of the value's lexeme: were the text a lexeme of its own, the
/// lexer would extend it over `\n</parameter` (text it may hold) and then have no way to end
/// it. The lexeme is lazy, ending at the first closing tag, the only one the text allows.
const CLOSE: &str = "\\n</parameter>\\n";

/// Keywords of a string schema that raw text cannot be held to (`Value::Text` bounds only its
/// length); other keywords are annotations or concern other types.
const BEYOND_TEXT: &[&str] =
    &["pattern", "format", "$ref", "$dynamicRef", "anyOf", "oneOf", "allOf", "not", "if", "then", "else"];

/// Root keywords under which the properties alone no longer say what the arguments may be.
const OPAQUE_ROOT_KEYWORDS: &[&str] = &[
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "enum",
    "const",
    "patternProperties",
    "propertyNames",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "minProperties",
    "maxProperties",
    "unevaluatedProperties",
];

/// Whether the parser reads `name` back as written: it trims names and keys and ends them at
/// `>`, `<` or a line break.
fn is_tag_name(name: &str) -> bool {
    !name.is_empty() && name.trim() == name && !name.contains(['<', '>', '\n', '\r'])
}

/// Raw text the parser reads back whole.
fn is_raw_text(text: &str) -> bool {
    !VALUE_ENDS.iter().any(|tag| text.contains(tag))
}

/// A tool's parameters as the XML form writes them, or `None` where it cannot hold to the
/// schema (see the module docs).
fn parameters(schema: &Json) -> Option<Vec<Parameter>> {
    let root = schema.as_object()?;
    if OPAQUE_ROOT_KEYWORDS.iter().any(|k| root.contains_key(*k)) {
        return None;
    }
    if root.get("type").is_some_and(|t| t != "object") {
        return None;
    }
    let empty = Map::new();
    let properties = match root.get("properties") {
        None => &empty,
        Some(p) => p.as_object()?,
    };
    let required: Vec<&str> = match root.get("required") {
        None => Vec::new(),
        Some(r) => r.as_array()?.iter().map(Json::as_str).collect::<Option<_>>()?,
    };
    // A required key the properties do not declare could only be written as a free key.
    if required.iter().any(|k| !properties.contains_key(*k)) {
        return None;
    }
    let definitions: Map<String, Json> =
        ["$defs", "definitions"].iter().filter_map(|k| Some(((*k).to_owned(), root.get(*k)?.clone()))).collect();
    let mut list = Vec::new();
    for (key, property) in properties {
        let required = required.contains(&key.as_str());
        if !is_tag_name(key) {
            return None;
        }
        let value = match property {
            // A JSON Schema (free-form, as the client's): `true` allows any value.
            Json::Bool(true) => Value::Json(json!({})),
            // No value is valid: the key cannot be written at all.
            Json::Bool(false) if required => return None,
            Json::Bool(false) => continue,
            Json::Object(object) if object.get("type").is_some_and(|t| t == "string") => string_value(object)?,
            Json::Object(object) => {
                // The property's `$ref`s point into the root's definitions.
                let mut object = object.clone();
                for (k, v) in &definitions {
                    object.entry(k.clone()).or_insert_with(|| v.clone());
                }
                Value::Json(Json::Object(object))
            }
            _ => return None,
        };
        list.push(Parameter { key: key.clone(), required, value });
    }
    Some(list)
}

/// How a `"type": "string"` property is written raw; `None` where raw text cannot hold to it.
fn string_value(schema: &Map<String, Json>) -> Option<Value> {
    if BEYOND_TEXT.iter().any(|k| schema.contains_key(*k)) {
        return None;
    }
    let texts = match (schema.get("const"), schema.get("enum")) {
        (Some(c), _) => Some(vec![c]),
        (None, Some(e)) => Some(e.as_array()?.iter().collect()),
        (None, None) => None,
    };
    if let Some(texts) = texts {
        let texts: Vec<String> = texts.into_iter().map(|t| t.as_str().map(str::to_owned)).collect::<Option<_>>()?;
        return (!texts.is_empty() && texts.iter().all(|t| is_raw_text(t))).then_some(Value::OneOf(texts));
    }
    // A length that is not a count is a malformed schema: JSON's compiler is left to say so.
    let min = match schema.get("minLength") {
        None => 0,
        Some(n) => n.as_u64()?,
    };
    let max = match schema.get("maxLength") {
        None => None,
        Some(n) => Some(n.as_u64()?),
    };
    Some(Value::Text { min, max })
}

/// A Lark string literal (its escapes are JSON's).
fn quoted(text: &str) -> String {
    Json::from(text).to_string()
}

/// The Lark rules for "a call to one of `tools`" in Qwen XML as the rule `calls`; `framing`
/// is the `<tool_call>` tags it shares with Hermes (and the JSON form of a tool it cannot
/// write as XML).
pub(super) fn call_rules(tools: &[Tool], parallel: bool, framing: &ToolCallFraming) -> String {
    let (open, close) = (quoted(framing.open), quoted(framing.close));
    let mut rules = String::new();
    let mut bounded = String::new();
    let mut alternatives = Vec::new();
    let mut free_text = false;
    for (i, tool) in tools.iter().enumerate() {
        let call = format!("call_{i}");
        let xml = parameters(&tool.parameters).filter(|_| is_tag_name(&tool.name));
        let Some(parameters) = xml else {
            // JSON Schema, free-form.
            let schema = compact(json!({
                "type": "object",
                "properties": {"name": {"const": tool.name}, framing.arguments_key: tool.parameters},
                "required": ["name", framing.arguments_key],
                "additionalProperties": false,
            }));
            rules.push_str(&format!("{call}: {open} %json {schema} {close}\n"));
            alternatives.push(call);
            continue;
        };
        let mut body = vec![format!("{open} {}", quoted(&format!("<function={}>\n", tool.name)))];
        for (k, parameter) in parameters.iter().enumerate() {
            let rule = format!("{call}_{k}");
            let tag = quoted(&format!("<parameter={}>\n", parameter.key));
            let expansion = match &parameter.value {
                Value::Text { min: 0, max: None } => {
                    free_text = true;
                    format!("{tag} value")
                }
                Value::Text { min, max } => {
                    let max = max.map_or(String::new(), |m| m.to_string());
                    bounded.push_str(&format!("TEXT_{i}_{k}: TEXT & /(?s:.{{{min},{max}}})/\n"));
                    bounded.push_str(&format!("VALUE_{i}_{k}: TEXT_{i}_{k} \"{CLOSE}\"\n"));
                    bounded.push_str(&format!("value_{i}_{k}[lazy]: VALUE_{i}_{k}\n"));
                    format!("{tag} value_{i}_{k}")
                }
                Value::OneOf(texts) => {
                    let whole = |t: &String| quoted(&format!("<parameter={}>\n{t}\n</parameter>\n", parameter.key));
                    texts.iter().map(whole).collect::<Vec<_>>().join(" | ")
                }
                Value::Json(schema) => format!("{tag} %json {} \"{CLOSE}\"", compact(schema.clone())),
            };
            rules.push_str(&format!("{rule}: {expansion}\n"));
            body.push(if parameter.required { rule } else { format!("{rule}?") });
        }
        body.push(format!("{} {close}", quoted("</function>")));
        rules.push_str(&format!("{call}: {}\n", body.join(" ")));
        alternatives.push(call);
    }
    if free_text || !bounded.is_empty() {
        rules.push_str(&format!("{TEXT}VALUE: TEXT \"{CLOSE}\"\nvalue[lazy]: VALUE\n{bounded}"));
    }
    let separator = quoted(framing.separator);
    rules.push_str(&format!("call: {}\n", alternatives.join(" | ")));
    rules.push_str(&if parallel { format!("calls: call ({separator} call)*\n") } else { "calls: call\n".to_owned() });
    rules
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Parameter, Value, parameters};

    /// Each kind of property gets the value it is written with; `$ref`s keep their targets.
    #[test]
    fn properties_become_parameters_in_schema_order() {
        let schema = json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "where"},
            "mode": {"type": "string", "enum": ["r", "w"]},
            "lines": {"type": "integer", "minimum": 1},
            "tag": {"type": "string", "maxLength": 8},
            "note": {"type": "string", "nullable": true, "x-hint": "free"},
        }, "required": ["path", "lines"], "$defs": {"x": {"type": "null"}}});
        let list = parameters(&schema).unwrap();
        let keys: Vec<_> = list.iter().map(|p| (p.key.as_str(), p.required)).collect();
        assert_eq!(keys, [("path", true), ("mode", false), ("lines", true), ("tag", false), ("note", false)]);
        assert_eq!(list[0].value, Value::Text { min: 0, max: None });
        assert_eq!(list[1].value, Value::OneOf(vec!["r".into(), "w".into()]));
        let Value::Json(lines) = &list[2].value else { panic!("{:?}", list[2]) };
        assert_eq!(lines["$defs"]["x"], json!({"type": "null"}), "references still resolve");
        assert_eq!(list[3].value, Value::Text { min: 0, max: Some(8) });
        assert_eq!(list[4].value, Value::Text { min: 0, max: None }, "annotations leave the text free");
        assert_eq!(parameters(&json!({"type": "object"})).unwrap(), Vec::<Parameter>::new());
    }

    /// Schemas whose calls go out as JSON inside the tags instead.
    #[test]
    fn what_the_xml_form_cannot_hold_to_is_none() {
        for schema in [
            json!({"anyOf": [{"type": "object"}]}),
            json!({"$ref": "#/$defs/a", "$defs": {"a": {"type": "object"}}}),
            json!({"type": "array"}),
            json!({"properties": {"a": {"type": "string", "pattern": "^x$"}}}),
            json!({"properties": {"a": {"type": "string", "format": "uri"}}}),
            json!({"properties": {"a": {"type": "string", "enum": ["x</parameter>"]}}}),
            json!({"properties": {"a b>": {"type": "string"}}}),
            json!({"properties": {}, "required": ["free"], "additionalProperties": true}),
            json!({"properties": {"a": false}, "required": ["a"]}),
        ] {
            assert_eq!(parameters(&schema), None, "{schema}");
        }
    }
}
