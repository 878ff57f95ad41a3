//! From generated token ids to OpenAI message parts: incremental detokenization, stop strings,
//! then the template family's output parser (reasoning, tool calls).

use std::sync::Arc;

use crate::engine::StopMatcher;
use radix_models::tokenizer::{IncrementalDetokenizer, Tokenizer};
use radix_templates::parse::{ParseEvent, ParserOptions, StreamingParser};

/// Turns tokens into parse events; stops at the first stop string.
pub(crate) struct OutputPipeline {
    detokenizer: Option<IncrementalDetokenizer<Arc<Tokenizer>>>,
    stop: StopMatcher,
    parser: StreamingParser,
    /// A stop string ended the output.
    pub(crate) stopped: bool,
    /// Tool calls were emitted.
    pub(crate) tool_calls: bool,
}

impl OutputPipeline {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, stops: Vec<String>, options: ParserOptions) -> Self {
        OutputPipeline {
            detokenizer: Some(IncrementalDetokenizer::new(tokenizer, true)),
            stop: StopMatcher::new(stops),
            parser: StreamingParser::new(options),
            stopped: false,
            tool_calls: false,
        }
    }

    /// Feeds one generated token.
    pub(crate) fn push(&mut self, token: u32) -> Vec<ParseEvent> {
        let Some(detokenizer) = self.detokenizer.as_mut() else { return Vec::new() };
        let text = detokenizer.push(token).ok().flatten().unwrap_or_default();
        self.text(&text)
    }

    fn text(&mut self, text: &str) -> Vec<ParseEvent> {
        if self.stopped || text.is_empty() {
            return Vec::new();
        }
        let out = self.stop.push(text);
        self.stopped = out.stopped;
        let events = self.parser.push(&out.text);
        self.note(events)
    }

    /// Flushes everything held back at the end of generation.
    pub(crate) fn finish(&mut self) -> Vec<ParseEvent> {
        let mut events = Vec::new();
        if let Some(detokenizer) = self.detokenizer.take() {
            let rest = detokenizer.finish().unwrap_or_default();
            events.extend(self.text(&rest));
        }
        if !self.stopped {
            let rest = self.stop.finish();
            let more = self.parser.push(&rest);
            events.extend(self.note(more));
        }
        let last = self.parser.finish();
        events.extend(self.note(last));
        events
    }

    fn note(&mut self, events: Vec<ParseEvent>) -> Vec<ParseEvent> {
        self.tool_calls |= events.iter().any(|e| matches!(e, ParseEvent::ToolCallStart { .. }));
        events
    }
}
