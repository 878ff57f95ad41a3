//! [`super::OutputFormat::Hermes`]: Qwen2.5/Qwen3/QwQ/Hermes `<think>` reasoning and
//! `<tool_call>{json}</tool_call>` calls; and [`super::OutputFormat::QwenXml`], the same
//! reasoning and content with XML calls inside `<tool_call>` ([`xml`]). The rules are
//! documented in the module docs of [`super`].

mod xml;

use std::sync::Arc;

use super::emit::{Emitter, Kind};
use super::json_scan::{Feed, ObjectScanner};
use super::markers::{HERMES_MARKERS, Match, THINK_CLOSE, THINK_OPEN, TOOL_CLOSE, TOOL_OPEN, match_at};
use super::recover::DeclaredTool;
use super::stream::Driver;
use xml::XmlCall;

/// Where in the reply the parser is.
#[derive(Debug)]
enum Mode {
    Reasoning(Reasoning),
    Content(Content),
    Call(Box<Call>),
    XmlCall(Box<XmlCall>),
}

/// What `<tool_call>` opens in content.
#[derive(Debug, Clone)]
pub(crate) enum Calls {
    /// Nothing: tools are disabled and the marker is text.
    Off,
    /// A Hermes JSON call.
    Json,
    /// A Qwen XML call (or a JSON one); the declared tools tell which parameters are strings.
    Xml(Arc<[DeclaredTool]>),
}

impl Calls {
    fn enabled(&self) -> bool {
        !matches!(self, Calls::Off)
    }

    /// The mode an enabled `<tool_call>` starts, `lead_ws` being the whitespace held before it.
    fn open(&self, lead_ws: String) -> Mode {
        match self {
            // `Off` never gets here (callers ask `enabled` first); a JSON call is the harmless answer.
            Calls::Off | Calls::Json => Mode::Call(Call::new(lead_ws)),
            Calls::Xml(tools) => Mode::XmlCall(XmlCall::new(lead_ws, tools.clone())),
        }
    }
}

/// Inside `<think>`.
#[derive(Debug)]
struct Reasoning {
    /// Nothing of the reasoning seen yet: drop newlines (and a repeated `<think>`).
    at_start: bool,
    /// Newlines held back: dropped if `</think>` or the end follows.
    pending_nl: usize,
}

/// Answer text.
#[derive(Debug, Default)]
struct Content {
    /// At the start of a segment (reply start, after `</think>`, after a call): whitespace is
    /// held in `pending_ws` until we know whether a structural marker follows.
    seg_start: bool,
    /// `<think>` may still open reasoning (the reply's very start).
    think_allowed: bool,
    /// Drop newlines (right after `</think>`).
    strip_nl: bool,
    /// A call just ended: a `</tool_call>` here closes it.
    after_call: bool,
    pending_ws: String,
}

/// Inside `<tool_call>`.
#[derive(Debug, Default)]
struct Call {
    /// Whitespace held before `<tool_call>`; dropped on commitment, content on fallback.
    lead_ws: String,
    /// The call's text from `<tool_call>` on, kept until commitment for the fallback.
    raw: String,
    scanner: ObjectScanner,
    /// Set on commitment.
    index: Option<usize>,
    /// Argument text seen before the name.
    args_pre: String,
    args_seen: bool,
}

/// The Hermes parser state.
#[derive(Debug)]
pub(crate) struct Hermes {
    calls: Calls,
    id_prefix: String,
    next_index: usize,
    mode: Mode,
}

/// What a mode's step ended with.
enum Next {
    /// Out of text, or waiting for more.
    Stop,
    /// Switch to this mode and go on.
    Switch(Mode),
}

fn first_char(rest: &str) -> char {
    rest.chars().next().unwrap_or('\0')
}

impl Hermes {
    pub(crate) fn new(calls: Calls, id_prefix: String, starts_in_reasoning: bool) -> Self {
        let mode = if starts_in_reasoning {
            Mode::Reasoning(Reasoning { at_start: true, pending_nl: 0 })
        } else {
            Mode::Content(Content { seg_start: true, think_allowed: true, ..Content::default() })
        };
        Hermes { calls, id_prefix, next_index: 0, mode }
    }
}

impl Driver for Hermes {
    fn step(&mut self, buf: &str, at_end: bool, em: &mut Emitter) -> usize {
        let mut i = 0;
        loop {
            let (next_i, next) = match &mut self.mode {
                Mode::Reasoning(r) => r.step(buf, i, at_end, em),
                Mode::Content(c) => c.step(&self.calls, buf, i, at_end, em),
                Mode::Call(call) => call.step(&mut self.next_index, &self.id_prefix, buf, i, em),
                Mode::XmlCall(call) => call.step(&mut self.next_index, &self.id_prefix, buf, i, at_end, em),
            };
            i = next_i;
            match next {
                Next::Stop => return i,
                Next::Switch(mode) => self.mode = mode,
            }
        }
    }

    fn finish(&mut self, em: &mut Emitter) {
        match &mut self.mode {
            // Trailing newlines of reasoning are stripped.
            Mode::Reasoning(_) => {}
            Mode::Content(c) => {
                // Whitespace after the last call is dropped; otherwise it is the answer.
                if self.next_index == 0 {
                    em.text(Kind::Content, &c.pending_ws);
                }
                c.pending_ws.clear();
            }
            Mode::Call(call) => {
                let mode = call.end(em);
                self.mode = mode;
            }
            Mode::XmlCall(call) => {
                let mode = call.end_of_reply(em);
                self.mode = mode;
            }
        }
    }
}

impl Reasoning {
    fn flush_nl(&mut self, em: &mut Emitter) {
        if self.pending_nl > 0 {
            em.text(Kind::Reasoning, &"\n".repeat(self.pending_nl));
            self.pending_nl = 0;
        }
    }

    fn step(&mut self, buf: &str, mut i: usize, at_end: bool, em: &mut Emitter) -> (usize, Next) {
        while i < buf.len() {
            let rest = &buf[i..];
            let ch = first_char(rest);
            if self.at_start {
                if ch == '\n' {
                    i += 1;
                    continue;
                }
                if ch == '<' {
                    match match_at(rest, HERMES_MARKERS, at_end) {
                        Match::Partial => return (i, Next::Stop),
                        Match::Full(THINK_OPEN) => {
                            i += THINK_OPEN.len();
                            continue;
                        }
                        _ => {}
                    }
                }
                self.at_start = false;
            }
            match ch {
                '\n' => {
                    self.pending_nl += 1;
                    i += 1;
                }
                '<' => match match_at(rest, HERMES_MARKERS, at_end) {
                    Match::Partial => return (i, Next::Stop),
                    Match::Full(THINK_CLOSE) => {
                        self.pending_nl = 0;
                        let content = Content { seg_start: true, strip_nl: true, ..Content::default() };
                        return (i + THINK_CLOSE.len(), Next::Switch(Mode::Content(content)));
                    }
                    Match::Full(m) => {
                        self.flush_nl(em);
                        em.marker(Kind::Reasoning, m);
                        i += m.len();
                    }
                    Match::None => {
                        self.flush_nl(em);
                        em.text(Kind::Reasoning, "<");
                        i += 1;
                    }
                },
                _ => {
                    self.flush_nl(em);
                    let end = rest.find(['<', '\n']).map_or(buf.len(), |p| i + p);
                    em.text(Kind::Reasoning, &buf[i..end]);
                    i = end;
                }
            }
        }
        (i, Next::Stop)
    }
}

impl Content {
    fn step(&mut self, calls: &Calls, buf: &str, mut i: usize, at_end: bool, em: &mut Emitter) -> (usize, Next) {
        while i < buf.len() {
            let rest = &buf[i..];
            let ch = first_char(rest);
            if self.seg_start {
                if ch == '\n' && self.strip_nl {
                    i += 1;
                    continue;
                }
                self.strip_nl = false;
                if ch.is_whitespace() {
                    self.pending_ws.push(ch);
                    i += ch.len_utf8();
                    continue;
                }
                if ch == '<' {
                    match match_at(rest, HERMES_MARKERS, at_end) {
                        Match::Partial => return (i, Next::Stop),
                        Match::Full(TOOL_OPEN) if calls.enabled() => {
                            let call = calls.open(std::mem::take(&mut self.pending_ws));
                            return (i + TOOL_OPEN.len(), Next::Switch(call));
                        }
                        Match::Full(TOOL_CLOSE) if self.after_call => {
                            self.pending_ws.clear();
                            self.after_call = false;
                            i += TOOL_CLOSE.len();
                            continue;
                        }
                        Match::Full(THINK_OPEN) if self.think_allowed => {
                            let reasoning = Reasoning { at_start: true, pending_nl: 0 };
                            return (i + THINK_OPEN.len(), Next::Switch(Mode::Reasoning(reasoning)));
                        }
                        _ => {}
                    }
                }
                em.text(Kind::Content, &std::mem::take(&mut self.pending_ws));
                self.seg_start = false;
                self.think_allowed = false;
                self.after_call = false;
            }
            if ch == '<' {
                match match_at(rest, HERMES_MARKERS, at_end) {
                    Match::Partial => return (i, Next::Stop),
                    Match::Full(TOOL_OPEN) if calls.enabled() => {
                        return (i + TOOL_OPEN.len(), Next::Switch(calls.open(String::new())));
                    }
                    Match::Full(m) => {
                        em.marker(Kind::Content, m);
                        i += m.len();
                    }
                    Match::None => {
                        em.text(Kind::Content, "<");
                        i += 1;
                    }
                }
            } else {
                let end = rest.find('<').map_or(buf.len(), |p| i + p);
                em.text(Kind::Content, &buf[i..end]);
                i = end;
            }
        }
        (i, Next::Stop)
    }
}

impl Call {
    fn new(lead_ws: String) -> Box<Call> {
        Box::new(Call { lead_ws, raw: TOOL_OPEN.to_owned(), ..Call::default() })
    }

    /// A call whose `<tool_call>` and the whitespace after it were read as the start of an XML
    /// call before a `{` showed it is JSON.
    fn after_whitespace(lead_ws: String, ws: &str) -> Box<Call> {
        let mut call = Call::new(lead_ws);
        for c in ws.chars() {
            // Whitespace before the object is framing.
            let _ = call.scanner.feed(c);
            call.raw.push(c);
        }
        call
    }

    /// Feeds the call's JSON; never waits (no lookahead is needed inside a call).
    fn step(
        &mut self,
        next_index: &mut usize,
        id_prefix: &str,
        buf: &str,
        mut i: usize,
        em: &mut Emitter,
    ) -> (usize, Next) {
        while i < buf.len() {
            let ch = first_char(&buf[i..]);
            let feed = self.scanner.feed(ch);
            if feed == Feed::Error {
                // Not consumed: content resumes at this character.
                return (i, Next::Switch(self.end(em)));
            }
            i += ch.len_utf8();
            if self.index.is_none() {
                self.raw.push(ch);
            }
            match feed {
                Feed::Structural | Feed::Error => {}
                Feed::Args => {
                    self.args_seen = true;
                    match self.index {
                        Some(index) => em.args_char(index, ch),
                        None => self.args_pre.push(ch),
                    }
                }
                Feed::Name(name) => {
                    let index = *next_index;
                    *next_index += 1;
                    self.index = Some(index);
                    self.raw = String::new();
                    self.lead_ws = String::new();
                    em.start(index, format!("{id_prefix}{index}"), name);
                    em.args(index, &std::mem::take(&mut self.args_pre));
                }
                Feed::End => return (i, Next::Switch(self.end(em))),
            }
        }
        (i, Next::Stop)
    }

    /// Ends the call (object closed, JSON broken, or end of reply) and returns the mode
    /// that follows: a committed call stands; an uncommitted one becomes content.
    fn end(&mut self, em: &mut Emitter) -> Mode {
        match self.index {
            Some(index) => {
                if !self.args_seen {
                    em.args(index, "{}");
                }
                Mode::Content(Content { seg_start: true, after_call: true, ..Content::default() })
            }
            None => {
                em.text(Kind::Content, &self.lead_ws);
                em.text_split(Kind::Content, &self.raw, HERMES_MARKERS);
                Mode::Content(Content::default())
            }
        }
    }
}
