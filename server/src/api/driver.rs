//! The one generation driver every API runs: a [`GenerationSpec`] goes to the engine, and the
//! pieces that come back are shaped by the API's [`WireFormat`], either into one JSON body or
//! into a server-sent event stream. The driver owns what every API shares: the event channel,
//! SSE keep-alive, which log-probabilities were already sent, errors turned into a last event,
//! and stopping (which aborts the sequence) once the client is gone.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use radix_templates::parse::{ParseEvent, ParserOptions};
use serde_json::Value as Json;
use tokio::sync::mpsc::Sender;

use super::cache_report::CacheContext;
use super::output::{Ending, Generation, Piece};
use super::{ApiError, ApiState};
use crate::engine::{GenerateRequest, Timings, TokenLogprobs};

/// Everything a request decided before generation starts, whichever API it came through.
pub(crate) struct GenerationSpec {
    /// What the engine runs: prompt tokens, sampling, token limit, stop tokens and strings,
    /// constraint, whether the prefix cache is used.
    pub(crate) request: GenerateRequest,
    /// How the reply is parsed (reasoning, tool calls).
    pub(crate) parser: ParserOptions,
    /// To explain a cache miss in terms of messages (chat prompts only).
    pub(crate) cache: Option<CacheContext>,
}

impl GenerationSpec {
    /// Submits the spec to the engine.
    fn start(self, state: &ApiState) -> Generation {
        let watch = state.recent.watch(&self.request, self.cache.as_ref());
        let mut generation = Generation::start(&state.engine, self.request, self.parser);
        generation.cache_context = self.cache;
        generation.recent = Some(watch);
        generation
    }
}

/// One server-sent event of a stream.
pub(crate) enum WireEvent {
    /// A `data:` event with a JSON object.
    Data(Json),
    /// A named event (`event: name`) with a JSON object, as Anthropic streams.
    Named(&'static str, Json),
    /// OpenAI's closing `data: [DONE]`.
    Done,
}

impl WireEvent {
    fn into_sse(self) -> Event {
        match self {
            WireEvent::Data(data) => Event::default().data(data.to_string()),
            WireEvent::Named(name, data) => Event::default().event(name).data(data.to_string()),
            WireEvent::Done => Event::default().data("[DONE]"),
        }
    }
}

/// Where a stream stands when its wire format shapes the next events: the generation so far,
/// and how many of its log-probabilities were sent (each API sends a token's with the next chunk
/// after it, and a token whose text is held back has no chunk of its own).
pub(crate) struct Progress<'a> {
    /// The generation so far.
    pub(crate) generation: &'a Generation,
    sent_logprobs: &'a mut usize,
}

impl<'a> Progress<'a> {
    /// The log-probabilities received since the last call, now counted as sent.
    pub(crate) fn unsent_logprobs(&mut self) -> &'a [TokenLogprobs] {
        let unsent = self.generation.logprobs.get(*self.sent_logprobs..).unwrap_or_default();
        *self.sent_logprobs = self.generation.logprobs.len();
        unsent
    }
}

/// A generation that ran to its end without streaming.
pub(crate) struct Done<'a> {
    /// The generation (usage, reasoning and tool-call state, log-probabilities).
    pub(crate) generation: &'a Generation,
    /// Every parse event of the reply.
    pub(crate) events: Vec<ParseEvent>,
    /// How it ended.
    pub(crate) ending: Ending,
    /// What it cost.
    pub(crate) timings: Timings,
}

/// How one API writes a reply: its stream events and its whole-body response.
pub(crate) trait WireFormat: Send + 'static {
    /// Events sent before generation produced anything (OpenAI chat's role chunk).
    fn start_events(&mut self) -> Vec<WireEvent> {
        Vec::new()
    }

    /// The events of one piece of the reply.
    fn on_piece(&mut self, piece: &Piece, at: &mut Progress) -> Result<Vec<WireEvent>, ApiError>;

    /// The events that close the stream once generation ended this way.
    fn finish(&mut self, end: &(Ending, Timings), at: &mut Progress) -> Result<Vec<WireEvent>, ApiError>;

    /// The last event of a stream that failed.
    fn error_event(&self, error: &ApiError) -> WireEvent {
        WireEvent::Data(error.body())
    }

    /// The whole response of a generation that was not streamed.
    fn complete(self, done: Done) -> Result<Response, ApiError>;
}

/// Runs `spec` and answers in `wire`'s format, streamed or as one body.
pub(crate) async fn respond<W: WireFormat>(state: &ApiState, spec: GenerationSpec, wire: W, stream: bool) -> Response {
    let generation = spec.start(state);
    if stream { stream_events(generation, wire).into_response() } else { complete(generation, wire).await }
}

async fn complete<W: WireFormat>(mut generation: Generation, wire: W) -> Response {
    let result = match generation.run().await {
        Ok((events, ending, timings)) => wire.complete(Done { generation: &generation, events, ending, timings }),
        Err(e) => Err(e),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Why a stream stopped early.
enum Stop {
    /// The client hung up: nothing more to send.
    ClientGone,
    /// Generation or shaping failed: the client gets the error as the last event.
    Failed(ApiError),
}

impl From<ApiError> for Stop {
    fn from(e: ApiError) -> Self {
        Stop::Failed(e)
    }
}

async fn send(tx: &Sender<Event>, events: Vec<WireEvent>) -> Result<(), Stop> {
    for event in events {
        tx.send(event.into_sse()).await.map_err(|_| Stop::ClientGone)?;
    }
    Ok(())
}

async fn drive<W: WireFormat>(generation: &mut Generation, wire: &mut W, tx: &Sender<Event>) -> Result<(), Stop> {
    let mut sent_logprobs = 0;
    send(tx, wire.start_events()).await?;
    loop {
        // Waiting for the engine must not hide a client that left: during a long prefill no
        // piece comes for seconds, and the engine aborts a sequence only once its receiver (in
        // `generation`) is dropped, which returning here does.
        let piece = tokio::select! {
            piece = generation.next() => piece?,
            () = tx.closed() => return Err(Stop::ClientGone),
        };
        let Some(piece) = piece else { break };
        let mut at = Progress { generation, sent_logprobs: &mut sent_logprobs };
        let mut events = wire.on_piece(&piece, &mut at)?;
        if let Some(end) = &piece.end {
            events.extend(wire.finish(end, &mut at)?);
        }
        send(tx, events).await?;
        if piece.end.is_some() {
            break;
        }
    }
    Ok(())
}

/// Streams the generation as server-sent events, with keep-alive comments so that clients with
/// a read timeout wait through a long prefill. Dropping the generation when the client is gone
/// aborts its sequence in the engine.
fn stream_events<W: WireFormat>(mut generation: Generation, mut wire: W) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        if let Err(Stop::Failed(e)) = drive(&mut generation, &mut wire, &tx).await {
            let _ = tx.send(wire.error_event(&e).into_sse()).await;
        }
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok::<_, Infallible>(event), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)).text("keep-alive"))
}
