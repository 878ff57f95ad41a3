//! From the engine's released text to message parts: the template family's output parser
//! (reasoning, tool calls); and [`Generation`], the engine-event loop every generation endpoint
//! (chat, completions, llama.cpp's `/completion`) drives. Detokenization, stop strings and
//! timings are the engine's: the text arriving here is already cut at a stop string.

use radix_templates::parse::{ParseEvent, ParserOptions, StreamingParser};
use tokio::sync::mpsc::UnboundedReceiver;

use super::ApiError;
use crate::engine::{EngineEvent, EngineHandle, FinishReason, GenerateRequest, Timings, TokenLogprobs};

/// Turns released text into parse events, and keeps what the APIs report about them.
pub(crate) struct OutputPipeline {
    parser: StreamingParser,
    /// Tokens whose text has not come out of the parser yet.
    held_tokens: usize,
    /// Tool calls were emitted.
    pub(crate) tool_calls: bool,
    /// Tokens whose text came out as reasoning. Text that the parser holds back (a marker in the
    /// making) counts with whatever it finally comes out as.
    pub(crate) reasoning_tokens: usize,
}

impl OutputPipeline {
    /// A pipeline parsing with `options` (the template family's output format).
    pub(crate) fn new(options: ParserOptions) -> Self {
        OutputPipeline { parser: StreamingParser::new(options), held_tokens: 0, tool_calls: false, reasoning_tokens: 0 }
    }

    /// Feeds the text one generated token released (possibly none yet).
    pub(crate) fn push(&mut self, text: &str) -> Vec<ParseEvent> {
        self.held_tokens += 1;
        let events = self.text(text);
        self.note(events)
    }

    fn text(&mut self, text: &str) -> Vec<ParseEvent> {
        if text.is_empty() { Vec::new() } else { self.parser.push(text) }
    }

    /// Flushes the parser at the end of generation, after the text the end released.
    pub(crate) fn finish(&mut self, rest: &str) -> Vec<ParseEvent> {
        let mut events = self.text(rest);
        events.extend(self.parser.finish());
        self.note(events)
    }

    fn note(&mut self, events: Vec<ParseEvent>) -> Vec<ParseEvent> {
        self.tool_calls |= events.iter().any(|e| matches!(e, ParseEvent::ToolCallStart { .. }));
        if !events.is_empty() {
            if events.iter().any(|e| matches!(e, ParseEvent::Reasoning(t) if !t.is_empty())) {
                self.reasoning_tokens += self.held_tokens;
            }
            self.held_tokens = 0;
        }
        events
    }
}

/// Why a generation ended, before each API names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// An end-of-sequence or end-of-turn token.
    Eos,
    /// The token limit, the context, or a full KV pool.
    Length,
    /// This stop string.
    Word(String),
}

impl Ending {
    /// OpenAI's `finish_reason`; tool calls win over how the text ended.
    pub(crate) fn finish_reason(&self, tool_calls: bool) -> &'static str {
        // A reply cut off by the token limit says so even inside a tool call: its arguments
        // may be incomplete JSON, and clients must not run it as a finished call.
        match self {
            Ending::Length => "length",
            _ if tool_calls => "tool_calls",
            Ending::Eos | Ending::Word(_) => "stop",
        }
    }
}

/// What one step of a [`Generation`] produced.
pub(crate) struct Piece {
    /// The token generated in this step, if the step was a token.
    pub(crate) token: Option<u32>,
    /// Parse events released by it.
    pub(crate) events: Vec<ParseEvent>,
    /// Set on the last piece: how generation ended and what it cost.
    pub(crate) end: Option<(Ending, Timings)>,
}

/// One request running on the engine, seen through the output pipeline. Dropping it drops the
/// event receiver, which aborts the sequence in the engine.
pub(crate) struct Generation {
    receiver: Option<UnboundedReceiver<EngineEvent>>,
    /// The output pipeline (reasoning and tool-call state).
    pub(crate) pipeline: OutputPipeline,
    /// Prompt length.
    pub(crate) prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub(crate) cached_tokens: usize,
    /// Generated token ids (stop tokens excluded, as the engine never sends them).
    pub(crate) tokens: Vec<u32>,
    /// Per generated token, when the request asked for log-probabilities.
    pub(crate) logprobs: Vec<TokenLogprobs>,
    /// What the chat path knows to explain a cache miss (set after `start`).
    pub(crate) cache_context: Option<super::cache_report::CacheContext>,
    /// The cache report, once the engine admitted the request.
    pub(crate) cache: Option<super::cache_report::Explained>,
    /// This request on the cache page (`recent.rs`), fed by the events below.
    pub(crate) recent: Option<super::recent::Watch>,
}

impl Generation {
    /// Submits `request` to the engine; its stop strings are matched there.
    pub(crate) fn start(engine: &EngineHandle, request: GenerateRequest, parser: ParserOptions) -> Self {
        let prompt_tokens = request.prompt.len();
        Generation {
            receiver: Some(engine.submit(request)),
            pipeline: OutputPipeline::new(parser),
            prompt_tokens,
            cached_tokens: 0,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            cache_context: None,
            cache: None,
            recent: None,
        }
    }

    /// The next piece; `Ok(None)` once the last piece was returned.
    pub(crate) async fn next(&mut self) -> Result<Option<Piece>, ApiError> {
        loop {
            let Some(receiver) = self.receiver.as_mut() else { return Ok(None) };
            let event = receiver.recv().await;
            match event {
                Some(EngineEvent::Started { cached_tokens, report, .. }) => {
                    self.cached_tokens = cached_tokens;
                    let context = self.cache_context.take();
                    let explained = super::cache_report::explain(context.as_ref(), report);
                    if let Some(watch) = self.recent.as_mut() {
                        watch.started(&explained, context);
                    }
                    self.cache = Some(explained);
                }
                Some(EngineEvent::Logprobs(logprobs)) => self.logprobs.push(logprobs),
                Some(EngineEvent::Token { id, text }) => {
                    if let Some(watch) = self.recent.as_mut() {
                        watch.token();
                    }
                    self.tokens.push(id);
                    let events = self.pipeline.push(&text);
                    return Ok(Some(Piece { token: Some(id), events, end: None }));
                }
                Some(EngineEvent::Finished { reason, timings, text }) => {
                    if let Some(watch) = self.recent.as_mut() {
                        watch.finished(&reason, &timings);
                    }
                    self.receiver = None;
                    let events = self.pipeline.finish(&text);
                    let ending = match reason {
                        FinishReason::Stop => Ending::Eos,
                        FinishReason::Length => Ending::Length,
                        FinishReason::StopString(word) => Ending::Word(word),
                    };
                    return Ok(Some(Piece { token: None, events, end: Some((ending, timings)) }));
                }
                Some(EngineEvent::Failed(message)) => {
                    if let Some(watch) = self.recent.as_mut() {
                        watch.failed();
                    }
                    self.receiver = None;
                    return Err(ApiError::internal(message));
                }
                None => {
                    self.receiver = None;
                    return Err(ApiError::internal("the engine dropped the request"));
                }
            }
        }
    }

    /// Runs to the end, returning every parse event, how it ended, and the timings.
    pub(crate) async fn run(&mut self) -> Result<(Vec<ParseEvent>, Ending, Timings), ApiError> {
        let mut all = Vec::new();
        while let Some(piece) = self.next().await? {
            all.extend(piece.events);
            if let Some((ending, timings)) = piece.end {
                return Ok((all, ending, timings));
            }
        }
        Err(ApiError::internal("the generation ended without a result"))
    }
}
