//! Qwen XML tool calls ([`crate::parse::OutputFormat::QwenXml`]), as Qwen3.5's template writes
//! them after `<tool_call>`:
//!
//! ```text
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! A call commits when `<function=NAME>` closes; each parameter is emitted as arguments once its
//! value ends, so the arguments always add up to one JSON object. The rules are in the module
//! docs of [`crate::parse`].

use std::sync::Arc;

use serde_json::Value as Json;

use super::{Call, Content, Mode, Next, first_char};
use crate::parse::emit::{Emitter, Kind};
use crate::parse::json_scan::is_json_ws;
use crate::parse::markers::{
    FUNCTION_CLOSE, FUNCTION_OPEN, HERMES_MARKERS, Match, PARAMETER_CLOSE, PARAMETER_OPEN, TOOL_CLOSE, TOOL_OPEN,
    XML_BODY_MARKERS, XML_VALUE_ENDS, match_at,
};
use crate::parse::recover::DeclaredTool;

/// Where inside the call the parser is.
#[derive(Debug)]
enum State {
    /// After `<tool_call>`: whitespace, then `<function=` (or `{`: a Hermes JSON call).
    Open,
    /// Inside `<function=`…`>`: the name so far.
    Name(String),
    /// Between parameters: whitespace, then `<parameter=`, `</function>` or `</tool_call>`.
    Body,
    /// Inside `<parameter=`…`>`: the key so far.
    Key(String),
    /// A parameter's value, up to the tag that ends it.
    Value { key: String, text: String },
    /// After `</function>`: whitespace, then `</tool_call>`.
    Close,
}

/// Inside an XML `<tool_call>`.
#[derive(Debug)]
pub(crate) struct XmlCall {
    /// Whitespace held before `<tool_call>`; dropped on commitment, content on fallback.
    lead_ws: String,
    /// The call's text from `<tool_call>` on, kept until commitment for the fallback.
    raw: String,
    state: State,
    /// Set on commitment, with the function name.
    index: Option<usize>,
    name: String,
    /// Parameters emitted so far.
    params: usize,
    /// The request's tools: a parameter their schema declares a string stays a string.
    tools: Arc<[DeclaredTool]>,
}

impl XmlCall {
    pub(super) fn new(lead_ws: String, tools: Arc<[DeclaredTool]>) -> Box<XmlCall> {
        Box::new(XmlCall {
            lead_ws,
            raw: TOOL_OPEN.to_owned(),
            state: State::Open,
            index: None,
            name: String::new(),
            params: 0,
            tools,
        })
    }

    /// Reads the call; waits only where a tag may still be forming.
    pub(super) fn step(
        &mut self,
        next_index: &mut usize,
        id_prefix: &str,
        buf: &str,
        mut i: usize,
        at_end: bool,
        em: &mut Emitter,
    ) -> (usize, Next) {
        while i < buf.len() {
            let rest = &buf[i..];
            let ch = first_char(rest);
            match &mut self.state {
                State::Open => {
                    if is_json_ws(ch) {
                        self.raw.push(ch);
                        i += 1;
                        continue;
                    }
                    if ch == '{' {
                        // Hermes JSON inside the tags: what a grammar-forced call writes.
                        let ws = &self.raw[TOOL_OPEN.len()..];
                        let call = Call::after_whitespace(std::mem::take(&mut self.lead_ws), ws);
                        return (i, Next::Switch(Mode::Call(call)));
                    }
                    match match_at(rest, &[FUNCTION_OPEN], at_end) {
                        Match::Partial => return (i, Next::Stop),
                        Match::Full(tag) => {
                            self.raw.push_str(tag);
                            i += tag.len();
                            self.state = State::Name(String::new());
                        }
                        Match::None => return (i, Next::Switch(self.fall_back(em))),
                    }
                }
                State::Name(name) => match ch {
                    '>' if !name.trim().is_empty() => {
                        let name = std::mem::take(name).trim().to_owned();
                        i += 1;
                        self.commit(next_index, id_prefix, name, em);
                    }
                    '>' | '<' | '\n' | '\r' => return (i, Next::Switch(self.fall_back(em))),
                    _ => {
                        name.push(ch);
                        self.raw.push(ch);
                        i += ch.len_utf8();
                    }
                },
                State::Body => {
                    if ch.is_whitespace() {
                        i += ch.len_utf8();
                        continue;
                    }
                    if ch != '<' {
                        return (i, Next::Switch(self.end(em, true)));
                    }
                    match match_at(rest, XML_BODY_MARKERS, at_end) {
                        Match::Partial => return (i, Next::Stop),
                        Match::Full(tag) => {
                            i += tag.len();
                            match tag {
                                PARAMETER_OPEN => self.state = State::Key(String::new()),
                                FUNCTION_CLOSE => self.state = State::Close,
                                _ => return (i, Next::Switch(self.end(em, false))),
                            }
                        }
                        Match::None => return (i, Next::Switch(self.end(em, true))),
                    }
                }
                State::Key(key) => match ch {
                    '>' if !key.trim().is_empty() => {
                        let key = std::mem::take(key).trim().to_owned();
                        i += 1;
                        self.state = State::Value { key, text: String::new() };
                    }
                    '>' | '<' | '\n' | '\r' => {
                        let key = std::mem::take(key);
                        return (i, Next::Switch(self.end_in_key(&key, em)));
                    }
                    _ => {
                        key.push(ch);
                        i += ch.len_utf8();
                    }
                },
                State::Value { key, text } => {
                    if ch != '<' {
                        let end = rest.find('<').map_or(buf.len(), |p| i + p);
                        text.push_str(&buf[i..end]);
                        i = end;
                        continue;
                    }
                    match match_at(rest, XML_VALUE_ENDS, at_end) {
                        Match::Partial => return (i, Next::Stop),
                        Match::None => {
                            text.push('<');
                            i += 1;
                        }
                        Match::Full(tag) => {
                            let (key, text) = (std::mem::take(key), std::mem::take(text));
                            self.parameter(&key, &text, em);
                            i += tag.len();
                            match tag {
                                PARAMETER_CLOSE => self.state = State::Body,
                                PARAMETER_OPEN => self.state = State::Key(String::new()),
                                FUNCTION_CLOSE => self.state = State::Close,
                                _ => return (i, Next::Switch(self.end(em, false))),
                            }
                        }
                    }
                }
                State::Close => {
                    if ch.is_whitespace() {
                        i += ch.len_utf8();
                        continue;
                    }
                    match match_at(rest, &[TOOL_CLOSE], at_end) {
                        Match::Partial => return (i, Next::Stop),
                        Match::Full(tag) => return (i + tag.len(), Next::Switch(self.end(em, false))),
                        Match::None => return (i, Next::Switch(self.end(em, true))),
                    }
                }
            }
        }
        (i, Next::Stop)
    }

    /// The reply ended inside the call: a committed call keeps what it has (a value being
    /// written is taken as it stands); an uncommitted one is content.
    pub(super) fn end_of_reply(&mut self, em: &mut Emitter) -> Mode {
        match std::mem::replace(&mut self.state, State::Body) {
            State::Open | State::Name(_) => self.fall_back(em),
            State::Key(key) => self.end_in_key(&key, em),
            State::Value { key, text } => {
                self.parameter(&key, &text, em);
                self.end(em, false)
            }
            State::Body | State::Close => self.end(em, false),
        }
    }

    fn commit(&mut self, next_index: &mut usize, id_prefix: &str, name: String, em: &mut Emitter) {
        let index = *next_index;
        *next_index += 1;
        self.index = Some(index);
        self.raw = String::new();
        self.lead_ws = String::new();
        em.start(index, format!("{id_prefix}{index}"), name.clone());
        self.name = name;
        self.state = State::Body;
    }

    /// Emits one parameter as the next member of the arguments object.
    fn parameter(&mut self, key: &str, text: &str, em: &mut Emitter) {
        let Some(index) = self.index else { return };
        let value = parameter_value(text, self.is_string_parameter(key));
        let separator = if self.params == 0 { "{" } else { ", " };
        em.args(index, &format!("{separator}{}: {value}", Json::from(key)));
        self.params += 1;
    }

    fn is_string_parameter(&self, key: &str) -> bool {
        self.tools
            .iter()
            .find(|tool| tool.name == self.name)
            .and_then(|tool| tool.parameters.get("properties")?.get(key)?.get("type"))
            .is_some_and(|kind| kind.as_str() == Some("string"))
    }

    /// Ends a committed call; with `after_call` (the call ended without its `</tool_call>`) a
    /// `</tool_call>` right after is still the call's.
    fn end(&mut self, em: &mut Emitter, after_call: bool) -> Mode {
        if let Some(index) = self.index {
            em.args(index, if self.params == 0 { "{}" } else { "}" });
        }
        Mode::Content(Content { seg_start: true, after_call, ..Content::default() })
    }

    /// A parameter tag that never closed properly: the call stands with the parameters before
    /// it, and the tag's text is content, so nothing of the reply is lost.
    fn end_in_key(&mut self, key: &str, em: &mut Emitter) -> Mode {
        self.end(em, false);
        em.text(Kind::Content, &format!("{PARAMETER_OPEN}{key}"));
        Mode::Content(Content::default())
    }

    /// An uncommitted call turns out not to be one: its text is content, from `<tool_call>`
    /// up to the character that broke it, where content resumes.
    fn fall_back(&mut self, em: &mut Emitter) -> Mode {
        em.text(Kind::Content, &self.lead_ws);
        em.text_split(Kind::Content, &self.raw, HERMES_MARKERS);
        Mode::Content(Content::default())
    }
}

/// A parameter's JSON value from its text, inverting the template: it writes a string as it
/// is, lists and mappings with `tojson`, and other values with Python's `str()` (`True`,
/// `None`, `1.5`). One newline after the opening tag and one before the closing tag are framing.
/// Text that is exactly a JSON value is that value (kept verbatim), unless the tool's schema
/// declares the parameter a string; Python's `True`, `False`, `None` are JSON's literals.
fn parameter_value(text: &str, is_string: bool) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let text = text.strip_suffix('\n').unwrap_or(text);
    if !is_string {
        // Surrounding whitespace means the template wrote a string: it writes no other value so.
        let bare = !text.starts_with(is_json_ws) && !text.ends_with(is_json_ws);
        if bare && serde_json::from_str::<Json>(text).is_ok() {
            return text.to_owned();
        }
        match text {
            "True" => return "true".to_owned(),
            "False" => return "false".to_owned(),
            "None" => return "null".to_owned(),
            _ => {}
        }
    }
    Json::from(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::parameter_value;

    #[test]
    fn values_invert_what_the_template_writes() {
        assert_eq!(parameter_value("\nParis\n", false), "\"Paris\"");
        assert_eq!(parameter_value("\n20\n", false), "20");
        assert_eq!(parameter_value("\n1e-07\n", false), "1e-07");
        assert_eq!(parameter_value("\nTrue\n", false), "true");
        assert_eq!(parameter_value("\nFalse\n", false), "false");
        assert_eq!(parameter_value("\nNone\n", false), "null");
        assert_eq!(parameter_value("\n{\"a\": [1, \"x\"]}\n", false), "{\"a\": [1, \"x\"]}");
        assert_eq!(parameter_value("\n[\"todo\", \"fixme\"]\n", false), "[\"todo\", \"fixme\"]");
        assert_eq!(parameter_value("\n\n", false), "\"\"");
        assert_eq!(parameter_value("", false), "\"\"");
    }

    #[test]
    fn only_one_framing_newline_goes_and_strings_keep_their_bytes() {
        assert_eq!(parameter_value("\n\nline\n\n", false), "\"\\nline\\n\"");
        assert_eq!(parameter_value("\n  echo \"a\nb\"  \n", false), "\"  echo \\\"a\\nb\\\"  \"");
        assert_eq!(parameter_value("\n 5\n", false), "\" 5\"", "padded text is a string");
        assert_eq!(parameter_value("no newlines", false), "\"no newlines\"");
        assert_eq!(parameter_value("\n{\"a\": \n", false), "\"{\\\"a\\\": \"", "broken JSON is a string");
    }

    #[test]
    fn a_declared_string_parameter_stays_a_string() {
        assert_eq!(parameter_value("\n12345\n", true), "\"12345\"");
        assert_eq!(parameter_value("\nTrue\n", true), "\"True\"");
        assert_eq!(parameter_value("\nnull\n", true), "\"null\"");
    }
}
