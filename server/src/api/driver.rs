//! The one generation driver every API runs: a [`GenerationSpec`] goes to the engine, and the
//! pieces that come back are shaped by the API's [`WireFormat`], either into one JSON body or
//! into a server-sent event stream. The driver owns what every API shares: the event channel,
//! SSE keep-alive, which log-probabilities were already sent, errors turned into a last event,
//! and stopping (which aborts the sequence) once the client is gone.

use std::convert::Infallible;
use std::sync::Arc;
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
    /// What the engine runs: prompt tokens, sampling, token limit, stop tokens, constraint,
    /// whether the prefix cache is used.
    pub(crate) request: GenerateRequest,
    /// Stop strings.
    pub(crate) stops: Vec<String>,
    /// How the reply is parsed (reasoning, tool calls).
    pub(crate) parser: ParserOptions,
    /// To explain a cache miss in terms of messages (chat prompts only).
    pub(crate) cache: Option<CacheContext>,
}

impl GenerationSpec {
    /// Submits the spec to the engine.
    fn start(self, state: &ApiState) -> Generation {
        let mut generation =
            Generation::start(&state.engine, Arc::clone(&state.tokenizer), self.request, self.stops, self.parser);
        generation.cache_context = self.cache;
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

/// The log-probabilities a stream has not sent yet: each API sends a token's with the next
/// chunk after it, and a token whose text is held back has no chunk of its own.
#[derive(Default)]
pub(crate) struct LogprobCursor {
    sent: usize,
}

impl LogprobCursor {
    /// The log-probabilities received since the last call, now counted as sent.
    pub(crate) fn take<'a>(&mut self, generation: &'a Generation) -> &'a [TokenLogprobs] {
        let unsent = generation.logprobs.get(self.sent..).unwrap_or_default();
        self.sent = generation.logprobs.len();
        unsent
    }
}

/// How one API writes a reply: its stream events and its whole-body response.
pub(crate) trait WireFormat: Send + 'static {
    /// Events sent before generation produced anything (OpenAI chat's role chunk).
    fn start_events(&mut self) -> Vec<WireEvent> {
        Vec::new()
    }

    /// The events of one piece of the reply.
    fn on_piece(
        &mut self,
        piece: &Piece,
        generation: &Generation,
        logprobs: &mut LogprobCursor,
    ) -> Result<Vec<WireEvent>, ApiError>;

    /// The events that close the stream once generation ended this way.
    fn finish(
        &mut self,
        generation: &Generation,
        ending: &Ending,
        timings: &Timings,
        logprobs: &mut LogprobCursor,
    ) -> Result<Vec<WireEvent>, ApiError>;

    /// The last event of a stream that failed.
    fn error_event(&self, error: &ApiError) -> WireEvent {
        WireEvent::Data(error.body())
    }

    /// The whole response of a generation that was not streamed, from all its parse events.
    fn complete(
        self,
        generation: &Generation,
        events: Vec<ParseEvent>,
        ending: Ending,
        timings: Timings,
    ) -> Result<Response, ApiError>;
}

/// Runs `spec` and answers in `wire`'s format, streamed or as one body.
pub(crate) async fn respond<W: WireFormat>(state: &ApiState, spec: GenerationSpec, wire: W, stream: bool) -> Response {
    let generation = spec.start(state);
    if stream { stream_events(generation, wire).into_response() } else { complete(generation, wire).await }
}

async fn complete<W: WireFormat>(mut generation: Generation, wire: W) -> Response {
    let result = match generation.run().await {
        Ok((events, ending, timings)) => wire.complete(&generation, events, ending, timings),
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
    let mut logprobs = LogprobCursor::default();
    send(tx, wire.start_events()).await?;
    while let Some(piece) = generation.next().await? {
        send(tx, wire.on_piece(&piece, generation, &mut logprobs)?).await?;
        if let Some((ending, timings)) = &piece.end {
            return send(tx, wire.finish(generation, ending, timings, &mut logprobs)?).await;
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
