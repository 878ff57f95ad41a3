//! Collects the events of one `push`/`finish`, merging adjacent pieces of the same kind.

use super::ParseEvent;
use super::markers::split_at_markers;

/// Which text event a piece of text goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Content,
    Reasoning,
}

/// Event sink. Text is appended to the previous event when that is of the same kind, except
/// that a marker emitted as text always starts a new event.
#[derive(Debug, Default)]
pub(crate) struct Emitter {
    pub(crate) events: Vec<ParseEvent>,
}

impl Emitter {
    /// Appends ordinary text (no marker inside).
    pub(crate) fn text(&mut self, kind: Kind, s: &str) {
        if s.is_empty() {
            return;
        }
        match (kind, self.events.last_mut()) {
            (Kind::Content, Some(ParseEvent::Content(t))) | (Kind::Reasoning, Some(ParseEvent::Reasoning(t))) => {
                t.push_str(s)
            }
            _ => self.push_new(kind, s),
        }
    }

    /// Emits text that starts with a marker: always a new event.
    pub(crate) fn marker(&mut self, kind: Kind, s: &str) {
        if !s.is_empty() {
            self.push_new(kind, s);
        }
    }

    /// Emits text that may contain markers anywhere, so that each marker starts an event.
    pub(crate) fn text_split(&mut self, kind: Kind, s: &str, markers: &[&'static str]) {
        for (piece, is_marker) in split_at_markers(s, markers) {
            if is_marker {
                self.marker(kind, piece);
            } else {
                self.text(kind, piece);
            }
        }
    }

    /// Appends argument text of call `index`.
    pub(crate) fn args(&mut self, index: usize, s: &str) {
        if s.is_empty() {
            return;
        }
        if let Some(ParseEvent::ToolCallArguments { index: i, delta }) = self.events.last_mut()
            && *i == index
        {
            delta.push_str(s);
            return;
        }
        self.events.push(ParseEvent::ToolCallArguments { index, delta: s.to_owned() });
    }

    /// Appends argument text of call `index`, one character.
    pub(crate) fn args_char(&mut self, index: usize, c: char) {
        let mut tmp = [0u8; 4];
        self.args(index, c.encode_utf8(&mut tmp));
    }

    /// Emits a `ToolCallStart`.
    pub(crate) fn start(&mut self, index: usize, id: String, name: String) {
        self.events.push(ParseEvent::ToolCallStart { index, id, name });
    }

    fn push_new(&mut self, kind: Kind, s: &str) {
        self.events.push(match kind {
            Kind::Content => ParseEvent::Content(s.to_owned()),
            Kind::Reasoning => ParseEvent::Reasoning(s.to_owned()),
        });
    }
}
