//! [`StreamingParser`]: buffering of unconsumed text and dispatch to the format's parser.

use super::emit::Emitter;
use super::hermes::{Calls, Hermes};
use super::llama3::Llama3;
use super::recover::BareCallRecovery;
use super::{OutputFormat, ParseEvent, ParserOptions};

/// A format's incremental parser. `step` consumes a prefix of `buf` (returning its length in
/// bytes, at a char boundary), deciding only what the consumed text determines; with
/// `at_end` it must consume everything. `finish` then closes whatever is still open.
pub(crate) trait Driver {
    fn step(&mut self, buf: &str, at_end: bool, em: &mut Emitter) -> usize;
    fn finish(&mut self, em: &mut Emitter);
}

#[derive(Debug)]
enum Inner {
    Plain,
    Hermes(Hermes),
    Llama3(Llama3),
}

/// Parses a reply incrementally: feed generated text with [`push`](Self::push) as it
/// arrives, then call [`finish`](Self::finish) once. The accumulated events
/// ([`super::ParsedMessage::from_events`]) do not depend on how the text was split.
#[derive(Debug)]
pub struct StreamingParser {
    inner: Inner,
    /// Text received but not yet consumed (a possible marker, or text awaiting more).
    buf: String,
    finished: bool,
    /// Turns a reply that is only a bare call object into that call (`declared_tools`).
    recovery: Option<BareCallRecovery>,
}

impl StreamingParser {
    /// A parser for one reply.
    pub fn new(opts: ParserOptions) -> Self {
        let ParserOptions { format, starts_in_reasoning, tool_call_id_prefix, tools_enabled, declared_tools } = opts;
        let calls = match format {
            _ if !tools_enabled => Calls::Off,
            OutputFormat::QwenXml => Calls::Xml(declared_tools.clone().into()),
            _ => Calls::Json,
        };
        let recovery = (tools_enabled && !declared_tools.is_empty())
            .then(|| BareCallRecovery::new(declared_tools, tool_call_id_prefix.clone()));
        let inner = match format {
            OutputFormat::Plain => Inner::Plain,
            OutputFormat::Hermes | OutputFormat::QwenXml => {
                Inner::Hermes(Hermes::new(calls, tool_call_id_prefix, starts_in_reasoning))
            }
            OutputFormat::Llama3Json => Inner::Llama3(Llama3::new(tools_enabled, tool_call_id_prefix)),
        };
        StreamingParser { inner, buf: String::new(), finished: false, recovery }
    }

    /// Feeds the next piece of generated text; returns the events it completes. Text that
    /// might still turn out to be part of a marker is held back. After
    /// [`finish`](Self::finish), pushed text is ignored.
    pub fn push(&mut self, text: &str) -> Vec<ParseEvent> {
        if self.finished {
            return Vec::new();
        }
        self.buf.push_str(text);
        let events = self.run(false);
        self.recover(events, false)
    }

    /// Ends the reply: flushes held-back text and closes an open reasoning block or tool
    /// call. Later calls return nothing.
    pub fn finish(&mut self) -> Vec<ParseEvent> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        let events = self.run(true);
        self.recover(events, true)
    }

    fn recover(&mut self, events: Vec<ParseEvent>, at_end: bool) -> Vec<ParseEvent> {
        match &mut self.recovery {
            Some(recovery) => recovery.filter(events, at_end),
            None => events,
        }
    }

    fn run(&mut self, at_end: bool) -> Vec<ParseEvent> {
        let mut em = Emitter::default();
        let driver: &mut dyn Driver = match &mut self.inner {
            Inner::Plain => {
                em.text(super::emit::Kind::Content, &self.buf);
                self.buf.clear();
                return em.events;
            }
            Inner::Hermes(h) => h,
            Inner::Llama3(l) => l,
        };
        let used = driver.step(&self.buf, at_end, &mut em).min(self.buf.len());
        debug_assert!(self.buf.is_char_boundary(used));
        debug_assert!(!at_end || used == self.buf.len(), "text left at the end");
        if self.buf.is_char_boundary(used) {
            self.buf.drain(..used);
        }
        if at_end {
            driver.finish(&mut em);
            // Defensive: nothing should be left, but never lose text.
            em.text(super::emit::Kind::Content, &std::mem::take(&mut self.buf));
        }
        em.events
    }
}
