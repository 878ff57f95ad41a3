//! `POST /v1/chat/completions`: the request read into a [`GenerationSpec`], and OpenAI chat's
//! wire format (`chat.completion` bodies, `chat.completion.chunk` events).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use radix_templates::parse::{DeclaredTool, ParseEvent, ParsedMessage};
use serde_json::{Value as Json, json};

use super::driver::{Done, GenerationSpec, Progress, WireEvent, WireFormat, respond};
use super::logprobs::{TokenText, chat_logprobs};
use super::output::{Ending, Piece};
use super::preparation::off_workers;
use super::prompt_structure::PromptStructure;
use super::reply::{created, timings_json, unique_suffix, usage};
use super::request::{
    ChatBody, ChatCompletionRequest, ToolChoice, ToolDefinition, check_context, parse_body, top_logprobs,
};
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
        constraint,
        tenant,
        cache_namespace: output.cache_namespace(),
        snapshot_points: snapshot_points.all,
        expected_points: snapshot_points.expected,
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

/// The delta object of one parse event.
fn delta(event: &ParseEvent) -> Json {
    match event {
        ParseEvent::Content(text) => json!({"content": text}),
        ParseEvent::Reasoning(text) => json!({"reasoning_content": text}),
        ParseEvent::ToolCallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
        ParseEvent::ToolCallArguments { index, delta } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
        }
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

    fn chunk(&self, delta: Json, finish: Option<&str>) -> Json {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
        })
    }

    /// Log-probabilities go with the next chunk sent after their token.
    fn with_logprobs(&mut self, mut chunk: Json, at: &mut Progress) -> Result<Json, ApiError> {
        if self.wants_logprobs {
            let unsent = at.unsent_logprobs();
            if !unsent.is_empty() {
                chunk["choices"][0]["logprobs"] = chat_logprobs(&mut self.token_text, unsent)?;
            }
        }
        Ok(chunk)
    }
}

impl WireFormat for ChatWire {
    fn start_events(&mut self) -> Vec<WireEvent> {
        vec![WireEvent::Data(self.chunk(json!({"role": "assistant", "content": ""}), None))]
    }

    fn on_piece(&mut self, piece: &Piece, at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let mut out = Vec::with_capacity(piece.events.len());
        for event in &piece.events {
            let chunk = self.chunk(delta(event), None);
            out.push(WireEvent::Data(self.with_logprobs(chunk, at)?));
        }
        Ok(out)
    }

    fn finish(&mut self, (ending, timings): &(Ending, Timings), at: &mut Progress) -> Result<Vec<WireEvent>, ApiError> {
        let generation = at.generation;
        let last = self.chunk(json!({}), Some(ending.finish_reason(generation.pipeline.tool_calls)));
        let mut last = self.with_logprobs(last, at)?;
        last["timings"] = timings_json(timings);
        super::cache_report::attach(&mut last, generation.cache.as_ref());
        let mut out = vec![WireEvent::Data(last)];
        if self.include_usage {
            out.push(WireEvent::Data(json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage(generation, generation.tokens.len())
            })));
        }
        out.push(WireEvent::Done);
        Ok(out)
    }

    fn complete(mut self, Done { generation, events, ending, timings }: Done) -> Result<Response, ApiError> {
        let message = ParsedMessage::from_events(events);
        let mut reply = json!({"role": "assistant", "content": message.content});
        if let Some(reasoning) = &message.reasoning_content {
            reply["reasoning_content"] = json!(reasoning);
        }
        if !message.tool_calls.is_empty() {
            if message.content.is_empty() {
                reply["content"] = Json::Null;
            }
            reply["tool_calls"] = message
                .tool_calls
                .iter()
                .map(
                    |c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}),
                )
                .collect();
        }
        let finish = ending.finish_reason(generation.pipeline.tool_calls);
        let logprobs = match self.wants_logprobs {
            true => chat_logprobs(&mut self.token_text, &generation.logprobs)?,
            false => Json::Null,
        };
        let mut body = json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": reply, "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage(generation, generation.tokens.len()),
            "timings": timings_json(&timings),
        });
        super::cache_report::attach(&mut body, generation.cache.as_ref());
        let mut response = axum::Json(body).into_response();
        super::cache_report::set_header(&mut response, generation.cache.as_ref());
        Ok(response)
    }
}
