//! The per-request cache report (ARCHITECTURE.md §3): how much of the prompt was cached and, when
//! reuse stopped before the end of the previous version of the conversation, where (token, part
//! of the conversation, text on each side) and why.
//!
//! The engine judges on tokens alone ([`CacheReport`]); here, where the messages are known,
//! the divergence is placed in a part of the conversation and `changed_content` is told apart
//! from `rerendered_history` (the same message rendered to different text).

use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;
use radix_templates::ChatRequest;
use radix_templates::prepare::RenderedPrompt;
use serde_json::Value as Json;

use super::prompt_structure::{PromptStructure, floor_char_boundary};
use super::response::radix::{self as response, Divergence, PreviousVersion, PromptParts};
use super::response::to_json;
use crate::engine::{CacheReport, MissReason};

/// Tokens of context shown on each side of a divergence.
const CONTEXT_TOKENS: usize = 8;

/// What the chat path knows about a prompt, to explain a miss in terms of messages.
pub(crate) struct CacheContext {
    /// Where the prompt's messages and tools are.
    structure: PromptStructure,
    tokenizer: Arc<Tokenizer>,
    /// The request's messages and tools.
    pub(crate) chat: ChatRequest,
    /// The rendered prompt.
    pub(crate) prompt_text: String,
    /// Its tokens.
    pub(crate) prompt: Vec<u32>,
    /// Where the request's own text spelled control tokens (encoded as text).
    content_controls: Vec<std::ops::Range<usize>>,
    /// The tokenizer's control-token spellings, for the prompt's parts.
    pub(crate) controls: Option<radix_templates::prepare::ControlSpellings>,
    /// Where each token of `prompt` starts in `prompt_text`, where the request needed them
    /// already (hybrid models' snapshot points): the prompt's parts then encode it no second time.
    pub(crate) offsets: Option<Vec<usize>>,
    /// The client asked for the report in the response (`"cache_report": true`).
    pub(crate) wanted: bool,
    /// The log line may quote the prompt around the divergence (`--log-prompts`); without it
    /// the log carries token counts and message indices only.
    pub(crate) log_prompts: bool,
}

impl CacheContext {
    /// The context of a chat prompt rendered from `chat` to `rendered`, whose pieces are
    /// `structure`, tokenized to `prompt`.
    pub(crate) fn new(
        structure: PromptStructure,
        tokenizer: &Arc<Tokenizer>,
        chat: ChatRequest,
        rendered: RenderedPrompt,
        prompt: Vec<u32>,
        wanted: bool,
    ) -> Self {
        CacheContext {
            structure,
            tokenizer: Arc::clone(tokenizer),
            chat,
            prompt_text: rendered.text,
            content_controls: rendered.content_controls,
            controls: None,
            offsets: None,
            prompt,
            wanted,
            log_prompts: false,
        }
    }

    /// The prompt's tokens per part, of which the first `cached` came from the cache
    /// (`prompt_parts`); `None` where the token offsets cannot be had.
    pub(crate) fn prompt_parts(&self, cached: usize) -> Option<PromptParts> {
        let offsets = self
            .offsets
            .clone()
            .or_else(|| self.tokenizer.prompt_offsets(&self.prompt_text, &self.content_controls).ok())
            .filter(|o| o.len() == self.prompt.len())?;
        Some(super::prompt_parts::prompt_parts(
            &self.structure,
            &self.chat,
            &self.prompt_text,
            &offsets,
            Some(cached),
            self.controls.as_ref(),
        ))
    }
}

/// The explained report of one request.
#[derive(Debug, Clone)]
pub(crate) struct Explained {
    /// The engine's token-level report.
    pub(crate) report: Box<CacheReport>,
    /// The final reason (the engine's, refined where messages tell more).
    pub(crate) reason: Option<MissReason>,
    /// The report as returned to clients (`cache_report`).
    pub(crate) json: Json,
    /// The client asked for it in the response.
    pub(crate) wanted: bool,
}

impl Explained {
    /// `x-radix-cache` header value.
    pub(crate) fn header(&self) -> String {
        let mut value = format!("cached={} prompt={}", self.report.cached_tokens, self.report.prompt_tokens);
        if let Some(reason) = self.reason {
            value.push_str(&format!(" reason={}", reason.as_str()));
        }
        value
    }
}

/// The report as a response's `cache_report`, when the client asked for it.
pub(crate) fn for_response(explained: Option<&Explained>) -> Option<Json> {
    explained.filter(|e| e.wanted).map(|e| e.json.clone())
}

/// Sets the `x-radix-cache` response header.
pub(crate) fn set_header(response: &mut axum::response::Response, explained: Option<&Explained>) {
    if let Some(value) = explained.and_then(|e| axum::http::HeaderValue::from_str(&e.header()).ok()) {
        response.headers_mut().insert("x-radix-cache", value);
    }
}

/// Where a divergence falls.
struct Place {
    part: &'static str,
    message: Option<usize>,
    /// Byte offset in the prompt text where that message starts.
    message_start: usize,
}

/// Explains `report` and logs one line about it. Without a chat context (a raw-text prompt) the
/// report stays at token level.
pub(crate) fn explain(context: Option<&CacheContext>, report: Box<CacheReport>) -> Explained {
    let mut reason = report.reason;
    let mut divergence = None;
    let mut log_place = String::new();
    if let (Some(at), Some(ctx)) = (report.divergence, context) {
        let window = |tokens: &[u32], from: usize, to: usize| -> String {
            let (from, to) = (from.min(tokens.len()), to.min(tokens.len()));
            ctx.tokenizer.decode(&tokens[from..to], false).unwrap_or_default()
        };
        let offset = ctx.tokenizer.decode(&ctx.prompt[..at.min(ctx.prompt.len())], false).map_or(0, |t| t.len());
        let offset = floor_char_boundary(&ctx.prompt_text, offset);
        let place = locate(&ctx.structure, &ctx.chat, &ctx.prompt_text, offset);
        reason = refine(ctx, &report, at, &place, reason);
        let role = place.message.and_then(|k| ctx.chat.messages.get(k)).and_then(|m| m["role"].as_str());
        let before = window(&ctx.prompt, at.saturating_sub(CONTEXT_TOKENS), at);
        let after = window(&ctx.prompt, at, at + CONTEXT_TOKENS);
        log_place = match place.message {
            Some(k) => format!(" in {} (message {k}, {})", place.part, role.unwrap_or("?")),
            None => format!(" in {}", place.part),
        };
        if ctx.log_prompts {
            log_place.push_str(&format!(" between {before:?} and {after:?}"));
        }
        divergence = Some(Divergence::Placed {
            token: at,
            part: place.part,
            message_index: place.message,
            role: role.map(str::to_owned),
            before,
            after,
            previous_after: report.previous.as_ref().map(|p| window(&p.tokens, at, at + CONTEXT_TOKENS)),
        });
    } else if let Some(at) = report.divergence {
        divergence = Some(Divergence::At { token: at });
    }
    let previous = report.previous.as_ref().map(|p| PreviousVersion {
        common_prefix_tokens: p.common_prefix,
        prompt_tokens: p.prompt_len,
        total_tokens: p.tokens.len(),
    });
    let restored_from_disk = Some(report.restored_from_disk).filter(|&n| n > 0);
    if let Some(restored) = restored_from_disk {
        log_place.push_str(&format!(" ({restored} cached tokens restored from disk)"));
    }
    if let Some(recomputed) = report.recomputed_for_snapshot {
        log_place.push_str(&format!(" ({recomputed} cached tokens recomputed from the nearest snapshot)"));
    }
    let body = response::CacheReport {
        prompt_tokens: report.prompt_tokens,
        cached_tokens: report.cached_tokens,
        reason: reason.map(MissReason::as_str),
        divergence,
        previous,
        restored_from_disk,
        recomputed_for_snapshot: report.recomputed_for_snapshot,
        prompt_parts: context.filter(|c| c.wanted).and_then(|c| c.prompt_parts(report.cached_tokens)),
    };
    let json = to_json(&body);
    match (reason, report.divergence) {
        (Some(reason), Some(at)) => eprintln!(
            "radix-serve: cache prompt={} cached={}: reuse stopped at token {at}{log_place}: {}",
            report.prompt_tokens,
            report.cached_tokens,
            reason.as_str()
        ),
        _ => eprintln!(
            "radix-serve: cache prompt={} cached={}: full hit{log_place}",
            report.prompt_tokens, report.cached_tokens
        ),
    }
    let wanted = context.is_some_and(|c| c.wanted);
    Explained { report, reason, json, wanted }
}

/// The part of the conversation the byte `offset` of the prompt text falls in: message `k` owns
/// the prompt from the end of the last message's text found before it (so its header is its
/// own) to the end of its text; one not rendered verbatim owns nothing.
fn locate(structure: &PromptStructure, chat: &ChatRequest, prompt_text: &str, offset: usize) -> Place {
    if let Some(tools) = structure.tools(chat, prompt_text).filter(|t| t.contains(&offset)) {
        return Place { part: "tools", message: None, message_start: tools.start };
    }
    let mut start = 0;
    for (k, found) in structure.messages.iter().enumerate() {
        let end = found.as_ref().map_or(start, |r| r.end);
        if offset < end {
            let part = if k < structure.leading_system { "system" } else { "message" };
            return Place { part, message: Some(k), message_start: start };
        }
        start = end;
    }
    Place { part: "generation_prompt", message: None, message_start: start }
}

/// Refines the engine's reason with the messages: a divergence inside a message whose text the
/// previous version also holds (from the same place on) is that message rendered differently.
fn refine(
    ctx: &CacheContext,
    report: &CacheReport,
    at: usize,
    place: &Place,
    reason: Option<MissReason>,
) -> Option<MissReason> {
    let (Some(previous), Some(k)) = (report.previous.as_ref(), place.message) else { return reason };
    let text = &ctx.structure.texts[k];
    if text.is_empty() {
        return reason;
    }
    let decode = |tokens: &[u32]| ctx.tokenizer.decode(tokens, false).unwrap_or_default();
    match reason {
        Some(MissReason::ChangedContent) => {
            let before = decode(&previous.tokens[..previous.prompt_len.min(previous.tokens.len())]);
            let from = floor_char_boundary(&before, place.message_start);
            before[from..].contains(text.as_str()).then_some(MissReason::RerenderedHistory).or(reason)
        }
        // Inside what the previous request generated: the reply, re-sent as history, was
        // rendered to other tokens than the model produced.
        Some(MissReason::NewContent) if at < previous.tokens.len() && at >= previous.prompt_len => {
            let generated = decode(&previous.tokens[previous.prompt_len..]);
            generated.contains(text.as_str()).then_some(MissReason::RerenderedHistory).or(reason)
        }
        _ => reason,
    }
}

#[cfg(test)]
mod tests {
    use radix_templates::prepare::PreparedTemplate;
    use serde_json::json;

    use super::*;

    /// ChatML with tools in the system turn and reasoning shown on the latest assistant turn only.
    const TEMPLATE: &str = "{%- set ns = namespace(last=-1) -%}\
        {%- for m in messages %}{% if m.role == 'assistant' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor -%}\
        {%- if tools %}<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif -%}\
        {%- for m in messages %}<|im_start|>{{ m.role }}\n\
        {%- if m.role == 'assistant' and loop.index0 == ns.last and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif -%}\
        {{ m.content }}<|im_end|>\n{% endfor -%}\
        {%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}";

    fn place_of(body: Json, needle: &str) -> (&'static str, Option<usize>) {
        let template = PreparedTemplate::new(
            radix_templates::testing::template_from_text(TEMPLATE, Default::default()).expect("the template compiles"),
        );
        let chat = ChatRequest::from_json(&body).unwrap();
        let text = template.render(&chat).unwrap();
        let offset = text.find(needle).unwrap_or_else(|| panic!("{needle:?} not in {text:?}"));
        let place = locate(&PromptStructure::new(&template, &chat, &text), &chat, &text, offset);
        (place.part, place.message)
    }

    #[test]
    fn divergences_are_placed_in_the_part_that_holds_them() {
        let body = json!({
            "messages": [
                {"role": "system", "content": "stable block"},
                {"role": "system", "content": "dynamic block"},
                {"role": "user", "content": "question one"},
                {"role": "assistant", "content": "answer one", "reasoning_content": "thinking one"},
                {"role": "user", "content": "question two"},
                {"role": "assistant", "content": "answer two"},
                {"role": "user", "content": "question three"}
            ],
            "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
        });
        assert_eq!(place_of(body.clone(), "read_file"), ("tools", None));
        assert_eq!(place_of(body.clone(), "stable"), ("system", Some(0)));
        assert_eq!(place_of(body.clone(), "dynamic"), ("system", Some(1)));
        assert_eq!(place_of(body.clone(), "question one"), ("message", Some(2)));
        // Rendered without its reasoning here, but with it when it was the latest turn: the
        // message is still found.
        assert_eq!(place_of(body.clone(), "answer one"), ("message", Some(3)));
        assert_eq!(place_of(body.clone(), "question three"), ("message", Some(6)));
        // A message's header is its own.
        assert_eq!(place_of(body, "<|im_start|>assistant"), ("message", Some(3)));
        let end = json!({"messages": [{"role": "user", "content": "hi"}]});
        let template = PreparedTemplate::new(
            radix_templates::testing::template_from_text(TEMPLATE, Default::default()).expect("the template compiles"),
        );
        let chat = ChatRequest::from_json(&end).unwrap();
        let text = template.render(&chat).unwrap();
        let tail = text.rfind("<|im_start|>assistant").unwrap();
        assert_eq!(
            locate(&PromptStructure::new(&template, &chat, &text), &chat, &text, tail).part,
            "generation_prompt"
        );
    }
}
