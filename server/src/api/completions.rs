//! `POST /v1/completions`: OpenAI's legacy text completions, one prompt and one choice per
//! request; and the prompt-to-spec step it shares with llama.cpp's `/completion`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value as Json;

use super::driver::{Done, GenerationSpec, Progress, WireEvent, WireFormat, respond};
use super::logprobs::TokenText;
use super::output::{Ending, Generation, Piece};
use super::preparation::off_workers;
use super::reply::{created, plain_parser, text_of, unique_suffix, usage};
use super::request::{CompletionRequest, GenerationBody, GenerationFields, check_context, prompt_tokens, top_logprobs};
use super::response;
use super::response::openai::{Completion, CompletionLogprobs, TextChoice, Usage};
use super::response::to_json;
use super::{ApiError, ApiState};
use crate::engine::{GenerateRequest, SamplingParams, Tenant, Timings};

/// OpenAI's default `max_tokens` for text completions.
const DEFAULT_MAX_TOKENS: i64 = 16;

/// The routes of this module.
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new().route("/v1/completions", post(completions))
}

/// The spec of a raw-text request: the prompt is tokenized as given, no chat template; sampling
/// over `defaults`. `max_tokens` is the requested limit, negative for "until a stop token or the
/// context is full"; 0 evaluates the prompt (into the cache) and generates nothing.
pub(super) fn text_spec(
    state: &ApiState,
    prompt: Option<&Json>,
    sampling: SamplingParams,
    max_tokens: i64,
    output: &GenerationFields,
    tenant: Tenant,
) -> Result<GenerationSpec, ApiError> {
    let prompt = prompt_tokens(&state.tokenizer, prompt, state.context_length)?;
    let context = state.context_length;
    check_context(prompt.len(), context, "prompt")?;
    let room = context - prompt.len();
    // The engine always samples at least one token; a limit of 0 still runs the prompt (and so
    // caches it), and the caller shows no output.
    let max_tokens = if max_tokens < 0 { room } else { (max_tokens as usize).clamp(1, room) };
    let request = GenerateRequest {
        prompt,
        sampling,
        max_tokens,
        stop_tokens: state.stop_tokens.clone(),
        stop_strings: output.stop.0.clone(),
        use_cache: output.use_cache(),
        draft_max: output.draft_max()?,
        constraint: None,
        tenant,
        cache_namespace: output.cache_namespace(),
        snapshot_points: Vec::new(),
        expected_points: Vec::new(),
        branch_points: Vec::new(),
    };
    Ok(GenerationSpec { request, parser: plain_parser(), cache: None })
}

/// Refuses what we do not implement, rather than silently answering something else.
fn refuse_unsupported(fields: &CompletionRequest) -> Result<(), ApiError> {
    if fields.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only 'n': 1 is supported"));
    }
    if fields.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only 'best_of': 1 is supported"));
    }
    if fields.echo.unwrap_or(false) {
        return Err(ApiError::bad_request("'echo' is not supported"));
    }
    if fields.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request("'suffix' (fill-in-the-middle) is not supported"));
    }
    Ok(())
}

async fn completions(State(state): State<Arc<ApiState>>, headers: HeaderMap, body: Bytes) -> Response {
    let tenant = Tenant::new(state.api_keys.presented(&headers).as_deref(), None);
    let prepared = off_workers(&state, move |state| {
        let GenerationBody { fields, sampling: sampling_fields, output } =
            GenerationBody::<CompletionRequest>::parse(&body)?;
        refuse_unsupported(&fields)?;
        let max_tokens = match fields.max_tokens {
            Some(n) if n < 0 => return Err(ApiError::bad_request("'max_tokens' must not be negative")),
            Some(n) => n,
            None => DEFAULT_MAX_TOKENS,
        };
        let defaults =
            SamplingParams { logprobs: top_logprobs(fields.logprobs, "logprobs")?, ..state.sampling_defaults.clone() };
        let sampling = sampling_fields.over(&defaults)?;
        let spec = text_spec(state, fields.prompt.as_ref(), sampling, max_tokens, &output, tenant)?;
        Ok((spec, output, max_tokens == 0))
    })
    .await;
    let (spec, output, silent) = match prepared {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let wire = CompletionsWire {
        id: format!("cmpl-{}", unique_suffix()),
        created: created(),
        model: state.model_name.clone(),
        include_usage: output.include_usage(),
        silent,
        wants_logprobs: spec.request.sampling.logprobs.is_some(),
        token_text: TokenText::new(Arc::clone(&state.tokenizer)),
        offset: 0,
    };
    respond(&state, spec, wire, output.stream()).await
}

/// OpenAI text completions' wire format.
struct CompletionsWire {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// `max_tokens: 0`: the prompt is evaluated, nothing is shown.
    silent: bool,
    wants_logprobs: bool,
    token_text: TokenText,
    /// Bytes of text streamed so far, for `text_offset`.
    offset: usize,
}

impl CompletionsWire {
    fn chunk(&self, choices: Vec<TextChoice>) -> Completion<TextChoice> {
        Completion::new(&self.id, "text_completion", self.created, &self.model, choices)
    }

    /// Generated tokens as the usage counts them: none when nothing is shown.
    fn usage(&self, generation: &Generation) -> Usage {
        usage(generation, if self.silent { 0 } else { generation.tokens.len() })
    }
}

fn choice(text: String, finish_reason: Option<&'static str>, logprobs: Option<CompletionLogprobs>) -> Vec<TextChoice> {
    vec![TextChoice { index: 0, text, logprobs, finish_reason }]
}

impl WireFormat for CompletionsWire {
    fn on_piece(&mut self, piece: &Piece, at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let text = text_of(&piece.events);
        if text.is_empty() || self.silent {
            return Ok(Vec::new());
        }
        // The tokens since the last chunk, which this text completes.
        let unsent = at.unsent_logprobs();
        let logprobs = self.wants_logprobs.then(|| self.token_text.completion_logprobs(unsent, self.offset));
        self.offset += text.len();
        Ok(vec![WireEvent::Data(to_json(&self.chunk(choice(text, None, logprobs))))])
    }

    fn finish(&mut self, (ending, timings): &(Ending, Timings), at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let mut last = self.chunk(choice(String::new(), Some(ending.finish_reason(false)), None));
        last.timings = Some(response::Timings::new(timings));
        let mut out = vec![WireEvent::Data(to_json(&last))];
        if self.include_usage {
            let mut usage_chunk = self.chunk(Vec::new());
            usage_chunk.usage = Some(self.usage(at.generation));
            out.push(WireEvent::Data(to_json(&usage_chunk)));
        }
        out.push(WireEvent::Done);
        Ok(out)
    }

    fn complete(self, Done { generation, events, ending, timings }: Done) -> Result<Response, ApiError> {
        let text = if self.silent { String::new() } else { text_of(&events) };
        let logprobs =
            (self.wants_logprobs && !self.silent).then(|| self.token_text.completion_logprobs(&generation.logprobs, 0));
        let mut body = self.chunk(choice(text, Some(ending.finish_reason(false)), logprobs));
        body.usage = Some(self.usage(generation));
        body.timings = Some(response::Timings::new(&timings));
        Ok(axum::Json(to_json(&body)).into_response())
    }
}
