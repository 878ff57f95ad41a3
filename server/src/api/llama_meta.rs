//! llama-server's endpoints around generation: `/tokenize`, `/detokenize`, `/apply-template`,
//! `/props` and `/slots`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use radix_templates::ChatRequest;
use serde_json::Value as Json;

use super::logprobs::TokenText;
use super::preparation::off_workers;
use super::request::{DetokenizeRequest, TokenizeRequest, check_prompt_bytes, parse_body, token_id, typed};
use super::response::llama::{
    AppliedTemplate, Detokenized, Empty, GenerationSettings, Modalities, Piece, Props, Slot, TokenPiece, Tokenized,
};
use super::response::to_json;
use super::{ApiError, ApiState};

fn respond(result: Result<Json, ApiError>) -> Response {
    match result {
        Ok(value) => axum::Json(value).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Most bytes of `content` `/tokenize` takes with `with_pieces`.
const MAX_TOKENIZE_PIECES_BYTES: usize = 1 << 20;

/// `POST /tokenize`: `content`, `add_special` (BOS where the model adds one; default false),
/// `with_pieces` (each id with its text, or its bytes where they are not whole UTF-8),
/// `parse_special` (special-token spellings become their tokens; default true, as llama-server;
/// false tokenizes them as text, as message content is in a chat prompt).
pub(super) async fn tokenize(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    respond(
        off_workers(&state, move |state| {
            let fields: TokenizeRequest = typed(&parse_body(&body)?)?;
            let Some(content) = &fields.content else { return Err(ApiError::bad_request("'content' is required")) };
            // With pieces, each token becomes a JSON object: tens of bytes of output and far more
            // of memory per byte of input (28.5 MB took 13 GB), so that form is bounded.
            if fields.with_pieces.unwrap_or(false) && content.len() > MAX_TOKENIZE_PIECES_BYTES {
                return Err(ApiError::bad_request(format!(
                    "'content' is {} bytes; with 'with_pieces' at most {MAX_TOKENIZE_PIECES_BYTES} are tokenized per request",
                    content.len()
                )));
            }
            check_prompt_bytes(content.len(), state.context_length, "'content'")?;
            let tokenizer = &state.tokenizer;
            let failed = |e| ApiError::internal(format!("tokenization failed: {e}"));
            let add_special = fields.add_special.unwrap_or(false);
            let ids = match fields.parse_special.unwrap_or(true) {
                true => tokenizer.encode(content, add_special).map_err(failed)?,
                false => {
                    let bos = tokenizer.bos_token_id().filter(|_| add_special && tokenizer.add_bos());
                    let whole = 0..content.len();
                    let text = tokenizer.encode_prompt(content, std::slice::from_ref(&whole)).map_err(failed)?;
                    bos.into_iter().chain(text).collect()
                }
            };
            if !fields.with_pieces.unwrap_or(false) {
                return Ok(to_json(&Tokenized { tokens: ids }));
            }
            let mut token_text = TokenText::new(Arc::clone(&state.tokenizer));
            let mut tokens = Vec::with_capacity(ids.len());
            for &id in &ids {
                // Part of a multi-byte character: llama-server gives the bytes instead of text.
                let piece = match String::from_utf8(token_text.bytes(id)?) {
                    Ok(text) => Piece::Text(text),
                    Err(e) => Piece::Bytes(e.into_bytes()),
                };
                tokens.push(TokenPiece { id, piece });
            }
            Ok(to_json(&Tokenized { tokens }))
        })
        .await,
    )
}

/// `POST /detokenize`: `tokens` (ids) to `content`, special tokens written out.
pub(super) async fn detokenize(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    respond(
        off_workers(&state, move |state| {
            let fields: DetokenizeRequest = typed(&parse_body(&body)?)?;
            let items = fields.tokens.unwrap_or_default();
            let ids = items.iter().map(|v| token_id(&state.tokenizer, v.as_u64(), v)).collect::<Result<Vec<_>, _>>()?;
            let content = state
                .tokenizer
                .decode(&ids, false)
                .map_err(|e| ApiError::internal(format!("detokenizing failed: {e}")))?;
            Ok(to_json(&Detokenized { content }))
        })
        .await,
    )
}

/// `POST /apply-template`: a chat body to `{"prompt"}`, through the same message preparation
/// and template as `/v1/chat/completions`.
pub(super) async fn apply_template(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    respond(
        off_workers(&state, move |state| {
            let body = parse_body(&body)?;
            let chat = ChatRequest::from_json(&body)?;
            let rendered = state.template.render_marked(&chat, state.content_controls.as_ref())?;
            check_prompt_bytes(rendered.text.len(), state.context_length, "the rendered prompt")?;
            let offsets = state
                .tokenizer
                .prompt_offsets(&rendered.text, &rendered.content_controls)
                .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))?;
            let structure = super::prompt_structure::PromptStructure::new(&state.template, &chat, &rendered.text);
            let parts = super::prompt_parts::prompt_parts(
                &structure,
                &chat,
                &rendered.text,
                &offsets,
                None,
                state.content_controls.as_ref(),
            );
            Ok(to_json(&AppliedTemplate { prompt: rendered.text, prompt_tokens: offsets.len(), prompt_parts: parts }))
        })
        .await,
    )
}

/// A slot's `params` and `next_token` when idle, as `/props` and `/slots` show them.
fn idle_slot(state: &ApiState, id: usize, is_processing: bool) -> Slot {
    let params =
        GenerationSettings::new(state.context_length, &state.model_name, &state.sampling_defaults, -1, &[], false);
    Slot::idle(id, state.context_length, is_processing, params)
}

/// A special token's text: as the template knows it, else the tokenizer's.
fn special_token(state: &ApiState, name: &str, id: Option<u32>) -> String {
    let source = state.template.template.source();
    match source.special_tokens.get(name) {
        Some(text) => text.clone(),
        None => id.and_then(|id| state.tokenizer.decode(&[id], false).ok()).unwrap_or_default(),
    }
}

/// `GET /props`.
pub(super) async fn props(State(state): State<Arc<ApiState>>) -> Response {
    let source = state.template.template.source();
    let chat_template = source.select(false).map(|(_, text)| text.to_owned()).unwrap_or_default();
    let eos = state.tokenizer.eos_token_ids().iter().next().copied();
    let props = Props {
        default_generation_settings: idle_slot(&state, 0, false),
        total_slots: state.total_slots,
        model_alias: state.model_name.clone(),
        model_path: state.model_path.clone(),
        modalities: Modalities::default(),
        endpoint_slots: true,
        endpoint_props: false,
        endpoint_metrics: true,
        chat_template,
        chat_template_caps: Empty::default(),
        bos_token: special_token(&state, "bos_token", state.tokenizer.bos_token_id()),
        eos_token: special_token(&state, "eos_token", eos),
        build_info: format!("radix-serve {}", env!("CARGO_PKG_VERSION")),
        is_sleeping: false,
        chat_template_tool_use: source.templates.get("tool_use").cloned(),
        kv_cache: state.kv_cache,
    };
    axum::Json(to_json(&props)).into_response()
}

/// `GET /slots`: one entry per `--parallel` slot. The engine has no fixed slots: any request
/// runs in any free place of its batch. Slot `i` reads as processing while more than `i`
/// sequences run, so the count of busy slots is right, not which request is in which.
/// `?fail_on_no_slot=1` answers 503 when every slot is busy, as llama-server does.
pub(super) async fn slots(State(state): State<Arc<ApiState>>, uri: Uri) -> Response {
    let running = state.engine.stats().running;
    let fail_on_no_slot =
        uri.query().unwrap_or_default().split('&').any(|kv| kv == "fail_on_no_slot=1" || kv == "fail_on_no_slot=true");
    if fail_on_no_slot && running >= state.total_slots {
        return ApiError::NoSlot.into_response();
    }
    let slots: Vec<Slot> = (0..state.total_slots).map(|id| idle_slot(&state, id, id < running)).collect();
    axum::Json(to_json(&slots)).into_response()
}
