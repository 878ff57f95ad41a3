//! [`super::OutputFormat::Llama3Json`]: Llama 3.x JSON tool calls, optionally after
//! `<|python_tag|>`, several separated by `;`. Call objects are buffered until they close
//! and then validated; the rules are documented in the module docs of [`super`].

use super::emit::{Emitter, Kind};
use super::json_scan::{Feed, ObjectScanner, is_json_ws};
use super::markers::{LLAMA3_MARKERS, Match, PYTHON_TAG, match_at};
use super::stream::Driver;

#[derive(Debug)]
enum Mode {
    /// Before the first call (`between == false`) or between calls: whitespace (and, between
    /// calls, one `;`) is held until we know whether another call follows.
    Lead { pending: String, between: bool, semicolon: bool },
    /// Answer text; only `<|python_tag|>` can start calls.
    Content,
    /// Inside a call object.
    Object(Box<Object>),
}

#[derive(Debug, Default)]
struct Object {
    /// Held text before the object (content if the object is rejected).
    lead: String,
    /// The object's text, from the tag (if any) on.
    raw: String,
    /// Where the JSON starts in `raw`.
    json_start: usize,
    scanner: ObjectScanner,
    name: Option<String>,
    args: String,
}

/// The Llama 3 parser state.
#[derive(Debug)]
pub(crate) struct Llama3 {
    tools: bool,
    id_prefix: String,
    next_index: usize,
    mode: Mode,
}

fn first_char(rest: &str) -> char {
    rest.chars().next().unwrap_or('\0')
}

impl Llama3 {
    pub(crate) fn new(tools: bool, id_prefix: String) -> Self {
        let mode =
            if tools { Mode::Lead { pending: String::new(), between: false, semicolon: false } } else { Mode::Content };
        Llama3 { tools, id_prefix, next_index: 0, mode }
    }

    fn object(lead: String, tag: bool) -> Mode {
        let raw = if tag { PYTHON_TAG.to_owned() } else { String::new() };
        Mode::Object(Box::new(Object { lead, json_start: raw.len(), raw, ..Object::default() }))
    }

    /// Rejects the current object: its text becomes content.
    fn reject(obj: &Object, em: &mut Emitter) -> Mode {
        em.text(Kind::Content, &obj.lead);
        em.text_split(Kind::Content, &obj.raw, LLAMA3_MARKERS);
        Mode::Content
    }

    /// The object closed: accept it as a call or reject it.
    fn close(&mut self, obj: &Object, em: &mut Emitter) -> Mode {
        let valid = obj.args.starts_with('{')
            && serde_json::from_str::<serde::de::IgnoredAny>(&obj.raw[obj.json_start..]).is_ok();
        match &obj.name {
            Some(name) if valid => {
                let index = self.next_index;
                self.next_index += 1;
                em.start(index, format!("{}{index}", self.id_prefix), name.clone());
                em.args(index, &obj.args);
                Mode::Lead { pending: String::new(), between: true, semicolon: false }
            }
            _ => Self::reject(obj, em),
        }
    }
}

impl Driver for Llama3 {
    fn step(&mut self, buf: &str, at_end: bool, em: &mut Emitter) -> usize {
        let mut i = 0;
        while i < buf.len() {
            let rest = &buf[i..];
            let ch = first_char(rest);
            let next = match &mut self.mode {
                Mode::Lead { pending, between, semicolon } => {
                    if is_json_ws(ch) || (ch == ';' && *between && !*semicolon) {
                        *semicolon |= ch == ';';
                        pending.push(ch);
                        i += 1;
                        continue;
                    }
                    match (ch, match_at(rest, LLAMA3_MARKERS, at_end)) {
                        (_, Match::Partial) => return i,
                        (_, Match::Full(tag)) => {
                            i += tag.len();
                            Self::object(std::mem::take(pending), true)
                        }
                        ('{', _) => Self::object(std::mem::take(pending), false),
                        _ => {
                            em.text(Kind::Content, pending);
                            Mode::Content
                        }
                    }
                }
                Mode::Content => {
                    if ch == '<' {
                        match match_at(rest, LLAMA3_MARKERS, at_end) {
                            Match::Partial => return i,
                            Match::Full(tag) if self.tools => {
                                i += tag.len();
                                Self::object(String::new(), true)
                            }
                            Match::Full(tag) => {
                                em.marker(Kind::Content, tag);
                                i += tag.len();
                                continue;
                            }
                            Match::None => {
                                em.text(Kind::Content, "<");
                                i += 1;
                                continue;
                            }
                        }
                    } else {
                        let end = rest.find('<').map_or(buf.len(), |p| i + p);
                        em.text(Kind::Content, &buf[i..end]);
                        i = end;
                        continue;
                    }
                }
                Mode::Object(obj) => match obj.scanner.feed(ch) {
                    // Not consumed: content resumes at this character.
                    Feed::Error => Self::reject(obj, em),
                    feed => {
                        i += ch.len_utf8();
                        obj.raw.push(ch);
                        match feed {
                            Feed::Args => obj.args.push(ch),
                            Feed::Name(name) => obj.name = Some(name),
                            Feed::End => {
                                let obj = std::mem::take(obj);
                                self.mode = self.close(&obj, em);
                            }
                            Feed::Structural | Feed::Error => {}
                        }
                        continue;
                    }
                },
            };
            self.mode = next;
        }
        i
    }

    fn finish(&mut self, em: &mut Emitter) {
        match &mut self.mode {
            Mode::Lead { pending, between, .. } => {
                // Whitespace and `;` after the last call are dropped.
                if !*between {
                    em.text(Kind::Content, pending);
                }
                pending.clear();
            }
            Mode::Content => {}
            Mode::Object(obj) => {
                let obj = std::mem::take(obj);
                self.mode = Self::reject(&obj, em);
            }
        }
    }
}
