//! Rendering a chat template exactly as transformers' `apply_chat_template` does.
//!
//! transformers renders with a Jinja2 `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` plus `raise_exception`, `strftime_now`, `namespace` and its own `tojson`.
//! This module configures minijinja to behave the same way, and prepares the render inputs the
//! way transformers does (None-valued message keys dropped, reasoning fields aliased, special
//! tokens passed as variables, `continue_final_message` handled by the same tag trick).

use std::collections::BTreeMap;
use std::sync::Arc;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde_json::{Map, Value as Json};

use crate::TemplateError;
use crate::pyvalue::{JsonDumpOptions, py_is_space, py_json_dumps, py_str};
use crate::source::TemplateSource;

/// What a template is rendered with: the request's conversation and options.
#[derive(Debug, Clone, Default)]
pub struct RenderInput {
    /// OpenAI-style messages (objects with at least `role`).
    pub messages: Vec<Json>,
    /// OpenAI-style tool definitions, or `None` when the request has none.
    pub tools: Option<Vec<Json>>,
    /// Append the header that starts the assistant's reply.
    pub add_generation_prompt: bool,
    /// Leave the last message open so the model continues it.
    pub continue_final_message: bool,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub kwargs: Map<String, Json>,
}

/// A compiled chat template, ready to render requests. Cheap to share across threads.
#[derive(Clone)]
pub struct ChatTemplate {
    inner: Arc<Compiled>,
}

struct Compiled {
    env: Environment<'static>,
    source: TemplateSource,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("origin", &self.inner.source.origin).finish()
    }
}

/// The error `raise_exception` raises, kept as the error's source so that the template's own
/// message can be told apart from minijinja's errors.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

impl ChatTemplate {
    /// Compiles every template of `source`; a syntax error names the template and line.
    pub fn new(source: TemplateSource) -> Result<Self, TemplateError> {
        let mut env = transformers_environment();
        for (name, text) in &source.templates {
            env.add_template_owned(name.clone(), rewrite_generation_blocks(text))
                .map_err(|e| TemplateError::Syntax { message: describe(&e) })?;
        }
        Ok(ChatTemplate { inner: Arc::new(Compiled { env, source }) })
    }

    /// The source this template was loaded from.
    pub fn source(&self) -> &TemplateSource {
        &self.inner.source
    }

    /// Renders `input` to the prompt text, byte-identical to transformers' `apply_chat_template`
    /// with `tokenize=False`, or returns the error transformers would raise.
    pub fn render(&self, input: &RenderInput) -> Result<String, TemplateError> {
        if input.messages.is_empty() {
            return Err(TemplateError::BadRequest(
                "Cannot apply chat template to an empty conversation. Provide at least one message.".into(),
            ));
        }
        if input.continue_final_message && input.add_generation_prompt {
            return Err(TemplateError::BadRequest(
                "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message \
                 when you want the model to continue the final message, and add_generation_prompt when you want \
                 to add a header that will prompt it to start a new assistant message instead."
                    .into(),
            ));
        }
        let mut messages = Vec::with_capacity(input.messages.len());
        for message in &input.messages {
            messages.push(normalize_message(message)?);
        }
        let (name, text) = self.inner.source.select(input.tools.is_some())?;
        let continued = if input.continue_final_message { Some(tag_final_message(&mut messages, text)?) } else { None };

        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (key, token) in &self.inner.source.special_tokens {
            ctx.insert(key.clone(), Value::from(token.clone()));
        }
        for (key, value) in &input.kwargs {
            ctx.insert(key.clone(), to_value(value));
        }
        ctx.insert("messages".into(), to_value(&messages));
        ctx.insert("tools".into(), input.tools.as_ref().map(to_value).unwrap_or(Value::from(())));
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert("add_generation_prompt".into(), Value::from(input.add_generation_prompt));

        let template =
            self.inner.env.get_template(name).map_err(|e| TemplateError::Syntax { message: describe(&e) })?;
        let mut out = CappedOutput { bytes: Vec::new(), limit: RENDER_OUTPUT_LIMIT };
        if let Err(err) = template.render_captured_to(to_value(&ctx), &mut out) {
            return Err(match out.bytes.len() >= RENDER_OUTPUT_LIMIT {
                true => TemplateError::BadRequest(format!(
                    "the chat template's output passed its limit of {} MiB for this request",
                    RENDER_OUTPUT_LIMIT >> 20
                )),
                false => render_error(err),
            });
        }
        let rendered = String::from_utf8(out.bytes).expect("minijinja writes UTF-8");
        match continued {
            Some(final_text) => cut_at_continue_tag(rendered, &final_text),
            None => Ok(rendered),
        }
    }
}

/// transformers drops message keys whose value is None, then aliases reasoning fields:
/// `{"thinking": r, **message, "reasoning_content": r}` (the key order matters to templates
/// that iterate over a message).
fn normalize_message(message: &Json) -> Result<Json, TemplateError> {
    let Json::Object(fields) = message else {
        return Err(TemplateError::BadRequest(format!(
            "Chat messages should be dicts, dataclasses or pydantic models, but got {message}."
        )));
    };
    let fields: Map<String, Json> =
        fields.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let reasoning = ["reasoning_content", "thinking", "reasoning"].iter().find_map(|k| fields.get(*k).cloned());
    let Some(reasoning) = reasoning else {
        return Ok(Json::Object(fields));
    };
    let mut aliased = Map::new();
    aliased.insert("thinking".into(), reasoning.clone());
    for (k, v) in fields {
        aliased.insert(k, v);
    }
    aliased.insert("reasoning_content".into(), reasoning);
    Ok(Json::Object(aliased))
}

/// Appends transformers' continue tag to the final message's text and returns that text.
fn tag_final_message(messages: &mut [Json], template_text: &str) -> Result<String, TemplateError> {
    let bad = |m: &str| TemplateError::BadRequest(m.to_owned());
    let last =
        messages.last_mut().ok_or_else(|| bad("continue_final_message is set but the conversation is empty!"))?;
    if !template_text.contains("content") {
        return Err(bad(
            "continue_final_message is set to \"content\" but this is not an accepted field in the chat_template",
        ));
    }
    match last.get_mut("content") {
        Some(Json::String(text)) => {
            let original = text.clone();
            text.push_str(CONTINUE_TAG);
            Ok(original)
        }
        Some(Json::Array(blocks)) => {
            for block in blocks.iter_mut().rev() {
                if let Some(Json::String(text)) = block.get_mut("text") {
                    let original = text.clone();
                    text.push_str(CONTINUE_TAG);
                    return Ok(original);
                }
            }
            Err(bad("continue_final_message is set but we could not find any text to continue in the final message!"))
        }
        Some(_) => Err(bad("continue_final_message is set but the final message's content is neither text nor parts")),
        None => Err(bad("continue_final_message is set but the final message has no \"content\" to continue!")),
    }
}

fn py_strip(s: &str) -> &str {
    s.trim_matches(py_is_space)
}

fn cut_at_continue_tag(rendered: String, final_text: &str) -> Result<String, TemplateError> {
    let tag = py_strip(CONTINUE_TAG);
    if !rendered.contains(py_strip(final_text)) || !rendered.contains(tag) {
        return Err(TemplateError::BadRequest(format!(
            "continue_final_message is set but the final message does not appear in the chat after applying the \
             chat template! This can happen if the chat template deletes portions of the final message. Please \
             verify the chat template and final message in your chat to ensure they are compatible.Final message \
             to continue: {}\nRendered chat:\n{rendered}",
            py_strip(final_text)
        )));
    }
    let at = rendered.rfind(tag).expect("checked above");
    if rendered[at..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..at].to_owned())
    } else {
        Ok(rendered[..at].trim_end_matches(py_is_space).to_owned())
    }
}

/// transformers' `{% generation %}` tag only marks assistant spans for training masks; for
/// rendering it is a no-op block. minijinja does not know it, so turn it into `{% if true %}`,
/// keeping the whitespace-control markers so trimming stays identical.
fn rewrite_generation_blocks(text: &str) -> String {
    if !text.contains("generation") {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body, trail) = split_ws_markers(inner);
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_ws_markers(inner: &str) -> (&str, &str, &str) {
    let lead = if inner.starts_with('-') || inner.starts_with('+') { &inner[..1] } else { "" };
    let inner = &inner[lead.len()..];
    let trail = if inner.ends_with('-') || inner.ends_with('+') { &inner[inner.len() - 1..] } else { "" };
    (lead, &inner[..inner.len() - trail.len()], trail)
}

fn describe(err: &Error) -> String {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        message.push_str(": ");
        message.push_str(&inner.to_string());
        source = inner.source();
    }
    message
}

fn render_error(err: Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(inner) = source {
        if let Some(raised) = inner.downcast_ref::<RaisedByTemplate>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = inner.source();
    }
    TemplateError::Render { message: describe(&err) }
}

/// The work one render may do (minijinja's fuel: about one per instruction and per 64 bytes
/// made). Real templates use well under a million even for long agent conversations with
/// tools; this bounds a runaway template to a second or two.
pub const RENDER_FUEL: u64 = 50_000_000;

/// Most bytes one render may write. Fuel counts instructions, not bytes: one instruction that
/// prints a 10 MB message, looped, would otherwise fill memory long before the fuel runs out.
/// Twice the largest request body, so that every request the server accepts renders.
pub const RENDER_OUTPUT_LIMIT: usize = 64 << 20;

/// A render's output, refusing bytes past its limit (which stops the render).
struct CappedOutput {
    bytes: Vec<u8>,
    limit: usize,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.bytes.extend_from_slice(&buf[..self.limit - self.bytes.len()]);
            return Err(std::io::Error::other("the render's output limit is reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How deep a render may recurse (macros count about 10 per call); minijinja's own default of
/// 500 assumes a main thread's stack, renders run on smaller worker stacks.
pub const RENDER_RECURSION_LIMIT: usize = 200;

/// A minijinja environment that behaves like transformers' Jinja2 environment.
fn transformers_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("default delimiters are valid"),
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // A hostile `--chat-template-file` or request (huge loops, deep recursion through macros)
    // must fail the render, not hang the server or overflow a worker thread's stack.
    env.set_fuel(Some(RENDER_FUEL));
    env.set_recursion_limit(RENDER_RECURSION_LIMIT);
    // Jinja2 prints values with Python's str(): True, None, ['a'], {'k': 1}.
    env.set_formatter(|out, _state, value| {
        out.write_str(&py_str(value)).map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
    });
    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: Value| py_str(&v));
    env.add_filter("trim", trim);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_test("iterable", |v: Value| v.is_undefined() || (!v.is_none() && v.try_iter().is_ok()));
    env.add_test("sequence", |v: Value| matches!(v.kind(), ValueKind::String | ValueKind::Seq | ValueKind::Map));
    env
}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = py_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(RaisedByTemplate(message)))
}

fn strftime_now(format: String) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("invalid strftime format {format:?}")));
    }
    Ok(Value::from(chrono::Local::now().format_with_items(items.into_iter()).to_string()))
}

fn trim(_state: &State, value: Value, chars: Option<String>) -> String {
    let text = py_str(&value);
    match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_owned(),
        None => py_strip(&text).to_owned(),
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` with every option settable by position or keyword.
fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let bad = |m: String| Error::new(ErrorKind::InvalidOperation, m);
    let mut options = JsonDumpOptions::default();
    let positional = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > positional.len() {
        return Err(bad("tojson takes at most 4 arguments".into()));
    }
    let mut named: Vec<(&str, Value)> = positional.iter().copied().zip(args.iter().cloned()).collect();
    for key in positional {
        if let Some(v) = kwargs.get::<Option<Value>>(key)? {
            named.push((key, v));
        }
    }
    kwargs.assert_all_used()?;
    for (key, v) in named {
        match key {
            "ensure_ascii" => options.ensure_ascii = v.is_true(),
            "sort_keys" => options.sort_keys = v.is_true(),
            "indent" => {
                options.indent = match v.kind() {
                    ValueKind::None | ValueKind::Undefined => None,
                    ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
                    ValueKind::Number => match i64::try_from(v) {
                        // Bounded so that a template cannot make us allocate without limit.
                        Ok(n @ 0..=64) => Some(" ".repeat(n as usize)),
                        Ok(n) if n < 0 => Some(String::new()),
                        _ => return Err(bad("tojson: indent must be an integer from 0 to 64".into())),
                    },
                    _ => return Err(bad(format!("tojson: indent must be an int or a string, not {}", v.kind()))),
                }
            }
            "separators" => {
                if v.is_none() || v.is_undefined() {
                    continue;
                }
                let parts: Vec<Value> = v.try_iter()?.collect();
                match parts.as_slice() {
                    [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                        options.separators = Some((a.as_str().unwrap().to_owned(), b.as_str().unwrap().to_owned()))
                    }
                    _ => return Err(bad("tojson: separators must be a pair of strings".into())),
                }
            }
            _ => unreachable!("only known keys are collected"),
        }
    }
    py_json_dumps(&value, &options).map(Value::from).map_err(bad)
}

/// Converts any serializable value (JSON here) into a template value.
pub(crate) fn to_value<T: serde::Serialize>(value: T) -> Value {
    Value::from(minijinja::value::Serde(value))
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    fn render(text: &str) -> Result<String, TemplateError> {
        let template = crate::testing::template_from_text(text, BTreeMap::new()).unwrap();
        let input =
            RenderInput { messages: vec![serde_json::json!({"role": "user", "content": "hi"})], ..Default::default() };
        template.render(&input)
    }

    #[test]
    fn an_endless_loop_runs_out_of_fuel() {
        let started = std::time::Instant::now();
        let err =
            render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}").unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
        assert!(started.elapsed().as_secs() < 30, "took {:?}", started.elapsed());
    }

    #[test]
    fn unbounded_recursion_is_an_error() {
        let err = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").unwrap_err();
        assert!(err.to_string().contains("recursion"), "{err}");
    }

    #[test]
    fn a_loop_that_prints_without_end_stops_at_the_output_limit() {
        let started = std::time::Instant::now();
        let big = "x".repeat(1 << 20);
        let template = crate::testing::template_from_text(
            "{% for a in range(100000) %}{{ messages[0].content }}{% endfor %}",
            BTreeMap::new(),
        )
        .unwrap();
        let input =
            RenderInput { messages: vec![serde_json::json!({"role": "user", "content": big})], ..Default::default() };
        let err = template.render(&input).unwrap_err();
        assert!(matches!(err, TemplateError::BadRequest(_)), "{err}");
        assert!(err.to_string().contains("64 MiB"), "{err}");
        assert!(started.elapsed().as_secs() < 30, "took {:?}", started.elapsed());
    }

    #[test]
    fn ordinary_templates_are_within_the_limits() {
        let text = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
        assert_eq!(render(text).unwrap(), "user: hi\n");
    }
}
