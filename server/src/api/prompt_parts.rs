//! Where a chat prompt's tokens go: system prompt, tool schemas, each role's messages, reasoning,
//! tool-call arguments and the generation prompt, each split into cached and computed tokens
//! (`prompt_parts` in the cache report and on `/apply-template`).
//!
//! Context-indicator plugins for agents estimate this split with a characters-per-token rule;
//! the server knows it exactly. The prompt text is divided into byte ranges, each token goes to
//! the range its first byte is in, so the parts add up to the prompt's tokens:
//! - message `k` owns the text from the end of message `k - 1` to the end of its own text, and
//!   on to the next control token (its header is its own, as in the cache report; ending at a
//!   control token, its text tokenizes alike alone); leading system messages are `system`;
//! - the tool schemas are what the prompt gains when rendered with `tools` (`tools`);
//! - inside an assistant message, its reasoning text and each tool call's arguments, where the
//!   prompt holds them verbatim (`reasoning`, `tool_call_arguments`);
//! - what follows the last message is the `generation_prompt`.

use std::ops::Range;

use radix_templates::ChatRequest;
use radix_templates::prepare::ControlSpellings;
use serde_json::Value as Json;

use super::prompt_structure::{PromptStructure, find_messages};
use super::response::radix::{MessageCount, PartCount, PromptParts};

/// The part kinds, in the order the report lists them (`PromptParts`' fields).
const KINDS: [&str; 8] =
    ["system", "tools", "user", "assistant", "reasoning", "tool_call_arguments", "tool", "generation_prompt"];

/// One labelled byte range of the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Span {
    bytes: Range<usize>,
    kind: &'static str,
    /// The message it belongs to (none for tools and the generation prompt).
    message: Option<usize>,
}

/// The byte ranges of `prompt_text`, later ones taking precedence where they overlap. A
/// message's range ends where the next control token starts (`controls`, the tokenizer's), so
/// that its text is tokenized alike alone and in the prompt.
fn spans(
    structure: &PromptStructure,
    chat: &ChatRequest,
    prompt_text: &str,
    controls: Option<&ControlSpellings>,
) -> Vec<Span> {
    let control_starts: Vec<usize> =
        controls.map_or(Vec::new(), |c| c.find_in(prompt_text).iter().map(|r| r.start).collect());
    let next_control = |at: usize| control_starts.iter().copied().find(|&c| c >= at).unwrap_or(at);
    let found = find_messages(prompt_text, structure.texts.iter().map(|t| [t]), next_control);
    let mut spans = Vec::new();
    let mut start = 0;
    for (k, (message, found)) in chat.messages.iter().zip(found).enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        let Some(text) = found else { continue };
        let end = next_control(text.end);
        let kind = match role {
            _ if k < structure.leading_system => "system",
            "system" | "developer" => "system",
            "assistant" => "assistant",
            "tool" => "tool",
            _ => "user",
        };
        spans.push(Span { bytes: start..end, kind, message: Some(k) });
        if role == "assistant" {
            spans.extend(inner_spans(message, prompt_text, start..end, k));
        }
        start = end;
    }
    spans.push(Span { bytes: start..prompt_text.len(), kind: "generation_prompt", message: None });
    if let Some(bytes) = structure.tools(chat, prompt_text) {
        spans.push(Span { bytes, kind: "tools", message: None });
    }
    spans
}

/// An assistant message's reasoning and tool-call arguments, where `within` holds them verbatim.
fn inner_spans(message: &Json, prompt_text: &str, within: Range<usize>, k: usize) -> Vec<Span> {
    let mut texts: Vec<(&'static str, String)> = Vec::new();
    for key in ["reasoning_content", "reasoning", "thinking"] {
        if let Some(text) = message[key].as_str().map(str::trim).filter(|t| !t.is_empty()) {
            texts.push(("reasoning", text.to_owned()));
            break;
        }
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let arguments = &call["function"]["arguments"];
        let text = match arguments {
            Json::String(raw) => raw.clone(),
            Json::Null => continue,
            other => other.to_string(),
        };
        texts.push(("tool_call_arguments", text));
    }
    let region = &prompt_text[within.clone()];
    let mut from = 0;
    let mut out = Vec::new();
    for (kind, text) in texts {
        if let Some(found) = region.get(from..).and_then(|rest| rest.find(&text)) {
            let start = within.start + from + found;
            out.push(Span { bytes: start..start + text.len(), kind, message: Some(k) });
            from += found + text.len();
        }
    }
    out
}

/// Counts per part of a prompt whose tokens start at `offsets` (bytes into `prompt_text`), of
/// which the first `cached` came from the prefix cache (`None`: not known, e.g. on
/// `/apply-template`); `controls` are the tokenizer's control-token spellings.
pub(crate) fn prompt_parts(
    structure: &PromptStructure,
    chat: &ChatRequest,
    prompt_text: &str,
    offsets: &[usize],
    cached: Option<usize>,
    controls: Option<&ControlSpellings>,
) -> PromptParts {
    let spans = spans(structure, chat, prompt_text, controls);
    let byte_ranges = message_ranges(&spans, chat.messages.len());
    let owner = |offset: usize| spans.iter().rev().find(|s| s.bytes.contains(&offset));
    let mut messages: Vec<(usize, usize)> = vec![(0, 0); chat.messages.len()];
    let mut counts = [(0usize, 0usize); KINDS.len()];
    for (i, &offset) in offsets.iter().enumerate() {
        let is_cached = cached.is_some_and(|c| i < c);
        let span = owner(offset);
        let kind = span.map_or("generation_prompt", |s| s.kind);
        let slot = KINDS.iter().position(|k| *k == kind).expect("every kind is listed");
        counts[slot].0 += 1;
        counts[slot].1 += usize::from(is_cached);
        if let Some(k) = byte_ranges.iter().position(|r| r.as_ref().is_some_and(|r| r.contains(&offset))) {
            messages[k].0 += 1;
            messages[k].1 += usize::from(is_cached);
        }
    }
    let entry = |(tokens, in_cache): (usize, usize)| PartCount::new(tokens, cached.map(|_| in_cache));
    let [system, tools, user, assistant, reasoning, tool_call_arguments, tool, generation_prompt] = counts.map(entry);
    let per_message = messages
        .into_iter()
        .enumerate()
        .map(|(k, count)| MessageCount {
            count: entry(count),
            index: k,
            role: chat.messages[k]["role"].clone(),
            bytes: byte_ranges[k].as_ref().map(|r| [r.start, r.end]),
        })
        .collect();
    PromptParts {
        system,
        tools,
        user,
        assistant,
        reasoning,
        tool_call_arguments,
        tool,
        generation_prompt,
        messages: Some(per_message),
    }
}

/// Each message's whole byte range (its header included), where it was found.
fn message_ranges(spans: &[Span], messages: usize) -> Vec<Option<Range<usize>>> {
    let mut ranges = vec![None; messages];
    for span in spans.iter().filter(|s| !matches!(s.kind, "reasoning" | "tool_call_arguments")) {
        if let Some(k) = span.message {
            ranges[k] = Some(span.bytes.clone());
        }
    }
    ranges
}
