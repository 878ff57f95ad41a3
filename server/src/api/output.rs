//! From generated token ids to message parts: incremental detokenization, stop strings, then the
//! template family's output parser (reasoning, tool calls); and [`Generation`], the engine-event
//! loop every generation endpoint (chat, completions, llama.cpp's `/completion`) drives.

use std::sync::Arc;
use std::time::Instant;

use radix_models::tokenizer::{IncrementalDetokenizer, Tokenizer};
use radix_templates::parse::{ParseEvent, ParserOptions, StreamingParser};
use tokio::sync::mpsc::UnboundedReceiver;

use super::ApiError;
use crate::engine::{EngineEvent, EngineHandle, FinishReason, GenerateRequest, StopMatcher, Timings, TokenLogprobs};

/// Turns tokens into parse events; stops at the first stop string.
pub(crate) struct OutputPipeline {
    detokenizer: Option<IncrementalDetokenizer<Arc<Tokenizer>>>,
    stops: Vec<String>,
    stop: StopMatcher,
    parser: StreamingParser,
    /// Everything decoded, stop strings included, to tell which stop string matched.
    raw: String,
    /// Bytes of `raw` released past the stop matcher.
    released: usize,
    /// Tokens whose text has not come out of the parser yet.
    held_tokens: usize,
    /// A stop string ended the output.
    pub(crate) stopped: bool,
    /// The stop string that matched.
    pub(crate) stop_word: Option<String>,
    /// Tool calls were emitted.
    pub(crate) tool_calls: bool,
    /// Tokens whose text came out as reasoning. Text that the parser holds back (a marker in the
    /// making) counts with whatever it finally comes out as.
    pub(crate) reasoning_tokens: usize,
}

impl OutputPipeline {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, stops: Vec<String>, options: ParserOptions) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        OutputPipeline {
            detokenizer: Some(IncrementalDetokenizer::new(tokenizer, true)),
            stop: StopMatcher::new(stops.clone()),
            stops,
            parser: StreamingParser::new(options),
            raw: String::new(),
            released: 0,
            held_tokens: 0,
            stopped: false,
            stop_word: None,
            tool_calls: false,
            reasoning_tokens: 0,
        }
    }

    /// Feeds one generated token.
    pub(crate) fn push(&mut self, token: u32) -> Vec<ParseEvent> {
        let Some(detokenizer) = self.detokenizer.as_mut() else { return Vec::new() };
        let text = detokenizer.push(token).ok().flatten().unwrap_or_default();
        self.held_tokens += 1;
        let events = self.text(&text);
        self.note(events)
    }

    fn text(&mut self, text: &str) -> Vec<ParseEvent> {
        if self.stopped || text.is_empty() {
            return Vec::new();
        }
        self.raw.push_str(text);
        let out = self.stop.push(text);
        self.released += out.text.len();
        if out.stopped {
            self.stopped = true;
            let rest = &self.raw[self.released..];
            self.stop_word =
                self.stops.iter().filter(|s| rest.starts_with(s.as_str())).max_by_key(|s| s.len()).cloned();
        }
        self.parser.push(&out.text)
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
            events.extend(self.parser.push(&rest));
        }
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

/// One request running on the engine, seen through the output pipeline. Dropping it (or
/// reaching a stop string) drops the event receiver, which aborts the sequence in the engine.
pub(crate) struct Generation {
    receiver: Option<UnboundedReceiver<EngineEvent>>,
    /// The output pipeline (reasoning and tool-call state, the matched stop string).
    pub(crate) pipeline: OutputPipeline,
    /// Prompt length.
    pub(crate) prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub(crate) cached_tokens: usize,
    /// Generated token ids (stop tokens excluded, as the engine never sends them).
    pub(crate) tokens: Vec<u32>,
    /// Per generated token, when the request asked for log-probabilities.
    pub(crate) logprobs: Vec<TokenLogprobs>,
    submitted: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    /// What the chat path knows to explain a cache miss (set after `start`).
    pub(crate) cache_context: Option<super::cache_report::CacheContext>,
    /// The cache report, once the engine admitted the request.
    pub(crate) cache: Option<super::cache_report::Explained>,
}

impl Generation {
    /// Submits `request` to the engine.
    pub(crate) fn start(
        engine: &EngineHandle,
        tokenizer: Arc<Tokenizer>,
        request: GenerateRequest,
        stops: Vec<String>,
        parser: ParserOptions,
    ) -> Self {
        let prompt_tokens = request.prompt.len();
        Generation {
            receiver: Some(engine.submit(request)),
            pipeline: OutputPipeline::new(tokenizer, stops, parser),
            prompt_tokens,
            cached_tokens: 0,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            submitted: Instant::now(),
            admitted: None,
            first_token: None,
            cache_context: None,
            cache: None,
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
                    self.cache = Some(super::cache_report::explain(self.cache_context.take(), report));
                    self.admitted = Some(Instant::now());
                }
                Some(EngineEvent::Logprobs(logprobs)) => self.logprobs.push(logprobs),
                Some(EngineEvent::Token(token)) => {
                    self.tokens.push(token);
                    self.first_token.get_or_insert_with(Instant::now);
                    let mut events = self.pipeline.push(token);
                    if !self.pipeline.stopped {
                        return Ok(Some(Piece { token: Some(token), events, end: None }));
                    }
                    events.extend(self.pipeline.finish());
                    let word = self.pipeline.stop_word.clone().unwrap_or_default();
                    let timings = self.local_timings();
                    return Ok(Some(self.end(Some(token), events, Ending::Word(word), timings)));
                }
                Some(EngineEvent::Finished { reason, mut timings }) => {
                    let events = self.pipeline.finish();
                    let ending = match reason {
                        FinishReason::Stop => Ending::Eos,
                        FinishReason::Length => Ending::Length,
                    };
                    if timings.cache_n == 0 {
                        timings.cache_n = self.cached_tokens;
                    }
                    return Ok(Some(self.end(None, events, ending, timings)));
                }
                Some(EngineEvent::Failed(message)) => {
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

    fn end(&mut self, token: Option<u32>, events: Vec<ParseEvent>, ending: Ending, timings: Timings) -> Piece {
        // A stop string ends the output here: dropping the receiver aborts the sequence.
        self.receiver = None;
        Piece { token, events, end: Some((ending, timings)) }
    }

    /// Timings measured on this side, for an end the engine does not report (a stop string).
    fn local_timings(&self) -> Timings {
        let now = Instant::now();
        let admitted = self.admitted.unwrap_or(self.submitted);
        let first = self.first_token.unwrap_or(now);
        Timings {
            cache_n: self.cached_tokens,
            prompt_n: self.prompt_tokens - self.cached_tokens.min(self.prompt_tokens),
            prompt_ms: first.duration_since(admitted).as_secs_f64() * 1e3,
            predicted_n: self.tokens.len(),
            predicted_ms: now.duration_since(first).as_secs_f64() * 1e3,
        }
    }
}
