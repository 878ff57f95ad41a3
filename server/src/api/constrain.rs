//! From a chat request's `tools`, `tool_choice`, `parallel_tool_calls` and `response_format` to
//! the grammar its reply must follow (llguidance's Lark dialect, with `%json` schemas).
//!
//! Enforced: `tool_choice: "required"` (a call to one of the tools), a named function (a call to
//! it), `response_format` `json_object` (any JSON object) and `json_schema` (the schema). A
//! call is written in the model's own tool-call format, so the output parser reads it back as
//! `tool_calls`: a JSON call object in the family's framing (`ModelFormat::tool_call_framing`:
//! Hermes' `<tool_call>` tags, Llama 3's bare objects), and for Qwen3.5's XML format its
//! `<function=NAME>` and `<parameter=KEY>` tags inside `<tool_call>` ([`xml`]). `"auto"` with a
//! `response_format` lets the model choose between a call and the JSON reply; `"auto"` with
//! tools constrains a reply only once it opens a call (a lazy grammar: framed, bare or fenced
//! JSON, the call must then be valid; Qwen3.5's XML calls stay free); `"none"` constrains
//! nothing. Where the prompt left reasoning open, a forced reply closes it first.
//!
//! Schemas are written with `json!`: they are JSON Schema, the client's own (tool parameters,
//! `response_format`) or built around it, free-form by nature.

use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_templates::ModelFormat;
use radix_templates::parse::OutputFormat;
use serde_json::{Value as Json, json};

use super::ApiError;
use super::request::{ChatCompletionRequest, ResponseFormat, ToolChoice, ToolDefinition};
use crate::engine::{Constraint, ConstraintFactory};

mod xml;

/// One declared function.
#[derive(Debug, Clone, PartialEq)]
struct Tool {
    name: String,
    parameters: Json,
}

/// What the reply must be.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    /// One of these tools is called (several calls in a row when `parallel`).
    Calls { tools: Vec<Tool>, parallel: bool },
    /// A JSON document valid under this schema.
    Json(Json),
    /// Either of the two (`tool_choice: "auto"` with a `response_format`).
    CallsOrJson { tools: Vec<Tool>, parallel: bool, schema: Json },
    /// Free, unless the reply opens a call (`tool_choice: "auto"` with tools): then a valid call
    /// of one of these tools, framed, bare or fenced (a lazy grammar).
    CallIfOpened { tools: Vec<Tool>, parallel: bool },
}

/// JSON as a model that began an object itself writes it: whitespace where it likes, but at
/// most a line's worth in one place, so a small model cannot fill the reply with it.
fn lenient(mut schema: Json) -> Json {
    if let Some(object) = schema.as_object_mut() {
        object.insert("x-guidance".into(), json!({"whitespace_pattern": "[ \\t\\r\\n]{0,64}"}));
    }
    schema
}

/// The grammar engine writes JSON the way Python's `json.dumps` does, with no free whitespace:
/// a small model given the freedom fills replies with newlines until `max_tokens`.
fn compact(mut schema: Json) -> Json {
    if let Some(object) = schema.as_object_mut() {
        object.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "key_separator": ": ", "item_separator": ", "}),
        );
    }
    schema
}

/// Tool arguments get only the keys their schema declares: a schema that does not say
/// `additionalProperties` would let a small model invent keys until `max_tokens` cuts the call
/// off, and no client reads undeclared arguments (OpenAI's strict mode demands the same).
fn closed_objects(mut schema: Json) -> Json {
    fn close(schema: &mut Json) {
        let Some(object) = schema.as_object_mut() else { return };
        if object.contains_key("properties") && !object.contains_key("additionalProperties") {
            object.insert("additionalProperties".into(), Json::Bool(false));
        }
        for key in ["properties", "$defs", "definitions"] {
            if let Some(Json::Object(children)) = object.get_mut(key) {
                children.values_mut().for_each(close);
            }
        }
        for key in ["items", "additionalItems"] {
            if let Some(child) = object.get_mut(key) {
                close(child);
            }
        }
        for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
            if let Some(Json::Array(children)) = object.get_mut(key) {
                children.iter_mut().for_each(close);
            }
        }
    }
    close(&mut schema);
    schema
}

fn tools(fields: &ChatCompletionRequest) -> Result<Vec<Tool>, ApiError> {
    let Some(list) = &fields.tools else { return Ok(Vec::new()) };
    list.iter()
        .enumerate()
        .map(|(i, ToolDefinition::Function { function })| {
            if function.name.is_empty() {
                return Err(ApiError::bad_request(format!("tools[{i}].function.name must be a non-empty string")));
            }
            let parameters = match &function.parameters {
                None => json!({"type": "object"}),
                Some(p) if p.is_object() => closed_objects(p.clone()),
                Some(_) => {
                    return Err(ApiError::bad_request(format!("tools[{i}].function.parameters must be a JSON schema")));
                }
            };
            Ok(Tool { name: function.name.clone(), parameters })
        })
        .collect()
}

/// The schema `response_format` asks for, if any.
fn response_schema(fields: &ChatCompletionRequest) -> Result<Option<Json>, ApiError> {
    match &fields.response_format {
        None | Some(ResponseFormat::Text) => Ok(None),
        Some(ResponseFormat::JsonObject) => Ok(Some(json!({"type": "object"}))),
        Some(ResponseFormat::JsonSchema { json_schema }) => match &json_schema.schema {
            None => Ok(Some(json!({}))),
            Some(schema) if schema.is_object() || schema.is_boolean() => Ok(Some(schema.clone())),
            Some(_) => Err(ApiError::bad_request("response_format.json_schema.schema must be a JSON schema")),
        },
    }
}

/// Reads the request's constraint fields; `None` when the reply is free.
fn shape(fields: &ChatCompletionRequest) -> Result<Option<Shape>, ApiError> {
    let tools = tools(fields)?;
    let parallel = fields.parallel_tool_calls.unwrap_or(true);
    let schema = response_schema(fields)?;
    let no_tools =
        |choice: &str| ApiError::bad_request(format!("tool_choice {choice} needs a non-empty 'tools' array"));
    let calls = match &fields.tool_choice {
        None | Some(ToolChoice::Auto) if !tools.is_empty() && schema.is_none() => {
            return Ok(Some(Shape::CallIfOpened { tools, parallel }));
        }
        None | Some(ToolChoice::Auto) => None,
        Some(ToolChoice::None) => return Ok(schema.map(Shape::Json)),
        Some(ToolChoice::Required) => {
            if tools.is_empty() {
                return Err(no_tools("\"required\""));
            }
            Some(Shape::Calls { tools: tools.clone(), parallel })
        }
        Some(ToolChoice::Function(name)) => {
            if tools.is_empty() {
                return Err(no_tools("naming a function"));
            }
            let tool = tools.iter().find(|t| &t.name == name).ok_or_else(|| {
                ApiError::bad_request(format!("tool_choice names the function {name:?}, which is not in 'tools'"))
            })?;
            // A named function is one call to it, as OpenAI does.
            Some(Shape::Calls { tools: vec![tool.clone()], parallel: false })
        }
    };
    Ok(match (calls, schema) {
        (Some(calls), _) => Some(calls),
        (None, Some(schema)) if !tools.is_empty() => Some(Shape::CallsOrJson { tools, parallel, schema }),
        (None, Some(schema)) => Some(Shape::Json(schema)),
        (None, None) => None,
    })
}

/// The call objects of `tools` as the rules `call_0`, `call_1`, …, each JSON written `style`.
fn call_objects(tools: &[Tool], arguments_key: &str, style: fn(Json) -> Json) -> (String, String) {
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let schema = style(json!({
            "type": "object",
            "properties": {"name": {"const": tool.name}, arguments_key: tool.parameters},
            "required": ["name", arguments_key],
            "additionalProperties": false,
        }));
        rules.push_str(&format!("call_{i}: %json {schema}\n"));
        alternatives.push(format!("call_{i}"));
    }
    (rules, alternatives.join(" | "))
}

/// The lazy grammar of `tool_choice: "auto"`: a reply that opens a call (in the model's framing,
/// or as a bare or fenced object, as small models write it) must be a valid call of a declared
/// tool. The constraint only applies once the reply opens one ([`Constraint::lazy`]).
fn lazy_call_rules(tools: &[Tool], parallel: bool, format: OutputFormat) -> String {
    let framing = ModelFormat::new(format).tool_call_framing();
    let arguments_key = framing.map_or("arguments", |f| f.arguments_key);
    let (objects, alternatives) = call_objects(tools, arguments_key, lenient);
    let mut rules = format!("{objects}bare: {alternatives}\n");
    rules.push_str("fenced: \"```json\\n\" bare \"\\n```\" | \"```\\n\" bare \"\\n```\"\n");
    let mut openings = vec!["bare", "fenced"];
    // Qwen3.5 frames calls as XML (`<tool_call>\n<function=NAME>...`), which no JSON grammar
    // describes: a framed opening would force `{` after `<tool_call>` and push the model off its
    // own format. Its framed calls stay free (the parser reads them); bare and fenced JSON, as
    // a small model may write them instead, are still held to the declared tools.
    let framed_json = format != OutputFormat::QwenXml;
    if let Some(framing) = framing.filter(|f| !f.open.is_empty() && framed_json) {
        let quoted = |text: &str| Json::from(text).to_string();
        let framed = format!("framed: {} bare {}\n", quoted(framing.open), quoted(framing.close));
        rules.push_str(&framed);
        let separator = quoted(framing.separator);
        rules.push_str(&if parallel {
            format!("framed_calls: framed ({separator} framed)*\n")
        } else {
            "framed_calls: framed\n".to_owned()
        });
        openings.push("framed_calls");
    }
    let starts: Vec<String> = openings.iter().flat_map(|o| [o.to_string(), format!("WS {o}")]).collect();
    format!("start: {}\nWS: /[ \\t\\r\\n]+/\n{rules}", starts.join(" | "))
}

/// The Lark rules for "a call to one of `tools`" as the rule `calls`.
fn call_rules(tools: &[Tool], parallel: bool, format: OutputFormat) -> Result<String, ApiError> {
    let Some(framing) = ModelFormat::new(format).tool_call_framing() else {
        return Err(ApiError::bad_request(
            "this model's chat template has no tool-call format, so tool_choice \"required\" or a named \
             function cannot be honoured; start the server with a --chat-template-file that shows tools",
        ));
    };
    if format == OutputFormat::QwenXml {
        return Ok(xml::call_rules(tools, parallel, &framing));
    }
    let arguments_key = framing.arguments_key;
    // Lark string literals read JSON string escapes; empty framing writes nothing.
    let quoted = |text: &str| Json::from(text).to_string();
    let open = if framing.open.is_empty() { String::new() } else { format!("{} ", quoted(framing.open)) };
    let close = if framing.close.is_empty() { String::new() } else { format!(" {}", quoted(framing.close)) };
    let separator = quoted(framing.separator);
    let (mut rules, alternatives) = call_objects(tools, arguments_key, compact);
    rules.push_str(&format!("call: {open}({alternatives}){close}\n"));
    rules.push_str(&if parallel { format!("calls: call ({separator} call)*\n") } else { "calls: call\n".to_owned() });
    Ok(rules)
}

/// The Lark grammar the reply must match, or `None` when it is free; `true` with it when it
/// applies only once the reply opens a call (lazy).
fn grammar(fields: &ChatCompletionRequest, format: OutputFormat) -> Result<Option<(String, bool)>, ApiError> {
    let Some(shape) = shape(fields)? else { return Ok(None) };
    if let Shape::CallIfOpened { tools, parallel } = &shape {
        return Ok(Some((lazy_call_rules(tools, *parallel, format), true)));
    }
    Ok(Some((
        match shape {
            Shape::Json(schema) => format!("start: %json {}\n", compact(schema)),
            Shape::Calls { tools, parallel } => format!("start: calls\n{}", call_rules(&tools, parallel, format)?),
            Shape::CallsOrJson { tools, parallel, schema } => match call_rules(&tools, parallel, format) {
                Ok(rules) => format!("start: calls | json\njson: %json {}\n{rules}", compact(schema)),
                // Without a tool-call format "auto" cannot call anything: the JSON reply it is.
                Err(_) => format!("start: %json {}\n", compact(schema)),
            },
            Shape::CallIfOpened { .. } => unreachable!("returned above"),
        },
        false,
    )))
}

/// The constraint a chat request asks for (HTTP 400 for a malformed field or a schema the
/// grammar engine rejects), or `None` when the reply is free text. `reasoning_close`: the
/// marker that ends the reasoning the prompt left open (Qwen3/3.5's `<think>`), if it did.
pub(super) fn chat_constraint(
    fields: &ChatCompletionRequest,
    format: OutputFormat,
    reasoning_close: Option<&str>,
    tokenizer: &Arc<Tokenizer>,
) -> Result<Option<Constraint>, ApiError> {
    let Some((mut grammar, lazy)) = grammar(fields, format)? else { return Ok(None) };
    if let (Some(close), false) = (reasoning_close, lazy) {
        // A forced call or JSON reply to a prompt that opened reasoning: close the (empty)
        // reasoning first, as the template does without thinking, so the answer is content and
        // not text inside the reasoning. (A lazy grammar only starts at a call's opening.)
        let close = Json::from(format!("{close}\n\n")).to_string();
        grammar = format!("start: {close} answer\n{}", grammar.replacen("start:", "answer:", 1));
    }
    let factory = ConstraintFactory::shared(tokenizer).map_err(ApiError::internal)?;
    let constraint = factory
        .lark(&grammar)
        .map_err(|e| ApiError::bad_request(format!("tools or response_format cannot be enforced: {e}")))?;
    Ok(Some(if lazy { constraint.lazy() } else { constraint }))
}

#[cfg(test)]
mod tests;
