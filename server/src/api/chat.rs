//! `POST /v1/chat/completions`: the request read into a [`GenerationSpec`], and OpenAI chat's
//! wire format (`chat.completion` bodies, `chat.completion.chunk` events).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use radix_templates::parse::{DeclaredTool, ParsedMessage};
use serde_json::json;

use super::driver::{Done, GenerationSpec, Progress, WireEvent, WireFormat, respond};
use super::logprobs::{TokenText, chat_logprobs};
use super::output::{Ending, Piece};
use super::preparation::off_workers;
use super::prompt_structure::PromptStructure;
use super::reply::{created, unique_suffix, usage};
use super::request::{
    ChatBody, ChatCompletionRequest, ToolChoice, ToolDefinition, check_context, parse_body, top_logprobs,
};
use super::response;
use super::response::openai::{ChatChoice, ChatMessage, ChunkChoice, Completion, Delta, FunctionCall, ToolCall};
use super::response::to_json;
use super::{ApiError, ApiState};
use crate::engine::{GenerateRequest, Tenant, Timings};

/// A chat request, decided: what to generate and how the client wants it back.
pub(super) struct PreparedChat {
    /// What to generate.
    pub(super) spec: GenerationSpec,
    /// Stream the reply.
    pub(super) stream: bool,
    /// Send a usage chunk at the end of the stream.
    include_usage: bool,
}

pub(super) async fn chat_completions(State(state): State<Arc<ApiState>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = state.api_keys.presented(&headers);
    if let Some(recorder) = &state.recorder {
        recorder.record("/v1/chat/completions", &body);
    }
    let prepared =
        off_workers(&state, move |state| prepare(state, ChatBody::from_json(&parse_body(&body)?)?, key.as_deref()))
            .await;
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let wire = ChatWire::new(&state, &prepared);
    respond(&state, prepared.spec, wire, prepared.stream).await
}

/// Decides everything about a chat request before generation (the Anthropic API builds its
/// [`ChatBody`] from its own body and comes through here too). `key` is the API key the
/// request carried, which with its `cache_salt` or `user` names its tenant.
pub(super) fn prepare(state: &ApiState, body: ChatBody, key: Option<&str>) -> Result<PreparedChat, ApiError> {
    let ChatBody { conversation: chat, fields, sampling: sampling_fields, output } = body;
    super::limits::check_roles(&chat.messages)?;
    if fields.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only 'n': 1 is supported"));
    }
    let rendered = state.template.render_marked(&chat, state.content_controls.as_ref())?;
    super::request::check_prompt_bytes(rendered.text.len(), state.context_length, "the rendered prompt")?;
    let failed = |e: radix_models::tokenizer::TokenizerError| ApiError::internal(format!("tokenization failed: {e}"));
    // Snapshot points need where each token starts; only hybrid models use them.
    let (prompt, offsets) = match state.hybrid {
        true => {
            let (ids, offsets) = state
                .tokenizer
                .encode_prompt_with_offsets(&rendered.text, &rendered.content_controls)
                .map_err(failed)?;
            (ids, Some(offsets))
        }
        false => (state.tokenizer.encode_prompt(&rendered.text, &rendered.content_controls).map_err(failed)?, None),
    };
    let context = state.context_length;
    check_context(prompt.len(), context, "messages")?;
    let max_tokens = match fields.max_completion_tokens.or(fields.max_tokens) {
        Some(n) if n >= 1.0 => (n as usize).min(context - prompt.len()),
        Some(_) => return Err(ApiError::bad_request("'max_tokens' must be at least 1")),
        None => context - prompt.len(),
    };
    let mut sampling = sampling_fields.over(&state.sampling_defaults)?;
    sampling.logprobs = logprobs_setting(&fields)?;
    let tools_enabled =
        chat.tools.as_ref().is_some_and(|t| !t.is_empty()) && fields.tool_choice != Some(ToolChoice::None);
    // Tools the template does not show are described by us, asking for Hermes calls.
    let format = match state.template.describes_tools(&chat) {
        true => state.format.with_described_tools(),
        false => state.format.clone(),
    };
    let parser = format.parser_options(
        &rendered.text,
        format!("call_{}_", unique_suffix()),
        tools_enabled,
        declared_tools(&fields),
    );
    let reasoning_close = format.starts_in_reasoning(&rendered.text).then(|| format.reasoning_close());
    let constraint = super::constrain::chat_constraint(&fields, format.output, reasoning_close, &state.tokenizer)?;
    let tenant = Tenant::new(key, output.cache_salt.as_deref().or(fields.user.as_deref()));
    let structure = PromptStructure::new(&state.template, &chat, &rendered.text);
    let snapshot_points = offsets.as_deref().map_or_else(Default::default, |offsets| {
        super::snapshot_points::snapshot_points(
            &state.template,
            &structure,
            &chat,
            &rendered,
            offsets,
            state.control_spellings.as_ref(),
        )
    });
    let mut cache = super::cache_report::CacheContext::new(
        structure,
        &state.tokenizer,
        chat,
        rendered,
        prompt.clone(),
        fields.cache_report.unwrap_or(false),
    );
    cache.log_prompts = state.log_prompts;
    cache.offsets = offsets;
    if cache.wanted {
        cache.controls = state.content_controls.clone();
    }
    let request = GenerateRequest {
        prompt,
        sampling,
        max_tokens,
        stop_tokens: state.stop_tokens.clone(),
        stop_strings: output.stop.0.clone(),
        use_cache: output.use_cache(),
        draft_max: output.draft_max()?,
        constraint,
        tenant,
        cache_namespace: output.cache_namespace(),
        snapshot_points: snapshot_points.all,
        expected_points: snapshot_points.expected,
        branch_points: snapshot_points.branch,
    };
    let spec = GenerationSpec { request, parser, cache: Some(cache) };
    Ok(PreparedChat { spec, stream: output.stream(), include_usage: output.include_usage() })
}

/// The declared tools, under every `tool_choice`: the Qwen XML parser reads from their schemas
/// which parameters are strings, which a forced XML call writes as raw text (`"12"` must not
/// come back as `12`). Under `"auto"` they also turn a reply that is only a bare call object
/// into a call; under a forced choice the grammar writes the call's framing, so that recovery
/// finds nothing to recover.
fn declared_tools(fields: &ChatCompletionRequest) -> Vec<DeclaredTool> {
    let definitions = fields.tools.iter().flatten();
    definitions
        .map(|ToolDefinition::Function { function }| DeclaredTool {
            name: function.name.clone(),
            // The client's own JSON Schema, free-form: an empty one where it gave none.
            parameters: function.parameters.clone().unwrap_or_else(|| json!({})),
        })
        .collect()
}

/// `logprobs` (bool) and `top_logprobs` (0 to 20 alternatives, only with `logprobs`).
fn logprobs_setting(fields: &ChatCompletionRequest) -> Result<Option<usize>, ApiError> {
    match (fields.logprobs.unwrap_or(false), top_logprobs(fields.top_logprobs, "top_logprobs")?) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, None | Some(0)) => Ok(None),
        (false, Some(_)) => Err(ApiError::bad_request("'top_logprobs' needs 'logprobs': true")),
    }
}

/// OpenAI chat's wire format.
struct ChatWire {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    wants_logprobs: bool,
    token_text: TokenText,
}

impl ChatWire {
    fn new(state: &ApiState, prepared: &PreparedChat) -> Self {
        ChatWire {
            id: format!("chatcmpl-{}", unique_suffix()),
            created: created(),
            model: state.model_name.clone(),
            include_usage: prepared.include_usage,
            wants_logprobs: prepared.spec.request.sampling.logprobs.is_some(),
            token_text: TokenText::new(Arc::clone(&state.tokenizer)),
        }
    }

    fn chunk(&self, choices: Vec<ChunkChoice>) -> Completion<ChunkChoice> {
        Completion::new(&self.id, "chat.completion.chunk", self.created, &self.model, choices)
    }

    /// A chunk of one choice; log-probabilities go with the next chunk sent after their token.
    fn choice_chunk(
        &mut self,
        delta: Delta,
        finish_reason: Option<&'static str>,
        at: &mut Progress,
    ) -> Result<Completion<ChunkChoice>, ApiError> {
        let mut logprobs = None;
        if self.wants_logprobs {
            let unsent = at.unsent_logprobs();
            if !unsent.is_empty() {
                logprobs = Some(chat_logprobs(&mut self.token_text, unsent)?);
            }
        }
        Ok(self.chunk(vec![ChunkChoice { index: 0, delta, logprobs, finish_reason }]))
    }
}

impl WireFormat for ChatWire {
    fn start_events(&mut self) -> Vec<WireEvent> {
        let start = ChunkChoice {
            index: 0,
            delta: Delta::Start { role: "assistant", content: "" },
            logprobs: None,
            finish_reason: None,
        };
        vec![WireEvent::Data(to_json(&self.chunk(vec![start])))]
    }

    fn on_piece(&mut self, piece: &Piece, at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let mut out = Vec::with_capacity(piece.events.len());
        for event in &piece.events {
            let chunk = self.choice_chunk(Delta::of(event), None, at)?;
            out.push(WireEvent::Data(to_json(&chunk)));
        }
        Ok(out)
    }

    fn finish(&mut self, (ending, timings): &(Ending, Timings), at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let generation = at.generation;
        let finish = ending.finish_reason(generation.pipeline.tool_calls);
        let mut last = self.choice_chunk(Delta::Empty {}, Some(finish), at)?;
        last.timings = Some(response::Timings::new(timings));
        last.cache_report = super::cache_report::for_response(generation.cache.as_ref());
        let mut out = vec![WireEvent::Data(to_json(&last))];
        if self.include_usage {
            let mut usage_chunk = self.chunk(Vec::new());
            usage_chunk.usage = Some(usage(generation, generation.tokens.len()));
            out.push(WireEvent::Data(to_json(&usage_chunk)));
        }
        out.push(WireEvent::Done);
        Ok(out)
    }

    fn complete(mut self, Done { generation, events, ending, timings }: Done) -> Result<Response, ApiError> {
        let message = ParsedMessage::from_events(events);
        let tool_calls: Vec<ToolCall> = message
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                kind: "function",
                function: FunctionCall { name: c.name.clone(), arguments: c.arguments.clone() },
            })
            .collect();
        // A reply of tool calls alone has no text: `null`, not `""`.
        let content = Some(message.content).filter(|c| !c.is_empty() || tool_calls.is_empty());
        let reply =
            ChatMessage { role: "assistant", content, reasoning_content: message.reasoning_content, tool_calls };
        let finish_reason = ending.finish_reason(generation.pipeline.tool_calls);
        let logprobs = match self.wants_logprobs {
            true => Some(chat_logprobs(&mut self.token_text, &generation.logprobs)?),
            false => None,
        };
        let body = Completion {
            id: self.id,
            object: "chat.completion",
            created: self.created,
            model: self.model,
            choices: vec![ChatChoice { index: 0, message: reply, logprobs, finish_reason }],
            usage: Some(usage(generation, generation.tokens.len())),
            timings: Some(response::Timings::new(&timings)),
            cache_report: super::cache_report::for_response(generation.cache.as_ref()),
        };
        let mut response = axum::Json(to_json(&body)).into_response();
        super::cache_report::set_header(&mut response, generation.cache.as_ref());
        Ok(response)
    }
}
